//! Every duration a driver's configuration takes, at its extremes: the longest one accepted
//! (a day, `MAX_TIMEOUT`; the longest TTL for Redlock's minimum validity) gives a working lock,
//! and anything longer, up to `Duration::MAX` through the setters and `u64::MAX` through the
//! URL, a Config error before any lock is taken; never a panic. A timeout is added to clock
//! readings and to other timeouts in many places, and one unchecked addition crashed the
//! caller of every driver here. Against the servers of `scripts/services.sh up`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::sync::Arc;
use std::time::Duration;

use distlock::lock_core::driver::MAX_TIMEOUT;
use distlock::lock_core::MAX_TTL;
use distlock::lock_etcd::{EtcdConfig, EtcdLock};
use distlock::lock_postgres::{PgConfig, PgLock};
use distlock::lock_redis::{RedisConfig, RedisLock};
use distlock::lock_redlock::{RedlockConfig, RedlockLock};
use distlock::lock_zookeeper::{ZkConfig, ZkLock};
use distlock::{DistributedLock, Error, LockName, LockOptions, Result};
use test_support::servers;

const MAX: Duration = Duration::MAX;
/// One millisecond above the longest timeout accepted.
const OVER: Duration = MAX_TIMEOUT.saturating_add(Duration::from_millis(1));
/// Three of the Redlock masters.
fn redlock() -> String {
    servers::url("redlock://{redlock1},{redlock2},{redlock3}")
}

/// The `pg` server.
fn pg() -> String {
    servers::url("postgres://locker@{pg}/postgres?sslmode=disable")
}

/// A grant, a renewal, a waiter that times out on the held lock, a release: all must work.
async fn works(what: &str, connected: Result<Arc<dyn DistributedLock>>) {
    let locks = connected.unwrap_or_else(|e| panic!("{what}: refused at connect: {e:?}"));
    let name = LockName::new(format!(
        "extreme-{}-{}",
        locks.backend(),
        std::process::id()
    ))
    .unwrap();
    let ttl = locks.capabilities().min_ttl.max(Duration::from_secs(2));
    let opts = LockOptions::new(ttl);
    let lease = match locks.try_acquire(&name, &opts).await {
        Ok(Some(lease)) => lease,
        other => panic!("{what}: try_acquire of a fresh name gave {other:?}"),
    };
    lease
        .renew()
        .await
        .unwrap_or_else(|e| panic!("{what}: renew: {e:?}"));
    let waiter = locks
        .acquire(&name, &opts.clone().wait_for(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(waiter, Err(Error::Timeout { .. })),
        "{what}: a waiter on a held lock got {waiter:?}"
    );
    lease
        .release()
        .await
        .unwrap_or_else(|e| panic!("{what}: release: {e:?}"));
}

/// Refused as a configuration error, at parse or at connect.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T>) {
    assert!(
        matches!(r, Err(Error::Config { .. })),
        "{what}: expected a Config error, got {r:?}"
    );
}

fn arc<L: DistributedLock + 'static>(r: Result<L>) -> Result<Arc<dyn DistributedLock>> {
    r.map(|l| Arc::new(l) as Arc<dyn DistributedLock>)
}

/// Each of `params` at each of `values`, added to `base`'s query: a Config error at parse or
/// connect.
async fn urls_refused(base: &str, params: &[&str], values: &[u128]) {
    let sep = if base.contains('?') { '&' } else { '?' };
    for param in params {
        for value in values {
            let url = format!("{base}{sep}{param}={value}");
            refused(&url, distlock::connect(&url).await);
        }
    }
}

/// In milliseconds: `u64::MAX`, and one above the longest timeout.
const MS_OVER: [u128; 2] = [u64::MAX as u128, MAX_TIMEOUT.as_millis() + 1];

/// The two timeouts of lock-core's `timeout_setters!` (Redis and etcd): both a day works,
/// either one longer is refused at connect.
macro_rules! two_timeouts {
    ($what:literal, $base:expr, $lock:ident) => {
        let base = $base;
        let both = |d| base().with_connect_timeout(d).with_request_timeout(d);
        let day = $lock::connect(both(MAX_TIMEOUT)).await;
        works(concat!($what, ", both timeouts a day"), arc(day)).await;
        for d in [OVER, MAX] {
            let connect = $lock::connect(base().with_connect_timeout(d)).await;
            refused(concat!($what, " connect timeout"), connect);
            let request = $lock::connect(base().with_request_timeout(d)).await;
            refused(concat!($what, " request timeout"), request);
        }
    };
}

#[tokio::test]
async fn redis_timeouts_at_their_extremes() {
    two_timeouts!(
        "redis",
        || RedisConfig::new("127.0.0.1", servers::port("redis")),
        RedisLock
    );
}

#[tokio::test]
async fn redlock_durations_at_their_extremes() {
    let base = || RedlockConfig::from_url(&redlock()).unwrap();
    let longest = base()
        .with_node_timeout(MAX_TIMEOUT)
        .with_retry_delay(MAX_TIMEOUT)
        .with_min_validity(Duration::from_millis(1));
    works(
        "redlock, node timeout and retry delay a day",
        arc(RedlockLock::connect(longest).await),
    )
    .await;
    // The longest minimum validity leaves no TTL that could meet it: typed errors only.
    let locks = RedlockLock::connect(base().with_min_validity(MAX_TTL))
        .await
        .unwrap();
    let name = LockName::new("extreme-min-validity").unwrap();
    let r = locks.try_acquire(&name, &LockOptions::new(MAX_TTL)).await;
    assert!(
        matches!(r, Err(Error::InvalidOptions { .. })),
        "redlock min validity = MAX_TTL, TTL = MAX_TTL: {r:?}"
    );
    for d in [OVER, MAX] {
        refused(
            "redlock node timeout",
            RedlockLock::connect(base().with_node_timeout(d)).await,
        );
        refused(
            "redlock retry delay",
            RedlockLock::connect(base().with_retry_delay(d)).await,
        );
    }
    refused(
        "redlock min validity",
        RedlockLock::connect(base().with_min_validity(MAX_TTL + Duration::from_millis(1))).await,
    );
    let params = ["node_timeout_ms", "retry_delay_ms", "min_validity_ms"];
    urls_refused(&redlock(), &params, &MS_OVER).await;
}

#[tokio::test]
async fn zookeeper_session_timeout_at_its_extremes() {
    let base = || ZkConfig::new(servers::url("{zk}"));
    // The server fits a day to its own maximum.
    let day = base().with_session_timeout(MAX_TIMEOUT);
    works("zk, session timeout a day", arc(ZkLock::connect(day).await)).await;
    for d in [OVER, MAX] {
        refused(
            "zk session timeout",
            ZkLock::connect(base().with_session_timeout(d)).await,
        );
    }
    urls_refused(
        &servers::url("zk://{zk}"),
        &["session_timeout_ms"],
        &MS_OVER,
    )
    .await;
}

#[tokio::test]
async fn etcd_timeouts_at_their_extremes() {
    two_timeouts!(
        "etcd",
        || EtcdConfig::new([&*servers::url("{etcd}")]),
        EtcdLock
    );
    let params = ["timeout_ms", "connect_timeout_ms"];
    urls_refused(&servers::url("etcd://{etcd}"), &params, &MS_OVER).await;
}

#[tokio::test]
async fn postgres_timeouts_at_their_extremes() {
    let base = || PgConfig::from_url(&pg()).unwrap();
    let day = base().with_connect_timeout(MAX_TIMEOUT);
    works("pg, connect timeout a day", arc(PgLock::connect(day).await)).await;
    for d in [OVER, MAX] {
        refused(
            "pg connect timeout",
            PgLock::connect(base().with_connect_timeout(d)).await,
        );
    }
    // In whole seconds: u64::MAX of them overflowed the login's bound.
    let secs_over = [u64::MAX.into(), (MAX_TIMEOUT.as_secs() + 1).into()];
    urls_refused(&pg(), &["connect_timeout"], &secs_over).await;
    // The session timeout has its own range (1 s ..= 1 h), refused by its setter.
    refused("pg session timeout", base().with_session_timeout(MAX));
    urls_refused(&pg(), &["session_timeout_ms"], &MS_OVER).await;
}
