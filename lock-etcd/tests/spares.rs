//! Leases kept as spares between locks (`spares.rs`), against the single member of
//! `scripts/services.sh` (`ETCD_URL`, default port 12379): a lock taken on a spare is valid
//! for no longer than what is left of that lease.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, LockOptions};
use lock_etcd::EtcdLock;

/// Release, then take another name at once, five times: each grant after the first reuses the
/// released lease, confirmed so recently that no keep-alive is sent (the "fresh spare" path).
/// Its `valid_until` must stay within the call's start plus the TTL: that path once counted
/// the TTL twice (a `valid_until` about one TTL too late), which the safety checker found as
/// a holder believing for 3 s on a 2 s lease while others held the lock.
#[tokio::test]
async fn a_lock_on_a_fresh_spare_is_valid_for_no_longer_than_its_ttl() {
    let url = std::env::var("ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:12379".into());
    let locks = EtcdLock::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("etcd (scripts/services.sh up etcd): {e}"));
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
