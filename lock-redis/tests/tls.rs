//! `rediss://` against the TLS-only `redis-tls` server of `scripts/services.sh` (port 16392,
//! certificate from a test CA the script makes: `$DISTLOCK_SERVICES_DIR/redis-tls/ca.crt`).
//! Needs the `tls` feature: `cargo test -p lock-redis --features tls --test tls`.
#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, LockOptions};
use lock_redis::{RedisConfig, RedisLock};

const PORT: u16 = 16392;

fn ca_file() -> String {
    test_support::test_ca("redis-tls")
}

#[tokio::test]
async fn trusted_ca_from_the_url_locks_over_tls() {
    let url = format!("rediss://127.0.0.1:{PORT}?tls_ca_file={}", ca_file());
    let lock = RedisLock::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("connect over TLS (scripts/services.sh up redis-tls): {e}"));
    assert!(lock.config().is_tls());
    let name = fresh_name("tls");
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease = lock.try_acquire(&name, &opts).await.unwrap().expect("free");
    assert!(lease.fencing_token().is_some());
    assert!(lock.try_acquire(&name, &opts).await.unwrap().is_none());
    lease.release().await.unwrap();
    lock.try_acquire(&name, &opts)
        .await
        .unwrap()
        .expect("free after release")
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn ca_given_as_pem_works_too() {
    let pem = std::fs::read(ca_file()).expect("the test CA (scripts/services.sh up redis-tls)");
    let config = RedisConfig::new("127.0.0.1", PORT).with_tls_ca_pem(pem);
    let lock = RedisLock::connect(config).await.unwrap();
    let lease = lock
        .try_acquire(
            &fresh_name("tls-pem"),
            &LockOptions::new(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .expect("free");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn an_untrusted_certificate_is_an_error_not_a_panic() {
    // The test CA is not a public root: the handshake must fail, and say so.
    let r = RedisLock::from_url(&format!("rediss://127.0.0.1:{PORT}")).await;
    let Err(e) = r else {
        panic!("a certificate from an unknown CA was accepted");
    };
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Config { .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_missing_ca_file_is_a_config_error() {
    let r = RedisLock::from_url(&format!(
        "rediss://127.0.0.1:{PORT}?tls_ca_file=/nonexistent/distlock-ca.pem"
    ))
    .await;
    assert!(
        matches!(r, Err(Error::Config { .. })),
        "{:?}",
        r.map(|_| ())
    );
}

#[test]
fn tls_ca_file_needs_rediss() {
    let e = RedisConfig::from_url("redis://127.0.0.1:1?tls_ca_file=/x").unwrap_err();
    assert!(matches!(e, Error::Config { .. }), "{e:?}");
}
