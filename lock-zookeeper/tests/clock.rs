//! ZooKeeper under steps of the server's wall clock (`test_support::clock`: a standalone
//! server of the test's own). ZooKeeper counts sessions, and so locks, on its monotonic clock:
//! a step of its time of day neither ends a held lock nor keeps a dead holder's lock longer.
//! (On Redis the same steps do both: `lock-redis/tests/clock.rs`; RELIABILITY.md, "Clock
//! faults".) The step is confirmed first through the `mtime` ZooKeeper gives a new node.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use conformance_tests::{fresh_name, ClockStep, FaultProxy};
use lock_core::{DistributedLock, LeaseState, LockOptions};
use lock_zookeeper::{ZkConfig, ZkLock};
use test_support::clock::ClockedServer;
use test_support::serial;

const SESSION: Duration = Duration::from_secs(2);

async fn zk(hosts: &str) -> ZkLock {
    ZkLock::connect(ZkConfig::new(hosts).with_session_timeout(SESSION))
        .await
        .unwrap()
}

/// For `span`, the lock stays with `lease`: nobody else is granted it, and the lease stays
/// Held.
async fn stays_held(lease: &dyn lock_core::Lease, other: &ZkLock, span: Duration, what: &str) {
    let opts = LockOptions::new(SESSION).manual_renewal();
    let until = Instant::now() + span;
    while Instant::now() < until {
        let second = other.try_acquire(lease.name(), &opts).await.unwrap();
        assert!(
            second.is_none(),
            "{what}: a second holder was granted {:?} before the end of the check",
            until.saturating_duration_since(Instant::now())
        );
        assert_eq!(
            lease.state(),
            LeaseState::Held,
            "{what}: the holder's lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn a_step_of_the_servers_clock_neither_ends_a_lock_nor_keeps_a_dead_holders() {
    serial(async {
        let server = ClockedServer::zookeeper(0).await.unwrap();
        let proxy = FaultProxy::start(server.addr().parse().unwrap()).unwrap();
        let (holder, other) = (
            zk(&proxy.addr().to_string()).await,
            zk(&server.addr()).await,
        );
        let name = fresh_name("clock-zk");
        let lease = holder
            .acquire(&name, &LockOptions::new(SESSION).auto_renew(None))
            .await
            .unwrap();
        let step = Duration::from_secs(60);

        server.set_step(ClockStep::Ahead(step)).await.unwrap();
        stays_held(&*lease, &other, SESSION * 3, "after a 60 s forward step").await;
        server.set_step(ClockStep::Behind(step)).await.unwrap();
        stays_held(&*lease, &other, SESSION * 3, "after a 60 s backward step").await;

        // The holder dies (its connection goes silent) while the clock is 60 s behind: its
        // lock is free after the session timeout, not the session timeout plus the step.
        let lost = lease.lost();
        proxy.blackhole();
        let cut = Instant::now();
        let second = other
            .acquire(
                &name,
                &LockOptions::new(SESSION).wait_for(Duration::from_secs(30)),
            )
            .await
            .unwrap();
        let freed = cut.elapsed();
        println!(
            "ZooKeeper, clock 60 s behind: a cut-off holder's lock was free {freed:?} after the \
             cut (session timeout {SESSION:?})"
        );
        assert!(
            freed < SESSION * 3,
            "a cut-off holder's lock should be free about one session timeout ({SESSION:?}) \
             after the cut, whatever the server's time of day; it took {freed:?}"
        );
        assert!(
            lost.is_lost(),
            "the cut-off holder must know it lost the lock before a second holder is granted"
        );
        second.release().await.unwrap();
    });
}

/// A clocked ZooKeeper as a conformance harness, for the suite's cases about the server's
/// clock.
struct OnClockedZk(std::sync::Arc<ClockedServer>);

#[conformance_tests::async_trait]
impl conformance_tests::Harness for OnClockedZk {
    async fn client(
        &self,
    ) -> Result<std::sync::Arc<dyn DistributedLock>, conformance_tests::BoxError> {
        Ok(std::sync::Arc::new(zk(&self.0.addr()).await))
    }
    fn timing(&self) -> conformance_tests::Timing {
        conformance_tests::Timing::for_ttl(SESSION)
    }
    fn servers(&self) -> Option<std::sync::Arc<dyn conformance_tests::Servers>> {
        Some(self.0.clone())
    }
}

/// What ZooKeeper declares (`expires_by = Elapsed`, fencing by `czxid`) against the suite's
/// own cases, on a server whose time of day steps.
#[test]
fn the_suites_clock_cases_pass() {
    serial(async {
        let h = OnClockedZk(std::sync::Arc::new(
            ClockedServer::zookeeper(0).await.unwrap(),
        ));
        use conformance_tests::cases::server;
        server::a_step_of_the_servers_clock_does_not_move_expiry(&h)
            .await
            .unwrap();
        server::tokens_do_not_follow_the_servers_clock(&h)
            .await
            .unwrap();
    });
}
