//! Renewals shared by a client's leases (`renewals.rs`), counted on a Redis server of the test's
//! own (its `INFO commandstats` then counts this client's requests only): N leases renewed by
//! their watchdogs cost a few requests per renewal period, not N, and every key is really
//! renewed; a lease renewed by hand, past its `max_hold`, or whose key was taken from it is
//! renewed on nobody's behalf; a renewal by hand always asks the server.
//! Needs `redis-server` (`scripts/services.sh install`); lane own-servers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Lease, LeaseState, LockOptions, Mode};
use lock_redis::{RedisConfig, RedisLock};
use test_support::ports::free_ports;

/// A `redis-server` of the test's own, killed with it.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn server() -> Server {
    let held = free_ports(1);
    let port = held.numbers()[0];
    held.release();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/services.sh install)");
    let server = Server { child, port };
    let started = Instant::now();
    while server.cli(&["PING"]).trim() != "PONG" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server
}

impl Server {
    /// `redis-cli`, for the start only: the checks go by [`Admin`], for a process started
    /// meanwhile would hold up the test's runtime and its watchdogs with it.
    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn locks(&self) -> RedisLock {
        RedisLock::connect(RedisConfig::from_url(&self.url()).unwrap())
            .await
            .unwrap()
    }

    async fn admin(&self) -> Admin {
        let client = redis::Client::open(self.url()).unwrap();
        Admin(client.get_multiplexed_async_connection().await.unwrap())
    }
}

/// A connection of the test's own to its server (it runs no scripts).
struct Admin(redis::aio::MultiplexedConnection);

impl Admin {
    async fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        cmd.query_async(&mut self.0).await.unwrap()
    }

    /// Scripts run since the last `CONFIG RESETSTAT` (`EVALSHA` and `EVAL`): each grant,
    /// renewal request and release is one.
    async fn scripts_run(&mut self) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]).await;
        ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
            .iter()
            .filter_map(|p| info.lines().find_map(|l| l.strip_prefix(p)))
            .map(|rest| rest.split(',').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    async fn reset_stats(&mut self) {
        let () = self.cmd(&["CONFIG", "RESETSTAT"]).await;
    }

    /// The key's remaining time in ms (-2: gone).
    async fn pttl(&mut self, key: &str) -> i64 {
        self.cmd(&["PTTL", key]).await
    }
}

const TTL: Duration = Duration::from_millis(1500);

fn auto(mode: Mode) -> LockOptions {
    LockOptions::new(TTL).mode(mode).auto_renew(None)
}

#[tokio::test]
async fn many_leases_renew_in_a_few_requests_per_period_and_each_key_is_renewed() {
    let server = server().await;
    let (locks, mut admin) = (server.locks().await, server.admin().await);
    // 200 leases of every kind the script renews (exclusive, shared, permits), granted
    // 2.5 ms apart so that their renewals fall all over a period (a third of the TTL).
    let mut leases: Vec<Box<dyn Lease>> = Vec::new();
    for i in 0..200 {
        let mode = [Mode::Exclusive, Mode::Shared, Mode::Permits(2)][i % 3];
        let name = format!("many-{i}").parse().unwrap();
        leases.push(
            locks
                .try_acquire(&name, &auto(mode))
                .await
                .unwrap()
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_micros(2500)).await;
    }
    // One key is taken from its holder: the next shared request refuses it, and only it.
    let taken = leases.remove(0);
    let () = admin.cmd(&["DEL", &taken.backend_key().unwrap()]).await;
    admin.reset_stats().await;
    let window = TTL * 3;
    tokio::time::sleep(window).await;
    let requests = admin.scripts_run().await;
    let periods = (window.as_millis() / (TTL / 3).as_millis()) as u64;
    // Alone, each lease sends one a period: 199 * 9 = 1,791. Together, about two a period.
    assert!(
        requests <= 4 * periods,
        "199 leases renewed by their watchdogs sent {requests} renewals in {window:?} ({periods} \
         renewal periods): more than 4 a period, so they do not renew together"
    );
    assert_eq!(
        taken.state(),
        LeaseState::Lost,
        "a lease whose key was deleted is still believed after three TTLs"
    );
    for l in &leases {
        let key = l.backend_key().unwrap();
        let left = admin.pttl(&key).await;
        assert!(
            l.state() == LeaseState::Held && left > (TTL / 3).as_millis() as i64,
            "after {window:?} a lease renewed with others is {:?} and its key {key} has {left} \
             ms left (TTL {TTL:?}): not renewed",
            l.state()
        );
    }
    eprintln!("199 leases, {window:?}: {requests} renewal requests ({periods} periods)");
    for l in leases {
        l.release().await.unwrap();
    }
}

#[tokio::test]
async fn only_watchdogs_within_max_hold_are_renewed_on_others_behalf_and_by_hand_always_asks() {
    let server = server().await;
    let (locks, mut admin) = (server.locks().await, server.admin().await);
    let name = |n: &str| n.parse().unwrap();
    let by_hand = locks
        .try_acquire(&name("by-hand"), &LockOptions::new(TTL).manual_renewal())
        .await
        .unwrap()
        .unwrap();
    let capped = LockOptions::new(TTL).auto_renew(Some(Duration::from_millis(300)));
    let capped = locks
        .try_acquire(&name("capped"), &capped)
        .await
        .unwrap()
        .unwrap();
    // Leases renewed by watchdogs all along, granted so that some renewal is under way at every
    // moment of the window.
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
    // By hand: each renewal asks the server, even while others' renewals are under way (an
    // answer from the book would be the grant's, half a second old).
    for _ in 0..2 {
        // Within a quarter of the TTL of the last: what a watchdog would take from the book.
        tokio::time::sleep(Duration::from_millis(350)).await;
        let asked = Instant::now();
        by_hand.renew().await.unwrap();
        let left = admin.pttl(&by_hand.backend_key().unwrap()).await;
        assert!(
            // An answer from the book would be 350 ms old: valid for under 1,150 ms more, its
            // key (not renewed) under 1,150 ms left; a slow test gets 250 ms of room.
            by_hand.valid_until() >= asked + TTL * 9 / 10 && left > 1250,
            "a renewal by hand did not renew: valid {:?} after it was asked, the key {left} ms left",
            by_hand.valid_until().saturating_duration_since(asked)
        );
    }
    let last = Instant::now(); // the holder's last renewal by hand; max_hold passed before
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    for (what, lease) in [
        ("renewed by hand", &by_hand),
        ("past its max_hold", &capped),
    ] {
        let key = lease.backend_key().unwrap();
        assert_eq!(
            admin.pttl(&key).await,
            -2,
            "a lease {what} was kept alive by the other leases' renewals ({key} still exists \
             {:?} after its holder's last renewal, TTL {TTL:?})",
            last.elapsed()
        );
    }
    for l in &renewing {
        assert_eq!(l.state(), LeaseState::Held);
    }
}
