//! The backend half of a held Redlock lock: renew and release, each a round decided at a
//! majority; the masters that have not answered yet still get the request.
//!
//! A client's leases renew together on each master, as on a single Redis server
//! (`lock_redis::raw::renewals`): a renewal's request to a master renews, in the same script,
//! the client's other leases there that a watchdog renews and that are past half their
//! renewal period. A watchdog whose lease was so renewed on a majority of the masters, recently
//! enough, takes that as its renewal and sends nothing; its validity counts from the send of
//! the oldest of the majority's newest confirmations, drift subtracted, as a round of its own
//! would. A renewal by hand, and a watchdog short of such a majority, run a round of their own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::LeaseOps;
use lock_core::{Error, LockOptions, Mode, Renewal, Result};
use lock_redis::raw::renewals::{self, Enrolled, Found, Renewable};
use lock_redis::raw::scripts::LockKeys;
use lock_redis::raw::RedisNode;

use crate::round::{release_request, until_quorum, Round};

pub(crate) struct RedlockLeaseOps {
    pub(crate) nodes: Arc<[RedisNode]>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) token: Arc<str>,
    pub(crate) mode: Mode,
    /// On each master, what a renewal there renews (a writer's token; a reader's member where
    /// that master granted, `None` elsewhere) and the lease's place in the master's book.
    pub(crate) on: Arc<[Option<(Renewable, Enrolled)>]>,
    pub(crate) ttl: Duration,
    /// The clock-drift allowance for `ttl` (see [`RedlockConfig::drift`]).
    pub(crate) drift: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) quorum: usize,
}

/// On each master, what a renewal there renews and the lease's place in that master's book:
/// `members[i]` for a reader (`None`: that master did not grant), the token for a writer.
/// Renewed on others' behalf only by a watchdog (`opts`), and until its `max_hold`; the grant
/// was sent at `sent`.
pub(crate) fn enrol(
    nodes: &[RedisNode],
    keys: &Arc<LockKeys>,
    token: &Arc<str>,
    members: &[Option<String>],
    ttl: Duration,
    opts: &LockOptions,
    sent: Instant,
) -> Arc<[Option<(Renewable, Enrolled)>]> {
    let mode = opts.mode;
    let ahead = match opts.renewal {
        Renewal::Auto { max_hold } => Some(max_hold.and_then(|d| sent.checked_add(d))),
        _ => None,
    };
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let token: Arc<str> = match (mode, members.get(i)) {
                (Mode::Exclusive, _) => token.clone(),
                (_, Some(Some(m))) => m.as_str().into(),
                _ => return None,
            };
            let what = Renewable {
                keys: keys.clone(),
                token,
                mode,
                ttl,
                valued: false,
            };
            let enrolled = node.renewals().enrol(what.clone(), ahead, (sent, 0));
            Some((what, enrolled))
        })
        .collect()
}

#[async_trait]
impl LeaseOps for RedlockLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.keys.lock.clone())
    }

    async fn renew(&self) -> Result<Instant> {
        let _one_at_a_time = self.one_at_a_time().await;
        self.round().await
    }

    /// A confirmation that other leases' requests got for this one on a majority of the
    /// masters since its last renewal, or a round of its own.
    async fn renew_due(&self) -> Result<Instant> {
        let _one_at_a_time = self.one_at_a_time().await;
        match self.confirmed() {
            Some(valid_until) => Ok(valid_until),
            None => self.round().await,
        }
    }

    async fn release(&self) -> Result<()> {
        for (_, enrolled) in self.on.iter().flatten() {
            enrolled.leave(); // renewed on nobody's behalf from here
        }
        let round = Round::new(
            &self.nodes,
            self.node_timeout,
            release_request(&self.keys, &self.token, self.mode),
        );
        let ((released, not_held, _), rest) = until_quorum(round, self.quorum).await;
        // The lock is free once a majority released it; the slower masters are released in
        // the background (or their keys expire).
        rest.finish_in_background();
        if released >= self.quorum {
            Ok(())
        } else if not_held > self.nodes.len() - self.quorum || released + not_held >= self.quorum {
            Err(Error::not_held(&self.keys.name()))
        } else {
            Err(Error::QuorumNotReached {
                granted: released,
                needed: self.quorum,
            })
        }
    }
}

impl RedlockLeaseOps {
    /// One renewal round of the client's at a time (the first master's book's lock): a
    /// watchdog that asks while one is under way waits for it, and then finds whether it was
    /// in it. A round's slower masters, left to finish in the background, do not hold it.
    async fn one_at_a_time(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.nodes.first() {
            Some(first) => Some(first.renewals().sending.lock().await),
            None => None,
        }
    }

    /// The validity that recent confirmations on a majority of the masters give (each sent
    /// within the last quarter TTL, on this lease's behalf or its own): from the send of the
    /// majority's oldest, drift subtracted. `None`: too few, ask.
    fn confirmed(&self) -> Option<Instant> {
        let sent: Vec<Instant> = self
            .on
            .iter()
            .flatten()
            .filter_map(|(_, enrolled)| match enrolled.found(true, 0) {
                Found::Confirmed(at) => Some(at),
                Found::Refused | Found::Ask => None,
            })
            .collect();
        Some(majority_since(sent, self.quorum)? + self.ttl.saturating_sub(self.drift))
    }

    /// One round: on each master, one request renewing this lease and the leases of the
    /// client there that go with it, their answers recorded in that master's book.
    async fn round(&self) -> Result<Instant> {
        let start = Instant::now();
        let on = self.on.clone();
        let all = vec![false; self.nodes.len()];
        let round = Round::on(&self.nodes, &all, self.node_timeout, move |i, mut c| {
            let on = on.clone();
            async move {
                let Some(Some((what, enrolled))) = on.get(i) else {
                    return Ok(false); // a reader where this master did not grant
                };
                let sent = Instant::now();
                let batch = enrolled.batch(what, sent);
                let leases: Vec<_> = batch.iter().map(|(_, w)| w.renewing()).collect();
                let renewed = renewals::renew(&mut c, &leases).await?;
                let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
                enrolled.record(&ids, &renewed, (sent, 0), true);
                Ok(renewed.first() == Some(&true))
            }
        });
        let ((extended, not_held, _), rest) = until_quorum(round, self.quorum).await;
        // Slower masters are extended too, in the background: a majority is enough to hold.
        rest.finish_in_background();
        let validity = self
            .ttl
            .checked_sub(start.elapsed() + self.drift)
            .unwrap_or_default();
        if extended >= self.quorum && !validity.is_zero() {
            return Ok(start + self.ttl.saturating_sub(self.drift));
        }
        // Masters that were extended stay extended: undoing them would only shorten a lease
        // that a later renewal may still save.
        if not_held > self.nodes.len() - self.quorum {
            return Err(Error::not_held(&self.keys.name()));
        }
        Err(Error::QuorumNotReached {
            granted: extended,
            needed: self.quorum,
        })
    }
}

/// Since when a majority (`quorum`) of the masters whose latest confirmations were sent at
/// `sent` (one each) have been confirmed: the oldest of the `quorum` newest. `None`: fewer.
fn majority_since(mut sent: Vec<Instant>, quorum: usize) -> Option<Instant> {
    sent.sort_unstable_by(|a, b| b.cmp(a));
    sent.get(quorum.checked_sub(1)?).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_counts_from_the_oldest_of_its_newest_confirmations() {
        let now = Instant::now();
        let ago = |ms: u64| now - Duration::from_millis(ms);
        // Five masters, quorum 3: the three newest are 10, 20 and 40 ms old.
        let sent = vec![ago(40), ago(10), ago(90), ago(20), ago(60)];
        assert_eq!(majority_since(sent, 3), Some(ago(40)));
        assert_eq!(
            majority_since(vec![ago(10), ago(20)], 3),
            None,
            "two of five"
        );
        assert_eq!(majority_since(vec![], 0), None);
    }
}
