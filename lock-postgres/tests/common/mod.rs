//! What the shared-sessions tests (`shared_sessions.rs`, `shared_family.rs`) share: clients
//! named on the server (so their connections can be counted), what the server says of them,
//! and the hand-off that proves a poller is woken.
// Each test file uses some of these.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Lease, LockName, LockOptions};
use lock_postgres::{advisory_key, PgLock};
use test_support::servers;

pub(crate) const SESSION_MS: u64 = 2000;

pub(crate) fn opts() -> LockOptions {
    LockOptions::new(Duration::from_millis(SESSION_MS))
}

/// A client with `shared_sessions=shared` and, if given, `wait_sessions=waits`, named `app` on
/// the server.
pub(crate) async fn bounded(shared: usize, waits: Option<usize>, app: &str) -> PgLock {
    let waits = waits
        .map(|w| format!("&wait_sessions={w}"))
        .unwrap_or_default();
    PgLock::from_url(&servers::url(&format!(
        "postgres://locker@{{pg}}/postgres?sslmode=disable&session_timeout_ms={SESSION_MS}\
         &shared_sessions={shared}{waits}&application_name={app}"
    )))
    .await
    .unwrap()
}

/// `lock`'s try of `name` with `opts`, granted.
pub(crate) async fn granted(lock: &PgLock, name: &LockName, opts: LockOptions) -> Box<dyn Lease> {
    let got = lock.try_acquire(name, &opts).await.unwrap();
    got.unwrap_or_else(|| panic!("{name}: refused ({:?}), expected free", opts.mode))
}

/// How many requests for `name`'s own advisory key wait on the server now (a reader's or a
/// permit's wait queues there first).
pub(crate) async fn waiting(c: &tokio_postgres::Client, name: &LockName) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = $1",
        &[&advisory_key(name)],
    )
    .await
    .unwrap()
    .get(0)
}

/// The server connections named `app`.
pub(crate) async fn connections(c: &tokio_postgres::Client, app: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .await
    .unwrap()
    .get(0)
}

/// Every one of `waiters` granted within 10 s (the names were just released), and let go.
pub(crate) async fn all_granted(
    waiters: Vec<tokio::task::JoinHandle<lock_core::Result<Box<dyn Lease>>>>,
) {
    for (i, w) in waiters.into_iter().enumerate() {
        let got = tokio::time::timeout(Duration::from_secs(10), w).await;
        let lease = got
            .unwrap_or_else(|_| panic!("waiter {i} not granted within 10 s of the releases"))
            .unwrap()
            .unwrap_or_else(|e| panic!("waiter {i}: {e}"));
        lease.release().await.unwrap();
    }
}

/// Five hand-offs of one name from `holder`'s lease (`held`'s mode) to a poller of `waiter`
/// (`wants`' mode), each granted within 150 ms of the release, not at the poller's next try:
/// it has polled for 1.5 s, so its pauses are 250 to 500 ms, and a release at a random point
/// of one leaves under 150 ms to its end in about 2 of 5 cases: all five quick by chance,
/// about 1 in 100. Each round polls the name anew, listening again after the round before
/// stopped.
pub(crate) async fn woken_hand_offs(
    holder: &PgLock,
    waiter: &PgLock,
    held: LockOptions,
    wants: LockOptions,
    what: &str,
) {
    let name = conformance_tests::fresh_name("waits-woken");
    for round in 0..5 {
        let lease = granted(holder, &name, held.clone()).await;
        let polling = {
            let (lock, name) = (waiter.clone(), name.clone());
            let wait = wants.clone().wait_for(Duration::from_secs(20));
            tokio::spawn(async move {
                let l = lock.acquire(&name, &wait).await;
                (Instant::now(), l)
            })
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let released = Instant::now();
        lease.release().await.unwrap();
        let (at, next) = polling.await.unwrap();
        let took = at.duration_since(released);
        assert!(
            took < Duration::from_millis(150),
            "round {round}: a {:?} poller was granted {took:?} after {what} ({:?}): not woken \
             by it",
            wants.mode,
            held.mode
        );
        next.unwrap().release().await.unwrap();
        // The poller's listening ends with it (in the background).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
