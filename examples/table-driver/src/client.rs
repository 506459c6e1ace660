//! The "server": a table of locks in memory, and the three requests a lock makes to it. A real
//! driver sends these to its backend, each one atomic there.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::LockName;
use tokio::sync::Notify;

/// The "server": lock entries and fencing counters, shared by all clients made from it.
#[derive(Clone, Default)]
pub struct Table {
    pub(crate) shared: Arc<Shared>,
}

#[derive(Default)]
pub(crate) struct Shared {
    entries: Mutex<HashMap<LockName, Entry>>,
    fences: Mutex<HashMap<LockName, u64>>,
    /// Wakes waiters when a lock is released (a real backend would use pub/sub or a watch).
    pub(crate) released: Notify,
    /// Operations served: the suite checks with it that waiters do not poll.
    requests: AtomicU64,
    pub(crate) next_owner: AtomicU64,
}

struct Entry {
    owner: u64,
    expires: Instant,
}

impl Table {
    /// How many operations the table has served.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Deletes a lock behind its holder's back (what an operator might do).
    pub fn break_lock(&self, name: &LockName) {
        self.shared.lock_entries().remove(name);
        self.shared.released.notify_waiters();
    }
}

impl Shared {
    fn lock_entries(&self) -> parking_lot::MutexGuard<'_, HashMap<LockName, Entry>> {
        self.entries.lock()
    }

    /// The backend's atomic "acquire": grant if free (or expired), else say how long the
    /// holder has left. One request.
    pub(crate) fn try_grant(
        &self,
        name: &LockName,
        owner: u64,
        ttl: Duration,
    ) -> std::result::Result<u64, Duration> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut entries = self.lock_entries();
        if let Some(e) = entries.get(name) {
            if e.expires > now {
                return Err(e.expires - now);
            }
        }
        entries.insert(
            name.clone(),
            Entry {
                owner,
                expires: now + ttl,
            },
        );
        let mut fences = self.fences.lock();
        let fence = fences.entry(name.clone()).or_insert(0);
        *fence += 1;
        Ok(*fence)
    }

    /// The backend's atomic "extend": `ttl` more from now if `owner` still holds `name`
    /// (unexpired); `false` otherwise, and then nothing changes. One request.
    pub(crate) fn extend(&self, name: &LockName, owner: u64, ttl: Duration) -> bool {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        match self.lock_entries().get_mut(name) {
            Some(e) if e.owner == owner && e.expires > now => {
                e.expires = now + ttl;
                true
            }
            _ => false,
        }
    }

    /// The backend's atomic "delete if mine": `false` if `owner` no longer holds `name`
    /// (released, broken, or expired), and then nothing changes. One request.
    pub(crate) fn delete(&self, name: &LockName, owner: u64) -> bool {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.lock_entries();
        match entries.get(name) {
            Some(e) if e.owner == owner && e.expires > Instant::now() => {
                entries.remove(name);
                drop(entries);
                self.released.notify_waiters();
                true
            }
            _ => false,
        }
    }
}
