//! The history checker's workload on a cluster a test started itself ([`Cluster`]), while the
//! nemesis partitions its members: what a proxy between clients and servers cannot do, under
//! the many clients and grants of the safety run rather than one holder and one waiter.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::safety::{run, seed, Report, Workload};
use conformance_tests::{Harness, Servers, Timing};
use lock_core::{BoxError, DistributedLock};

use crate::partition::{Cluster, Fault};

/// A [`Harness`] over a test's own cluster: each client talks to the next member in turn (and
/// lists every member if the cluster's [`Parts::every`](crate::partition::Parts::every) says
/// so); its [`Servers`] freeze members by pid and cut them off from the others
/// ([`Fault::Isolate`]). They are not restarted: the members are the test's children.
struct OwnCluster<C> {
    cluster: Arc<C>,
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
        Some(Arc::new(Members(self.cluster.clone())))
    }
}

/// The cluster's members, as the nemesis breaks them.
struct Members<C>(Arc<C>);

impl<C> fmt::Debug for Members<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a test's own cluster")
    }
}

#[async_trait]
impl<C: Cluster + 'static> Servers for Members<C> {
    fn members(&self) -> Vec<String> {
        (0..self.0.parts().clients.len())
            .map(|i| format!("m{i}"))
            .collect()
    }

    async fn freeze(&self, i: usize) -> Result<(), BoxError> {
        Fault::Freeze.set(&*self.0, i, true);
        Ok(())
    }

    async fn thaw(&self, i: usize) -> Result<(), BoxError> {
        Fault::Freeze.set(&*self.0, i, false);
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

    fn can_isolate(&self) -> bool {
        true
    }

    async fn isolate(&self, i: usize, on: bool) -> Result<(), BoxError> {
        Fault::Isolate.set(&*self.0, i, on);
        Ok(())
    }
}

/// Runs the suite's short workload (here twelve clients over six names; one hold in ten 1–3
/// TTLs long) for up to `limit` on `cluster`, at `ttl`, while the nemesis cuts members off
/// from the others (half the time the leader, for 1–3 TTLs; at least eight times, time
/// allowing), and checks the history: no overlap, tokens in grant order, every loss seen
/// before the next grant, every name granted again after the last heal. Prints the report's
/// summary (`--nocapture`) and returns it.
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
    cluster.leader().await;
    let harness = OwnCluster {
        cluster: Arc::new(cluster),
        next: AtomicUsize::new(0),
        ttl,
    };
    // Twelve clients, not eight: four per member, so that most partitions strike a holder,
    // with others waiting on the other side.
    let mut w = Workload {
        clients: 12,
        ..Workload::short(seed())
    };
    w.limit = limit;
    w.hold = w.hold.min(ttl / 4);
    // One hold in ten spans 1–3 TTLs: renewals, not only grants, meet the partitions.
    w.long_per_mille = 100;
    // Partitions only: drawn among other kinds, a run of this length could make too few.
    w.fault_kinds = Some(&["partition"]);
    w.min_faults = 8;
    let report = match run(&harness, &w).await {
        Ok(r) => r,
        Err(e) => panic!("the workload could not run: {e}"),
    };
    eprintln!("partition history: {}", report.summary());
    if let Err(e) = report.verdict() {
        panic!("{e}");
    }
    let partitions = report.faults.get("partition").copied().unwrap_or(0);
    assert!(
        partitions >= 2,
        "the nemesis made {partitions} partition(s) in {:?} (faults {:?}, seed {}): the run did \
         not test partitions",
        report.elapsed,
        report.faults,
        report.seed
    );
    report
}
