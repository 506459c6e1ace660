//! Spare leases: a released lock's lease, kept for the next acquisition with the same TTL.

use std::time::Duration;

use crate::term::Tenure;

/// Leases whose lock was released, for the next acquisition of the same TTL: reusing one
/// saves a grant and a revoke (two consensus writes) per lock. A spare has no key; one that
/// expires in the pool costs nothing.
#[derive(Default)]
pub(crate) struct Spares(parking_lot::Mutex<Vec<(Duration, Tenure)>>);

impl Spares {
    const MAX: usize = 64;

    /// A spare of this TTL that should still be alive, if any (its lease, term and validity).
    pub(crate) fn take(&self, ttl: Duration) -> Option<Tenure> {
        let mut v = self.0.lock();
        let soon = std::time::Instant::now() + Duration::from_millis(200);
        v.retain(|(_, t)| t.valid_until > soon);
        let i = v.iter().rposition(|(t, _)| *t == ttl)?;
        Some(v.swap_remove(i).1)
    }

    /// Keeps a lease of `ttl` for reuse; `false` if the pool is full (the caller revokes it).
    pub(crate) fn put(&self, ttl: Duration, tenure: Tenure) -> bool {
        let mut v = self.0.lock();
        if v.len() >= Self::MAX {
            return false;
        }
        v.push((ttl, tenure));
        true
    }
}
