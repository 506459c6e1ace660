//! Each master is one independent server: one server under two names or two database numbers
//! is refused (it would count twice towards the majority), and so is a master that may evict
//! keys. Masters: the `redlock1`..`redlock3` servers and `redis-evict`
//! (`allkeys-lru`) of `scripts/services.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, Error, LockOptions};
use lock_redis::RedisConfig;
use lock_redlock::{RedlockConfig, RedlockLock};
use test_support::servers;

fn is_config(e: &Error, needle: &str) -> bool {
    matches!(e, Error::Config { message: m, .. } if m.contains(needle))
}

/// `localhost` and `127.0.0.1` are one server: with three "masters" of which two are the same,
/// that server alone is a majority.
#[tokio::test]
async fn one_server_under_two_names_is_refused() {
    let url = &*servers::url(&format!(
        "redlock://{{redlock1}},localhost:{},{{redlock2}}",
        servers::port("redlock1")
    ));
    match RedlockLock::from_url(url).await {
        Err(e) => assert!(is_config(&e, "same Redis server"), "{e:?}"),
        Ok(lock) => {
            // Show what the duplicate allows: one real server grants a "majority".
            let lease = lock
                .try_acquire(
                    &fresh_name("dup"),
                    &LockOptions::new(Duration::from_secs(5)),
                )
                .await;
            panic!("connected with one server listed twice; try_acquire: {lease:?}");
        }
    }
}

#[tokio::test]
async fn one_server_under_two_database_numbers_is_refused() {
    let masters = vec![
        RedisConfig::new("127.0.0.1", servers::port("redlock1")),
        RedisConfig::new("127.0.0.1", servers::port("redlock1")).with_database(1),
        RedisConfig::new("127.0.0.1", servers::port("redlock2")),
    ];
    let e = RedlockConfig::new(masters).unwrap_err();
    assert!(is_config(&e, "listed twice"), "{e:?}");
}

/// The server behind an address changes after connect (a proxy, a DNS name): the duplicate is
/// caught before the next grant, not counted.
#[tokio::test]
async fn a_master_that_becomes_a_duplicate_is_refused_before_a_grant() {
    let up: SocketAddr = servers::url("{redlock3}").parse().unwrap();
    let proxy = FaultProxy::start(up).unwrap();
    let p = proxy.addr();
    let masters = vec![
        RedisConfig::new("127.0.0.1", servers::port("redlock1")),
        RedisConfig::new("127.0.0.1", servers::port("redlock2")),
        RedisConfig::new(p.ip().to_string(), p.port()),
    ];
    let lock = RedlockLock::connect(RedlockConfig::new(masters).unwrap())
        .await
        .unwrap();
    let name = fresh_name("dup-later");
    let opts = LockOptions::new(Duration::from_secs(5));
    lock.try_acquire(&name, &opts)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.redirect(servers::url("{redlock1}").parse().unwrap());
    proxy.cut();
    let mut last = String::new();
    for _ in 0..40 {
        match lock.try_acquire(&name, &opts).await {
            Err(e) if is_config(&e, "same Redis server") => return,
            Ok(Some(l)) => {
                last = "granted".into();
                l.release().await.unwrap();
            }
            other => last = format!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the master that became a duplicate was never refused; last: {last}");
}

#[tokio::test]
async fn a_master_that_may_evict_is_refused_unless_accepted() {
    let url = &*servers::url("redlock://{redlock1},{redlock2},{redis-evict}");
    let e = RedlockLock::from_url(url).await.unwrap_err();
    assert!(is_config(&e, "allkeys-lru"), "{e:?}");
    let lock = RedlockLock::from_url(&format!("{url}?allow_eviction=true"))
        .await
        .unwrap();
    let lease = lock
        .try_acquire(
            &fresh_name("evict-ok"),
            &LockOptions::new(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .unwrap();
    lease.release().await.unwrap();
}

/// A master that is a replica is refused at connect: a read-only one never votes, so the
/// majority tolerates one failure less than it claims; a writable one votes with keys its
/// next sync erases.
#[tokio::test]
async fn a_replica_among_the_masters_is_refused() {
    for writable in [false, true] {
        let replica = test_support::redis_replica(writable).await.unwrap();
        let url = servers::url(&format!(
            "redlock://{{redlock1}},{{redlock2}},{}",
            replica.addr()
        ));
        match RedlockLock::from_url(&url).await {
            Err(e) => assert!(is_config(&e, "replica"), "writable {writable}: {e:?}"),
            Ok(_) => panic!("a replica (writable {writable}) was accepted as a master"),
        }
    }
}

/// A TTL whose validity, after the drift allowance, cannot exceed `min_validity_ms` would fail
/// every attempt (the grant is always released as too short), and an `acquire` would retry
/// until its deadline, forever by default. It is an invalid option at once instead: the
/// driver's minimum TTL follows `min_validity_ms`.
#[tokio::test]
async fn a_ttl_that_cannot_outlast_min_validity_is_refused_at_once() {
    let url = &*servers::url("redlock://{redlock1},{redlock2},{redlock3}?min_validity_ms=5000");
    let locks = RedlockLock::from_url(url).await.unwrap();
    let min = locks.capabilities().min_ttl;
    assert!(
        min > Duration::from_secs(5),
        "min_ttl {min:?} at or below min_validity"
    );
    let name = fresh_name("min-validity");
    let short = LockOptions::new(Duration::from_secs(5));
    let got = tokio::time::timeout(Duration::from_secs(5), locks.acquire(&name, &short)).await;
    match got {
        Ok(Err(Error::InvalidOptions(_))) => {}
        Ok(other) => panic!("ttl 5s with min_validity 5s: expected InvalidOptions, got {other:?}"),
        Err(_) => panic!("ttl 5s with min_validity 5s: acquire still retrying after 5s"),
    }
    // Just above the minimum: the round's own time comes off the validity too.
    let lease = locks
        .try_acquire(&name, &LockOptions::new(min + Duration::from_millis(200)))
        .await
        .unwrap()
        .expect("a lock of just above the minimum TTL");
    assert!(
        lease.valid_until() > std::time::Instant::now() + Duration::from_secs(5),
        "granted with no more than min_validity left"
    );
    lease.release().await.unwrap();
}
