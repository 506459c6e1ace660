//! Faults against a real redis-server: a server frozen with `DEBUG SLEEP`, a server killed and
//! restarted. (A partitioned holder, a dropped connection and a request cancelled in flight are
//! the conformance suite's `faults` and `waiting` cases.)
//!
//! Server: `REDIS_FAULT_URL` (default `redis://{redis-fault}`, the `redis-fault` server of
//! `scripts/services.sh`, which nothing else uses). The tests freeze and kill it, so they run
//! one at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, Fencing, LeaseState, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::servers;
use test_support::{kill, serial, services};

fn url() -> String {
    std::env::var("REDIS_FAULT_URL").unwrap_or_else(|_| servers::url("redis://{redis-fault}"))
}

fn config() -> RedisConfig {
    RedisConfig::from_url(&url())
        .unwrap()
        .with_request_timeout(Duration::from_millis(250))
        .with_connect_timeout(Duration::from_millis(500))
}

async fn direct() -> RedisLock {
    RedisLock::connect(config())
        .await
        .expect("redis-fault server (start it: scripts/services.sh up redis-fault)")
}

#[test]
fn frozen_server_past_the_ttl_loses_the_lease_and_never_resurrects_it() {
    serial(async {
        let holder = direct().await;
        let other = direct().await;
        let name = fresh_name("frozen");
        let ttl = Duration::from_millis(600);
        let lease = Arc::new(
            holder
                .acquire(&name, &LockOptions::new(ttl).auto_renew(None))
                .await
                .unwrap(),
        );
        let lost = lease.lost();
        // DEBUG SLEEP blocks the whole server; send it from a connection of its own.
        let mut raw = redis::Client::open(url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let freeze = tokio::spawn(async move {
            let _: redis::RedisResult<()> = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("1.5")
                .query_async(&mut raw)
                .await;
        });
        let frozen_at = Instant::now();
        tokio::time::timeout(Duration::from_secs(3), lost.wait())
            .await
            .expect("the lease never turned Lost while the server was frozen");
        let lost_at = Instant::now();
        assert!(
            lost_at < frozen_at + Duration::from_millis(1400),
            "lost only after the server woke up"
        );
        freeze.await.unwrap();
        let next = other
            .acquire(
                &name,
                &LockOptions::new(ttl).wait_for(Duration::from_secs(2)),
            )
            .await
            .expect("the key expired during the freeze; another client must get it");
        assert!(
            lease.renew().await.is_err(),
            "renew succeeded after the lease expired in a frozen server"
        );
        assert!(
            holder
                .try_acquire(&name, &LockOptions::new(ttl))
                .await
                .unwrap()
                .is_none(),
            "lock resurrected for the frozen holder"
        );
        next.release().await.unwrap();
    });
}

#[test]
fn killed_and_restarted_server_loses_locks_and_counters_and_clients_recover() {
    serial(async {
        let holder = direct().await;
        assert_eq!(
            holder.capabilities().fencing,
            Fencing::BestEffort,
            "a server without appendfsync always must not claim strict fencing"
        );
        let name = fresh_name("killed");
        let ttl = Duration::from_millis(800);
        let first = holder.acquire(&name, &LockOptions::new(ttl)).await.unwrap();
        let second_token = {
            first.release().await.unwrap();
            let l = holder
                .acquire(&name, &LockOptions::new(ttl).auto_renew(None))
                .await
                .unwrap();
            let t = l.fencing_token().unwrap();
            (l, t)
        };
        let (lease, token_before) = second_token;
        let lost = lease.lost();
        kill("KILL", services(&["pid", "redis-fault"]));
        tokio::time::timeout(ttl * 2, lost.wait())
            .await
            .expect("lost signal after the server died");
        assert_eq!(lease.state(), LeaseState::Lost);
        services(&["up", "redis-fault"]);
        // The same client recovers by itself.
        let after = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match holder.try_acquire(&name, &LockOptions::new(ttl)).await {
                    Ok(Some(l)) => return l,
                    Ok(None) => {
                        panic!("the restarted server (no persistence) still holds the lock")
                    }
                    Err(e) => {
                        assert!(
                            matches!(e, Error::Unavailable { .. }),
                            "unexpected error while reconnecting: {e:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        })
        .await
        .expect("client did not recover after the server restarted");
        // Why fencing is only BestEffort here: the counter restarted with the server.
        let token_after = after.fencing_token().unwrap();
        assert!(
            token_after <= token_before,
            "counter survived a restart without AOF? {token_after} > {token_before}"
        );
        assert!(
            lease.release().await.is_err(),
            "release of a lease the restart forgot succeeded"
        );
        after.release().await.unwrap();
    });
}

/// The redis-fault server as a conformance harness: plain clients, no link faults.
struct FaultServer;

#[conformance_tests::async_trait]
impl conformance_tests::Harness for FaultServer {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, conformance_tests::BoxError> {
        Ok(Arc::new(RedisLock::connect(config()).await?))
    }
}

/// The documented limit of a Redis without `appendfsync always` (README, guarantees): a crash
/// and restart forgets every lock and the fencing counter. The history checker must show it —
/// tokens that go back after the restart (b); also (a) when a newcomer is granted the forgotten
/// name before the old holder's validity runs out (not here: the restart outlasts the TTL) —
/// or it would miss the same loss in a driver.
#[test]
fn restart_without_persistence_is_caught_by_the_history_checker() {
    use conformance_tests::safety::{run, Kind, Workload};
    serial(async {
        let w = Workload {
            clients: 4,
            names: 1,
            grants: 600,
            limit: Duration::from_secs(20),
            faults: false,
            hold: Duration::from_millis(50),
            ..Workload::short(16391)
        };
        // Crash and restart once the history has tokens to go back from.
        let crash = tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            test_support::restart_servers(&["redis-fault"]).await
        });
        let report = run(&FaultServer, &w).await.unwrap();
        crash.await.unwrap().unwrap();
        let kinds: Vec<Kind> = report.violations.iter().map(|v| v.kind).collect();
        assert!(
            kinds.contains(&Kind::Fencing),
            "a restart that forgot the fencing counter was not reported as a fencing \
             violation; the checker found {kinds:?} in {} grants",
            report.grants
        );
        eprintln!(
            "caught: {} violation(s), kinds {:?}; first: {}",
            report.violations.len(),
            kinds.iter().collect::<std::collections::BTreeSet<_>>(),
            report.violations[0]
        );
    });
}
