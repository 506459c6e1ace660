//! Granting a lease and learning its term, and moving a lock key onto a lease of the current
//! term after a leader change (why: `term.rs`); the same for the leases locks share
//! (`shared.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lock_core::driver::lease_end;
use lock_core::Result;

use crate::client::{txn_on_lease, Cluster};
use crate::revoke::{spawn_revoke, RevokeGuard};
use crate::term::{Granted, Tenure};

/// Grants a lease of at least `ttl` (whole seconds, at least one). Its term is the grant's
/// when that is the term this client saw last before sending it: the grant was then
/// applied in that term (a grant's header may report a later term than its entry's).
pub(crate) async fn grant(c: &Cluster, ttl: Duration) -> Result<Granted> {
    let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
    let before = c.term.load(Ordering::Relaxed);
    let start = Instant::now();
    let grant = c
        .call(|mut c| async move { c.lease_grant(secs, None).await })
        .await?;
    let term = c.observe(grant.header());
    let ttl = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(0)).max(ttl);
    Ok(Granted {
        ttl,
        tenure: Tenure {
            id: grant.id(),
            term: if term == before { term } else { 0 },
            valid_until: lease_end(start, ttl),
        },
    })
}

/// Moves `key` (the incarnation created at `rev`) from lease `from` onto a lease granted
/// now, and revokes `from`. `None` when the key is gone or no longer on `from`. A failed
/// or cancelled move revokes the new lease (a key moved onto it goes too: the lock is
/// lost, never held on a lease nobody keeps alive).
pub(crate) async fn rehome(
    c: &Arc<Cluster>,
    key: &str,
    rev: i64,
    from: i64,
    ttl: Duration,
) -> Result<Option<Tenure>> {
    if c.config.shared_lease() {
        return rehome_shared(c, key, rev, from, ttl).await;
    }
    let granted = grant(c, ttl).await?;
    let mut guard = RevokeGuard::new(c, granted.tenure.id, granted.ttl);
    let Some(tenure) = move_onto(c, key, rev, from, granted.tenure).await? else {
        return Ok(None);
    };
    guard.disarm();
    spawn_revoke(c.clone(), from, tenure.valid_until);
    Ok(Some(tenure))
}

/// Moves `key` (created at `rev`) from lease `from` onto lease `to`, in one transaction that
/// checks it is still that key on `from`: `to` as it now stands (its term 0 if yet another
/// leader answered: valid for what `to` vouches for, and moved again at the next renewal), or
/// `None` when the key is gone or no longer on `from`.
async fn move_onto(
    c: &Cluster,
    key: &str,
    rev: i64,
    from: i64,
    mut to: Tenure,
) -> Result<Option<Tenure>> {
    let txn = Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, rev),
            Compare::lease(key, CompareOp::Equal, from),
        ])
        // The value stays: a leader's proclaimed value moves with its key.
        .and_then([TxnOp::put(
            key,
            "",
            Some(PutOptions::new().with_lease(to.id).with_ignore_value()),
        )]);
    let resp = txn_on_lease(&c.config, &c.client, txn, to.id).await?;
    let term = c.observe(resp.header());
    if !resp.succeeded() {
        return Ok(None);
    }
    if term != to.term {
        to.term = 0;
    }
    tracing::debug!(
        key,
        from,
        to = to.id,
        term,
        "lock key moved to a lease of the new term"
    );
    Ok(Some(to))
}

/// The lease the client's locks of `ttl` share now (`shared.rs`): the current one when it
/// belongs to the newest term this client has seen and has not expired; else one granted now,
/// once for every caller waiting here.
pub(crate) async fn shared_lease(c: &Cluster, ttl: Duration) -> Result<(Tenure, Duration)> {
    let _granting = c.shared.granting().await;
    if let Some(usable) = c.shared.usable(ttl, c.term.load(Ordering::Relaxed)) {
        return Ok(usable);
    }
    let granted = grant(c, ttl).await?;
    Ok(c.shared.install(ttl, &granted))
}

/// Moves `key` (created at `rev`) from lease `from` onto the client's shared lease of the
/// current term, which is not `from` after a leader change; `from` stays (other keys may be on
/// it) and expires once nothing keeps it alive. `None` when the key is gone or no longer on
/// `from`.
async fn rehome_shared(
    c: &Arc<Cluster>,
    key: &str,
    rev: i64,
    from: i64,
    ttl: Duration,
) -> Result<Option<Tenure>> {
    let (tenure, _) = shared_lease(c, ttl).await?;
    if tenure.id == from {
        return Ok(Some(tenure));
    }
    let moved = move_onto(c, key, rev, from, tenure).await;
    if moved.is_err() {
        c.shared.forget(tenure.id); // doubtful now: the next lock gets another
    }
    moved
}
