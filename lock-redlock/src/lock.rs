//! `RedlockLock`: quorum acquire, renew and release over independent masters.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::{join_all, BoxFuture};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lock_core::driver::{Grant, LeaseOps, ManagedLease};
use lock_core::{
    Capabilities, Deadline, DistributedLock, Error, Fencing, Lease, LockName, LockOptions, Result,
};
use lock_redis::scripts::{self, Acquired, LockKeys};
use lock_redis::{RedisNode, ReleaseOnDrop};
use redis::aio::ConnectionManager;

use crate::RedlockConfig;

const BACKEND: &str = "redlock";

const CAPS: Capabilities = Capabilities::new()
    .with_fencing(Fencing::None)
    .with_inspect(true)
    .with_min_ttl(Duration::from_millis(20));

/// A Redlock client over N independent Redis masters.
///
/// A lock is held when a majority (N/2 + 1) of masters granted it within a validity of
/// TTL − elapsed − drift, measured on the monotonic clock from before the first request. Every
/// request goes to all masters in parallel, each with its own timeout, and is decided as soon
/// as a majority agrees (slower masters still get it); a failed acquisition is released on
/// every master that may hold it, including those that did not answer.
///
/// **No fencing tokens**: independent masters cannot agree on a monotonic counter without
/// consensus, so [`Capabilities::fencing`] is `Fencing::None` and
/// [`Lease::fencing_token`](lock_core::Lease::fencing_token) is `None`. When correctness needs
/// a token, use the etcd or ZooKeeper driver.
///
/// **Operational rule**: a master that restarts must either have persisted its keys
/// (`appendonly yes` + `appendfsync always`) or stay down longer than the longest TTL in use;
/// otherwise it forgets grants and a second client can assemble a majority while the first
/// still holds the lock.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::{DistributedLock, LockName, LockOptions};
/// use lock_redlock::RedlockLock;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// let locks = RedlockLock::from_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?;
/// let lease = locks.acquire(&LockName::new("report")?, &LockOptions::new(Duration::from_secs(10))).await?;
/// assert!(lease.fencing_token().is_none());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockLock {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedlockConfig,
    nodes: Arc<[RedisNode]>,
}

enum Attempt {
    Granted(Box<dyn Lease>),
    /// `Some`: a majority reported a holder, whose keys expire after at least this long.
    /// `None`: votes split (or no expiry was reported): nobody is known to hold it.
    Busy(Option<Duration>),
}

impl RedlockLock {
    /// Connects to every master in parallel. Succeeds when a majority answers; masters that are
    /// down are retried in the background. Rejected credentials on any master are a
    /// [`Error::Config`]; fewer than a majority reachable is [`Error::Unavailable`].
    pub async fn connect(config: RedlockConfig) -> Result<Self> {
        // One release is announced by every master that held it; count it once.
        let dedup = lock_redis::ReleaseDedup::default();
        let mut nodes: Vec<RedisNode> = Vec::with_capacity(config.masters().len());
        for m in config.masters() {
            nodes.push(RedisNode::lazy_shared(m.clone(), BACKEND, dedup.clone()).await?);
        }
        // One INFO per master: reachable, credentials accepted, no eviction, and its identity.
        let checks = join_all(
            nodes
                .iter()
                .map(|n| n.verify(n.config().connect_timeout() + n.config().request_timeout())),
        )
        .await;
        let mut reachable = 0;
        let mut down = Vec::new();
        for (node, r) in nodes.iter().zip(checks) {
            match r {
                Ok(()) => reachable += 1,
                Err(e @ (Error::Config { .. } | Error::Unauthenticated { .. })) => return Err(e),
                Err(_) => down.push(node.config().redacted_url()),
            }
        }
        same_server_twice(&nodes)?;
        if reachable < config.quorum() {
            return Err(Error::unavailable(
                BACKEND,
                format!(
                    "only {reachable} of {} masters answered (need {}); down: {}",
                    nodes.len(),
                    config.quorum(),
                    down.join(", ")
                ),
            ));
        }
        if !down.is_empty() {
            tracing::warn!(down = ?down, "Redlock starts with masters down; they are retried");
        }
        Ok(RedlockLock {
            inner: Arc::new(Inner {
                config,
                nodes: nodes.into(),
            }),
        })
    }

    /// [`connect`](Self::connect) from a `redlock://` URL.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(RedlockConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    fn keys(&self, name: &LockName) -> Arc<LockKeys> {
        Arc::new(LockKeys::new(self.inner.config.masters()[0].prefix(), name))
    }

    async fn attempt(
        &self,
        name: &LockName,
        keys: &Arc<LockKeys>,
        ttl: Duration,
        opts: &LockOptions,
    ) -> Result<Attempt> {
        let cfg = &self.inner.config;
        let nodes = &self.inner.nodes;
        let quorum = cfg.quorum();
        let node_timeout = cfg.node_timeout_for(ttl);
        // Masters not checked since their connection dropped get no vote in this attempt.
        let unchecked = self.verify_masters(node_timeout).await?;
        let token: Arc<str> = uuid::Uuid::new_v4().simple().to_string().into();
        // If this future is dropped between sending and deciding, the guard releases the token
        // everywhere in the background: a cancelled acquire leaves no ghost holder.
        let mut undo = ReleaseOnDrop::new(nodes.clone(), keys.clone(), token.clone(), node_timeout);
        let start = Instant::now();
        let mut round = Round::on(nodes, &unchecked, node_timeout, |mut c| {
            let (keys, token) = (keys.clone(), token.clone());
            async move { scripts::acquire_unfenced(&mut c, &keys, &token, ttl).await }
        });
        let (mut granted, mut busy) = (0, 0);
        let mut remaining: Option<Duration> = None;
        // Masters that answered "held by someone else", or were not asked, store nothing of
        // ours: no cleanup there.
        let mut refused = unchecked;
        while let Some((i, r)) = round.next().await {
            match r {
                Ok(Ok(Acquired::Granted { .. })) => granted += 1,
                Ok(Ok(Acquired::Busy { remaining: r })) => {
                    busy += 1;
                    refused[i] = true;
                    if let Some(r) = r {
                        remaining = Some(remaining.map_or(r, |m: Duration| m.min(r)));
                    }
                }
                _ => {}
            }
            // A grant is decided once a majority granted: waiting for the slowest masters would
            // only add their latency. A refusal waits for every answer instead: each master
            // that refused needs no cleanup, which is cheaper than cleaning up after the
            // unanswered ones.
            if granted >= quorum {
                break;
            }
        }
        // The requests still in flight go on in the background rather than being dropped: a
        // dropped request may never be written (the connection skips requests nobody awaits),
        // and a lock held on a bare majority is lost when any one of those masters fails.
        // Should one grant after a failed attempt, the cleanup below (same connection, so
        // ordered after it) or the TTL removes it.
        round.finish_in_background();
        let drift = cfg.drift(ttl);
        let validity = ttl.checked_sub(start.elapsed() + drift).unwrap_or_default();
        if granted >= quorum && validity > cfg.min_validity() {
            undo.disarm(); // the lease owns the token from here
            let ops = RedlockLeaseOps {
                nodes: nodes.clone(),
                keys: keys.clone(),
                token,
                ttl,
                drift,
                node_timeout,
                quorum,
            };
            return Ok(Attempt::Granted(Box::new(ManagedLease::new(
                name.clone(),
                Grant {
                    token: None,
                    ttl,
                    valid_until: start + ttl.saturating_sub(drift),
                },
                opts.renewal,
                ops,
            ))));
        }
        // Failed: undo every grant, on every master that may hold one (one that timed out or
        // has not answered yet may have granted). Awaited, so the next attempt is not refused
        // by this one's leftovers.
        let mut cleanup = Round::on(nodes, &refused, node_timeout, release_request(keys, &token));
        while cleanup.next().await.is_some() {}
        undo.disarm();
        if granted >= quorum {
            return Err(Error::unavailable(
                BACKEND,
                format!(
                    "a majority granted, but only after {:?} of a {ttl:?} TTL: no validity left",
                    start.elapsed()
                ),
            ));
        }
        if granted + busy >= quorum {
            // Enough masters answered: the lock is held elsewhere, or votes split.
            return Ok(Attempt::Busy(if busy >= quorum { remaining } else { None }));
        }
        Err(Error::QuorumNotReached {
            granted,
            needed: quorum,
        })
    }

    /// Checks, in parallel and within `node_timeout`, every master whose connection dropped
    /// since its last check (see [`RedisNode::verify`]): the server behind an address may be
    /// another one now. Returns which masters are still unchecked (unreachable: no vote this
    /// time). A master whose check failed less than `retry_delay` ago is not tried again yet,
    /// so a master that is down costs an acquire at most one `node_timeout` per `retry_delay`.
    /// [`Error::Config`] for a master that may evict keys, or one server listed twice.
    async fn verify_masters(&self, node_timeout: Duration) -> Result<Vec<bool>> {
        let nodes = &self.inner.nodes;
        let pause = self.inner.config.retry_delay();
        let due = |n: &RedisNode| {
            n.needs_verify()
                && n.last_verify_attempt()
                    .map_or(true, |t| t.elapsed() >= pause)
        };
        let checks = join_all(nodes.iter().map(|n| async move {
            if due(n) {
                n.verify(node_timeout).await
            } else {
                Ok(())
            }
        }))
        .await;
        let mut unchecked = Vec::with_capacity(nodes.len());
        for (n, r) in nodes.iter().zip(checks) {
            match r {
                Err(e @ (Error::Config { .. } | Error::Unauthenticated { .. })) => return Err(e),
                _ => unchecked.push(n.is_stale()),
            }
        }
        same_server_twice(nodes)?;
        Ok(unchecked)
    }

    /// One acquisition without waiting: a split vote (nobody won) is retried after a random
    /// pause, up to `retry_count` times, as Redlock prescribes; a lock a majority reports held
    /// is `Ok(None)` at once.
    async fn once(
        &self,
        name: &LockName,
        keys: &Arc<LockKeys>,
        ttl: Duration,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        for attempt in 1..=self.inner.config.retry_count() {
            match self.attempt(name, keys, ttl, opts).await? {
                Attempt::Granted(l) => return Ok(Some(l)),
                Attempt::Busy(Some(_)) => return Ok(None),
                Attempt::Busy(None) if attempt < self.inner.config.retry_count() => {
                    tokio::time::sleep(self.jitter()).await;
                }
                Attempt::Busy(None) => return Ok(None),
            }
        }
        Ok(None)
    }

    /// A random pause in `0..retry_delay`, so competing clients do not retry in lockstep.
    fn jitter(&self) -> Duration {
        let max = self.inner.config.retry_delay().as_millis().max(1);
        let r = uuid::Uuid::new_v4().as_u128() % max;
        Duration::from_millis(u64::try_from(r).unwrap_or(0))
    }
}

/// Refuses masters that are one server under two names (`localhost` and `127.0.0.1`, two
/// addresses of one host): by `run_id`, which is unique per server process. It would count
/// twice towards the majority, so one server could grant the lock alone.
fn same_server_twice(nodes: &[RedisNode]) -> Result<()> {
    let mut seen: std::collections::HashMap<Arc<str>, &RedisNode> = Default::default();
    for n in nodes {
        let Some(id) = n.run_id() else { continue };
        if let Some(first) = seen.insert(id.clone(), n) {
            return Err(Error::config(format!(
                "masters {} and {} are the same Redis server (run_id {id}): it would count twice \
                 towards the majority",
                first.config().redacted_url(),
                n.config().redacted_url()
            )));
        }
    }
    Ok(())
}

/// One master's answer: the request's result, or the per-node timeout elapsed.
type NodeReply<T> = std::result::Result<redis::RedisResult<T>, tokio::time::error::Elapsed>;

/// One request to each of several masters, all in flight at once, each bounded by the per-node
/// timeout; answers are taken as they arrive, so a caller can stop at a majority.
struct Round<T> {
    pending: FuturesUnordered<BoxFuture<'static, (usize, NodeReply<T>)>>,
}

impl<T: Send + 'static> Round<T> {
    /// Sends `request` to every master.
    fn new<F, Fut>(nodes: &[RedisNode], node_timeout: Duration, request: F) -> Self
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'static,
    {
        Self::on(nodes, &vec![false; nodes.len()], node_timeout, request)
    }

    /// Sends `request` to every master whose `skip` entry is false.
    fn on<F, Fut>(nodes: &[RedisNode], skip: &[bool], node_timeout: Duration, request: F) -> Self
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'static,
    {
        let pending = nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| !skip.get(*i).copied().unwrap_or(false))
            .map(|(i, n)| {
                let reply = tokio::time::timeout(node_timeout, request(n.connection()));
                Box::pin(async move { (i, reply.await) }) as BoxFuture<'static, _>
            })
            .collect();
        Round { pending }
    }

    /// The next answer (master index, reply); `None` once every master answered.
    async fn next(&mut self) -> Option<(usize, NodeReply<T>)> {
        self.pending.next().await
    }

    /// Lets the requests still in flight run to their answer or timeout in a background task,
    /// so a release or renewal reaches every master that answers even after the caller moved
    /// on. The task lives at most one per-node timeout.
    fn finish_in_background(self) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = self.pending;
        // Always inside a runtime here (the requests use its timers); never panic if not.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { while pending.next().await.is_some() {} });
        }
    }
}

/// The release script for one master, owning what it needs (for [`Round`]).
fn release_request(
    keys: &Arc<LockKeys>,
    token: &Arc<str>,
) -> impl Fn(ConnectionManager) -> BoxFuture<'static, redis::RedisResult<bool>> {
    let (keys, token) = (keys.clone(), token.clone());
    move |mut c| {
        let (keys, token) = (keys.clone(), token.clone());
        Box::pin(async move { scripts::release(&mut c, &keys, &token).await })
    }
}

/// Counts a compare-and-act round (release, renew) until `quorum` masters said yes or every
/// master answered; returns (yes, no, failed) and the requests still in flight.
async fn until_quorum(
    mut round: Round<bool>,
    quorum: usize,
) -> ((usize, usize, usize), Round<bool>) {
    let (mut yes, mut no, mut failed) = (0, 0, 0);
    while let Some((_, r)) = round.next().await {
        match r {
            Ok(Ok(true)) => yes += 1,
            Ok(Ok(false)) => no += 1,
            _ => failed += 1,
        }
        if yes >= quorum {
            break;
        }
    }
    ((yes, no, failed), round)
}

#[async_trait]
impl DistributedLock for RedlockLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        CAPS
    }

    /// A quorum read: `GET` + `PTTL` on every master. Held when a majority store the same
    /// owner token; the remaining time is how long until fewer than a majority still do. No
    /// fencing token (Redlock has none). Free when no token has a majority (split leftovers of
    /// failed attempts hold nothing); too few answers is `QuorumNotReached`.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        let cfg = &self.inner.config;
        let quorum = cfg.quorum();
        let keys = self.keys(name);
        let mut round = Round::new(
            &self.inner.nodes,
            cfg.node_timeout_for(Duration::MAX),
            |mut c| {
                let key = keys.lock.clone();
                async move {
                    redis::pipe()
                        .cmd("GET")
                        .arg(&key)
                        .cmd("PTTL")
                        .arg(&key)
                        .query_async::<(Option<String>, i64)>(&mut c)
                        .await
                }
            },
        );
        let mut answered = 0;
        let mut owners: std::collections::HashMap<String, Vec<Duration>> = Default::default();
        while let Some((_, r)) = round.next().await {
            if let Ok(Ok((token, pttl))) = r {
                answered += 1;
                if let Some(t) = token {
                    // -1: no expiry (not ours to judge); -2: expired between GET and PTTL.
                    let left = u64::try_from(pttl).map_or(Duration::MAX, Duration::from_millis);
                    if pttl != -2 {
                        owners.entry(t).or_default().push(left);
                    }
                }
            }
        }
        if answered < quorum {
            return Err(Error::QuorumNotReached {
                granted: answered,
                needed: quorum,
            });
        }
        Ok(owners
            .into_values()
            .find(|left| left.len() >= quorum)
            .map(|mut left| {
                left.sort_unstable_by(|a, b| b.cmp(a));
                let until_minority = left.get(quorum - 1).copied();
                lock_core::HolderInfo::new(None, until_minority.filter(|d| *d != Duration::MAX))
            }))
    }

    async fn acquire_until(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        let keys = self.keys(name);
        if deadline == Deadline::Now {
            return self.once(name, &keys, ttl, opts).await;
        }
        let mut watches = Vec::new();
        let mut subscribed = false;
        loop {
            // Registered before the attempt, so a release during the attempt is not missed.
            let mut wakes: Vec<_> = watches
                .iter()
                .map(|w: &lock_redis::ReleaseWatch| Box::pin(w.notify().notified()))
                .collect();
            for w in wakes.iter_mut() {
                w.as_mut().enable();
            }
            let remaining = match self.attempt(name, &keys, ttl, opts).await {
                Ok(Attempt::Granted(l)) => return Ok(Some(l)),
                Ok(Attempt::Busy(r)) => r,
                Err(e) if e.is_retryable() => {
                    let pause = self.jitter().max(Duration::from_millis(10));
                    if deadline.at().is_some_and(|d| Instant::now() + pause >= d) {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "Redlock attempt failed; retrying while the wait allows");
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if deadline.passed() {
                return Ok(None);
            }
            if !subscribed {
                // Subscribe on every master that answers, then retry at once: a release
                // announcement from any of them wakes us from now on.
                subscribed = true;
                drop(wakes);
                let subs = join_all(self.inner.nodes.iter().map(|n| {
                    let keys = &keys;
                    async move {
                        tokio::time::timeout(n.config().request_timeout(), n.watch_releases(keys))
                            .await
                    }
                }))
                .await;
                watches = subs
                    .into_iter()
                    .filter_map(|r| r.ok().and_then(|r| r.ok()))
                    .collect();
                continue;
            }
            // Sleep until a release message, the holder's expiry, or (split vote, or no master
            // took a subscription) a random pause.
            let sleep_for = match remaining {
                Some(r) => r + self.jitter() / 10,
                None => self.jitter(),
            };
            let wake = Instant::now() + sleep_for;
            let wake = deadline.at().map_or(wake, |d| wake.min(d));
            if wakes.is_empty() {
                tokio::time::sleep_until(wake.into()).await;
            } else {
                tokio::select! {
                    _ = futures_util::future::select_all(wakes) => {}
                    _ = tokio::time::sleep_until(wake.into()) => {}
                }
            }
        }
    }
}

impl fmt::Debug for RedlockLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLock")
            .field("config", &self.inner.config)
            .finish()
    }
}

struct RedlockLeaseOps {
    nodes: Arc<[RedisNode]>,
    keys: Arc<LockKeys>,
    token: Arc<str>,
    ttl: Duration,
    /// The clock-drift allowance for `ttl` (see [`RedlockConfig::drift`]).
    drift: Duration,
    node_timeout: Duration,
    quorum: usize,
}

impl fmt::Debug for RedlockLeaseOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLease")
            .field("key", &self.keys.lock)
            .field("masters", &self.nodes.len())
            .finish()
    }
}

impl RedlockLeaseOps {
    fn name(&self) -> LockName {
        let inner = self
            .keys
            .lock
            .rsplit_once('{')
            .map(|(_, r)| r.trim_end_matches('}'))
            .unwrap_or("");
        LockName::new(inner)
            .unwrap_or_else(|_| LockName::new("unknown").unwrap_or_else(|_| unreachable!()))
    }
}

#[async_trait]
impl LeaseOps for RedlockLeaseOps {
    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let (keys, token, ttl) = (self.keys.clone(), self.token.clone(), self.ttl);
        let round = Round::new(&self.nodes, self.node_timeout, move |mut c| {
            let (keys, token) = (keys.clone(), token.clone());
            async move { scripts::renew(&mut c, &keys, &token, ttl).await }
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
            return Err(Error::NotHeld { name: self.name() });
        }
        Err(Error::QuorumNotReached {
            granted: extended,
            needed: self.quorum,
        })
    }

    async fn release(&self) -> Result<()> {
        let round = Round::new(
            &self.nodes,
            self.node_timeout,
            release_request(&self.keys, &self.token),
        );
        let ((released, not_held, _), rest) = until_quorum(round, self.quorum).await;
        // The lock is free once a majority released it; the slower masters are released in
        // the background (or their keys expire).
        rest.finish_in_background();
        if released >= self.quorum {
            Ok(())
        } else if not_held > self.nodes.len() - self.quorum || released + not_held >= self.quorum {
            Err(Error::NotHeld { name: self.name() })
        } else {
            Err(Error::QuorumNotReached {
                granted: released,
                needed: self.quorum,
            })
        }
    }
}
