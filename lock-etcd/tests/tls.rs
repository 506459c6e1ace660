//! `etcd://…?tls=true` against the TLS-only `etcd-tls` member of `scripts/services.sh` (port
//! 12879, certificate from a test CA the script makes: `$DISTLOCK_SERVICES_DIR/etcd-tls/ca.crt`).
//! Needs the `tls` feature: `cargo test -p lock-etcd --features tls --test tls`.
#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, LockOptions};
use lock_etcd::{EtcdConfig, EtcdLock};

const PORT: u16 = 12879;

fn ca_file() -> String {
    test_support::test_ca("etcd-tls")
}

#[tokio::test]
async fn trusted_ca_from_the_url_locks_over_tls() {
    let url = format!("etcd://127.0.0.1:{PORT}?tls=true&tls_ca_file={}", ca_file());
    let locks = EtcdLock::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("connect over TLS (scripts/services.sh up etcd-tls): {e}"));
    assert!(locks.config().to_string().ends_with("?tls=true"));
    let name = fresh_name("etcd-tls");
    let opts = LockOptions::new(locks.capabilities().min_ttl);
    let lease = locks
        .try_acquire(&name, &opts)
        .await
        .unwrap()
        .expect("free");
    assert!(lease.fencing_token().is_some());
    assert!(locks.try_acquire(&name, &opts).await.unwrap().is_none());
    lease.release().await.unwrap();
}

#[tokio::test]
async fn ca_given_as_pem_works_too() {
    let pem = std::fs::read(ca_file()).expect("the test CA (scripts/services.sh up etcd-tls)");
    let config = EtcdConfig::new([format!("127.0.0.1:{PORT}")]).with_tls_ca_pem(pem);
    let locks = EtcdLock::connect(config).await.unwrap();
    let ttl = locks.capabilities().min_ttl;
    locks
        .try_acquire(&fresh_name("etcd-tls-pem"), &LockOptions::new(ttl))
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn an_untrusted_certificate_is_an_error_not_a_panic() {
    let r = EtcdLock::from_url(&format!("etcd://127.0.0.1:{PORT}?tls=true")).await;
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
    let r = EtcdLock::from_url(&format!(
        "etcd://127.0.0.1:{PORT}?tls=true&tls_ca_file=/nonexistent/distlock-ca.pem"
    ))
    .await;
    assert!(
        matches!(r, Err(Error::Config { .. })),
        "{:?}",
        r.map(|_| ())
    );
}

#[test]
fn tls_ca_file_needs_tls() {
    let e = EtcdConfig::from_url("etcd://127.0.0.1:1?tls_ca_file=/x").unwrap_err();
    assert!(matches!(e, Error::Config { .. }), "{e:?}");
}
