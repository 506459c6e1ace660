//! Leases kept as spares between locks (`spares.rs`), against the single member of
//! `scripts/services.sh` (`ETCD_URL`, default: its `etcd` server): a lock taken on a spare is valid
//! for no longer than what is left of that lease, and a released lease the pool does not keep
//! is revoked.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, LockOptions};

mod common;
use common::{lease_of, remaining, revoked, single};

/// Release, then take another name at once, five times: each grant after the first reuses the
/// released lease, confirmed so recently that no keep-alive is sent (the "fresh spare" path).
/// Its `valid_until` must stay within the call's start plus the TTL: that path once counted
/// the TTL twice (a `valid_until` about one TTL too late), which the safety checker found as
/// a holder believing for 3 s on a 2 s lease while others held the lock.
#[tokio::test]
async fn a_lock_on_a_fresh_spare_is_valid_for_no_longer_than_its_ttl() {
    let locks = single().await;
    let ttl = Duration::from_secs(4);
    let opts = LockOptions::new(ttl);
    for round in 0..5 {
        let name = fresh_name(&format!("spare-{round}"));
        let before = Instant::now();
        let lease = locks
            .try_acquire(&name, &opts)
            .await
            .unwrap()
            .expect("free");
        let limit = before + lease.ttl() + Duration::from_millis(2);
        assert!(
            lease.valid_until() <= limit,
            "round {round}: valid_until is {:?} past the call's start + TTL {:?}",
            lease.valid_until().saturating_duration_since(limit),
            lease.ttl()
        );
        lease.release().await.unwrap();
    }
}

/// A released lease that is not kept as a spare is revoked at once, not left to live out its
/// TTL: the release that finds the pool full (it keeps 64), and a release that finds its key
/// gone (`NotHeld`: an operator deleted it). The leases the pool does keep stay alive.
#[tokio::test]
async fn a_released_lease_not_kept_as_a_spare_is_revoked() {
    let locks = single().await;
    let mut admin = locks.client();
    let opts = LockOptions::new(Duration::from_secs(30));
    // Held at once, so each is granted on a lease of its own.
    let mut held = Vec::new();
    for i in 0..65 {
        let name = fresh_name(&format!("pool-{i}"));
        let lease = locks
            .try_acquire(&name, &opts)
            .await
            .unwrap()
            .expect("free");
        let id = lease_of(&mut admin, &lease.backend_key().expect("a key")).await;
        held.push((lease, id));
    }
    let ids: Vec<i64> = held.iter().map(|(_, id)| *id).collect();
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(
        distinct.len(),
        65,
        "65 locks held at once share leases: {ids:x?}"
    );
    for (lease, _) in held {
        lease.release().await.unwrap();
    }
    revoked(&mut admin, ids[64], "the 65th release, with 64 spares kept").await;
    for &id in &ids[..64] {
        let left = remaining(&mut admin, id).await.unwrap();
        assert!(
            left > 0,
            "spare lease {id:x} is gone ({left}) after its lock's release"
        );
    }

    let name = fresh_name("pool-broken");
    let lease = locks
        .try_acquire(&name, &opts)
        .await
        .unwrap()
        .expect("free");
    let key = lease.backend_key().expect("a key");
    let id = lease_of(&mut admin, &key).await;
    admin.delete(key.as_str(), None).await.unwrap();
    let released = lease.release().await;
    assert!(
        matches!(released, Err(Error::NotHeld { .. })),
        "release of a lock whose key an operator deleted: {released:?}"
    );
    revoked(&mut admin, id, "a release that found its key gone").await;
}
