//! `EtcdLock::guarded_txn`: writes that etcd applies only while the lease still holds its lock,
//! against the single member of `scripts/services.sh` (`ETCD_URL`, default: its `etcd` server).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, LockOptions};
use lock_etcd::etcd_client::{DeleteOptions, TxnOp};
use lock_etcd::EtcdLock;

mod common;
use common::single;

async fn read(locks: &EtcdLock, key: &str) -> Option<String> {
    let resp = locks.client().get(key, None).await.unwrap();
    resp.kvs()
        .first()
        .map(|kv| kv.value_str().unwrap().to_string())
}

#[tokio::test]
async fn writes_while_held_and_never_after() {
    let (a, b) = (single().await, single().await);
    let name = fresh_name("guarded");
    let data = format!("/distlock-guarded-data/{name}");
    let opts = LockOptions::new(Duration::from_secs(10));
    let lease = a.try_acquire(&name, &opts).await.unwrap().expect("free");
    a.guarded_txn(&*lease, [TxnOp::put(data.as_str(), "from-a", None)])
        .await
        .expect("a holder's guarded write");
    assert_eq!(read(&a, &data).await.as_deref(), Some("from-a"));

    // An operator deletes the lock behind A's back; B takes it and writes.
    let dir = format!("{}/{name}/", a.config().prefix());
    a.client()
        .delete(dir, Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    let successor = b
        .try_acquire(&name, &opts)
        .await
        .unwrap()
        .expect("free again");
    b.guarded_txn(&*successor, [TxnOp::put(data.as_str(), "from-b", None)])
        .await
        .expect("the successor's guarded write");

    // A still has its lease object, but not the lock: its write must not land.
    let r = a
        .guarded_txn(&*lease, [TxnOp::put(data.as_str(), "stale-a", None)])
        .await;
    assert!(matches!(r, Err(Error::NotHeld { .. })), "{r:?}");
    assert_eq!(read(&a, &data).await.as_deref(), Some("from-b"));

    // Released: the successor's lease object can no longer write either.
    let token = successor.fencing_token();
    let held_name = successor.name().clone();
    successor.release().await.unwrap();
    let gone = b
        .try_acquire(&held_name, &opts)
        .await
        .unwrap()
        .expect("free");
    assert_ne!(gone.fencing_token(), token);
    gone.release().await.unwrap();
    a.client().delete(data.as_str(), None).await.unwrap();
}

#[tokio::test]
async fn a_released_lease_cannot_write() {
    let a = single().await;
    let name = fresh_name("guarded-released");
    let data = format!("/distlock-guarded-data/{name}");
    let lease = a
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free");
    // Keep a second view of the same grant: a lease with the same name and token.
    let shadow = ShadowLease {
        name: lease.name().clone(),
        token: lease.fencing_token(),
        key: lease.backend_key(),
    };
    lease.release().await.unwrap();
    let r = a
        .guarded_txn(&shadow, [TxnOp::put(data.as_str(), "late", None)])
        .await;
    assert!(matches!(r, Err(Error::NotHeld { .. })), "{r:?}");
    assert_eq!(read(&a, &data).await, None, "a write after release landed");
    let none = ShadowLease {
        name: name.clone(),
        token: None,
        key: None,
    };
    let r = a
        .guarded_txn(&none, [TxnOp::put(data.as_str(), "x", None)])
        .await;
    assert!(matches!(r, Err(Error::Unsupported { .. })), "{r:?}");
}

/// A lease of another backend whose token happens to equal the `create_revision` of the etcd
/// key that holds the same name now (another client's grant) is refused: before, the look-up
/// by name and revision found that key and the write went through as if the lease held it.
#[tokio::test]
async fn a_lease_this_driver_did_not_grant_is_refused() {
    let (a, b) = (single().await, single().await);
    let name = fresh_name("guarded-foreign");
    let data = format!("/distlock-guarded-data/{name}");
    let held = b
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free");
    // Another backend's lease of the same name, with the same number as its token.
    let foreign = lock_core::memory::MemoryLock::new()
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free");
    let forged = ShadowLease {
        name: name.clone(),
        token: held.fencing_token(),
        key: foreign.backend_key(),
    };
    let r = a
        .guarded_txn(&forged, [TxnOp::put(data.as_str(), "foreign", None)])
        .await;
    assert!(matches!(r, Err(Error::Unsupported { .. })), "{r:?}");
    assert_eq!(
        read(&a, &data).await,
        None,
        "a foreign lease's write landed"
    );
    // The same with a key of this driver's form, but another lease's.
    let other = ShadowLease {
        name: name.clone(),
        token: held.fencing_token(),
        key: held.backend_key().map(|k| format!("{k}0")),
    };
    let r = a
        .guarded_txn(&other, [TxnOp::put(data.as_str(), "other", None)])
        .await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(read(&a, &data).await, None, "another lease's write landed");
    held.release().await.unwrap();
}

/// What `guarded_txn` reads of a lease: its name, token and backend key (the rest is never
/// called).
#[derive(Debug)]
struct ShadowLease {
    name: lock_core::LockName,
    token: Option<lock_core::FencingToken>,
    key: Option<String>,
}

#[lock_core::async_trait]
impl lock_core::Lease for ShadowLease {
    fn name(&self) -> &lock_core::LockName {
        &self.name
    }
    fn fencing_token(&self) -> Option<lock_core::FencingToken> {
        self.token
    }
    fn ttl(&self) -> Duration {
        Duration::ZERO
    }
    fn valid_until(&self) -> std::time::Instant {
        std::time::Instant::now()
    }
    fn state(&self) -> lock_core::LeaseState {
        lock_core::LeaseState::Lost
    }
    fn lost(&self) -> lock_core::LostSignal {
        lock_core::driver::LeaseTracker::new(std::time::Instant::now()).signal()
    }
    async fn renew(&self) -> lock_core::Result<()> {
        Err(Error::not_held(&self.name))
    }
    async fn release(self: Box<Self>) -> lock_core::Result<()> {
        Ok(())
    }
    fn abandon(self: Box<Self>) {}
    fn backend_key(&self) -> Option<String> {
        self.key.clone()
    }
}
