//! Digest authentication against the auth-enforcing ZooKeeper of `scripts/services.sh`
//! (`zk-auth`): lock nodes carry ACLs another user cannot delete. (Credentials
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
        .unwrap_or_else(|| test_support::servers::port("zk-auth"))
}

fn url(userinfo: &str) -> String {
    format!(
        "zk://{userinfo}127.0.0.1:{}?session_timeout_ms=4000&base=/distlock-auth",
        port()
    )
}

#[tokio::test]
async fn other_users_cannot_delete_the_lock() {
    // The account of scripts/servers.tsv, which the conformance suite's security cases use
    // too: a digest identity owns the base node it creates, so one account for both.
    let account = test_support::servers::server("zk-auth");
    let (user, password) = account.user.zip(account.password).unwrap();
    let owner = ZkLock::from_url(&url(&format!("{user}:{password}@")))
        .await
        .unwrap();
    let shown = owner.config().to_string();
    assert!(!shown.contains(password), "password in {shown}");
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
