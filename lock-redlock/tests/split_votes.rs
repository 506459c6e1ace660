//! Split votes: when racers each take a minority of the masters, no holder has a majority and
//! nobody holds the lock. Refusals from a majority of masters are then not "held": a racer that
//! gave up on them would leave the lock to nobody. Masters: `redlock1`..`redlock5`
//! (`redlock1`–`redlock5`) of `scripts/services.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, LockName, LockOptions};
use lock_redis::raw::scripts::LockKeys;
use lock_redis::{RedisConfig, DEFAULT_PREFIX};
use lock_redlock::{RedlockConfig, RedlockLock};

mod support;
use support::ports;

fn config() -> RedlockConfig {
    RedlockConfig::new(
        ports()
            .iter()
            .map(|p| RedisConfig::new("127.0.0.1", *p))
            .collect(),
    )
    .unwrap()
}

/// A client that retries a split vote up to 20 times, with pauses of up to 100 ms.
async fn patient() -> RedlockLock {
    RedlockLock::connect(
        config()
            .with_retry_count(20)
            .with_retry_delay(Duration::from_millis(100)),
    )
    .await
    .expect("Redlock masters (start them: scripts/services.sh up)")
}

/// Writes `value` as the lock key of `name` on the master at `port`, as a racer's partial grant
/// would be, expiring after `ttl`.
async fn plant(port: u16, name: &LockName, value: &str, ttl: Duration) {
    let mut c = support::direct_conn(port).await;
    let keys = LockKeys::new(DEFAULT_PREFIX, name);
    let _: () = redis::cmd("SET")
        .arg(&keys.lock)
        .arg(value)
        .arg("PX")
        .arg(u64::try_from(ttl.as_millis()).unwrap())
        .query_async(&mut c)
        .await
        .unwrap();
}

/// Two racers' leftovers, on two masters and one: a try_acquire gets the other two, sees three
/// refusals, and must retry (Redlock's split-vote rule) rather than report the lock held — no
/// one holds a majority. The leftovers expire after 100 ms, well within the retries allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_from_a_majority_of_different_holders_are_a_split_not_a_holder() {
    let lock = patient().await;
    let name = fresh_name("split");
    let ttl = Duration::from_millis(100);
    let planted = Instant::now();
    plant(ports()[0], &name, "distlock-racer-a", ttl).await;
    plant(ports()[1], &name, "distlock-racer-a", ttl).await;
    plant(ports()[2], &name, "distlock-racer-b", ttl).await;
    let inspected = lock.inspect(&name).await.unwrap();
    assert!(
        inspected.is_none(),
        "inspect called a 2–1 split held: {inspected:?}"
    );
    let got = lock
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    let lease = got.unwrap_or_else(|| {
        panic!(
            "try_acquire gave up {:?} after planting a 2–1 split whose keys expire after {ttl:?}: \
             it took three refusals from two different holders for a held lock",
            planted.elapsed()
        )
    });
    lease.release().await.unwrap();
}

/// The same refusals from one holder are a held lock: try_acquire returns `None` at once,
/// without spending its split-vote retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_from_a_majority_for_one_holder_are_held() {
    let lock = patient().await;
    let name = fresh_name("held");
    for p in &ports()[..3] {
        plant(*p, &name, "distlock-holder", Duration::from_secs(5)).await;
    }
    let started = Instant::now();
    let got = lock
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(got.is_none(), "a lock held on 3 of 5 masters was granted");
    // Twenty retries would take about a second; one attempt takes a round trip.
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "try_acquire on a lock held by a majority took {:?}: it retried as if votes split",
        started.elapsed()
    );
}

/// Five clients, the i-th 0 ms from master i and 20 ms (each way, through its own fault proxy)
/// from the other four, retrying a split vote `retry_count` times: whatever they race for
/// together, each one's nearest master grants to it first, so a first round splits five ways.
async fn split_by_latency(retry_count: u32) -> (Vec<Arc<RedlockLock>>, Vec<FaultProxy>) {
    let far = Duration::from_millis(20);
    let mut proxies = Vec::new();
    let mut clients = Vec::new();
    for racer in 0..ports().len() {
        let mut masters = Vec::new();
        for (m, port) in ports().iter().enumerate() {
            let p = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], *port))).unwrap();
            if m != racer {
                p.delay(far);
            }
            masters.push(RedisConfig::new("127.0.0.1", p.addr().port()));
            proxies.push(p);
        }
        // The per-node timeout well above the far masters' round trip, so that they vote.
        let cfg = RedlockConfig::new(masters)
            .unwrap()
            .with_retry_count(retry_count)
            .with_node_timeout(Duration::from_millis(200));
        clients.push(Arc::new(RedlockLock::connect(cfg).await.unwrap()));
    }
    (clients, proxies)
}

/// The five racers of [`split_by_latency`] start try_acquire together; the first round always
/// splits five ways. Every race must still end with exactly one winner. A driver that takes
/// four refusals for a held lock gives up everywhere: no winner, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racers_split_by_latency_still_elect_exactly_one_winner() {
    const RACES: usize = 5;
    // Retries are what resolves a split; more of them than the default so that this test is
    // about telling a split from a holder, not about the odds of three random pauses.
    let (clients, proxies) = split_by_latency(10).await;
    let opts = LockOptions::new(Duration::from_secs(10));
    let mut outcomes = Vec::new();
    for _ in 0..RACES {
        let name = fresh_name("race");
        let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
        let tasks: Vec<_> = clients
            .iter()
            .map(|c| {
                let (c, name, opts, barrier) =
                    (c.clone(), name.clone(), opts.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    c.try_acquire(&name, &opts).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            if let Some(l) = t.await.unwrap().unwrap() {
                winners.push(l);
            }
        }
        outcomes.push(winners.len());
        for w in winners {
            w.release().await.unwrap();
        }
    }
    assert!(
        outcomes.iter().all(|n| *n == 1),
        "winners per race of five racers whose first round splits the masters: {outcomes:?} \
         (each race must have exactly one)"
    );
    drop(proxies);
}

/// The five clients of [`split_by_latency`], with the default retries, each wait (up to 20 s)
/// for the same free lock, hold it 10 ms and release it: every one of them gets its turn. Their
/// retries are woken together by each other's cleanup announcements, which must not keep them
/// splitting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_split_by_latency_each_get_a_turn() {
    let (clients, proxies) = split_by_latency(3).await;
    let name = fresh_name("wait-race");
    let opts = LockOptions::new(Duration::from_secs(10)).wait_for(Duration::from_secs(20));
    let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            let (c, name, opts, barrier) = (c.clone(), name.clone(), opts.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let lease = c.acquire(&name, &opts).await?;
                tokio::time::sleep(Duration::from_millis(10)).await;
                lease.release().await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        if let Err(e) = t.await.unwrap() {
            panic!("waiter {i} of 5 on a lock each holds for 10 ms did not get its turn: {e}");
        }
    }
    drop(proxies);
}
