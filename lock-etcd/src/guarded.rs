//! `guarded_txn`: a write that etcd applies only while a lease still holds its lock.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lock_core::{Error, Lease, LockName, Result};

use crate::client::{txn_call, Cluster};
use crate::config::BACKEND;
use crate::layout::{contender, dir};

/// [`EtcdLock::guarded_txn`](crate::EtcdLock::guarded_txn) on `cluster`.
pub(crate) async fn guarded_txn(
    cluster: &Cluster,
    lease: &dyn Lease,
    ops: impl IntoIterator<Item = TxnOp>,
) -> Result<etcd_client::TxnResponse> {
    let rev = lease
        .fencing_token()
        .and_then(|t| i64::try_from(t.get()).ok())
        .ok_or(Error::Unsupported {
            backend: BACKEND,
            operation: "a guarded transaction for a lease without an etcd fencing token",
        })?;
    // The lock key of this grant, as the lease itself reports it: a lease of another
    // backend (or of another prefix) is refused, whatever its token — the key under this
    // name created at that revision would be some other client's grant.
    let key = lease
        .backend_key()
        .filter(|k| contender(&dir(&cluster.config, lease.name()), k.as_bytes()))
        .ok_or(Error::Unsupported {
            backend: BACKEND,
            operation: "a guarded transaction for a lease this etcd driver did not grant",
        })?;
    txn_if_owner(
        cluster,
        key.into_bytes(),
        rev,
        ops.into_iter().collect(),
        lease.name(),
    )
    .await
}

/// `ops` if `key` still has `create_revision == rev`, else `NotHeld`: the check that makes
/// [`guarded_txn`] safe even when the lock is lost after its key was
/// looked up.
pub(crate) async fn txn_if_owner(
    cluster: &Cluster,
    key: Vec<u8>,
    rev: i64,
    ops: Vec<TxnOp>,
    name: &LockName,
) -> Result<etcd_client::TxnResponse> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, rev)])
        .and_then(ops);
    let resp = txn_call(&cluster.config, &cluster.client, txn).await?;
    if resp.succeeded() {
        Ok(resp)
    } else {
        Err(Error::NotHeld { name: name.clone() })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::EtcdLock;
    use etcd_client::GetOptions;
    use lock_core::{DistributedLock, LockOptions};
    use std::time::Duration;

    /// The lock is lost after the lease last looked (its key deleted, as at lease expiry) and
    /// before the transaction: the transaction's own compare must refuse the write (against the single etcd member of
    /// `scripts/services.sh`).
    #[tokio::test]
    pub(crate) async fn guarded_write_refused_when_lost_after_the_lookup() {
        let url = std::env::var("ETCD_URL")
            .unwrap_or_else(|_| test_support::servers::url("etcd://{etcd}"));
        let locks = EtcdLock::from_url(&url)
            .await
            .expect("etcd (scripts/services.sh up etcd)");
        let name = LockName::new(format!(
            "guarded-race-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ))
        .unwrap();
        let lease = locks
            .try_acquire(&name, &LockOptions::new(Duration::from_secs(10)))
            .await
            .unwrap()
            .expect("free");
        let rev = i64::try_from(lease.fencing_token().unwrap().get()).unwrap();
        let found = locks
            .client()
            .get(
                dir(locks.config(), &name),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        let key = found.kvs()[0].key().to_vec();
        // Lost right after the look-up: the key is deleted (as at lease expiry).
        locks.client().delete(key.clone(), None).await.unwrap();
        let data = format!("/distlock-guarded-data/{name}");
        let r = txn_if_owner(
            &locks.inner.cluster,
            key,
            rev,
            vec![TxnOp::put(data.as_str(), "late", None)],
            &name,
        )
        .await;
        assert!(matches!(r, Err(Error::NotHeld { .. })), "{r:?}");
        let written = locks.client().get(data.as_str(), None).await.unwrap();
        assert!(written.kvs().is_empty(), "a write after the loss landed");
        lease.abandon();
    }
}
