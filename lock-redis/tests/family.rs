//! Shared holders and permits on Redis, where the suite cannot reach: the group lives in the
//! lock's own key, so another client than distlock (`SET key token NX PX`, as redis-py) is kept
//! out by readers and keeps readers out; an operator's `DEL` of the key ends the group; plain
//! keys refuse the family rather than grant an exclusive lock in its place.
//! Server: `REDIS_URL` (default `redis://{redis}`, `scripts/services.sh up redis`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, LeaseState, LockOptions, Mode};
use lock_redis::{RedisConfig, RedisLock};
use test_support::servers;

fn url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| servers::url("redis://{redis}"))
}

async fn locks() -> RedisLock {
    RedisLock::connect(RedisConfig::from_url(&url()).unwrap())
        .await
        .unwrap()
}

fn key(locks: &RedisLock, name: &lock_core::LockName) -> String {
    format!("{}{{{name}}}", locks.config().prefix())
}

async fn foreign_set(locks: &RedisLock, key: &str) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg("redis-py-token")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query_async(&mut locks.connection())
        .await
        .unwrap();
    set.is_some()
}

fn opts(mode: Mode) -> LockOptions {
    LockOptions::new(Duration::from_secs(5)).mode(mode)
}

#[tokio::test]
async fn a_group_keeps_another_client_out_and_the_other_way_round() {
    let locks = locks().await;
    for mode in [Mode::Shared, Mode::Permits(3)] {
        let name = fresh_name("family-foreign");
        let key = key(&locks, &name);
        let member = locks
            .try_acquire(&name, &opts(mode))
            .await
            .unwrap()
            .unwrap();
        assert!(
            !foreign_set(&locks, &key).await,
            "a client using SET NX took the key while a {mode} holder held the name"
        );
        member.release().await.unwrap();
        assert!(
            foreign_set(&locks, &key).await,
            "the last {mode} holder released, and the key stayed taken"
        );
        let refused = locks.try_acquire(&name, &opts(mode)).await.unwrap();
        assert!(
            refused.is_none(),
            "a {mode} request was granted while another client held the key"
        );
        let holders = locks.holders(&name).await.unwrap();
        assert!(
            holders.len() == 1 && holders[0].foreign && holders[0].fencing_token.is_none(),
            "holders of a key another client holds: {holders:?}"
        );
    }
}

#[tokio::test]
async fn deleting_the_key_ends_every_member() {
    let locks = locks().await;
    let name = fresh_name("family-deleted");
    let a = locks.try_acquire(&name, &opts(Mode::Permits(2))).await;
    let b = locks.try_acquire(&name, &opts(Mode::Permits(2))).await;
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    let _: i64 = redis::cmd("DEL")
        .arg(key(&locks, &name))
        .query_async(&mut locks.connection())
        .await
        .unwrap();
    for (who, lease) in [("first", &a), ("second", &b)] {
        let renewed = lease.renew().await;
        assert!(
            matches!(renewed, Err(Error::NotHeld { .. })),
            "the {who} permit's renewal after an operator deleted the key: {renewed:?}"
        );
        assert_eq!(lease.state(), LeaseState::Lost, "the {who} permit");
    }
    // The deleted group's members count no more: two new permits, and a third refused.
    let c = locks.try_acquire(&name, &opts(Mode::Permits(2))).await;
    let d = locks.try_acquire(&name, &opts(Mode::Permits(2))).await;
    assert!(
        c.unwrap().is_some() && d.unwrap().is_some(),
        "after the key was deleted, its old members still took permits"
    );
    assert!(locks
        .try_acquire(&name, &opts(Mode::Permits(2)))
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn plain_keys_refuse_the_family() {
    let config = RedisConfig::from_url(&url())
        .unwrap()
        .with_plain_keys(true)
        .with_prefix("")
        .unwrap();
    let locks = RedisLock::connect(config).await.unwrap();
    let caps = locks.capabilities();
    assert!(!caps.shared && !caps.permits, "{caps:?}");
    let name = fresh_name("family-plain");
    for mode in [Mode::Shared, Mode::Permits(2)] {
        let r = locks.try_acquire(&name, &opts(mode)).await;
        assert!(
            matches!(r, Err(Error::Unsupported { .. })),
            "a {mode} request with plain keys: {r:?}"
        );
    }
}
