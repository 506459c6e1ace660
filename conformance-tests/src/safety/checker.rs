//! Reads a history and reports every violation of (a) no overlap, (b) fencing, (c) loss before
//! re-grant and (d) liveness, with the operations involved.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use super::belief::{beliefs, Belief};
use super::history::{Event, LeaseId, Op, NOBODY};

/// Which promise a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// (a) Two clients believed they held one name at the same instant.
    Overlap,
    /// (b) Tokens did not strictly increase in grant order, or the store accepted a write with
    /// a token lower than one it had accepted.
    Fencing,
    /// (c) A holder that had not released was still believing it held (no lost signal, its
    /// `valid_until` ahead) when the next holder's grant returned.
    LossNotSeen,
    /// (d) After the last fault healed (and the servers served again, where they say so), a
    /// name was not granted within the bound, or a client was never answered by its backend
    /// again; or an acquisition never finished, or overstayed its bounded wait by the
    /// workload's whole margin.
    Liveness,
}

/// One broken promise, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which promise.
    pub kind: Kind,
    /// The name (index into the run's names; [`NOBODY`] for a violation of one client's).
    pub name: usize,
    /// The leases involved, earlier first.
    pub leases: Vec<LeaseId>,
    /// When it happened.
    pub at: Instant,
    /// What happened, in words (times relative to the start of the history).
    pub detail: String,
}

impl Violation {
    /// A violation of (d): no lease is involved.
    fn liveness(name: usize, at: Instant, detail: String) -> Self {
        Violation {
            kind: Kind::Liveness,
            name,
            leases: vec![],
            at,
            detail,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name == NOBODY {
            write!(f, "{:?}: {}", self.kind, self.detail)
        } else {
            write!(f, "{:?} on name {}: {}", self.kind, self.name, self.detail)
        }
    }
}

/// How long after a cut a grant that was answered on the connection being cut may still be
/// recorded (see [`CUT_NOTICE`]).
const CUT_SETTLE: Duration = Duration::from_millis(1);

/// The one excuse the checker gives, and its width. For a lock that is its connection's
/// session ([`Rules::session_bound`]), a cut of the holder's link frees the lock on the server
/// the moment the server sees the close, and the holder learns of it when its own client sees
/// the same close: nothing orders the two, and the next holder's grant can return first.
///
/// An overlap is that race only if all of these hold: the earlier holder's link was cut (after
/// its grant, give or take a millisecond for a reply already on its way); the later lease's
/// grant — not a belief that starts again — returned after that cut; and the earlier holder's
/// belief ended within `CUT_NOTICE` of the cut. Anything else, an overlap between two clients
/// neither of which was cut included, is a violation.
///
/// Measured on PostgreSQL (`lock-postgres/tests/faults.rs`, 40 cuts with a waiter queued,
/// 2026-11-24): the holder was Lost at most 1.9 ms after the cut, and the waiter's grant
/// returned first by at most 1.6 ms. 10 ms is that notice with room for the two task wake-ups
/// that record each side on a loaded two-core machine, and no wider: a driver that notices a
/// closed connection only at its next renewal or poll misses it (the negative control
/// `Flaw::SessionLostByPolling` polls every sixth of a 200 ms TTL, the width this excuse had
/// before, and is caught).
pub const CUT_NOTICE: Duration = Duration::from_millis(10);

/// What the checker needs besides the history.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// The driver gives fencing tokens: (b) applies.
    pub fencing: bool,
    /// (d): every name must be granted again, and every client answered by its backend
    /// again, within this long after the last fault healed, or after the servers serve again
    /// where the history says when ([`Op::Serving`]).
    pub recovery: Duration,
    /// When the run stopped issuing operations (open beliefs end here).
    pub end: Instant,
    /// The driver's lock is its connection's session (`outlives_connection = false`): the
    /// cut race of [`CUT_NOTICE`] is counted (see [`cut_races`]), not reported. `false`: every
    /// overlap is a violation.
    pub session_bound: bool,
}

/// Every violation in `events` (time-ordered, as [`History::events`](super::History::events)
/// gives them).
pub fn check(events: &[Event], rules: &Rules) -> Vec<Violation> {
    analyse(events, rules).0
}

/// The overlaps [`CUT_NOTICE`] lets pass, each as long as it lasted: how far the next
/// holder's grant ran ahead of a cut holder's own notice.
pub fn cut_races(events: &[Event], rules: &Rules) -> Vec<Duration> {
    analyse(events, rules).1
}

/// The violations and the cut races of one history.
pub(super) fn analyse(events: &[Event], rules: &Rules) -> (Vec<Violation>, Vec<Duration>) {
    let origin = events.first().map_or(rules.end, |e| e.at);
    let rel = |t: Instant| t.saturating_duration_since(origin);
    let beliefs = beliefs(events, rules.end);
    let mut out = Vec::new();
    let mut races = Vec::new();
    let mut by_name: BTreeMap<usize, Vec<&Belief>> = BTreeMap::new();
    for b in beliefs.values() {
        by_name.entry(b.name).or_default().push(b);
    }
    let mut cuts: HashMap<usize, Vec<Instant>> = HashMap::new();
    for e in events.iter().filter(|e| e.op == Op::Cut) {
        cuts.entry(e.client).or_default().push(e.at);
    }
    // An overlap from `s` (the later lease's grant) to `re` (the end of the earlier lease
    // `b`'s belief) is the cut race if `b`'s own client was cut after `b`'s grant and before
    // `s`, and `b`'s belief ended within the notice of that cut.
    let raced = |b: &Belief, s: Instant, re: Instant| {
        rules.session_bound
            && cuts.get(&b.client).is_some_and(|at| {
                at.iter()
                    .any(|&c| b.granted <= c + CUT_SETTLE && c <= s && re <= c + CUT_NOTICE)
            })
    };
    for (&name, leases) in &by_name {
        overlaps(name, leases, &rel, &raced, &mut out, &mut races);
        if rules.fencing {
            token_order(name, leases, &rel, &mut out);
        }
    }
    store_order(events, &beliefs, &rel, &mut out);
    liveness(events, rules, &by_name, &rel, &mut out);
    out.sort_by_key(|v| (v.kind, v.at));
    (out, races)
}

/// Judges every pair of overlapping belief spans of one name (not only each span against the
/// one reaching furthest: an excused race must not hide two other clients' overlap).
fn overlaps(
    name: usize,
    leases: &[&Belief],
    rel: &dyn Fn(Instant) -> Duration,
    raced: &dyn Fn(&Belief, Instant, Instant) -> bool,
    out: &mut Vec<Violation>,
    races: &mut Vec<Duration>,
) {
    let mut spans: Vec<(Instant, Instant, &Belief)> = leases
        .iter()
        .flat_map(|b| b.spans.iter().map(move |&(s, e)| (s, e, *b)))
        .collect();
    spans.sort_by_key(|s| s.0);
    // The spans not yet over at the current start.
    let mut open: Vec<(Instant, Instant, &Belief)> = Vec::new();
    for span in spans {
        let (s, e, b) = span;
        open.retain(|&(_, re, _)| re > s);
        for &(rs, re, rb) in &open {
            if rb.lease == b.lease {
                continue;
            }
            if b.granted == s && raced(rb, s, re) {
                races.push(re.min(e) - s);
                continue;
            }
            out.push(Violation {
                kind: Kind::Overlap,
                name,
                leases: vec![rb.lease, b.lease],
                at: s,
                detail: format!(
                    "client {} (lease {}, believing {:?}..{:?}) and client {} (lease {}, \
                     believing from {:?}) both believed they held it for {:?}",
                    rb.client,
                    rb.lease,
                    rel(rs),
                    rel(re),
                    b.client,
                    b.lease,
                    rel(s),
                    re.min(e) - s
                ),
            });
            // The earlier holder had lost the lock (it had not let go, and its release, if
            // any, failed) yet did not know when the successor's grant returned.
            if rb.let_go.map_or(true, |g| g > s) && !rb.released_ok && b.granted == s {
                out.push(Violation {
                    kind: Kind::LossNotSeen,
                    name,
                    leases: vec![rb.lease, b.lease],
                    at: s,
                    detail: format!(
                        "lease {} of client {} had not released and still believed it held \
                         (lost signal {}, valid until {:?}) when lease {} of client {} was \
                         granted at {:?}",
                        rb.lease,
                        rb.client,
                        rb.lost_signal
                            .map_or("never".to_string(), |t| format!("at {:?}", rel(t))),
                        rel(re),
                        b.lease,
                        b.client,
                        rel(s)
                    ),
                });
            }
        }
        open.push(span);
    }
}

fn token_order(
    name: usize,
    leases: &[&Belief],
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    // A belief that starts again (a resurrected lease) after a newer grant holds an old token:
    // its holder writes with a token the newer holder already superseded.
    let mut starts: Vec<(Instant, &Belief)> = leases
        .iter()
        .flat_map(|b| b.spans.iter().map(move |&(s, _)| (s, *b)))
        .collect();
    starts.sort_by_key(|s| s.0);
    let mut newest: Option<(u64, LeaseId)> = None;
    for (s, b) in starts {
        let Some(t) = b.token else { continue };
        match newest {
            Some((n, l)) if t < n && s > b.granted => out.push(Violation {
                kind: Kind::Fencing,
                name,
                leases: vec![l, b.lease],
                at: s,
                detail: format!(
                    "lease {} (token {t}) believed it held again at {:?}, after lease {l} was \
                     granted token {n}",
                    b.lease,
                    rel(s)
                ),
            }),
            _ => {}
        }
        if newest.map_or(true, |(n, _)| t > n) {
            newest = Some((t, b.lease));
        }
    }
    // Grants that were believed at all, in the order they returned.
    let mut held: Vec<&&Belief> = leases.iter().filter(|b| !b.spans.is_empty()).collect();
    held.sort_by_key(|b| b.granted);
    for w in held.windows(2) {
        let (a, b) = (w[0], w[1]);
        let ok = matches!((a.token, b.token), (Some(x), Some(y)) if y > x);
        if !ok {
            out.push(Violation {
                kind: Kind::Fencing,
                name,
                leases: vec![a.lease, b.lease],
                at: b.granted,
                detail: format!(
                    "lease {} granted at {:?} has token {:?}, not greater than {:?} of lease {} \
                     granted at {:?}",
                    b.lease,
                    rel(b.granted),
                    b.token,
                    a.token,
                    a.lease,
                    rel(a.granted)
                ),
            });
        }
    }
}

/// What fencing is for, judged end to end: once the fenced store accepted a write of a lease,
/// it never accepts one of a lease granted earlier (in the history's real-time grant order,
/// which the store never sees: it sees only tokens). A repeated token, a token out of grant
/// order, or a token a lease did not get at its grant lets a superseded holder's write in.
fn store_order(
    events: &[Event],
    beliefs: &HashMap<LeaseId, Belief>,
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    // Per name, the accepted write whose lease was granted latest so far.
    let mut newest: HashMap<usize, (Instant, LeaseId, u64)> = HashMap::new();
    for e in events {
        let Op::Write {
            lease,
            token: Some(t),
            accepted: true,
        } = e.op
        else {
            continue;
        };
        let Some(b) = beliefs.get(&lease) else {
            out.push(Violation {
                kind: Kind::Fencing,
                name: e.name,
                leases: vec![lease],
                at: e.at,
                detail: format!(
                    "the store accepted token {t} at {:?} from lease {lease}, which was never \
                     granted",
                    rel(e.at)
                ),
            });
            continue;
        };
        match newest.get(&e.name) {
            Some(&(g, l, nt)) if b.granted < g => out.push(Violation {
                kind: Kind::Fencing,
                name: e.name,
                leases: vec![l, lease],
                at: e.at,
                detail: format!(
                    "the store accepted a write of lease {lease} (granted at {:?}, token {t}) at \
                     {:?}, after it had accepted one of lease {l} (granted later, at {:?}, \
                     token {nt}): the superseded holder's token did not fence it out",
                    rel(b.granted),
                    rel(e.at),
                    rel(g)
                ),
            }),
            Some(&(g, _, _)) if b.granted == g => {}
            _ => {
                newest.insert(e.name, (b.granted, lease, t));
            }
        }
    }
}

fn liveness(
    events: &[Event],
    rules: &Rules,
    by_name: &BTreeMap<usize, Vec<&Belief>>,
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    let start = events.first().map_or(rules.end, |e| e.at);
    let healed = last_heal(events).unwrap_or(start);
    let from = settled(events).unwrap_or(start);
    let due = from + rules.recovery;
    let since = if from > healed {
        format!(
            "the servers serving again at {:?}, {:?} after the last heal at {:?}",
            rel(from),
            from - healed,
            rel(healed)
        )
    } else if last_heal(events).is_some() {
        format!("the last heal at {:?}", rel(healed))
    } else {
        "the start of the run".to_string()
    };
    if due <= rules.end {
        let names: Vec<usize> = events
            .iter()
            .filter(|e| e.name != NOBODY)
            .map(|e| e.name)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for name in names {
            let again = by_name
                .get(&name)
                .into_iter()
                .flatten()
                .any(|b| b.granted > from && b.granted <= due);
            if !again {
                out.push(Violation::liveness(
                    name,
                    due,
                    format!("not granted within {:?} of {since}", rules.recovery),
                ));
            }
        }
        clients_recover(events, from, rules.end, &since, rel, out);
    }
    // Every acquisition finishes within its bounded wait and the workload's margin: a
    // client's Acquire is followed by its outcome, not by the workload giving up on it.
    let mut pending: HashMap<usize, &Event> = HashMap::new();
    for e in events {
        match e.op {
            Op::Acquire => {
                pending.insert(e.client, e);
            }
            Op::Unknown => {
                let begun = pending.remove(&e.client).map_or(e.at, |a| a.at);
                out.push(Violation::liveness(
                    e.name,
                    e.at,
                    format!(
                        "client {}'s acquisition begun at {:?} had not returned at {:?}, past its \
                         bounded wait and the workload's margin (four TTLs and twice the \
                         slack): the driver overstayed its deadline",
                        e.client,
                        rel(begun),
                        rel(e.at)
                    ),
                ));
            }
            Op::Granted { .. } | Op::Refused { .. } => {
                pending.remove(&e.client);
            }
            _ => {}
        }
    }
    for (client, e) in pending {
        out.push(Violation::liveness(
            e.name,
            e.at,
            format!(
                "client {client}'s acquisition begun at {:?} never finished",
                rel(e.at)
            ),
        ));
    }
}

/// (d) per client: after `from`, every client that asked for a lock again is answered by its
/// backend again before the run ends — a grant, a wait that ran out while others held the
/// name, or a release that succeeded. A client whose every attempt fails (it never
/// reconnected, say) is a violation however well the others do.
fn clients_recover(
    events: &[Event],
    from: Instant,
    end: Instant,
    since: &str,
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    let mut seen: BTreeMap<usize, (bool, usize, Option<&Event>)> = BTreeMap::new();
    for e in events.iter().filter(|e| e.client != NOBODY) {
        let entry = seen.entry(e.client).or_insert((false, 0, None));
        if e.at <= from || e.at > end {
            continue;
        }
        match &e.op {
            Op::Granted { .. }
            | Op::Refused {
                timed_out: true, ..
            }
            | Op::Released { ok: true, .. } => entry.0 = true,
            Op::Acquire => entry.1 += 1,
            Op::Refused { .. } | Op::Unknown => entry.2 = Some(e),
            _ => {}
        }
    }
    for (client, (answered, attempts, last)) in seen {
        if answered || attempts == 0 {
            continue;
        }
        let how = match last {
            Some(Event {
                op: Op::Refused { error, .. },
                at,
                ..
            }) => format!("the last refused at {:?}: {error}", rel(*at)),
            Some(e) => format!("the last cancelled at {:?}", rel(e.at)),
            None => "none of them finished".to_string(),
        };
        out.push(Violation::liveness(
            NOBODY,
            end,
            format!(
                "client {client} was not answered by its backend from {} to the end of the run \
                 at {:?}: no grant, no wait that ran out, no release; {attempts} attempts, {how}",
                since,
                rel(end)
            ),
        ));
    }
}

/// When the last fault was healed, if any was.
pub(super) fn last_heal(events: &[Event]) -> Option<Instant> {
    (events.iter())
        .filter(|e| matches!(e.op, Op::Heal { .. }))
        .map(|e| e.at)
        .max()
}

/// Where liveness (d) counts from: when the servers were first seen serving again after the
/// last heal ([`Op::Serving`]), or the last heal if they were not (or serve once healed).
/// `None`: nothing was healed.
pub(super) fn settled(events: &[Event]) -> Option<Instant> {
    let healed = last_heal(events)?;
    let serving = (events.iter())
        .filter(|e| e.op == Op::Serving && e.at >= healed)
        .map(|e| e.at)
        .min();
    Some(serving.unwrap_or(healed))
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
