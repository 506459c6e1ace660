//! Authentication against the password- and ACL-protected `redis-auth` server of
//! `scripts/services.sh` (port 16390): right credentials work, wrong ones give a clear
//! `Unauthenticated` error, and no password ever shows in `Debug`, `Display` or error text.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, LockOptions};
use lock_redis::{RedisConfig, RedisLock};

fn port() -> u16 {
    std::env::var("REDIS_AUTH_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(16390)
}

async fn works(url: &str) {
    let lock = RedisLock::from_url(url)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let lease = lock
        .try_acquire(
            &fresh_name("auth"),
            &LockOptions::new(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .expect("free");
    lease.release().await.unwrap();
    for text in [
        format!("{lock:?}"),
        format!("{:?}", lock.config()),
        lock.config().to_string(),
    ] {
        assert!(!text.contains("-pw"), "password in {text}");
    }
}

#[tokio::test]
async fn acl_user_with_the_right_password_can_lock() {
    works(&format!("redis://locker:locker-pw@127.0.0.1:{}", port())).await;
}

#[tokio::test]
async fn requirepass_default_user_can_lock() {
    works(&format!("redis://:distlock-test-pw@127.0.0.1:{}", port())).await;
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_unauthenticated_without_the_password() {
    for (url, secret) in [
        (
            format!("redis://locker:WRONG-secret-1@127.0.0.1:{}", port()),
            Some("WRONG-secret-1"),
        ),
        (
            format!("redis://:WRONG-secret-2@127.0.0.1:{}", port()),
            Some("WRONG-secret-2"),
        ),
        (
            format!("redis://nobody:WRONG-secret-3@127.0.0.1:{}", port()),
            Some("WRONG-secret-3"),
        ),
        (format!("redis://127.0.0.1:{}", port()), None),
    ] {
        let err = RedisLock::from_url(&url)
            .await
            .expect_err("must be refused");
        let text = format!("{err} {err:?}");
        assert!(
            matches!(err, Error::Unauthenticated { .. }),
            "{url}: expected Unauthenticated, got {err:?}"
        );
        if let Some(s) = secret {
            assert!(!text.contains(s), "password leaked: {text}");
        }
    }
}

#[tokio::test]
async fn unreachable_server_error_names_the_server_but_not_the_password() {
    // Port 1 on loopback: nothing listens there.
    let cfg = RedisConfig::from_url("redis://locker:very-secret-pw@127.0.0.1:1")
        .unwrap()
        .with_connect_timeout(Duration::from_millis(300));
    let err = RedisLock::connect(cfg)
        .await
        .expect_err("nothing listens on port 1");
    let text = format!("{err} {err:?}");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!(
        text.contains("127.0.0.1:1"),
        "error does not name the server: {text}"
    );
    assert!(!text.contains("very-secret-pw"), "password leaked: {text}");
}
