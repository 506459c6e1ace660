//! The history checker's workload on a cluster a test started itself ([`Cluster`]), while the
//! nemesis partitions its members: what a proxy between clients and servers cannot do, under
//! the many clients and grants of the safety run rather than one holder and one waiter.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::safety::{draw, run, seed, Report, Workload};
use conformance_tests::{ClockStep, Harness, Partition, Servers, Timing};
use lock_core::{BoxError, DistributedLock};

use crate::partition::{Cluster, Fault, Faults};

/// A [`Harness`] over a test's own cluster: each client talks to the next member in turn (and
/// lists every member if the cluster's [`Parts::every`](crate::partition::Parts::every) says
/// so); its [`Servers`] freeze members by pid, partition them through their links
/// ([`Fault::Isolate`], [`Fault::Between`], [`Fault::Mute`]) and, where the members run under
/// the clock shim ([`Parts::clocks`](crate::partition::Parts::clocks)), step their clocks. They
/// are not restarted: the members are the test's children.
struct OwnCluster<C> {
    cluster: Arc<C>,
    /// Its members, as the nemesis breaks them: one for the run, which knows every fault in
    /// force.
    servers: Arc<ClusterServers<C>>,
    next: AtomicUsize,
    ttl: Duration,
}

#[async_trait]
impl<C: Cluster + 'static> Harness for OwnCluster<C> {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        let members = self.cluster.parts().clients.len().max(1);
        let i = self.next.fetch_add(1, Ordering::Relaxed) % members;
        Ok(self.cluster.client(i).await?)
    }

    fn timing(&self) -> Timing {
        Timing::for_ttl(self.ttl)
    }

    fn servers(&self) -> Option<Arc<dyn Servers>> {
        Some(self.servers.clone())
    }
}

/// The cluster's members, as the nemesis breaks them, and the faults in force on them (the
/// nemesis may make two at once).
struct ClusterServers<C>(Arc<C>, Faults);

impl<C> fmt::Debug for ClusterServers<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a test's own cluster")
    }
}

#[async_trait]
impl<C: Cluster + 'static> Servers for ClusterServers<C> {
    fn members(&self) -> Vec<String> {
        (0..self.0.parts().clients.len())
            .map(|i| format!("m{i}"))
            .collect()
    }

    async fn freeze(&self, i: usize) -> Result<(), BoxError> {
        self.1.set(&*self.0, Fault::Freeze, i, true);
        Ok(())
    }

    async fn thaw(&self, i: usize) -> Result<(), BoxError> {
        self.1.set(&*self.0, Fault::Freeze, i, false);
        Ok(())
    }

    async fn restart(&self, _: &[usize]) -> Result<(), BoxError> {
        Err("a test's own cluster is not restarted".into())
    }

    fn restart_keeps_locks(&self) -> bool {
        false
    }

    async fn leader(&self) -> Option<usize> {
        self.0.agreed_leader().await
    }

    /// Every member names one leader: each serves its clients.
    async fn serving(&self) -> bool {
        self.0.agreed_leader().await.is_some()
    }

    fn can_partition(&self) -> bool {
        true
    }

    async fn partition(&self, p: Partition, on: bool) -> Result<(), BoxError> {
        let (fault, i) = match p {
            Partition::Isolate(i) => (Fault::Isolate, i),
            Partition::Between(a, b) => (Fault::Between(b), a),
            Partition::Mute(i) => (Fault::Mute, i),
            other => return Err(format!("no such partition here: {other:?}").into()),
        };
        self.1.set(&*self.0, fault, i, on);
        Ok(())
    }

    fn can_step_clock(&self) -> bool {
        !self.0.parts().clocks.is_empty()
    }

    async fn step_clock(&self, i: usize, step: ClockStep) -> Result<(), BoxError> {
        let clock = (self.0.parts().clocks.get(i)).ok_or_else(|| format!("no clock for m{i}"))?;
        Ok(clock.set(step)?)
    }
}

/// The workload of these runs: the suite's short one with twelve clients (four per member, so
/// that most partitions strike a holder, with others waiting on the other side) over six
/// names, at `ttl`, one hold in ten 1–3 TTLs long (renewals, not only grants, meet the
/// faults), for `limit`.
fn workload(ttl: Duration, limit: Duration) -> Workload {
    let mut w = Workload {
        clients: 12,
        limit,
        ..Workload::short(seed())
    };
    w.hold = w.hold.min(ttl / 4);
    w.long_per_mille = 100;
    w
}

/// Runs `w` on `cluster` (once it has a leader) at `ttl`, prints the summary and panics on any
/// violation.
async fn checked<C: Cluster + 'static>(cluster: C, ttl: Duration, w: &Workload) -> Report {
    cluster.leader().await;
    let cluster = Arc::new(cluster);
    let harness = OwnCluster {
        servers: Arc::new(ClusterServers(cluster.clone(), Faults::default())),
        cluster,
        next: AtomicUsize::new(0),
        ttl,
    };
    let report = match run(&harness, w).await {
        Ok(r) => r,
        Err(e) => panic!("the workload could not run: {e}"),
    };
    eprintln!("partition history: {}", report.summary());
    if let Err(e) = report.verdict() {
        // The servers' own account of the last seconds: a red in CI keeps nothing else.
        let tails = crate::partition::log_tails(&harness.cluster.parts().dir, LOG_TAIL);
        panic!("{e}\n{tails}");
    }
    report
}

/// Lines of each server's log that a failed run prints.
const LOG_TAIL: usize = 40;

/// Runs the suite's short workload (here twelve clients over six names; one hold in ten 1–3
/// TTLs long) for up to `limit` on `cluster`, at `ttl`, while the nemesis cuts members off
/// from the others (half the time the leader, for 1–3 TTLs; at least eight times, time
/// allowing), and checks the history: no overlap, tokens in grant order, every loss seen
/// before the next grant, every name granted again after the last heal. Prints the report's
/// summary (`--nocapture`) and returns it. [`history_under`] with `["partition"]`.
///
/// # Panics
/// If the cluster agrees on no leader within a minute; on any violation (the failure shows
/// the history around the first); if the run made fewer than two partitions, which would not
/// be the run this claims to be.
pub async fn history_under_partitions<C: Cluster + 'static>(
    cluster: C,
    ttl: Duration,
    limit: Duration,
) -> Report {
    history_under(cluster, ttl, limit, &["partition"]).await
}

/// As [`history_under_partitions`], with the nemesis's fault kinds limited to `kinds` (of
/// [`FAULT_KINDS`](conformance_tests::safety::FAULT_KINDS): `"bridge"`, `"one-way"`, ...).
///
/// # Panics
/// As [`history_under_partitions`]; the run must make at least two faults of `kinds`.
pub async fn history_under<C: Cluster + 'static>(
    cluster: C,
    ttl: Duration,
    limit: Duration,
    kinds: &'static [&'static str],
) -> Report {
    let mut w = workload(ttl, limit);
    // These kinds only: drawn among others, a run of this length could make too few.
    w.fault_kinds = Some(kinds);
    w.min_faults = 8;
    let report = checked(cluster, ttl, &w).await;
    let made: u64 = kinds
        .iter()
        .map(|k| report.faults.get(k).copied().unwrap_or(0))
        .sum();
    assert!(
        made >= 2,
        "the nemesis made {made} fault(s) of {kinds:?} in {:?} (faults {:?}, seed {}): the run \
         did not test them",
        report.elapsed,
        report.faults,
        report.seed
    );
    report
}

/// The partition soak (an ignored test, for RELIABILITY.md): the same workload for
/// `DISTLOCK_PARTITION_SOAK_SECS` seconds (default 600) with every fault this harness can
/// make — partitions of each shape, freezes and pauses — checked as above. Where `DISTLOCK_SOAK_OUT` names a
/// path prefix, writes `<prefix>.md` (the soak table's row, labelled `label`) and
/// `<prefix>.svg` (the timeline).
///
/// # Panics
/// As [`history_under_partitions`], but for the count of partitions; if the files cannot be
/// written.
pub async fn soak_under_partitions<C: Cluster + 'static>(
    cluster: C,
    ttl: Duration,
    label: &str,
) -> Report {
    let secs = std::env::var("DISTLOCK_PARTITION_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let mut w = workload(ttl, Duration::from_secs(secs));
    w.grants = u64::MAX; // the run lasts its limit
    w.two_at_once = true;
    let report = checked(cluster, ttl, &w).await;
    if let Ok(prefix) = std::env::var("DISTLOCK_SOAK_OUT") {
        let row = conformance_tests::cases::safety::table_row(label, &report);
        if let Err(e) = std::fs::write(format!("{prefix}.md"), format!("{row}\n")) {
            panic!("cannot write {prefix}.md: {e}");
        }
        let svg = format!("{prefix}.svg");
        let drawn = draw(&report, label, w.names, w.clients, ttl, svg.as_ref());
        if let Err(e) = drawn {
            panic!("cannot draw {svg}: {e}");
        }
    }
    report
}
