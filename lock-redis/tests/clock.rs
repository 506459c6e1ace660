//! The server's wall clock, stepped and skewed (`test_support::clock`: redis-servers of the
//! test's own, no persistence). Redis expires a key at an absolute time of day, so its clock
//! decides when a lock ends; the holder counts its validity on its own monotonic clock. These
//! tests measure what that means, and pin down the documented limits (lib docs, "Failure
//! modes"; RELIABILITY.md, "Clock faults"):
//!
//! - a forward step ends every lock with less time left than the step, at once: a second
//!   holder is granted while the first still believes; the fencing token orders the two, and
//!   the first learns it at its next renewal (with the watchdog: within a third of the TTL);
//! - a backward step keeps an abandoned lock for the TTL plus the step;
//! - a clock that runs fast is covered by the drift allowance (1 % of the TTL + 2 ms) up to
//!   about 1 %, and no further.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::safety::{run, seed, Kind, Workload};
use conformance_tests::{fresh_name, BoxError, ClockStep, Harness, Servers};
use lock_core::{DistributedLock, Error, LeaseState, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::clock::ClockedServer;
use test_support::serial;

/// A clocked server running `ppm` fast, and two clients of it.
async fn server_and_clients(ppm: i64) -> (ClockedServer, RedisLock, RedisLock) {
    let server = ClockedServer::redis(1, ppm).await.unwrap().remove(0);
    let client = || RedisLock::connect(RedisConfig::new("127.0.0.1", server.port()));
    let (holder, other) = (client().await.unwrap(), client().await.unwrap());
    (server, holder, other)
}

#[test]
fn a_forward_step_ends_a_held_lock_at_once_and_the_token_orders_the_two_holders() {
    serial(async {
        let (server, holder, other) = server_and_clients(0).await;
        let name = fresh_name("clock-forward");
        let opts = LockOptions::new(Duration::from_secs(10)).manual_renewal();
        let first = holder.try_acquire(&name, &opts).await.unwrap().unwrap();
        assert!(
            other.try_acquire(&name, &opts).await.unwrap().is_none(),
            "mutual exclusion before any clock fault: a second holder was granted"
        );

        server
            .set_step(ClockStep::Ahead(Duration::from_secs(20)))
            .await
            .unwrap();
        let second = other.try_acquire(&name, &opts).await.unwrap().expect(
            "the documented limit: a forward step of the server's clock past a key's expiry \
             ends the lock at once. If the driver now refuses, it has a defence the docs must \
             describe",
        );
        let believed = first
            .valid_until()
            .saturating_duration_since(Instant::now());
        println!(
            "forward step of 20 s: a second holder granted while the first still believed in \
             {believed:?} of validity"
        );
        assert!(
            believed > Duration::from_secs(5) && first.state() == LeaseState::Held,
            "the first holder should still believe (state {:?}, {believed:?} left): nothing \
             told it",
            first.state()
        );
        let (t1, t2) = (
            first.fencing_token().unwrap(),
            second.fencing_token().unwrap(),
        );
        assert!(
            t2 > t1,
            "fencing: the second holder's token {t2:?} must be above the first's {t1:?}, so a \
             fenced resource refuses the first"
        );

        // The first holder learns at its next renewal.
        let lost = first.lost();
        let err = first.renew().await.unwrap_err();
        assert!(
            matches!(err, Error::NotHeld { .. } | Error::Lost { .. }),
            "renewing a lease whose key another holder now owns must be NotHeld or Lost, got {err:?}"
        );
        assert!(
            lost.is_lost(),
            "the lost signal did not fire with the Lost renewal"
        );
        second.release().await.unwrap();
    });
}

#[test]
fn with_the_watchdog_a_holder_stepped_out_learns_it_within_a_third_of_the_ttl() {
    serial(async {
        let (server, holder, other) = server_and_clients(0).await;
        let name = fresh_name("clock-watchdog");
        let ttl = Duration::from_secs(3);
        let first = holder
            .acquire(&name, &LockOptions::new(ttl).auto_renew(None))
            .await
            .unwrap();
        let lost = first.lost();
        server
            .set_step(ClockStep::Ahead(Duration::from_secs(60)))
            .await
            .unwrap();
        let second = other
            .try_acquire(&name, &LockOptions::new(ttl).manual_renewal())
            .await
            .unwrap()
            .expect("a forward step past the key's expiry ends the lock at once");
        let granted = Instant::now();
        let bound = ttl / 3 + Duration::from_millis(500);
        tokio::time::timeout(bound, lost.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the first holder's watchdog renews every TTL/3 ({:?}): its lost signal \
                     should fire within {bound:?} of the second grant, state is {:?}",
                    ttl / 3,
                    first.state()
                )
            });
        println!(
            "forward step of 60 s under the watchdog (TTL {ttl:?}): the stepped-out holder \
             learnt it {:?} after the second grant",
            granted.elapsed()
        );
        second.release().await.unwrap();
    });
}

#[test]
fn a_backward_step_keeps_an_abandoned_lock_for_the_ttl_plus_the_step() {
    serial(async {
        let (server, holder, other) = server_and_clients(0).await;
        let name = fresh_name("clock-back");
        let ttl = Duration::from_secs(2);
        let back = Duration::from_secs(3);
        let opts = LockOptions::new(ttl).manual_renewal();
        let acquired = Instant::now();
        holder
            .try_acquire(&name, &opts)
            .await
            .unwrap()
            .unwrap()
            .abandon();
        server.set_step(ClockStep::Behind(back)).await.unwrap();
        let second = other
            .acquire(&name, &opts.clone().wait_for(Duration::from_secs(15)))
            .await
            .unwrap();
        let waited = acquired.elapsed();
        println!("backward step of {back:?}: an abandoned {ttl:?} lock was free after {waited:?}");
        assert!(
            waited >= ttl + back - Duration::from_millis(300)
                && waited <= ttl + back + Duration::from_secs(2),
            "an abandoned lock should outlive its TTL {ttl:?} by the backward step {back:?}, \
             was free after {waited:?}"
        );
        second.release().await.unwrap();
    });
}

/// How long a lease's holder still believed in it when a contender polling every millisecond
/// was granted the lock (zero: it no longer did), on a server whose clock runs `ppm` fast.
async fn overlap_on_a_fast_clock(ppm: i64, ttl: Duration) -> Duration {
    let (_server, holder, other) = server_and_clients(ppm).await;
    let name = fresh_name("clock-fast");
    let opts = LockOptions::new(ttl).manual_renewal();
    let first = holder.try_acquire(&name, &opts).await.unwrap().unwrap();
    let deadline = Instant::now() + ttl * 2;
    loop {
        if let Some(second) = other.try_acquire(&name, &opts).await.unwrap() {
            let overlap = first
                .valid_until()
                .saturating_duration_since(Instant::now());
            second.release().await.unwrap();
            return overlap;
        }
        assert!(Instant::now() < deadline, "never granted within two TTLs");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn a_server_clock_running_fast_is_covered_up_to_the_drift_allowance() {
    serial(async {
        let ttl = Duration::from_secs(5);
        let mut rows = Vec::new();
        for ppm in [0, 5_000, 9_000, 15_000, 30_000] {
            let overlap = overlap_on_a_fast_clock(ppm, ttl).await;
            println!(
                "server clock {:.1} % fast, TTL {ttl:?}: holder still believed {overlap:?}",
                ppm as f64 / 1e4
            );
            rows.push((ppm, overlap));
        }
        for (ppm, overlap) in rows {
            // Within 1 % (the drift allowance, less a margin for the 1 ms expiry precision)
            // the holder stops believing before the key expires; at 3 % it cannot (the
            // expected overlap is ~90 ms, which also shows the check can see one).
            if ppm <= 9_000 {
                assert_eq!(
                    overlap,
                    Duration::ZERO,
                    "a server clock {ppm} ppm fast is within the drift allowance, yet a second \
                     holder was granted while the first still believed for {overlap:?}"
                );
            } else if ppm >= 30_000 {
                assert!(
                    overlap > Duration::ZERO,
                    "a server clock {ppm} ppm fast is beyond the drift allowance: the overlap \
                     should show (is the rate in effect?)"
                );
            }
        }
    });
}

/// A clocked server as a conformance harness: plain clients of it, and the server for the
/// nemesis, which here only steps its clock.
struct OnClockedRedis(Arc<ClockedServer>);

#[conformance_tests::async_trait]
impl Harness for OnClockedRedis {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        let config = RedisConfig::new("127.0.0.1", self.0.port());
        Ok(Arc::new(RedisLock::connect(config).await?))
    }
    fn servers(&self) -> Option<Arc<dyn Servers>> {
        Some(self.0.clone())
    }
}

/// The nemesis's clock steps bite where the backend ends locks by its time of day: under the
/// safety workload with only clock faults, the history checker must report what they do to
/// Redis (a lock ended early: an overlap (a), or a holder that had not seen its loss (c)).
/// Every step strikes with a forward jump somewhere: a step ahead at once, a step behind when
/// it heals (keys set meanwhile are then past their end). The same nemesis finds nothing on
/// ZooKeeper (`lock-zookeeper/tests/partition.rs`, `a_history_under_clock_steps_is_clean`).
#[test]
fn clock_steps_on_redis_are_caught_by_the_history_checker() {
    serial(async {
        let server = Arc::new(ClockedServer::redis(1, 0).await.unwrap().remove(0));
        // One name, and three holds in ten 1–3 TTLs long: a step that ends a hold early finds
        // waiters ready to take the name.
        let w = Workload {
            names: 1,
            long_per_mille: 300,
            limit: Duration::from_secs(30),
            fault_kinds: Some(&["clock"]),
            min_faults: 4,
            ..Workload::short(seed())
        };
        let report = run(&OnClockedRedis(server), &w).await.unwrap();
        let steps = report.faults.get("clock").copied().unwrap_or(0);
        let kinds: BTreeSet<Kind> = report.violations.iter().map(|v| v.kind).collect();
        println!(
            "clock steps on Redis: {steps} steps, {} grants, violations {:?} (seed {})",
            report.grants,
            report.violations_by_kind(),
            report.seed
        );
        assert!(
            steps >= 2,
            "the nemesis made {steps} clock step(s): no test"
        );
        assert!(
            kinds.contains(&Kind::Overlap) || kinds.contains(&Kind::LossNotSeen),
            "{steps} steps of the Redis server's clock under the workload, and the checker \
             reported no overlap and no unseen loss (found {kinds:?} in {} grants, seed {})",
            report.grants,
            report.seed
        );
    });
}

/// The suite's cases about the server's clock, on Redis: tokens (an `INCR` counter) do not
/// follow the time of day; expiry does, as Redis declares (`expires_by = TimeOfDay`), so the
/// case that a driver declaring `Elapsed` must pass fails here — on a real backend that ends
/// locks by its time of day, which is the flaw that case is written to catch.
#[test]
fn the_suites_clock_cases_on_redis() {
    serial(async {
        let server = Arc::new(ClockedServer::redis(1, 0).await.unwrap().remove(0));
        let h = OnClockedRedis(server);
        use conformance_tests::cases::server;
        server::tokens_do_not_follow_the_servers_clock(&h)
            .await
            .unwrap();
        let declared = h.client().await.unwrap().capabilities().expires_by;
        assert_eq!(declared, lock_core::ExpiryClock::TimeOfDay);
        let caught = server::a_step_of_the_servers_clock_does_not_move_expiry(&h).await;
        println!("Redis under the case for `expires_by = Elapsed`: {caught:?}");
        assert!(
            caught.is_err(),
            "a step of the Redis server's clock ended no lock: the case cannot see what it is \
             written to catch (or the step was not in effect)"
        );
    });
}
