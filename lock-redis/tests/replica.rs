//! A Redis replica is refused as a lock server, at connect: a read-only one refuses every
//! grant (each acquisition would fail as if the server were down), and a writable one
//! (`replica-read-only no`) takes locks that its next sync with its master erases, so the
//! lock could be granted twice. The servers are the test's own (`test_support::redis_replica`).
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
