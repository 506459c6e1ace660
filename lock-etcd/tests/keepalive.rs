//! Keep-alive streams kept per lease (`keepers.rs`), against the single member of
//! `scripts/services.sh` (`ETCD_URL`, default: its `etcd` server): a lease's renewals reuse one
//! gRPC stream instead of opening one each (opened and dropped at every renewal, a few
//! thousand held locks made the client's HTTP/2 layer close its connection), and a lease
//! revoked behind its holder's back still turns Lost.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, LeaseState, LockOptions};
use test_support::etcd_calls_started;

mod common;
use common::{all_held, lease_of, renewals, single};

async fn keep_alive_streams(locks: &lock_etcd::EtcdLock) -> u64 {
    etcd_calls_started(locks.config().endpoints(), "LeaseKeepAlive")
        .await
        .expect("the member's /metrics")
}

/// Three leases renewed by their watchdogs for 4 s (about six renewals each): their
/// keep-alives open one stream per lease, not one per renewal.
/// (Serial: the member counts every client's streams.)
#[test]
fn renewals_reuse_one_keep_alive_stream_per_lease() {
    test_support::serial(renewals_reuse_one_stream());
}

async fn renewals_reuse_one_stream() {
    let locks = single().await;
    let opts = LockOptions::new(Duration::from_secs(2)).auto_renew(None);
    let mut held = Vec::new();
    for i in 0..3 {
        let name = fresh_name(&format!("kept-{i}"));
        held.push(
            locks
                .try_acquire(&name, &opts)
                .await
                .unwrap()
                .expect("free"),
        );
    }
    let before = keep_alive_streams(&locks).await;
    let renewed = renewals(&held);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let opened = keep_alive_streams(&locks).await - before;
    let renewed = renewals(&held) - renewed;
    all_held(&held, "every lease renewed");
    assert!(
        renewed >= 12,
        "{renewed} renewals of 3 leases in 4 s at a 2 s TTL (every 2/3 s: about 18)"
    );
    assert!(
        opened <= 3,
        "{opened} keep-alive streams opened for {renewed} renewals of 3 leases: a stream per \
         renewal, not one kept per lease"
    );
    for l in held {
        l.release().await.unwrap();
    }
}

/// A lease revoked behind its holder's back, after renewals that went on its kept stream: the
/// holder's lease turns Lost within its TTL and the slack (the next keep-alive hears the lease
/// is gone; were it heard as alive, the read after it finds the key gone).
#[test]
fn a_revoked_lease_renewed_on_a_kept_stream_turns_lost() {
    test_support::serial(kept_stream_hears_gone());
}

async fn kept_stream_hears_gone() {
    let locks = single().await;
    let mut admin = locks.client();
    let ttl = Duration::from_secs(2);
    let opts = LockOptions::new(ttl).auto_renew(None);
    let name = fresh_name("kept-gone");
    let lease = locks
        .try_acquire(&name, &opts)
        .await
        .unwrap()
        .expect("free");
    let lost = lease.lost();
    // Past two renewals: the kept stream is the one the next keep-alive uses.
    let by = Instant::now() + Duration::from_secs(5);
    while lease.renewals().unwrap_or(0) < 2 {
        assert!(Instant::now() < by, "two renewals within 5 s at a 2 s TTL");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = lease.backend_key().expect("an etcd lease has a key");
    let id = lease_of(&mut admin, &key).await;
    assert_ne!(id, 0, "the key is on a lease");
    admin.lease_revoke(id).await.expect("revoke the lease");
    let revoked = Instant::now();
    tokio::time::timeout(ttl + Duration::from_millis(1500), lost)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the lease was revoked {:?} ago and its holder still reads {:?}: a renewal on \
                 the kept stream kept a revoked lease Held",
                revoked.elapsed(),
                lease.state()
            )
        });
    assert!(
        !matches!(lease.state(), LeaseState::Held),
        "Lost fired, state {:?}",
        lease.state()
    );
}
