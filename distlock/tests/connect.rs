//! Every scheme parses and connects against the servers of `scripts/services.sh up`, and
//! wrong schemes or disabled features give errors that say what to do. Run with
//! `--features full` to reach every driver (scripts/test.sh does).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use distlock::{Error, LockName, LockOptions};
use test_support::servers;

/// Acquire and release once through the facade: the URL reached a working driver.
#[cfg_attr(not(feature = "file"), allow(dead_code))] // every driver test is feature-gated
async fn round_trips(backend: &str, urls: &[&str]) {
    for url in urls {
        round_trip(url, backend).await;
    }
}

async fn round_trip(url: &str, backend: &str) {
    let locks = distlock::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/services.sh up)", distlock::redact(url)));
    assert_eq!(locks.backend(), backend);
    let ttl = locks.capabilities().min_ttl.max(Duration::from_secs(2));
    let name = LockName::new(format!("facade-{backend}-{}", std::process::id())).unwrap();
    let lease = locks
        .try_acquire(&name, &LockOptions::new(ttl))
        .await
        .unwrap()
        .expect("a fresh name is free");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn memory_stores_are_shared_by_name() {
    let a = distlock::connect("memory://shared").await.unwrap();
    let b = distlock::connect("memory://shared").await.unwrap();
    let c = distlock::connect("memory://other").await.unwrap();
    let name = LockName::new("facade-memory").unwrap();
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease = a.try_acquire(&name, &opts).await.unwrap().unwrap();
    assert!(b.try_acquire(&name, &opts).await.unwrap().is_none());
    let other = c.try_acquire(&name, &opts).await.unwrap();
    assert!(other.is_some(), "memory://other must be a different store");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn bad_urls_are_config_errors_that_never_echo_the_password() {
    for bad in [
        "no-scheme-here",
        "1redis://u:secretpw@h:1", // a scheme starts with a letter (in any case: Redis:// is redis://)
        "://u:secretpw@h",
        "nosuch://u:secretpw@h:1",
        "memory://a/b",
    ] {
        match distlock::connect(bad).await {
            Err(Error::Config { message: msg, .. }) => {
                assert!(!msg.contains("secretpw"), "{bad}: {msg}")
            }
            Err(e) => panic!("{bad}: expected Config, got {e:?}"),
            Ok(_) => panic!("{bad}: connected"),
        }
    }
    let Err(Error::Config { message: msg, .. }) = distlock::connect("nosuch://h").await else {
        panic!("nosuch:// accepted")
    };
    assert!(msg.contains("memory"), "the error lists the schemes: {msg}");
}

#[tokio::test]
async fn from_env_reads_distlock_url() {
    // The only test that touches DISTLOCK_URL.
    std::env::remove_var("DISTLOCK_URL");
    assert!(matches!(
        distlock::from_env().await,
        Err(Error::Config { .. })
    ));
    std::env::set_var("DISTLOCK_URL", "memory://env");
    assert_eq!(distlock::from_env().await.unwrap().backend(), "memory");
    std::env::remove_var("DISTLOCK_URL");
}

#[cfg(feature = "file")]
#[tokio::test]
async fn file_urls_connect() {
    let dir = std::env::temp_dir().join(format!("distlock-facade-{}", std::process::id()));
    round_trip(&format!("file://{}", dir.display()), "file").await;
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(not(feature = "zookeeper"))]
#[tokio::test]
async fn a_disabled_driver_names_its_feature() {
    let Err(Error::Config { message: msg, .. }) =
        distlock::connect(&servers::url("zk://{zk}")).await
    else {
        panic!("zk:// connected without the zookeeper feature")
    };
    assert!(msg.contains("`zookeeper`"), "{msg}");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_urls_connect() {
    round_trips(
        "redis",
        &[
            &*servers::url("redis://{redis}"),
            &*servers::url("redis://locker:locker-pw@{redis-auth}"),
        ],
    )
    .await;
}

#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn rediss_urls_connect() {
    round_trip(
        &servers::url(&format!(
            "rediss://{{redis-tls}}?tls_ca_file={}",
            test_support::test_ca("redis-tls")
        )),
        "redis",
    )
    .await;
}

#[cfg(feature = "etcd-tls")]
#[tokio::test]
async fn etcd_over_tls_connects() {
    round_trip(
        &servers::url(&format!(
            "etcd://{{etcd-tls}}?tls=true&tls_ca_file={}",
            test_support::test_ca("etcd-tls")
        )),
        "etcd",
    )
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_wrong_redis_password_is_not_echoed() {
    let Err(e) =
        distlock::connect(&servers::url("redis://locker:wrong-secret-pw@{redis-auth}")).await
    else {
        panic!("connected with a wrong password")
    };
    assert!(!format!("{e} {e:?}").contains("wrong-secret-pw"), "{e:?}");
}

#[cfg(feature = "redlock")]
#[tokio::test]
async fn redlock_urls_connect() {
    round_trip(
        &servers::url("redlock://{redlock1},{redlock2},{redlock3},{redlock4},{redlock5}"),
        "redlock",
    )
    .await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test]
async fn zookeeper_urls_connect() {
    round_trips(
        "zookeeper",
        &[
            &*servers::url("zk://{zk}?session_timeout_ms=2000"),
            &*servers::url("zk://{zk-ens1},{zk-ens2},{zk-ens3}/facade?session_timeout_ms=2000"),
        ],
    )
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_urls_connect() {
    round_trips(
        "postgres",
        &[
            &*servers::url(
                "postgres://locker@{pg}/postgres?sslmode=disable&session_timeout_ms=2000",
            ),
            &*servers::url("postgresql://locker:locker-pw@{pg-auth}/postgres?sslmode=disable"),
        ],
    )
    .await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_urls_connect() {
    round_trips(
        "etcd",
        &[
            &*servers::url("etcd://{etcd}"),
            &*servers::url("etcd://{etcd-c1},{etcd-c2},{etcd-c3}/facade"),
            &*servers::url("etcd://locker:locker-pw@{etcd-auth}/distlock-auth"),
        ],
    )
    .await;
}

/// A refused connection names its root cause once, after the client's own words (tokio-postgres
/// says only "error connecting to server" and leaves the cause to `source()`), and never the
/// password.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_refused_postgres_connection_says_why() {
    let err = distlock::connect("postgres://u:hunter2@127.0.0.1:1/db?sslmode=disable")
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let said = err.to_string();
    assert_eq!(
        said,
        "postgres backend unavailable: error connecting to server: Connection refused \
         (os error 111) (postgres://u:***@127.0.0.1:1/db)"
    );
}

/// A server that is not there: each driver's error names the server it tried and why, once,
/// and is `Unavailable` (retryable).
#[tokio::test]
async fn an_unreachable_server_is_named_with_the_reason() {
    let mut cases: Vec<(&str, &str)> = Vec::new();
    #[cfg(feature = "redis")]
    cases.push((
        "redis://127.0.0.1:1",
        "redis backend unavailable: cannot connect to redis://127.0.0.1:1: Connection refused (os error 111)",
    ));
    #[cfg(feature = "redlock")]
    cases.push((
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "redlock backend unavailable: only 0 of 3 masters answered (need 2); down: redis://127.0.0.1:1, redis://127.0.0.1:2, redis://127.0.0.1:3",
    ));
    #[cfg(feature = "zookeeper")]
    cases.push((
        "zk://127.0.0.1:1",
        "zookeeper backend unavailable: cannot connect to zk://127.0.0.1:1: no available hosts",
    ));
    #[cfg(feature = "etcd")]
    cases.push((
        "etcd://127.0.0.1:1",
        "etcd backend unavailable: cannot connect to etcd://127.0.0.1:1: Connection refused (os error 111)",
    ));
    for (url, want) in cases {
        let err = distlock::connect(url)
            .await
            .expect_err("nothing listens there");
        assert!(err.is_retryable(), "{url}: {err:?}");
        assert_eq!(err.to_string(), want, "{url}");
    }
}
