//! What more than one of this crate's test binaries asks the server directly.
#![allow(dead_code)] // each test binary uses some of these

use std::time::{Duration, Instant};

use lock_etcd::etcd_client::Client;
use lock_etcd::EtcdLock;
use test_support::servers;

/// A lock on the single member of `scripts/services.sh` (`ETCD_URL`, default: its `etcd` server).
pub(crate) async fn single() -> EtcdLock {
    let url = std::env::var("ETCD_URL").unwrap_or_else(|_| servers::url("etcd://{etcd}"));
    EtcdLock::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("etcd (scripts/services.sh up etcd): {e}"))
}

/// The lease the key `key` is on (0: none), read through `client`.
pub(crate) async fn lease_of(client: &mut Client, key: &str) -> i64 {
    let got = client.get(key, None).await.expect("read the lock key");
    got.kvs().first().map_or(0, |kv| kv.lease())
}

/// Lease `id`'s remaining TTL in seconds as the server reports it (negative: gone).
pub(crate) async fn remaining(
    client: &mut Client,
    id: i64,
) -> Result<i64, lock_etcd::etcd_client::Error> {
    client.lease_time_to_live(id, None).await.map(|r| r.ttl())
}

/// Waits until lease `id` is gone (revoked), for 3 s at most; an error (an election under
/// way) is asked again.
pub(crate) async fn revoked(client: &mut Client, id: i64, why: &str) {
    let by = Instant::now() + Duration::from_secs(3);
    loop {
        let left = remaining(client, id).await;
        if matches!(left, Ok(t) if t < 0) {
            return;
        }
        assert!(
            Instant::now() < by,
            "lease {id:x} still lives 3 s after {why}: {left:?} s left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The renewals `held` made so far, summed.
pub(crate) fn renewals(held: &[Box<dyn lock_core::Lease>]) -> u64 {
    held.iter().map(|l| l.renewals().unwrap_or(0)).sum()
}

/// Every one of `held` is Held (`what`: why it should be).
pub(crate) fn all_held(held: &[Box<dyn lock_core::Lease>], what: &str) {
    for l in held {
        assert_eq!(l.state(), lock_core::LeaseState::Held, "{what}");
    }
}
