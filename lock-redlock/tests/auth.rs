//! Credentials in a `redlock://` URL reach the masters: the password- and ACL-protected
//! `redis-auth` server of `scripts/services.sh` (port 16390) as a one-master Redlock. Right
//! credentials lock; wrong ones are an `Unauthenticated` error; the password shows nowhere.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, LockOptions};
use lock_redlock::RedlockLock;

#[tokio::test]
async fn url_credentials_authenticate_every_master() {
    for url in [
        "redlock://locker:locker-pw@127.0.0.1:16390",
        "redlock://:distlock-test-pw@127.0.0.1:16390",
    ] {
        let lock = RedlockLock::from_url(url)
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
        let shown = format!("{lock:?} {}", lock.config());
        assert!(!shown.contains("-pw"), "password in {shown}");
    }
}

#[tokio::test]
async fn wrong_credentials_are_unauthenticated_without_the_password() {
    let Err(e) = RedlockLock::from_url("redlock://locker:WRONG-secret-9@127.0.0.1:16390").await
    else {
        panic!("wrong password accepted");
    };
    assert!(matches!(e, Error::Unauthenticated { .. }), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("WRONG-secret-9"), "{e}");
}

/// Masters over TLS: the TLS-only `redis-tls` server (16392) as a one-master Redlock.
#[cfg(feature = "tls")]
#[tokio::test]
async fn masters_over_tls_with_a_private_ca() {
    let url = format!(
        "redlock://127.0.0.1:16392?tls=true&tls_ca_file={}",
        test_support::test_ca("redis-tls")
    );
    let lock = RedlockLock::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("connect over TLS (scripts/services.sh up redis-tls): {e}"));
    let lease = lock
        .try_acquire(
            &fresh_name("tls"),
            &LockOptions::new(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .expect("free");
    lease.release().await.unwrap();
    // Without the CA, the test certificate is not trusted: no master answers.
    let r = RedlockLock::from_url("redlock://127.0.0.1:16392?tls=true").await;
    assert!(r.is_err(), "an untrusted certificate was accepted");
}
