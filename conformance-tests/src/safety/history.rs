//! The history a safety run records: every operation of every client, on one monotonic clock
//! (all clients run in this process, so "at the same instant" is exact).

use lock_core::Mode;
use parking_lot::Mutex;
use std::time::Instant;

/// One lease, numbered in grant order within a run.
pub type LeaseId = u64;

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// A client asked for the name (a bounded wait).
    Acquire,
    /// The grant returned, with the lease's token and `valid_until` at that moment.
    Granted {
        /// The lease.
        lease: LeaseId,
        /// Its fencing token, if the driver gives one.
        token: Option<u64>,
        /// Its `valid_until` when the grant returned.
        valid_until: Instant,
    },
    /// How the runtime ran the acquisition that returned `lease` (recorded with its grant):
    /// when its future was last woken and when the poll that returned the grant began. A
    /// grant recorded long after the driver's answer is told apart from one polled late.
    Polled {
        /// The lease.
        lease: LeaseId,
        /// The last wake-up before that poll (`None`: none was seen).
        woken: Option<Instant>,
        /// When that poll began.
        polled: Option<Instant>,
    },
    /// The mode lease `lease` holds in, recorded with its grant where it is not exclusive
    /// (a lease with no such event is exclusive).
    Mode {
        /// The lease.
        lease: LeaseId,
        /// Shared, or one of K permits.
        mode: Mode,
    },
    /// The attempt ended without a grant (timeout or error).
    Refused {
        /// Why, in the driver's words.
        error: String,
        /// It was the bounded wait running out (`Error::Timeout`): the backend answered,
        /// and somebody held the name throughout. Any other refusal is an error, which is no
        /// evidence that the client reaches its backend.
        timed_out: bool,
    },
    /// The attempt outlived the workload's own limit (its bounded wait, four TTLs and twice
    /// the slack) and was cancelled: the driver overstayed its deadline, a violation of (d).
    Unknown,
    /// The holder looked at its lease: its `valid_until` then, and whether it was Lost.
    Looked {
        /// The lease.
        lease: LeaseId,
        /// `valid_until` as the lease reported it.
        valid_until: Instant,
        /// The lease said Lost.
        lost: bool,
    },
    /// The lease's lost signal fired.
    LostSignal {
        /// The lease.
        lease: LeaseId,
    },
    /// The holder called `release` (it stops believing it holds from here).
    Release {
        /// The lease.
        lease: LeaseId,
    },
    /// `release` returned.
    Released {
        /// The lease.
        lease: LeaseId,
        /// It returned `Ok`.
        ok: bool,
    },
    /// The holder let go without a release (dropped or abandoned the lease).
    LetGo {
        /// The lease.
        lease: LeaseId,
    },
    /// A write to the fenced store.
    Write {
        /// The lease whose holder wrote.
        lease: LeaseId,
        /// The token it wrote with.
        token: Option<u64>,
        /// The store accepted it.
        accepted: bool,
    },
    /// The nemesis closed every connection of this event's client
    /// ([`Fault::Cut`](crate::Fault::Cut)), recorded the moment it did. For a driver whose lock
    /// is its connection's session, this is when the server may free the lock.
    Cut,
    /// The nemesis's witness of the client's last [`Op::Cut`] — a plain connection over the
    /// same link, read by a thread of its own and closed after the link's other connections —
    /// saw it close: the earliest this process could see the whole cut, later than the cut by
    /// the machine's load. A cut race's notice counts from here ([`CUT_NOTICE`](super::CUT_NOTICE)).
    CutSeen,
    /// A fault began (nemesis).
    Fault {
        /// What and where.
        what: String,
    },
    /// A fault was healed (nemesis).
    Heal {
        /// What and where.
        what: String,
    },
    /// An election's observer on this event's client and name showed a leader's term (`None`:
    /// nobody leads), after a gap if `resynced`.
    Observed {
        /// The leader's term.
        term: Option<u64>,
        /// The observer said it re-read after a gap.
        resynced: bool,
    },
    /// An observer's `next` failed (a non-retryable error): it observes no more.
    ObserverFailed {
        /// In the driver's words.
        error: String,
    },
    /// The run stopped its observers: every lease had ended by then (or the bound ran out).
    ObserversStopped,
    /// After the run's last heal, every server serves its clients again
    /// ([`Servers::serving`](crate::Servers::serving)), recorded when the nemesis first saw
    /// it. Liveness (d) counts from here.
    Serving,
}

/// One entry of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// When, on the run's one monotonic clock.
    pub at: Instant,
    /// Which client (the nemesis is `usize::MAX`).
    pub client: usize,
    /// Which name (index into the run's names; `usize::MAX` for faults).
    pub name: usize,
    /// What.
    pub op: Op,
}

/// The nemesis's "client" and "name" in events that concern no client or no name.
pub const NOBODY: usize = usize::MAX;

/// An append-only history, shared by the clients and the nemesis of a run.
#[derive(Debug, Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
}

impl History {
    /// Records `op` now.
    pub fn record(&self, client: usize, name: usize, op: Op) {
        self.record_at(Instant::now(), client, name, op);
    }

    /// Records `op` at `at` (an instant taken earlier, such as a grant's return).
    pub fn record_at(&self, at: Instant, client: usize, name: usize, op: Op) {
        let e = Event {
            at,
            client,
            name,
            op,
        };
        self.events.lock().push(e);
    }

    /// Every event so far, in time order.
    pub fn events(&self) -> Vec<Event> {
        let mut v = self.events.lock().clone();
        v.sort_by_key(|e| e.at);
        v
    }
}

/// Each fault in `events` (time-ordered) with its heal: the first later heal whose description
/// starts the fault's (the nemesis and the clients write them so), `None` if it never healed.
pub(super) fn fault_spans(events: &[Event]) -> Vec<(&Event, Option<&Event>)> {
    let mut open: Vec<&Event> = Vec::new();
    let mut out = Vec::new();
    for e in events {
        match &e.op {
            Op::Fault { .. } => open.push(e),
            Op::Heal { what } => {
                let starts = |f: &&Event| matches!(&f.op, Op::Fault { what: w } if w.starts_with(what.as_str()));
                if let Some(i) = open.iter().position(starts) {
                    out.push((open.remove(i), Some(e)));
                }
            }
            _ => {}
        }
    }
    out.extend(open.into_iter().map(|f| (f, None)));
    out
}
