//! Revoking the lease of an acquisition that ended without a grant (its key goes with it), or
//! one that guards nothing any more: sent again after a failure until the lease would have
//! expired by itself.

use std::time::{Duration, Instant};

use lock_core::driver::retry_in_background;
use lock_core::Result;

use std::sync::Arc;

use crate::client::Cluster;

/// Revokes a contender's lease if the acquisition ends without a grant, which also deletes its
/// key. A revoke that fails — on a connection that broke with the acquisition, say — is sent
/// again until it is answered or the lease has expired by itself: left alone, the key would stay
/// in the queue for a whole TTL, holding the lock nobody has or blocking the waiters behind it.
pub(crate) struct RevokeGuard {
    cluster: Arc<Cluster>,
    id: Option<i64>,
    /// When the lease expires by itself at the latest: revoking after that is pointless.
    expires: Instant,
}

impl RevokeGuard {
    /// Guards lease `id`, granted for `ttl`.
    pub(crate) fn new(cluster: &Arc<Cluster>, id: i64, ttl: Duration) -> Self {
        RevokeGuard {
            cluster: cluster.clone(),
            id: Some(id),
            expires: Instant::now() + ttl,
        }
    }

    /// The key moved onto lease `id` of `ttl` (the old one is revoked by the move): guards
    /// that one instead.
    pub(crate) fn switch(&mut self, id: i64, ttl: Duration) {
        self.id = Some(id);
        self.expires = Instant::now() + ttl;
    }

    /// The acquisition got the lock: the lease is the lock's now.
    pub(crate) fn disarm(&mut self) {
        self.id = None;
    }

    /// Revokes now, waiting for one attempt (the caller reports a timeout and its key should be
    /// gone by then); after a failure, keeps trying in the background.
    pub(crate) async fn revoke_now(&mut self) {
        if let Some(id) = self.id.take() {
            if let Err(e) = revoke(&self.cluster, id).await {
                tracing::debug!(error = %e, "revoking a contender's lease failed; retrying");
                spawn_revoke(self.cluster.clone(), id, self.expires);
            }
        }
    }
}

impl Drop for RevokeGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            spawn_revoke(self.cluster.clone(), id, self.expires);
        }
    }
}

async fn revoke(cluster: &Cluster, id: i64) -> Result<()> {
    // Its kept keep-alive stream (if any) goes first: nothing keeps a revoked lease alive.
    cluster.keepers.forget(id);
    cluster
        .call(|mut c| async move { c.lease_revoke(id).await })
        .await
        .map(|_| ())
}

/// Revokes lease `id` in the background, again after each failure that may pass (a revoke is
/// idempotent), until `expires`.
pub(crate) fn spawn_revoke(cluster: Arc<Cluster>, id: i64, expires: Instant) {
    retry_in_background(expires, move || {
        let cluster = cluster.clone();
        async move { revoke(&cluster, id).await }
    });
}
