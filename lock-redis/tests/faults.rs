//! Faults against a real redis-server: partitions and cuts through the suite's `FaultProxy`, a
//! server frozen with `DEBUG SLEEP`, a server killed and restarted.
//!
//! Server: `REDIS_FAULT_URL` (default `redis://127.0.0.1:16391`, the `redis-fault` server of
//! `scripts/services.sh`, which nothing else uses). The tests freeze and kill it, so they run
//! one at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, Error, Fencing, LeaseState, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::{kill, serial, services};

fn url() -> String {
    std::env::var("REDIS_FAULT_URL").unwrap_or_else(|_| "redis://127.0.0.1:16391".into())
}

fn config() -> RedisConfig {
    RedisConfig::from_url(&url())
        .unwrap()
        .with_request_timeout(Duration::from_millis(250))
        .with_connect_timeout(Duration::from_millis(500))
}

fn server_addr() -> SocketAddr {
    let c = config();
    format!("{}:{}", c.host(), c.port()).parse().unwrap()
}

async fn direct() -> RedisLock {
    RedisLock::connect(config())
        .await
        .expect("redis-fault server (start it: scripts/services.sh up redis-fault)")
}

async fn via(proxy: &FaultProxy) -> RedisLock {
    let a = proxy.addr();
    RedisLock::connect(
        RedisConfig::new(a.ip().to_string(), a.port())
            .with_request_timeout(Duration::from_millis(250))
            .with_connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap()
}

/// Records every state the lease passes through, sampled every 10 ms, until it is Lost.
fn record_states(
    lease: &Arc<Box<dyn lock_core::Lease>>,
) -> tokio::task::JoinHandle<(Vec<LeaseState>, Instant)> {
    let lease = lease.clone();
    tokio::spawn(async move {
        let mut seen = vec![];
        loop {
            let s = lease.state();
            if seen.last() != Some(&s) {
                seen.push(s);
            }
            if s == LeaseState::Lost {
                return (seen, Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

#[test]
fn partitioned_holder_knows_before_anyone_else_is_granted() {
    serial(async {
        let proxy = FaultProxy::start(server_addr()).unwrap();
        let holder = via(&proxy).await;
        let other = direct().await;
        let name = fresh_name("partition");
        let ttl = Duration::from_millis(900);
        let lease = Arc::new(
            holder
                .acquire(&name, &LockOptions::new(ttl).auto_renew(None))
                .await
                .unwrap(),
        );
        let states = record_states(&lease);
        proxy.blackhole();
        let next = other
            .acquire(&name, &LockOptions::new(ttl).wait_for(ttl * 4))
            .await
            .expect("the lock must be granted once the partitioned holder's key expires");
        let granted = Instant::now();
        let (seen, lost_at) = tokio::time::timeout(Duration::from_secs(1), states)
            .await
            .unwrap()
            .unwrap();
        assert!(
            lost_at <= granted,
            "holder learned of the loss {:?} after another client was granted",
            lost_at - granted
        );
        assert!(
            lease.valid_until() <= granted,
            "granted before the holder's valid_until"
        );
        assert_eq!(seen.first(), Some(&LeaseState::Held));
        assert!(
            seen.contains(&LeaseState::AtRisk),
            "never AtRisk while renewals failed: {seen:?}"
        );
        assert_eq!(seen.last(), Some(&LeaseState::Lost));
        next.release().await.unwrap();
        // Healed: the same client works again, no restart needed.
        proxy.heal();
        let again = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match holder
                    .try_acquire(&fresh_name("healed"), &LockOptions::new(ttl))
                    .await
                {
                    Ok(Some(l)) => return l,
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        })
        .await
        .expect("client did not recover after the partition healed");
        again.release().await.unwrap();
    });
}

#[test]
fn cut_connection_is_survived_by_an_auto_renewed_lease() {
    serial(async {
        let proxy = FaultProxy::start(server_addr()).unwrap();
        let holder = via(&proxy).await;
        let other = direct().await;
        let name = fresh_name("cut");
        let ttl = Duration::from_millis(1500);
        let lease = holder
            .acquire(&name, &LockOptions::new(ttl).auto_renew(None))
            .await
            .unwrap();
        let connections = proxy.connections();
        proxy.cut();
        tokio::time::sleep(ttl * 2).await;
        assert!(
            proxy.connections() > connections,
            "the client did not reconnect after the cut"
        );
        assert_eq!(
            lease.state(),
            LeaseState::Held,
            "lease did not recover after a reconnect"
        );
        assert!(
            other
                .try_acquire(&name, &LockOptions::new(ttl))
                .await
                .unwrap()
                .is_none(),
            "lock lost across a reconnect"
        );
        lease.release().await.unwrap();
        let l = other
            .try_acquire(&name, &LockOptions::new(ttl))
            .await
            .unwrap()
            .expect("free after release");
        l.release().await.unwrap();
    });
}

#[test]
fn acquire_cancelled_mid_request_leaves_no_holder() {
    serial(async {
        // The server answers 200 ms late; the caller gives up after 50 ms, while its request is
        // on its way. The request still grants, so the client must undo it.
        let proxy = FaultProxy::start(server_addr()).unwrap();
        let client = via(&proxy).await;
        let other = direct().await;
        let name = fresh_name("cancelled");
        let opts = LockOptions::new(Duration::from_secs(10));
        proxy.delay(Duration::from_millis(100));
        let r = tokio::time::timeout(
            Duration::from_millis(50),
            client.acquire(&name, &opts.clone().no_wait()),
        )
        .await;
        assert!(r.is_err(), "the attempt finished before it was cancelled");
        tokio::time::sleep(Duration::from_millis(600)).await;
        let l = other
            .try_acquire(&name, &opts)
            .await
            .unwrap()
            .expect("a cancelled acquire left a ghost holder");
        l.release().await.unwrap();
    });
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
        let states = record_states(&lease);
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
        let (_, lost_at) = tokio::time::timeout(Duration::from_secs(3), states)
            .await
            .unwrap()
            .unwrap();
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
