//! Another client than distlock on the lock's key (redis-py, redsync, the redis.io recipe:
//! `SET key token NX PX`, compare-and-delete), simulated here with raw commands, in both key
//! layouts. It announces no release, so a distlock waiter must look again on its own, soon;
//! `inspect` must call it another client and never show a token of ours for it.
//! Server: `REDIS_URL` (default `redis://{redis}`, `scripts/services.sh up redis`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Fencing, LockName, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::servers;

fn url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| servers::url("redis://{redis}"))
}

async fn locks(plain: bool) -> RedisLock {
    let mut config = RedisConfig::from_url(&url()).unwrap();
    if plain {
        config = config.with_plain_keys(true).with_prefix("").unwrap();
    }
    RedisLock::connect(config).await.unwrap()
}

/// The key another client uses for `name` in this layout.
fn key(locks: &RedisLock, name: &LockName) -> String {
    if locks.config().plain_keys() {
        format!("{}{name}", locks.config().prefix())
    } else {
        format!("{}{{{name}}}", locks.config().prefix())
    }
}

/// The other client takes the lock the way redis-py does.
async fn foreign_set(locks: &RedisLock, key: &str, token: &str, ttl: Duration) -> bool {
    let mut c = locks.connection();
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(u64::try_from(ttl.as_millis()).unwrap())
        .query_async(&mut c)
        .await
        .unwrap();
    set.is_some()
}

/// ... and lets go without any message.
async fn foreign_del(locks: &RedisLock, key: &str) {
    let mut c = locks.connection();
    let n: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1, "the foreign holder's key was gone before its release");
}

/// A distlock waiter behind a foreign holder gets the lock within 300 ms of the foreign
/// release (it looks again every 100 ms), not after the holder's remaining TTL (20 s here).
async fn waiter_sees_a_silent_release(plain: bool) {
    let locks = locks(plain).await;
    let name = fresh_name("foreign-wake");
    let key = key(&locks, &name);
    assert!(foreign_set(&locks, &key, "redis-py-token", Duration::from_secs(20)).await);
    let waiter = {
        let (locks, name) = (locks.clone(), name.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new(Duration::from_secs(5)).wait_for(Duration::from_secs(15));
            let lease = locks.acquire(&name, &opts).await;
            (Instant::now(), lease)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiter.is_finished(),
        "granted while the foreign client held"
    );
    let released = Instant::now();
    foreign_del(&locks, &key).await;
    let (granted, lease) = waiter.await.unwrap();
    let lease = lease.unwrap();
    let after = granted.saturating_duration_since(released);
    assert!(
        after < Duration::from_millis(300),
        "waiter not woken within 300 ms of the foreign release: granted {after:?} after it"
    );
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_sees_a_silent_foreign_release_in_plain_keys() {
    waiter_sees_a_silent_release(true).await;
}

#[tokio::test]
async fn a_waiter_sees_a_silent_foreign_release_in_tagged_keys() {
    waiter_sees_a_silent_release(false).await;
}

/// After a distlock holder (whose grant advanced the counter), a foreign holder: `inspect`
/// says another client holds, with no token, never the earlier holder's.
async fn inspect_names_another_client(plain: bool) {
    let locks = locks(plain).await;
    let name = fresh_name("foreign-inspect");
    let key = key(&locks, &name);
    let opts = LockOptions::new(Duration::from_secs(5));
    let ours = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    let held = locks.inspect(&name).await.unwrap().unwrap();
    assert!(!held.foreign, "distlock's own holder reported as foreign");
    assert_eq!(held.fencing_token, ours.fencing_token());
    ours.release().await.unwrap();
    assert!(foreign_set(&locks, &key, "redis-py-token", Duration::from_secs(5)).await);
    let theirs = locks.inspect(&name).await.unwrap().unwrap();
    assert!(
        theirs.foreign,
        "a foreign holder not reported as such: {theirs:?}"
    );
    assert_eq!(
        theirs.fencing_token, None,
        "a token shown for a foreign holder"
    );
    assert!(theirs
        .remaining
        .is_some_and(|r| r <= Duration::from_secs(5)));
    assert!(
        locks.try_acquire(&name, &opts).await.unwrap().is_none(),
        "granted over a foreign holder"
    );
    foreign_del(&locks, &key).await;
}

#[tokio::test]
async fn inspect_names_another_client_in_plain_keys() {
    inspect_names_another_client(true).await;
}

#[tokio::test]
async fn inspect_names_another_client_in_tagged_keys() {
    inspect_names_another_client(false).await;
}

/// Plain keys: the lock is the bare key with distlock's token as its value, no fence key is
/// written, and fencing is declared `None`.
#[tokio::test]
async fn plain_keys_are_the_recipe_layout_without_fencing() {
    let locks = locks(true).await;
    assert_eq!(locks.capabilities().fencing, Fencing::None);
    let name = fresh_name("plain-layout");
    let lease = locks
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.fencing_token(), None);
    assert_eq!(lease.backend_key().as_deref(), Some(name.as_str()));
    let mut c = locks.connection();
    let value: Option<String> = redis::cmd("GET")
        .arg(name.as_str())
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(value.is_some_and(|v| v.starts_with("distlock-")));
    let fence: i64 = redis::cmd("EXISTS")
        .arg(format!("{name}:fence"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(fence, 0, "a fence key in plain-key mode");
    lease.release().await.unwrap();
}
