//! Flaws that strike one grant in [`EVERY`] of a client and keep every promise on the others:
//! a case that checks a promise on one grant or two passes them.

use std::time::Instant;

use lock_core::LockName;

use super::harness::*;
use super::Flaw;

/// Of each client's grants, every this-many-th is struck.
pub(super) const EVERY: u64 = 20;

impl Flaw {
    /// Breaks its promise on one grant in [`EVERY`] only.
    pub(super) fn is_intermittent(self) -> bool {
        matches!(
            self,
            Flaw::IntermittentRepeatedToken
                | Flaw::IntermittentOverstatedValidity
                | Flaw::IntermittentLostWakeup
                | Flaw::IntermittentSilentLoss
        )
    }
}

impl FlawedLock {
    /// This client's grants so far.
    fn granted(&self) -> u64 {
        self.shared
            .granted
            .lock()
            .get(&self.id)
            .copied()
            .unwrap_or(0)
    }

    /// Counts a grant of this client: `true` if the intermittent flaw strikes it.
    pub(super) fn strikes_this_grant(&self) -> bool {
        if !self.flaw.is_intermittent() {
            return false;
        }
        let mut granted = self.shared.granted.lock();
        let n = granted.entry(self.id).or_insert(0);
        *n += 1;
        *n % EVERY == 0
    }

    /// [`Flaw::IntermittentLostWakeup`]: a waiter whose next grant is struck, and whose lock
    /// another client holds, misses the release's wake-up: it sleeps until the holder's expiry
    /// (or its own deadline), as a waiter whose notification was lost falls back on the TTL.
    pub(super) async fn miss_wakeup(&self, key: &LockName, deadline: Option<Instant>) {
        if self.flaw != Flaw::IntermittentLostWakeup || (self.granted() + 1) % EVERY != 0 {
            return;
        }
        let Some(g) = self.shared.grants.lock().get(key).copied() else {
            return;
        };
        if g.client == self.id || g.expires <= Instant::now() {
            return;
        }
        let until = deadline.map_or(g.expires, |d| d.min(g.expires));
        tokio::time::sleep_until(until.into()).await;
    }
}
