//! Waiting for the predecessor's key to go, keeping the waiter's own lease alive meanwhile.

use std::time::{Duration, Instant};

use etcd_client::{EventType, GetOptions, WatchFilterType, WatchOptions};
use lock_core::driver::{drift, lease_end};
use lock_core::{Deadline, Error, LockName, Result};

use crate::client::{mapped, send, Cluster, Resend, Unanswered};
use crate::config::BACKEND;
use crate::keepers::Exchange;
use crate::term::{Alive, Tenure};

/// What a waiter waits to see deleted.
pub(crate) enum Watched {
    /// The key before it that keeps it waiting (name, `create_revision`).
    Key(Vec<u8>, i64),
    /// Any of the keys before it (a permit: whichever holder goes first): a watch on the
    /// name's range, which every deletion under the name wakes.
    Any {
        /// The name's range.
        dir: String,
        /// The keys before the waiter's own (names, `create_revision`s).
        older: Vec<(Vec<u8>, i64)>,
    },
}

/// Sleeps until the watched key (or one of them) is deleted (or the watch breaks: the caller
/// re-checks either way), keeping the waiter's lease alive meanwhile.
pub(crate) async fn wait_for_delete(
    c: &Cluster,
    watched: Watched,
    seen: i64,
    lease: &mut WaitingLease,
    deadline: Deadline,
) -> Result<Woken> {
    // No start revision: the watch starts at the server's current one. Any start revision
    // in the past (even `seen + 1` once other keys changed) puts the watcher in etcd 3.4's
    // unsynced group, served only every 100 ms. A deletion between the check and the
    // watch's creation is caught below by looking at the predecessor once more.
    let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    let (target, opts) = match &watched {
        Watched::Key(pred, _) => (pred.clone(), opts),
        Watched::Any { dir, .. } => (dir.clone().into_bytes(), opts.with_prefix()),
    };
    let watch = c.call(|mut c| {
        let (target, opts) = (target.clone(), opts.clone());
        async move { c.watch(target, Some(opts)).await }
    });
    let mut stream = match watch.await {
        Ok(s) => s,
        Err(e) if e.is_retryable() => return Ok(Woken::Broken),
        Err(e) => return Err(e),
    };
    // A second watch of the same key on the same stream, asked once the first is created:
    // etcd before 3.7 leaves a watch unsynced (heard up to 100 ms late) when a write lands
    // while it is registered, and two registrations at different moments are both caught far
    // less often (BENCHMARKS.md, "etcd: where the hand-off tail goes"). The first alone is
    // enough to be correct: the second only hears sooner.
    let mut second = Some((target, opts));
    loop {
        let until_deadline = deadline.sleep();
        tokio::select! {
            msg = stream.message() => match msg {
                Ok(Some(resp)) if resp.created() && second.is_none() => {} // the second's
                Ok(Some(resp)) if resp.created() => {
                    if let Some((target, opts)) = second.take() {
                        // Not sent (the stream is closing): the first watch still serves.
                        let _ = stream.watch(target, Some(opts)).await;
                    }
                    let at = resp.header().map_or(i64::MAX, |h| h.revision());
                    if at > seen {
                        // Deleted before the watch began? Only a definite answer counts:
                        // an unanswered re-check sends the caller round again (it looks at
                        // the whole queue), never to sleep until its deadline.
                        let there = match &watched {
                            Watched::Key(pred, rev) => still_there(c, pred, *rev).await?,
                            Watched::Any { dir, older } => all_still_there(c, dir, older).await?,
                        };
                        match there {
                            Some(true) => {}
                            Some(false) => return Ok(Woken::Deleted),
                            None => return Ok(Woken::Broken),
                        }
                    }
                }
                Ok(Some(resp)) => {
                    if resp.canceled()
                        || resp.events().iter().any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(Woken::Deleted);
                    }
                }
                Ok(None) | Err(_) => return Ok(Woken::Broken),
            },
            _ = tokio::time::sleep_until(lease.next_keep_alive.into()) => {
                lease.keep_alive(c, deadline).await?;
            }
            _ = until_deadline => return Ok(Woken::Deadline),
        }
    }
}

/// Whether this incarnation of `key` still exists; `None` when the server did not answer
/// (a transient error is no evidence either way).
pub(crate) async fn still_there(c: &Cluster, key: &[u8], rev: i64) -> Result<Option<bool>> {
    let r = c
        .call(|mut c| async move { c.get(key, Some(GetOptions::new().with_keys_only())).await })
        .await;
    match r {
        Ok(r) => Ok(Some(
            r.kvs().first().map(|kv| kv.create_revision()) == Some(rev),
        )),
        Err(e) if e.is_retryable() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether every one of `older` (names, `create_revision`s) is still under `dir`; `None` when
/// the server did not answer.
async fn all_still_there(c: &Cluster, dir: &str, older: &[(Vec<u8>, i64)]) -> Result<Option<bool>> {
    let opts = GetOptions::new().with_prefix().with_keys_only();
    let r = c
        .call(|mut c| {
            let opts = opts.clone();
            async move { c.get(dir, Some(opts)).await }
        })
        .await;
    match r {
        Ok(r) => Ok(Some(older.iter().all(|(key, rev)| {
            r.kvs()
                .iter()
                .any(|kv| kv.key() == key.as_slice() && kv.create_revision() == *rev)
        }))),
        Err(e) if e.is_retryable() => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) enum Woken {
    Deleted,
    Broken,
    Deadline,
}

/// A waiter's lease, kept alive while it waits.
///
/// Unlike a holder's lease, a waiter's may go unconfirmed past its `valid_until`: it guards
/// nothing yet, and etcd extends every lease when a new leader takes over, so an election that
/// outlasts the TTL does not end it. The waiter keeps asking until the server says whether the
/// lease lives (gone: the wait is lost), for one request timeout past `valid_until` at most
/// (then the backend's error: a silent cluster is an error, not a wait without end), or until
/// the deadline. A grant needs a lease confirmed in its own term and unexpired
/// (`trusted_until`, `term.rs`).
pub(crate) struct WaitingLease {
    pub(crate) id: i64,
    pub(crate) ttl: Duration,
    /// The validity by the last keep-alive answered, whichever leader answered it.
    pub(crate) valid_until: Instant,
    pub(crate) next_keep_alive: Instant,
    pub(crate) name: LockName,
    /// The term the lease belongs to (0: unknown).
    pub(crate) term: u64,
    /// The validity every lessor that knows the lease agrees with: from the grant, or from a
    /// keep-alive that a read in `term` followed.
    pub(crate) trusted_until: Instant,
    /// When the last keep-alive was answered: a read sent after it vouches for it.
    answered: Option<Instant>,
}

impl WaitingLease {
    /// `tenure`'s lease, of `ttl`, put for a contender of `name`: its next keep-alive is due a
    /// third of the way through its validity.
    pub(crate) fn new(name: &LockName, tenure: Tenure, ttl: Duration) -> Self {
        let valid_until = tenure.valid_until;
        let next = valid_until.checked_sub(ttl.saturating_sub(drift(ttl)) * 2 / 3);
        WaitingLease {
            id: tenure.id,
            ttl,
            valid_until,
            next_keep_alive: next.unwrap_or_else(Instant::now),
            name: name.clone(),
            term: tenure.term,
            trusted_until: valid_until,
            answered: None,
        }
    }

    /// A keep-alive answered at `answered` moved the validity to `valid_until`.
    pub(crate) fn kept_alive(&mut self, valid_until: Instant, answered: Instant) {
        self.valid_until = valid_until;
        self.answered = Some(answered);
    }

    /// A read sent at `sent` reported `term`: in the lease's own term, the keep-alives answered
    /// before it were answered in that term too, and their validity is trusted.
    pub(crate) fn observed(&mut self, term: u64, sent: Instant) {
        if term != 0 && term == self.term && self.answered.is_some_and(|a| a <= sent) {
            self.trusted_until = self.trusted_until.max(self.valid_until);
        }
    }

    /// One keep-alive, bounded by half the TTL (and the request timeout, and the deadline).
    /// `Ok` when the lease lives (its validity moved on) or the server did not answer (another
    /// try is scheduled); `Err(Lost)` when the lease is gone; the backend's error when it has
    /// not answered for a request timeout past the lease's validity.
    ///
    /// Half the TTL, because a member whose leader froze keeps forwarding keep-alives to it
    /// until it learns of the next one: an attempt that waits out the whole request timeout
    /// there can outlive the lease the new leader extended (measured: lost every time at the
    /// minimum TTL, `tests/partition.rs`).
    pub(crate) async fn keep_alive(&mut self, cluster: &Cluster, deadline: Deadline) -> Result<()> {
        let start = Instant::now();
        let limit = deadline
            .at()
            .map_or(Duration::MAX, |at| at.saturating_duration_since(start))
            .min(self.ttl / 2)
            .max(Duration::from_millis(1));
        match keep_alive(cluster, self.id, self.ttl, limit).await {
            Ok(Some(Alive { ttl, since })) => {
                self.ttl = ttl;
                self.kept_alive(lease_end(since, ttl), Instant::now());
                self.next_keep_alive = since + ttl / 3;
                Ok(())
            }
            Ok(None) => Err(self.failed("its lease expired while waiting")),
            Err(e) if e.is_retryable() => {
                let now = Instant::now();
                if now > self.valid_until + cluster.config.request_timeout() {
                    return Err(e);
                }
                self.next_keep_alive = now + Duration::from_millis(100);
                Ok(())
            }
            Err(_) => Err(self.failed("its lease could not be kept alive while waiting")),
        }
    }

    /// The acquisition failed because its own lease is gone: nothing was held, so not
    /// [`Error::Lost`] (which speaks of a lease the caller had) but a retryable failure — a
    /// link too slow to keep a waiter's lease alive is transient, and a new attempt starts
    /// afresh.
    pub(crate) fn failed(&self, why: &str) -> Error {
        Error::unavailable(BACKEND, format!("{} not granted: {why}", self.name))
    }
}

/// One keep-alive round trip: `Some` if the lease lives (a keep-alive resets it to its
/// granted TTL), `None` if the server says it is gone.
///
/// On the lease's kept stream if it has one (`keepers.rs`); else etcd-client's
/// `lease_keep_alive` opens a stream, sends one request and consumes its answer itself (failing
/// with "lease not found" when the TTL is ≤ 0), so opening it *is* the round trip, and the
/// stream is then kept for the next one. A kept stream that failed is replaced within the same
/// `limit`.
pub(crate) async fn keep_alive(
    cluster: &Cluster,
    id: i64,
    ttl: Duration,
    limit: Duration,
) -> Result<Option<Alive>> {
    let limit = limit.min(cluster.config.request_timeout());
    if cluster.config.shared_lease() {
        // Many locks on one lease: one keep-alive answers them all (`shared.rs`).
        return cluster
            .shared
            .keep_alive(id, ttl, limit, |left| {
                keep_alive_once(cluster, id, ttl, left)
            })
            .await;
    }
    keep_alive_once(cluster, id, ttl, limit).await
}

/// [`keep_alive`], one round trip of its own.
async fn keep_alive_once(
    cluster: &Cluster,
    id: i64,
    ttl: Duration,
    limit: Duration,
) -> Result<Option<Alive>> {
    let (client, config) = (&cluster.client, &cluster.config);
    let start = Instant::now();
    let alive = Some(Alive { ttl, since: start });
    match tokio::time::timeout(limit, cluster.keepers.exchange(id)).await {
        Ok(Exchange::Alive) => return Ok(alive),
        Ok(Exchange::Gone) => return Ok(None),
        Ok(Exchange::None) => {}
        Ok(Exchange::Failed(e)) => {
            tracing::debug!(error = %e, lease = id, "kept keep-alive stream failed; opening another");
        }
        Err(_) => {
            return Err(Error::unavailable(
                BACKEND,
                format!(
                    "no keep-alive answer from {} within {limit:?}",
                    config.redacted_url()
                ),
            ))
        }
    }
    let limit = limit.saturating_sub(start.elapsed());
    // A keep-alive extends the lease to its TTL however often it lands: safe to send again.
    let sent = send(config, client, limit, Resend::Refused, |mut c| async move {
        c.lease_keep_alive(id).await
    })
    .await;
    match sent {
        Ok((keeper, stream)) => {
            cluster.keepers.keep(id, ttl, keeper, stream);
            Ok(alive)
        }
        Err(Unanswered::Failed(etcd_client::Error::LeaseKeepAliveError(m)))
            if m.contains("not found") =>
        {
            Ok(None)
        }
        Err(Unanswered::Late { before: None }) => Err(Error::unavailable(
            BACKEND,
            format!(
                "no keep-alive answer from {} within {limit:?}",
                config.redacted_url()
            ),
        )),
        Err(e) => Err(mapped(e, config, limit)),
    }
}
