//! Granting a lease and learning its term, and moving a lock key onto a lease of the current
//! term after a leader change (why: `term.rs`).

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
    let granted = grant(c, ttl).await?;
    let mut tenure = granted.tenure;
    let mut guard = RevokeGuard::new(c, tenure.id, granted.ttl);
    let txn = Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, rev),
            Compare::lease(key, CompareOp::Equal, from),
        ])
        // The value stays: a leader's proclaimed value moves with its key.
        .and_then([TxnOp::put(
            key,
            "",
            Some(PutOptions::new().with_lease(tenure.id).with_ignore_value()),
        )]);
    let resp = txn_on_lease(&c.config, &c.client, txn, tenure.id).await?;
    let term = c.observe(resp.header());
    if !resp.succeeded() {
        return Ok(None);
    }
    guard.disarm();
    spawn_revoke(c.clone(), from, tenure.valid_until);
    if term != tenure.term {
        // Yet another leader meanwhile: valid for what the grant vouches for, and moved
        // again at the next renewal.
        tenure.term = 0;
    }
    tracing::debug!(
        key,
        from,
        to = tenure.id,
        term,
        "lock key moved to a lease of the new term"
    );
    Ok(Some(tenure))
}
