//! The memory driver's store: the names in use, each one's holders and queue, and the steps
//! that grant, queue and let go under the store's one lock.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{watch, Notify};

use crate::driver::{Acquisition, Admission};
use crate::{Error, LeaderValue, LockName, Mode, Result};

/// The names in use. foldhash, not SipHash: hashing a name twice per cycle was 4 % of the
/// driver's acquire+release (callgrind); names come from the application itself.
pub(super) type Slots = HashMap<LockName, Slot, foldhash::fast::RandomState>;

#[derive(Default)]
pub(super) struct Store {
    pub(super) slots: Mutex<Slots>,
    pub(super) next_id: AtomicU64,
    pub(super) operations: AtomicU64,
}

#[derive(Default)]
pub(super) struct Slot {
    /// In grant order.
    pub(super) holders: Vec<Holder>,
    /// Last fencing token handed out; kept after release so tokens never repeat.
    pub(super) fence: u64,
    pub(super) queue: VecDeque<Waiter>,
    /// Bumped at every grant, release and proclaim: what observers' feeds wait on.
    pub(super) changes: Changes,
}

pub(super) struct Holder {
    pub(super) owner: u64,
    pub(super) expires_at: Instant,
    pub(super) mode: Mode,
    pub(super) fence: u64,
    pub(super) value: Option<LeaderValue>,
}

pub(super) struct Changes(pub(super) watch::Sender<u64>);

impl Default for Changes {
    fn default() -> Self {
        Changes(watch::channel(0).0)
    }
}

impl Changes {
    /// Tells the name's observers; with none, nothing is sent: a watch channel's send wakes
    /// its eight notifiers whether anyone waits or not (two sends per cycle were a tenth of
    /// the driver's instructions: 10,027 to 9,114 per cycle, callgrind), and even a silent
    /// one takes its lock. Sound because feeds subscribe, and every bump is made, under the
    /// store's lock; and nobody reads the count, only its changes.
    pub(super) fn bump(&self) {
        if self.0.receiver_count() > 0 {
            self.0.send_modify(|v| *v += 1);
        }
    }
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) notify: Arc<Notify>,
    pub(super) mode: Mode,
}

/// A waiter's place in a name's queue, from [`Store::enter`].
pub(super) struct Queued {
    pub(super) id: u64,
    pub(super) notify: Arc<Notify>,
    /// When the first holder's lease ends.
    pub(super) first_expiry: Option<Instant>,
}

pub(super) enum Attempt {
    Granted(Granted),
    /// Busy until `expires_at` (`None`: not this waiter's turn yet, or waiters queued ahead).
    Busy {
        expires_at: Option<Instant>,
    },
}

impl Slot {
    pub(super) fn expire(&mut self, now: Instant) {
        // Looked for first: most calls find nothing to drop, and `retain` costs more.
        if self.holders.iter().any(|h| now >= h.expires_at) {
            self.holders.retain(|h| now < h.expires_at);
            self.changes.bump();
        }
    }
    /// Wakes the first waiter; a waiter granted wakes the next, so compatible waiters (readers,
    /// permits) are granted one after another.
    pub(super) fn wake_head(&self) {
        if let Some(w) = self.queue.front() {
            w.notify.notify_one();
        }
    }
    /// When the first holder's lease ends: when a blocked waiter may have its turn.
    pub(super) fn first_expiry(&self) -> Option<Instant> {
        self.holders.iter().map(|h| h.expires_at).min()
    }
    /// Whether `mode` may join the holders now; a mismatch of permits against holders and
    /// waiters is an error.
    pub(super) fn admits(&self, name: &LockName, mode: Mode) -> Result<bool> {
        let holders = self.holders.iter().map(|h| h.mode);
        let users = holders.clone().chain(self.queue.iter().map(|w| w.mode));
        match mode.admits(holders, users) {
            Admission::Yes => Ok(true),
            Admission::No => Ok(false),
            Admission::Mismatch { held } => Err(permits_mismatch(name, held, mode)),
        }
    }
    pub(super) fn grant(&mut self, owner: u64, req: &Acquisition<'_>, now: Instant) -> Granted {
        self.fence += 1;
        let expires_at = now + req.ttl();
        self.holders.push(Holder {
            owner,
            expires_at,
            mode: req.mode(),
            fence: self.fence,
            value: req.value().cloned(),
        });
        self.changes.bump();
        Granted {
            owner,
            fence: self.fence,
            expires_at,
            at: now,
        }
    }
}

pub(super) fn permits_mismatch(name: &LockName, held: u32, mode: Mode) -> Error {
    Error::PermitsMismatch {
        name: name.clone(),
        held,
        asked: mode.limit().unwrap_or(0),
    }
}

impl Store {
    pub(super) fn slots(&self) -> MutexGuard<'_, Slots> {
        self.operations.fetch_add(1, Ordering::Relaxed);
        self.slots.lock()
    }

    /// One grant attempt. `waiter`: the caller's queue id, if it is queued.
    pub(super) fn attempt(&self, req: &Acquisition<'_>, waiter: Option<u64>) -> Result<Attempt> {
        let (name, mode) = (req.name(), req.mode());
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(name.clone()).or_default();
        slot.expire(now);
        let admitted = slot.admits(name, mode)?;
        let my_turn = match (slot.queue.front(), waiter) {
            (None, _) => true,
            (Some(head), Some(me)) => head.id == me,
            (Some(_), None) => false,
        };
        if !my_turn {
            return Ok(Attempt::Busy { expires_at: None });
        }
        if !admitted {
            return Ok(Attempt::Busy {
                expires_at: slot.first_expiry(),
            });
        }
        if waiter.is_some() {
            slot.queue.pop_front();
            slot.wake_head();
        }
        let owner = self.next_id.fetch_add(1, Ordering::Relaxed);
        Ok(Attempt::Granted(slot.grant(owner, req, now)))
    }

    /// Takes the lock, or joins the queue, in one step: no release can slip in between.
    /// `Ok(Err(first_expiry))` once queued.
    pub(super) fn enter(
        &self,
        req: &Acquisition<'_>,
    ) -> Result<std::result::Result<Granted, Queued>> {
        let (name, mode) = (req.name(), req.mode());
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(name.clone()).or_default();
        slot.expire(now);
        if slot.admits(name, mode)? && slot.queue.is_empty() {
            let owner = self.next_id.fetch_add(1, Ordering::Relaxed);
            return Ok(Ok(slot.grant(owner, req, now)));
        }
        // Made only here: an acquisition granted at once needs no wake-up of its own.
        let queued = Queued {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            notify: Arc::new(Notify::new()),
            first_expiry: slot.first_expiry(),
        };
        slot.queue.push_back(Waiter {
            id: queued.id,
            notify: queued.notify.clone(),
            mode,
        });
        Ok(Err(queued))
    }
}

/// Removes a waiter's queue record when its `acquire` returns or is dropped, and passes the
/// turn on if it was at the head of the queue.
pub(super) struct QueueGuard<'a> {
    pub(super) store: &'a Store,
    pub(super) name: &'a LockName,
    pub(super) id: u64,
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        let mut slots = self.store.slots();
        if let Some(slot) = slots.get_mut(self.name) {
            let was_head = slot.queue.front().is_some_and(|w| w.id == self.id);
            slot.queue.retain(|w| w.id != self.id);
            if was_head {
                slot.wake_head();
            }
        }
    }
}

pub(super) struct Granted {
    pub(super) owner: u64,
    pub(super) fence: u64,
    pub(super) expires_at: Instant,
    /// When the store granted it (its clock reading for `expires_at`).
    pub(super) at: Instant,
}
