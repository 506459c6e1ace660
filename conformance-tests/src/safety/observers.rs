//! Election observers beside a run's clients, where the driver holds elections: each name is
//! observed from two clients (one behind a breakable link where the run has them), every
//! leader shown recorded ([`Op::Observed`]) for the checker's rule (e); once the clients have
//! stopped, the run waits for every observer to show nobody, at most the recovery bound, then
//! stops them ([`Op::ObserversStopped`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::driver::Backoff;
use lock_core::{DistributedLock, Election, LockName};
use tokio::task::JoinHandle;

use super::history::{History, Op, NOBODY};

/// The observers of one run.
pub(super) struct Observers {
    tasks: Vec<JoinHandle<()>>,
    /// (client, name) of each.
    who: Vec<(usize, usize)>,
}

impl Observers {
    /// Observers of every name from the first two of `clients`; none where the driver holds
    /// no elections.
    pub(super) fn spawn(
        clients: &[Arc<dyn DistributedLock>],
        names: &[LockName],
        history: &Arc<History>,
    ) -> Self {
        let mut out = Observers {
            tasks: Vec::new(),
            who: Vec::new(),
        };
        for (c, lock) in clients.iter().enumerate().take(2) {
            let Ok(election) = Election::new(lock.clone()) else {
                continue;
            };
            for (n, name) in names.iter().enumerate() {
                let (e, name, h) = (election.clone(), name.clone(), history.clone());
                out.tasks.push(tokio::spawn(observe(c, n, e, name, h)));
                out.who.push((c, n));
            }
        }
        out
    }

    /// Waits until every observer's last showing is nobody, or `bound` has passed; then
    /// records the stop and stops them.
    pub(super) async fn settle(self, history: &History, bound: Duration, pace: Duration) {
        let until = Instant::now() + bound;
        while !self.who.is_empty() && Instant::now() < until {
            let events = history.events();
            let last = |c: usize, n: usize| {
                events.iter().rev().find_map(|e| match e.op {
                    Op::Observed { term, .. } if e.client == c && e.name == n => Some(term),
                    _ => None,
                })
            };
            if self
                .who
                .iter()
                .all(|&(c, n)| last(c, n).flatten().is_none())
            {
                break;
            }
            tokio::time::sleep(pace).await;
        }
        history.record(NOBODY, NOBODY, Op::ObserversStopped);
        for t in self.tasks {
            t.abort();
        }
    }
}

/// One observer: made again while the backend does not answer; every showing recorded.
async fn observe(c: usize, n: usize, e: Election, name: LockName, h: Arc<History>) {
    let mut pauses = Backoff::transient();
    let mut observer = loop {
        match e.observe(&name).await {
            Ok(o) => break o,
            Err(err) if err.is_retryable() => tokio::time::sleep(pauses.pause()).await,
            Err(err) => {
                let error = err.to_string();
                return h.record(c, n, Op::ObserverFailed { error });
            }
        }
    };
    loop {
        match observer.next().await {
            Ok(o) => {
                let term = o.leader.map(|l| l.term.get());
                let resynced = o.resynced;
                h.record(c, n, Op::Observed { term, resynced });
            }
            Err(err) => {
                let error = err.to_string();
                return h.record(c, n, Op::ObserverFailed { error });
            }
        }
    }
}
