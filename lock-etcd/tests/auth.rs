//! Authentication against the auth-enabled etcd of `scripts/services.sh` (`etcd-auth`, port
//! 12779, user `locker` with read/write on `/`): credentials from the URL work, wrong or missing
//! credentials are an `Unauthenticated` error, and the password never shows.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, LockOptions};
use lock_etcd::EtcdLock;

fn url(userinfo: &str) -> String {
    let port = std::env::var("ETCD_AUTH_PORT").unwrap_or_else(|_| "12779".into());
    format!("etcd://{userinfo}127.0.0.1:{port}/distlock-auth")
}

#[tokio::test]
async fn credentials_from_the_url_work_and_never_show() {
    let locks = EtcdLock::from_url(&url("locker:locker-pw@"))
        .await
        .unwrap_or_else(|e| panic!("etcd-auth (scripts/services.sh up etcd-auth): {e}"));
    for text in [format!("{locks:?}"), locks.config().to_string()] {
        assert!(!text.contains("locker-pw"), "password in {text}");
    }
    let name = fresh_name("etcd-auth");
    let ttl = locks.capabilities().min_ttl;
    let lease = locks
        .try_acquire(&name, &LockOptions::new(ttl))
        .await
        .unwrap()
        .expect("free");
    assert!(lease.fencing_token().is_some());
    lease.renew().await.unwrap();
    lease.release().await.unwrap();
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_unauthenticated_without_the_password() {
    for userinfo in ["locker:wrong-secret-pw@", ""] {
        match EtcdLock::from_url(&url(userinfo)).await {
            Ok(_) => panic!("connected with {userinfo:?}"),
            Err(e) => {
                assert!(
                    matches!(e, Error::Unauthenticated { .. }),
                    "{userinfo:?}: {e:?}"
                );
                assert!(!format!("{e} {e:?}").contains("wrong-secret-pw"), "{e:?}");
            }
        }
    }
}
