//! Revoking the lease of an acquisition that ended without a grant (its key goes with it), or
//! one that guards nothing any more; on a shared lease, deleting the acquisition's key instead
//! (`shared.rs`): sent again after a failure until the lease would have expired by itself.

use std::time::{Duration, Instant};

use lock_core::driver::retry_in_background;
use lock_core::Result;

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::client::{lease_not_found, mapped, send, Cluster, Resend, Unanswered};

/// Revokes a contender's lease if the acquisition ends without a grant, which also deletes its
/// key; on a shared lease (`shared.rs`), deletes the key instead, or makes sure its put can no
/// longer land. An undo that fails — on a connection that broke with the acquisition, say — is
/// sent again until it is answered or the lease has expired by itself: left alone, the key would
/// stay in the queue for a whole TTL, holding the lock nobody has or blocking the waiters behind
/// it.
pub(crate) struct RevokeGuard {
    cluster: Arc<Cluster>,
    undo: Option<Undo>,
    /// When the lease expires by itself at the latest: undoing after that is pointless.
    expires: Instant,
}

/// What undoes an acquisition that ended without a grant.
pub(crate) enum Undo {
    /// Revoking its own lease (its key goes with it).
    Lease(i64),
    /// Its key on a shared lease, with the tombstone that keeps a put still in flight out
    /// (`shared.rs`).
    Key {
        key: String,
        tomb: String,
        lease: i64,
    },
}

impl RevokeGuard {
    /// Guards lease `id`, granted for `ttl`.
    pub(crate) fn new(cluster: &Arc<Cluster>, id: i64, ttl: Duration) -> Self {
        Self::with(cluster, Undo::Lease(id), ttl)
    }

    /// Guards an acquisition by `undo`, on a lease of `ttl`.
    pub(crate) fn with(cluster: &Arc<Cluster>, undo: Undo, ttl: Duration) -> Self {
        RevokeGuard {
            cluster: cluster.clone(),
            undo: Some(undo),
            expires: Instant::now() + ttl,
        }
    }

    /// The key moved onto lease `id` of `ttl` (the old one is revoked by the move, unless
    /// shared): guards that one instead.
    pub(crate) fn switch(&mut self, id: i64, ttl: Duration) {
        match &mut self.undo {
            Some(Undo::Lease(old)) => *old = id,
            Some(Undo::Key { lease, .. }) => *lease = id,
            None => {}
        }
        self.expires = Instant::now() + ttl;
    }

    /// The acquisition got the lock: the lease is the lock's now.
    pub(crate) fn disarm(&mut self) {
        self.undo = None;
    }

    /// Undoes now, waiting for one attempt (the caller reports a timeout and its key should be
    /// gone by then); after a failure, keeps trying in the background.
    pub(crate) async fn revoke_now(&mut self) {
        self.undo_now(Resend::Unsent).await;
    }

    /// Undoes now, sent again at once after each failure that may pass, for a request timeout
    /// at most: `true` once answered (or with nothing to undo), when no key of this acquisition
    /// is left; after a failure, keeps trying in the background and says `false`.
    pub(crate) async fn undone(&mut self) -> bool {
        self.undo_now(Resend::Idempotent).await
    }

    async fn undo_now(&mut self, resend: Resend) -> bool {
        let Some(undo) = self.undo.take() else {
            return true;
        };
        match undo.run(&self.cluster, resend).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "undoing a contender's acquisition failed; retrying");
                spawn_undo(self.cluster.clone(), undo, self.expires);
                false
            }
        }
    }
}

impl Drop for RevokeGuard {
    fn drop(&mut self) {
        if let Some(undo) = self.undo.take() {
            spawn_undo(self.cluster.clone(), undo, self.expires);
        }
    }
}

impl Undo {
    async fn run(&self, cluster: &Cluster, resend: Resend) -> Result<()> {
        match self {
            Undo::Lease(id) => revoke(cluster, *id, resend).await,
            Undo::Key { key, tomb, lease } => undo_put(cluster, key, tomb, *lease, resend).await,
        }
    }
}

/// Runs `undo` in the background, again after each failure that may pass (each is
/// idempotent: one sent as its connection broke is sent again on the next at once), until
/// `expires`.
fn spawn_undo(cluster: Arc<Cluster>, undo: Undo, expires: Instant) {
    let undo = Arc::new(undo);
    retry_in_background(expires, move || {
        let (cluster, undo) = (cluster.clone(), undo.clone());
        async move { undo.run(&cluster, Resend::Idempotent).await }
    });
}

/// `Ok` once lease `id` is gone, by this revoke or before it (expired, or revoked by a try
/// whose answer was lost): its keys are gone with it either way. Sent again as `resend` says.
async fn revoke(cluster: &Cluster, id: i64, resend: Resend) -> Result<()> {
    // Its kept keep-alive stream (if any) goes first: nothing keeps a revoked lease alive.
    cluster.keepers.forget(id);
    let config = &cluster.config;
    let limit = config.request_timeout();
    let sent = send(config, &cluster.client, limit, resend, |mut c| async move {
        c.lease_revoke(id).await
    })
    .await;
    match sent {
        Ok(_) => Ok(()),
        Err(Unanswered::Failed(e)) if lease_not_found(&e) => Ok(()),
        Err(e) => Err(mapped(e, config, limit)),
    }
}

/// Revokes lease `id` in the background, again after each failure that may pass (a revoke is
/// idempotent), until `expires`.
pub(crate) fn spawn_revoke(cluster: Arc<Cluster>, id: i64, expires: Instant) {
    retry_in_background(expires, move || {
        let cluster = cluster.clone();
        async move { revoke(&cluster, id, Resend::Idempotent).await }
    });
}

/// Undoes an acquisition on shared lease `lease` whose key's put may still be in flight: in
/// one transaction, the key is deleted if it is there, and otherwise its tombstone is put, which
/// the put requires absent. A lease that is gone needs no tombstone (a put on it cannot land):
/// then only the key is deleted, wherever it moved.
pub(crate) async fn undo_put(
    c: &Cluster,
    key: &str,
    tomb: &str,
    lease: i64,
    resend: Resend,
) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            tomb,
            "",
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::delete(key, None)]);
    let limit = c.config.request_timeout();
    let sent = send(&c.config, &c.client, limit, resend, |mut cl| {
        let txn = txn.clone();
        async move { cl.txn(txn).await }
    })
    .await;
    match sent {
        Ok(_) => Ok(()),
        Err(Unanswered::Failed(e)) if lease_not_found(&e) => c
            .call(|mut cl| async move { cl.delete(key, None).await })
            .await
            .map(|_| ()),
        Err(e) => Err(mapped(e, &c.config, limit)),
    }
}
