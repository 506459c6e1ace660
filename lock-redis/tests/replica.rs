//! A Redis replica is refused as a lock server, at connect: a read-only one refuses every
//! grant (each acquisition would fail as if the server were down), and a writable one
//! (`replica-read-only no`) takes locks that its next sync with its master erases, so the
//! lock could be granted twice. So is a server in cluster mode. The servers are the test's own
//! (`test_support::redis_replica`, `ClockedServer::redis_cluster_node`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use lock_core::Error;
use lock_redis::RedisLock;

#[tokio::test]
async fn a_replica_is_refused_at_connect() {
    for writable in [false, true] {
        let replica = test_support::redis_replica(writable).await.unwrap();
        let url = format!("redis://{}", replica.addr());
        match RedisLock::from_url(&url).await {
            Err(Error::Config { message, .. }) => {
                assert!(
                    message.contains("replica"),
                    "writable {writable}: {message}"
                );
            }
            other => panic!("a replica (writable {writable}) was not refused: {other:?}"),
        }
    }
}

/// A server in cluster mode is refused at connect, as a configuration error that says so:
/// the driver speaks to one server, while a cluster keeps each lock's slot on one of its
/// nodes (the others answer `MOVED`) and moves slots between nodes. Without the check, this
/// node (which serves no slot) gave `CLUSTERDOWN` to every acquisition, a retryable
/// "unavailable" error that no retry cures. Once the node serves every slot (a single-node
/// cluster, on which locks would work), it is still refused, as the crate docs say: a check
/// that only caught a failing cluster would pass the first half.
#[tokio::test]
async fn a_cluster_node_is_refused_at_connect() {
    let node = test_support::clock::ClockedServer::redis_cluster_node()
        .await
        .unwrap();
    let url = format!("redis://{}", node.addr());
    assert_cluster_refused(&url, "serving no slot").await;
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("CLUSTER")
        .arg(&["ADDSLOTSRANGE", "0", "16383"])
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut admin)
            .await
            .unwrap();
        if info.contains("cluster_state:ok") {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the node never served its slots: {info}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_cluster_refused(&url, "serving every slot").await;
}

async fn assert_cluster_refused(url: &str, how: &str) {
    match RedisLock::from_url(url).await {
        Err(Error::Config { message, .. }) => {
            assert!(message.contains("cluster mode"), "{how}: {message}");
        }
        Ok(lock) => {
            let name = lock_core::LockName::new("cluster-probe").unwrap();
            let opts = lock_core::LockOptions::new(std::time::Duration::from_secs(2));
            let tried = lock_core::DistributedLock::try_acquire(&lock, &name, &opts).await;
            panic!(
                "a cluster node {how} was accepted at connect; an acquisition then gave {tried:?}"
            )
        }
        Err(other) => panic!("a cluster node {how} was refused with a non-config error: {other:?}"),
    }
}
