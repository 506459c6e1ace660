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

    /// Waits until every observer shows nobody since the last exclusive grant of its name
    /// ([`settled`]), or `bound` has passed; then records the stop and stops them.
    pub(super) async fn settle(self, history: &History, bound: Duration, pace: Duration) {
        let until = Instant::now() + bound;
        while !self.who.is_empty() && Instant::now() < until {
            if settled(&history.events(), &self.who) {
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

/// Whether every observer in `who` (client, name) last showed nobody, and showed it after the
/// last exclusive grant of its name. "Last showed nobody" alone was not enough: a client that
/// took the name as the run stopped and dropped it at once leaves the observers a showing
/// behind, and a look between the grant and their showing of it saw the nobody from before
/// (a clean run failed so, under load 16: its observers showed the last term 3 ms after the
/// run stopped watching). An observer that never showed anything is settled only if its name
/// had no exclusive grant. Shared and permit grants show no leader, so they do not count.
fn settled(events: &[super::history::Event], who: &[(usize, usize)]) -> bool {
    let shared: std::collections::HashSet<_> = events
        .iter()
        .filter_map(|e| match e.op {
            Op::Mode { lease, .. } => Some(lease),
            _ => None,
        })
        .collect();
    let last_grant = |n: usize| {
        events.iter().rev().find_map(|e| match e.op {
            Op::Granted { lease, .. } if e.name == n && !shared.contains(&lease) => Some(e.at),
            _ => None,
        })
    };
    who.iter().all(|&(c, n)| {
        let shown = events.iter().rev().find_map(|e| match e.op {
            Op::Observed { term, .. } if e.client == c && e.name == n => Some((term, e.at)),
            _ => None,
        });
        match (shown, last_grant(n)) {
            (None, grant) => grant.is_none(),
            (Some((term, _)), None) => term.is_none(),
            (Some((term, at)), Some(g)) => term.is_none() && at > g,
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safety::history::Event;

    fn event(at: Instant, client: usize, name: usize, op: Op) -> Event {
        Event {
            at,
            client,
            name,
            op,
        }
    }

    /// The failed run's shape: nobody shown, then a grant (let go at once) the observers have
    /// not shown yet: not settled; settled once they showed it end.
    #[test]
    fn a_grant_after_the_last_nobody_is_not_settled() {
        let t = Instant::now();
        let ms = |n: u64| t + Duration::from_millis(n);
        let nobody = Op::Observed {
            term: None,
            resynced: false,
        };
        let mut events = vec![
            event(ms(0), 0, 3, nobody.clone()),
            event(
                ms(10),
                0,
                3,
                Op::Granted {
                    lease: 618,
                    token: Some(107),
                    valid_until: ms(210),
                },
            ),
            event(ms(10), 0, 3, Op::LetGo { lease: 618 }),
        ];
        assert!(
            !settled(&events, &[(0, 3)]),
            "settled before the grant was shown"
        );
        events.push(event(
            ms(12),
            0,
            3,
            Op::Observed {
                term: Some(107),
                resynced: false,
            },
        ));
        assert!(
            !settled(&events, &[(0, 3)]),
            "settled while term 107 showed"
        );
        events.push(event(ms(15), 0, 3, nobody));
        assert!(
            settled(&events, &[(0, 3)]),
            "not settled after nobody showed"
        );
    }

    /// A shared grant shows no leader: it does not hold the settling up.
    #[test]
    fn a_shared_grant_does_not_count() {
        let t = Instant::now();
        let events = vec![
            event(
                t,
                1,
                2,
                Op::Observed {
                    term: None,
                    resynced: false,
                },
            ),
            event(
                t + Duration::from_millis(5),
                0,
                2,
                Op::Granted {
                    lease: 9,
                    token: Some(4),
                    valid_until: t + Duration::from_millis(200),
                },
            ),
            event(
                t + Duration::from_millis(5),
                0,
                2,
                Op::Mode {
                    lease: 9,
                    mode: lock_core::Mode::Shared,
                },
            ),
        ];
        assert!(settled(&events, &[(1, 2)]));
    }
}
