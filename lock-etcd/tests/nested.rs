//! A lock's queue is the keys directly under `<prefix>/<name>/`, and nothing deeper: a client
//! whose prefix nests inside it (`/distlock/jobs` beside the lock `jobs` under `/distlock`)
//! puts its keys in that range too, and they belong to other locks. etcd's own recipe reads
//! the whole range, so there such locks block each other. Against the single member of
//! `scripts/services.sh` (`ETCD_URL`, default: its `etcd` server).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Lease, LockName, LockOptions};
use lock_etcd::etcd_client::TxnOp;
use lock_etcd::{EtcdConfig, EtcdLock};
use test_support::servers;

/// A client of the single member with key prefix `prefix`.
async fn with_prefix(prefix: &str) -> EtcdLock {
    let url = std::env::var("ETCD_URL").unwrap_or_else(|_| servers::url("etcd://{etcd}"));
    let config = EtcdConfig::from_url(&url)
        .unwrap()
        .with_prefix(prefix)
        .unwrap();
    EtcdLock::connect(config)
        .await
        .unwrap_or_else(|e| panic!("etcd (scripts/services.sh up etcd): {e}"))
}

/// `outer` locks `name` under `/<run>`; `inner` uses `/<run>/<name>` as its prefix, so its
/// keys of lock `z` are `/<run>/<name>/z/<lease>`, inside `name`'s range.
async fn nested() -> (EtcdLock, EtcdLock, LockName, LockName) {
    let name = fresh_name("outer");
    let prefix = format!("/{}", fresh_name("nest"));
    let outer = with_prefix(&prefix).await;
    let inner = with_prefix(&format!("{prefix}/{name}")).await;
    (outer, inner, name, LockName::new("z").unwrap())
}

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(10))
}

/// `name`, which must be free, taken by `locks`.
async fn taken(locks: &EtcdLock, name: &LockName) -> Box<dyn Lease> {
    let lease = locks.try_acquire(name, &opts()).await.unwrap();
    lease.unwrap_or_else(|| panic!("{name} is busy, though nobody else uses it"))
}

#[tokio::test]
async fn a_nested_prefix_s_holder_does_not_hold_the_outer_lock() {
    let (outer, inner, name, z) = nested().await;
    let deeper = taken(&inner, &z).await;

    let seen = outer.inspect(&name).await.unwrap();
    assert!(
        seen.is_none(),
        "inspect({name}) reports the holder of another lock whose key sits deeper in its \
         range: {seen:?}"
    );
    let lease = outer.try_acquire(&name, &opts()).await.unwrap();
    let lease = lease.unwrap_or_else(|| {
        panic!("try_acquire({name}) found it busy: only a lock of a nested prefix is held")
    });
    // Its own key is found for a guarded write, not the nested one.
    let data = format!("/distlock-guarded-data/{name}");
    outer
        .guarded_txn(&*lease, [TxnOp::put(data.as_str(), "outer", None)])
        .await
        .expect("the holder's guarded write");
    lease.release().await.unwrap();
    deeper.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_is_not_queued_behind_a_nested_prefix_s_key() {
    let (outer, inner, name, z) = nested().await;
    let first = taken(&outer, &name).await;
    // Created between the holder's key and the waiter's: the waiter's predecessor by revision.
    let deeper = taken(&inner, &z).await;

    let waiter = {
        let (outer, name) = (outer.clone(), name.clone());
        tokio::spawn(async move { outer.acquire(&name, &opts()).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    first.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(3), waiter).await;
    let lease = match granted {
        Ok(joined) => joined.unwrap().expect("the waiter's grant"),
        Err(_) => panic!(
            "waiter on {name} not granted within 3 s of the holder's release at {released:?}: \
             it waits for the nested prefix's lock z, which is still held"
        ),
    };
    lease.release().await.unwrap();
    deeper.release().await.unwrap();
}
