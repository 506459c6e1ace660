//! What the fault tests of this crate share: the five masters of `scripts/services.sh`
//! (`redlock1`–`redlock5`), clients straight to them or behind a `FaultProxy` each, and a look
//! at each master's keys that bypasses any proxy.
#![allow(dead_code)] // each test binary uses its own part
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::FaultProxy;
use lock_core::{DistributedLock, LockName, LockOptions};
use lock_redis::raw::scripts::LockKeys;
use lock_redis::{RedisConfig, DEFAULT_PREFIX};
use lock_redlock::{RedlockConfig, RedlockLock};
use test_support::servers;

/// The five masters' ports (`redlock1` to `redlock5` of `scripts/servers.tsv`).
pub(crate) fn ports() -> [u16; 5] {
    servers::numbered("redlock")
}

pub(crate) fn master(port: u16) -> RedisConfig {
    RedisConfig::new("127.0.0.1", port)
        .with_request_timeout(Duration::from_millis(300))
        .with_connect_timeout(Duration::from_millis(300))
}

pub(crate) async fn direct() -> RedlockLock {
    let cfg = RedlockConfig::new(ports().iter().map(|p| master(*p)).collect()).unwrap();
    RedlockLock::connect(cfg)
        .await
        .expect("Redlock masters (start them: scripts/services.sh up)")
}

/// A client whose five masters each sit behind a proxy of their own.
pub(crate) async fn proxied(node_timeout: Duration) -> (RedlockLock, Vec<FaultProxy>) {
    proxied_with(node_timeout, master).await
}

/// [`proxied`], each master's connection configured by `master`.
pub(crate) async fn proxied_with(
    node_timeout: Duration,
    master: fn(u16) -> RedisConfig,
) -> (RedlockLock, Vec<FaultProxy>) {
    let proxies: Vec<FaultProxy> = ports()
        .iter()
        .map(|p| FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], *p))).unwrap())
        .collect();
    let cfg = RedlockConfig::new(proxies.iter().map(|p| master(p.addr().port())).collect())
        .unwrap()
        .with_node_timeout(node_timeout);
    (RedlockLock::connect(cfg).await.unwrap(), proxies)
}

/// A plain connection to one master, bypassing any proxy.
pub(crate) async fn direct_conn(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Ends every fault of `proxies`.
pub(crate) fn heal(proxies: &[FaultProxy]) {
    for p in proxies {
        p.heal();
    }
}

/// After `wait`, no master may hold a key of `name`; `what` says what would have left one.
pub(crate) async fn no_keys_after(name: &LockName, wait: Duration, what: &str) {
    tokio::time::sleep(wait).await;
    assert_eq!(keys_present(name).await, 0, "{what}");
}

/// Heals `proxies`; after `wait`, no master may hold a key of `name` (`what` says what would
/// have left one).
pub(crate) async fn heal_then_no_keys_after(
    proxies: &[FaultProxy],
    name: &LockName,
    wait: Duration,
    what: &str,
) {
    heal(proxies);
    no_keys_after(name, wait, what).await;
}

/// A fresh client, straight to the masters, gets `name` at once; `what` says why it must.
pub(crate) async fn free_for_another(name: &LockName, opts: &LockOptions, what: &str) {
    direct()
        .await
        .try_acquire(name, opts)
        .await
        .unwrap()
        .expect(what)
        .release()
        .await
        .unwrap();
}

/// On how many masters the lock key of `name` exists right now.
pub(crate) async fn keys_present(name: &LockName) -> usize {
    keys_on(name).await.len()
}

/// The ports of the masters on which the lock key of `name` exists right now.
pub(crate) async fn keys_on(name: &LockName) -> Vec<u16> {
    let keys = LockKeys::new(DEFAULT_PREFIX, name);
    let mut on = Vec::new();
    for p in ports() {
        let mut c = direct_conn(p).await;
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&keys.lock)
            .query_async(&mut c)
            .await
            .unwrap();
        if exists == 1 {
            on.push(p);
        }
    }
    on
}

/// Waits (up to 2 s) until every master holds the lock key of `name`: a grant is decided at a
/// majority, the slower masters' requests finish in the background.
pub(crate) async fn keys_on_every_master(name: &LockName) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while keys_present(name).await < ports().len() {
        assert!(
            std::time::Instant::now() < deadline,
            "2 s after a grant, the lock key is on {:?} of {:?} only",
            keys_on(name).await,
            ports()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Deletes the lock key of `name` on the master at `port`, as if it had never granted it.
pub(crate) async fn del_key(port: u16, name: &LockName) {
    let keys = LockKeys::new(DEFAULT_PREFIX, name);
    let mut c = direct_conn(port).await;
    redis::cmd("DEL")
        .arg(&keys.lock)
        .exec_async(&mut c)
        .await
        .unwrap();
}

/// Sets the lock key of `name` on the master at `port` to expire `after` from now.
pub(crate) async fn pexpire_key(port: u16, name: &LockName, after: Duration) {
    let keys = LockKeys::new(DEFAULT_PREFIX, name);
    let mut c = direct_conn(port).await;
    let set: i64 = redis::cmd("PEXPIRE")
        .arg(&keys.lock)
        .arg(u64::try_from(after.as_millis()).unwrap())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(set, 1, "no lock key of {name} on the master at {port}");
}
