//! Digest authentication against the auth-enforcing ZooKeeper of `scripts/services.sh`
//! (`zk-auth`, port 12191): lock nodes carry ACLs another user cannot delete. (Credentials
//! that work, a client without any, and passwords in errors are the conformance suite's
//! `security` cases.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, LockOptions};
use lock_zookeeper::ZkLock;

fn port() -> u16 {
    std::env::var("ZK_AUTH_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(12191)
}

fn url(userinfo: &str) -> String {
    format!(
        "zk://{userinfo}127.0.0.1:{}?session_timeout_ms=4000&base=/distlock-auth",
        port()
    )
}

#[tokio::test]
async fn other_users_cannot_delete_the_lock() {
    let owner = ZkLock::from_url(&url("locker:locker-secret-pw@"))
        .await
        .unwrap();
    let shown = owner.config().to_string();
    assert!(!shown.contains("locker-secret-pw"), "password in {shown}");
    let name = fresh_name("zk-auth");
    let lease = owner
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(4)))
        .await
        .unwrap()
        .expect("free");
    let parent = format!("/distlock-auth/{name}");
    let node = owner
        .client()
        .list_children(&parent)
        .await
        .unwrap()
        .pop()
        .unwrap();

    // Another authenticated user may not delete the holder's node.
    let intruder = zookeeper_client::Client::connector()
        .with_auth("digest", b"intruder:other-pw")
        .connect(&format!("127.0.0.1:{}", port()))
        .await
        .unwrap();
    let r = intruder.delete(&format!("{parent}/{node}"), None).await;
    assert!(
        matches!(r, Err(zookeeper_client::Error::NoAuth)),
        "another user deleted the lock node: {r:?}"
    );
    lease.release().await.unwrap();
}
