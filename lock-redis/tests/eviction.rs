//! A Redis that may evict keys under memory pressure is refused: at connect and after every
//! reconnect, unless the URL accepts it explicitly, and then without fencing tokens.
//!
//! Servers: `REDIS_EVICT_URL` (default `redis://{redis-evict}`, the `redis-evict` server of
//! `scripts/services.sh`: `maxmemory 64mb`, `maxmemory-policy allkeys-lru`) and `REDIS_URL`
//! (default `redis://{redis}`, `noeviction`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, Error, Fencing, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::servers;

fn evicting_url() -> String {
    std::env::var("REDIS_EVICT_URL").unwrap_or_else(|_| servers::url("redis://{redis-evict}"))
}

fn safe_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| servers::url("redis://{redis}"))
}

fn addr(url: &str) -> SocketAddr {
    let c = RedisConfig::from_url(url).unwrap();
    format!("{}:{}", c.host(), c.port()).parse().unwrap()
}

fn refusal(e: &Error) -> bool {
    matches!(e, Error::Config { message: m, .. } if m.contains("allkeys-lru") && m.contains("allow_eviction"))
}

#[tokio::test]
async fn an_evicting_server_is_refused_at_connect() {
    let e = RedisLock::from_url(&evicting_url()).await.unwrap_err();
    assert!(
        refusal(&e),
        "expected a Config error naming the policy, got {e:?}"
    );
    assert!(e.to_string().contains("fencing"), "{e}");
}

#[tokio::test]
async fn the_refusal_never_shows_the_password() {
    // The evicting server has no password; a wrong one is ignored by it (no requirepass), so
    // the refusal itself is what is shown, with the password redacted.
    let url = evicting_url().replace("redis://", "redis://:p%40ss%2Fw0rd-secret@");
    let e = RedisLock::from_url(&url).await.unwrap_err();
    for shown in [e.to_string(), format!("{e:?}")] {
        assert!(!shown.contains("w0rd-secret"), "{shown}");
    }
}

#[tokio::test]
async fn accepting_eviction_turns_fencing_off() {
    let url = format!("{}?allow_eviction=true", evicting_url());
    let locks = RedisLock::from_url(&url).await.unwrap();
    assert_eq!(locks.capabilities().fencing, Fencing::None);
    let name = fresh_name("evict-optin");
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    assert_eq!(
        lease.fencing_token(),
        None,
        "a token from an evictable counter"
    );
    let held = locks.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        held.fencing_token, None,
        "inspect showed an evictable counter"
    );
    lease.release().await.unwrap();
}

/// The server behind the client's address changes (a failover to a differently configured
/// replica): the reconnect is checked before the next grant.
#[tokio::test]
async fn a_reconnect_to_an_evicting_server_is_refused_before_any_grant() {
    let proxy = FaultProxy::start(addr(&safe_url())).unwrap();
    let a = proxy.addr();
    let locks = RedisLock::connect(
        RedisConfig::new(a.ip().to_string(), a.port())
            .with_connect_timeout(Duration::from_millis(500))
            .with_request_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let name = fresh_name("evict-reconnect");
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    lease.release().await.unwrap();
    proxy.redirect(addr(&evicting_url()));
    proxy.cut();
    let mut last = None;
    // The first request after the cut may see the drop itself (Unavailable); the one that
    // reaches the new server must be refused, never granted.
    for _ in 0..20 {
        match locks.try_acquire(&name, &opts).await {
            Ok(Some(l)) => panic!(
                "granted {:?} on a server that evicts keys (after the reconnect)",
                l.fencing_token()
            ),
            Err(e) if refusal(&e) => return,
            other => last = Some(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never refused the evicting server after the reconnect; last: {last:?}");
}
