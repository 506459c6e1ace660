//! Renewals shared by a client's leases on each master (`lease.rs`), counted on three
//! redis-servers of the test's own (their `INFO commandstats` then count this client's
//! requests only): N leases renewed by their watchdogs cost a few requests per renewal period
//! on each master, not N; every key is really renewed (a writer's on every master, a reader's
//! on the majority that granted it); a lease whose key was
//! deleted on a majority is Lost although the other leases' requests still renew it on the
//! rest; a renewal by hand always runs a round of its own.
//! Needs `redis-server` (`scripts/services.sh install`); lane own-servers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Lease, LeaseState, LockOptions, Mode};
use lock_redlock::RedlockLock;
use test_support::clock::ClockedServer;

/// A connection of the test's own to one master (it runs no scripts).
struct Admin(redis::aio::MultiplexedConnection);

impl Admin {
    async fn new(server: &ClockedServer) -> Admin {
        let client = redis::Client::open(format!("redis://{}", server.addr())).unwrap();
        Admin(client.get_multiplexed_async_connection().await.unwrap())
    }

    async fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        cmd.query_async(&mut self.0).await.unwrap()
    }

    /// Scripts run since the last `CONFIG RESETSTAT`: each grant, renewal request and release
    /// is one.
    async fn scripts_run(&mut self) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]).await;
        ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
            .iter()
            .filter_map(|p| info.lines().find_map(|l| l.strip_prefix(p)))
            .map(|rest| rest.split(',').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    /// The key's remaining time in ms (-2: gone).
    async fn pttl(&mut self, key: &str) -> i64 {
        self.cmd(&["PTTL", key]).await
    }
}

async fn masters() -> (Vec<ClockedServer>, RedlockLock, Vec<Admin>) {
    let servers = ClockedServer::redis(3, 0).await.unwrap();
    let addrs: Vec<String> = servers.iter().map(ClockedServer::addr).collect();
    let locks = RedlockLock::from_url(&format!("redlock://{}", addrs.join(",")))
        .await
        .unwrap();
    let mut admins = Vec::new();
    for s in &servers {
        admins.push(Admin::new(s).await);
    }
    (servers, locks, admins)
}

const TTL: Duration = Duration::from_millis(1500);

fn auto(mode: Mode) -> LockOptions {
    LockOptions::new(TTL).mode(mode).auto_renew(None)
}

#[tokio::test]
async fn many_leases_renew_in_a_few_requests_per_period_and_a_majority_decides() {
    let (_servers, locks, mut admins) = masters().await;
    // 60 leases, writers and readers, granted 5 ms apart so that their renewals fall all over
    // a period (a third of the TTL).
    let mut leases: Vec<Box<dyn Lease>> = Vec::new();
    for i in 0..60 {
        let mode = [Mode::Exclusive, Mode::Shared][i % 2];
        let name = format!("many-{i}").parse().unwrap();
        leases.push(
            locks
                .try_acquire(&name, &auto(mode))
                .await
                .unwrap()
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // One writer's key is taken from it on two masters of three: the others' requests still
    // renew it on the third, which is no majority.
    let taken = leases.remove(0);
    let key = taken.backend_key().unwrap();
    for a in &mut admins[..2] {
        let () = a.cmd(&["DEL", &key]).await;
    }
    for a in &mut admins {
        let () = a.cmd(&["CONFIG", "RESETSTAT"]).await;
    }
    let window = TTL * 3;
    tokio::time::sleep(window).await;
    let periods = (window.as_millis() / (TTL / 3).as_millis()) as u64;
    let mut requests = Vec::new();
    for a in &mut admins {
        requests.push(a.scripts_run().await);
    }
    // Alone, each lease sends one a period to each master: 59 * 9 = 531 per master. Together,
    // about two.
    assert!(
        requests.iter().all(|&r| r <= 4 * periods),
        "59 leases renewed by their watchdogs sent {requests:?} renewals to the three masters in \
         {window:?} ({periods} renewal periods): more than 4 a period on a master, so they do \
         not renew together"
    );
    assert_eq!(
        taken.state(),
        LeaseState::Lost,
        "a lease whose key was deleted on two masters of three is still believed after three \
         TTLs (its key on the third: {} ms left)",
        admins[2].pttl(&key).await
    );
    for (j, l) in leases.iter().enumerate() {
        let mode = [Mode::Exclusive, Mode::Shared][(j + 1) % 2]; // the first was removed
        let key = l.backend_key().unwrap();
        let mut left = Vec::new();
        for a in &mut admins {
            left.push(a.pttl(&key).await);
        }
        // A writer's key is on every master; a reader is a member only where its grant was
        // answered before the majority (the rest join in the background and expire).
        let renewed = left
            .iter()
            .filter(|&&ms| ms > (TTL / 3).as_millis() as i64)
            .count();
        let wanted = if mode == Mode::Exclusive { 3 } else { 2 };
        assert!(
            l.state() == LeaseState::Held && renewed >= wanted,
            "after {window:?} a {:?} lease renewed with others is {:?} and its key {key} has \
             {left:?} ms left on the masters (TTL {TTL:?}): not renewed",
            mode,
            l.state()
        );
    }
    eprintln!("59 leases, {window:?}: {requests:?} renewal requests ({periods} periods)");
    for l in leases {
        l.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_renewal_by_hand_asks_every_master_and_others_do_not_keep_it_alive() {
    let (_servers, locks, mut admins) = masters().await;
    let name = |n: &str| n.parse().unwrap();
    let by_hand = locks
        .try_acquire(&name("by-hand"), &LockOptions::new(TTL).manual_renewal())
        .await
        .unwrap()
        .unwrap();
    let mut renewing = Vec::new();
    for i in 0..20 {
        let n = name(&format!("renewing-{i}"));
        renewing.push(
            locks
                .try_acquire(&n, &auto(Mode::Exclusive))
                .await
                .unwrap()
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let key = by_hand.backend_key().unwrap();
    for _ in 0..2 {
        // Within a quarter of the TTL of the last: what a watchdog would take from the book.
        tokio::time::sleep(Duration::from_millis(350)).await;
        let asked = Instant::now();
        by_hand.renew().await.unwrap();
        for a in &mut admins {
            let left = a.pttl(&key).await;
            assert!(
                by_hand.valid_until() >= asked + TTL * 8 / 10 && left > 1250,
                "a renewal by hand did not renew on every master: valid {:?} after it was \
                 asked, the key {left} ms left on one",
                by_hand.valid_until().saturating_duration_since(asked)
            );
        }
    }
    let last = Instant::now();
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    for a in &mut admins {
        assert_eq!(
            a.pttl(&key).await,
            -2,
            "a lease renewed by hand was kept alive by the other leases' renewals ({key} still \
             exists {:?} after its holder's last renewal, TTL {TTL:?})",
            last.elapsed()
        );
    }
    for l in &renewing {
        assert_eq!(l.state(), LeaseState::Held);
    }
}
