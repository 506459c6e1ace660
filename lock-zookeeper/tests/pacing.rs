//! How long a ZooKeeper grant and a confirmation vouch for: the session timeout on the
//! standalone server (`zk`), half of it on the ensemble (`zk-ens1`–`zk-ens3`), where a follower's read
//! alone cannot vouch for a session (RELIABILITY.md, "ZooKeeper ensemble: stale followers and a
//! stalled leader"). The driver tells the two apart by the servers' `/zookeeper/config`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, LockOptions};
use lock_zookeeper::{ZkConfig, ZkLock};
use test_support::serial;
use test_support::servers;

const SESSION: Duration = Duration::from_secs(2);

/// How far past the start of a grant, then of a renewal, the lease's `valid_until` reaches.
async fn vouched(hosts: &str) -> (Duration, Duration) {
    let lock = ZkLock::connect(ZkConfig::new(hosts).with_session_timeout(SESSION))
        .await
        .unwrap_or_else(|e| panic!("ZooKeeper at {hosts} (scripts/services.sh up): {e}"));
    assert_eq!(
        lock.session_timeout(),
        SESSION,
        "negotiated session timeout"
    );
    let name = fresh_name("zk-pace");
    let before = Instant::now();
    let lease = lock
        .acquire(&name, &LockOptions::new(SESSION))
        .await
        .unwrap();
    let granted = lease.valid_until().saturating_duration_since(before);
    let before = Instant::now();
    lease.renew().await.unwrap();
    let renewed = lease.valid_until().saturating_duration_since(before);
    lease.release().await.unwrap();
    (granted, renewed)
}

#[test]
fn a_standalone_server_vouches_for_the_session_an_ensemble_for_half() {
    serial(async {
        // `valid_until` is the start of the vouching request plus what it vouches for: at
        // least that past the call's start, and at most the call's own duration more.
        for (what, span) in ["grant", "renewal"]
            .into_iter()
            .zip(<[Duration; 2]>::from(vouched(&servers::url("{zk}")).await))
        {
            assert!(
                span >= SESSION * 9 / 10,
                "standalone server: a {what} vouched for {span:?}, not the session timeout \
                 {SESSION:?} less drift"
            );
        }
        let ensemble = &*servers::url("{zk-ens1},{zk-ens2},{zk-ens3}");
        for (what, span) in ["grant", "renewal"]
            .into_iter()
            .zip(<[Duration; 2]>::from(vouched(ensemble).await))
        {
            assert!(
                span >= SESSION * 4 / 10 && span < SESSION * 3 / 4,
                "ensemble: a {what} vouched for {span:?}, not half the session timeout \
                 {SESSION:?} less drift (plus the call's own time)"
            );
        }
    });
}
