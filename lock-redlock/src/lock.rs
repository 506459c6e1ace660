//! `RedlockLock`: quorum acquire, renew and release over independent masters.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::join_all;
use lock_core::{
    Capabilities, DistributedLock, Error, Fencing, Lease, LeaseOps, LockName, LockOptions,
    ManagedLease, Result, Wait,
};
use lock_redis::scripts::{self, Acquired, LockKeys};
use lock_redis::{drift, RedisNode};

use crate::RedlockConfig;

const BACKEND: &str = "redlock";

const CAPS: Capabilities = Capabilities::new()
    .with_fencing(Fencing::None)
    .with_min_ttl(Duration::from_millis(20));

/// A Redlock client over N independent Redis masters.
///
/// A lock is held when a majority (N/2 + 1) of masters granted it within a validity of
/// TTL − elapsed − drift, measured on the monotonic clock from before the first request. Every
/// request goes to all masters in parallel, each with its own timeout; a failed acquisition is
/// released on every master, including those that did not answer.
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
        let nodes: Vec<RedisNode> = config
            .masters()
            .iter()
            .map(|m| RedisNode::lazy_shared(m.clone(), BACKEND, dedup.clone()))
            .collect::<Result<_>>()?;
        let pings = join_all(nodes.iter().map(|n| {
            let mut c = n.connection();
            let limit = n.config().connect_timeout() + n.config().response_timeout();
            async move {
                match tokio::time::timeout(limit, redis::cmd("PING").query_async::<String>(&mut c))
                    .await
                {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(Some(e)),
                    Err(_) => Err(None),
                }
            }
        }))
        .await;
        let mut reachable = 0;
        let mut down = Vec::new();
        for (node, r) in nodes.iter().zip(pings) {
            match r {
                Ok(()) => reachable += 1,
                Err(Some(e))
                    if e.kind() == redis::ErrorKind::AuthenticationFailed
                        || e.to_string().contains("WRONGPASS")
                        || e.to_string().contains("NOAUTH") =>
                {
                    return Err(Error::Config(format!(
                        "master {}:{} rejected the credentials",
                        node.config().host(),
                        node.config().port()
                    )));
                }
                Err(_) => down.push(node.config().redacted_url()),
            }
        }
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

    fn keys(&self, name: &LockName) -> LockKeys {
        LockKeys::new(self.inner.config.masters()[0].prefix(), name)
    }

    async fn attempt(
        &self,
        name: &LockName,
        keys: &LockKeys,
        ttl: Duration,
        opts: &LockOptions,
    ) -> Result<Attempt> {
        let cfg = &self.inner.config;
        let nodes = &self.inner.nodes;
        let quorum = cfg.quorum();
        let node_timeout = cfg.node_timeout_for(ttl);
        let token = uuid::Uuid::new_v4().simple().to_string();
        let start = Instant::now();
        let replies = join_all(nodes.iter().map(|n| {
            let mut c = n.connection();
            let token = &token;
            async move {
                tokio::time::timeout(
                    node_timeout,
                    scripts::acquire_unfenced(&mut c, keys, token, ttl),
                )
                .await
            }
        }))
        .await;
        let (mut granted, mut busy) = (0, 0);
        let mut remaining: Option<Duration> = None;
        for r in &replies {
            match r {
                Ok(Ok(Acquired::Granted { .. })) => granted += 1,
                Ok(Ok(Acquired::Busy { remaining: r })) => {
                    busy += 1;
                    if let Some(r) = r {
                        remaining = Some(remaining.map_or(*r, |m| m.min(*r)));
                    }
                }
                _ => {}
            }
        }
        let validity = ttl
            .checked_sub(start.elapsed() + drift(ttl))
            .unwrap_or_default();
        if granted >= quorum && validity > cfg.min_validity() {
            let ops = RedlockLeaseOps {
                nodes: nodes.clone(),
                keys: keys.clone(),
                token,
                ttl,
                node_timeout,
                quorum,
            };
            return Ok(Attempt::Granted(Box::new(ManagedLease::new(
                name.clone(),
                None,
                ttl,
                start + ttl.saturating_sub(drift(ttl)),
                opts.renewal,
                ops,
            ))));
        }
        // Failed: undo every grant, on every master (one that timed out may have granted).
        release_everywhere(nodes, keys, &token, node_timeout).await;
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

    /// A random pause in `0..retry_delay`, so competing clients do not retry in lockstep.
    fn jitter(&self) -> Duration {
        let max = self.inner.config.retry_delay().as_millis().max(1);
        let r = uuid::Uuid::new_v4().as_u128() % max;
        Duration::from_millis(u64::try_from(r).unwrap_or(0))
    }
}

/// Runs the release script on every master in parallel; returns (released, not held, failed).
async fn release_everywhere(
    nodes: &[RedisNode],
    keys: &LockKeys,
    token: &str,
    node_timeout: Duration,
) -> (usize, usize, usize) {
    let replies =
        join_all(nodes.iter().map(|n| {
            let mut c = n.connection();
            async move {
                tokio::time::timeout(node_timeout, scripts::release(&mut c, keys, token)).await
            }
        }))
        .await;
    count(&replies)
}

fn count(
    replies: &[std::result::Result<redis::RedisResult<bool>, tokio::time::error::Elapsed>],
) -> (usize, usize, usize) {
    let (mut yes, mut no, mut failed) = (0, 0, 0);
    for r in replies {
        match r {
            Ok(Ok(true)) => yes += 1,
            Ok(Ok(false)) => no += 1,
            _ => failed += 1,
        }
    }
    (yes, no, failed)
}

#[async_trait]
impl DistributedLock for RedlockLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        CAPS
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        let ttl = opts.validate(&CAPS)?;
        let keys = self.keys(name);
        for attempt in 1..=self.inner.config.retry_count() {
            match self.attempt(name, &keys, ttl, opts).await? {
                Attempt::Granted(l) => return Ok(Some(l)),
                // A majority reported a holder: it is held.
                Attempt::Busy(Some(_)) => return Ok(None),
                // Split vote: nobody won. Retry after a random pause, as Redlock prescribes.
                Attempt::Busy(None) if attempt < self.inner.config.retry_count() => {
                    tokio::time::sleep(self.jitter()).await;
                }
                Attempt::Busy(None) => return Ok(None),
            }
        }
        Ok(None)
    }

    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Box<dyn Lease>> {
        let ttl = opts.validate(&CAPS)?;
        let start = Instant::now();
        let deadline = opts.wait.deadline(start);
        let keys = self.keys(name);
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
                Ok(Attempt::Granted(l)) => return Ok(l),
                Ok(Attempt::Busy(r)) => r,
                Err(e) if e.is_retryable() && opts.wait != Wait::No => {
                    let pause = self.jitter().max(Duration::from_millis(10));
                    if deadline.is_some_and(|d| Instant::now() + pause >= d) {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "Redlock attempt failed; retrying while the wait allows");
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if opts.wait == Wait::No || deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout {
                    name: name.clone(),
                    waited: start.elapsed(),
                });
            }
            if !subscribed {
                // Subscribe on every master that answers, then retry at once: a release
                // announcement from any of them wakes us from now on.
                subscribed = true;
                drop(wakes);
                let subs = join_all(self.inner.nodes.iter().map(|n| {
                    let keys = &keys;
                    async move {
                        tokio::time::timeout(n.config().response_timeout(), n.watch_releases(keys))
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
            let wake = deadline.map_or(wake, |d| wake.min(d));
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
    keys: LockKeys,
    token: String,
    ttl: Duration,
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
        let replies = join_all(self.nodes.iter().map(|n| {
            let mut c = n.connection();
            async move {
                tokio::time::timeout(
                    self.node_timeout,
                    scripts::renew(&mut c, &self.keys, &self.token, self.ttl),
                )
                .await
            }
        }))
        .await;
        let (extended, not_held, _) = count(&replies);
        let validity = self
            .ttl
            .checked_sub(start.elapsed() + drift(self.ttl))
            .unwrap_or_default();
        if extended >= self.quorum && !validity.is_zero() {
            return Ok(start + self.ttl.saturating_sub(drift(self.ttl)));
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
        let (released, not_held, _) =
            release_everywhere(&self.nodes, &self.keys, &self.token, self.node_timeout).await;
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
