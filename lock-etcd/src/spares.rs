//! Spare leases: a released lock's lease, kept for the next acquisition with the same TTL.

use std::time::{Duration, Instant};

/// Leases whose lock was released, for the next acquisition of the same TTL: reusing one
/// saves a grant and a revoke (two consensus writes) per lock. A spare has no key; one that
/// expires in the pool costs nothing.
#[derive(Default)]
pub(crate) struct Spares(std::sync::Mutex<Vec<(i64, Duration, Instant)>>);

impl Spares {
    const MAX: usize = 64;

    /// A spare of this TTL that should still be alive, if any, and its validity.
    pub(crate) fn take(&self, ttl: Duration) -> Option<(i64, Instant)> {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let soon = Instant::now() + Duration::from_millis(200);
        v.retain(|(_, _, fresh_until)| *fresh_until > soon);
        let i = v.iter().rposition(|(_, t, _)| *t == ttl)?;
        let (id, _, fresh_until) = v.swap_remove(i);
        Some((id, fresh_until))
    }

    /// Keeps `id` for reuse; `false` if the pool is full (the caller revokes it).
    pub(crate) fn put(&self, id: i64, ttl: Duration, fresh_until: Instant) -> bool {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() >= Self::MAX {
            return false;
        }
        v.push((id, ttl, fresh_until));
        true
    }
}
