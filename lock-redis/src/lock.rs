//! `RedisLock`: the driver.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{lease_end, Acquisition, Backoff, Grant, ManagedLease};
use lock_core::{
    Capabilities, ChangeFeed, Deadline, DistributedLock, Error, Fencing, FencingToken, HolderInfo,
    Leader, Lease, LockName, LockOptions, Mode, Renewal, Result,
};

use crate::client::RedisNode;
use crate::config::BACKEND;
use crate::conn::Conn;
use crate::lease::RedisLeaseOps;
use crate::renewals::Renewable;
use crate::scripts::{self, Acquired, LockKeys};
use crate::undo::{release_any, ReleaseOnDrop};
use crate::wakeup::ReleaseWatch;
use crate::RedisConfig;

/// A distributed lock on one Redis server (or one Redis Cluster slot owner).
///
/// One `RedisLock` is one client: a single multiplexed RESP3 connection that reconnects by
/// itself, carries every lock operation, and receives the release announcements that wake
/// waiters. Clone it freely (clones share the connection); create another with
/// [`RedisLock::connect`] to get an independent client.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::{DistributedLock, LockName, LockOptions};
/// use lock_redis::{RedisConfig, RedisLock};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// let locks = RedisLock::connect(RedisConfig::from_url("redis://127.0.0.1:6379")?).await?;
/// let name = LockName::new("invoices")?;
/// let lease = locks
///     .acquire(&name, &LockOptions::new(Duration::from_secs(10)).auto_renew(None))
///     .await?;
/// println!("token {:?}", lease.fencing_token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLock {
    inner: Arc<Inner>,
}

struct Inner {
    node: RedisNode,
    /// `node` again, as the slice [`ReleaseOnDrop`] takes.
    nodes: Arc<[RedisNode]>,
    caps: Capabilities,
}

impl RedisLock {
    /// Connects (and authenticates) now; fails with [`Error::Config`] for rejected
    /// credentials and [`Error::Unavailable`] when the server cannot be reached.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let node = if let Some(sentinels) = config.sentinels().cloned() {
            crate::sentinel::connect(config, &sentinels).await?
        } else if let Some(nodes) = config.cluster().map(<[_]>::to_vec) {
            crate::cluster::connect(config, &nodes).await?
        } else {
            RedisNode::connect(config).await?
        };
        check_wait_aof(&node).await?;
        // An evicted counter restarts at 1: with eviction accepted, no tokens at all.
        // Plain keys: foreign holders take the lock without advancing any counter.
        let fencing = if node.config().allow_eviction() || node.config().plain_keys() {
            Fencing::None
        } else if node.config().fails_over() {
            // A failover can lose the counter's last increments with the old master
            // (replication is asynchronous), whatever its fsync policy: tokens can repeat.
            Fencing::BestEffort
        } else if node.config().wait_aof().is_some() {
            // Each grant counts once it is in the append-only file on disk (checked above).
            Fencing::Strict
        } else {
            durable_fencing(&node.connection()).await
        };
        // A key's end is a time of day on the server; what makes the counter survive a
        // restart (an fsync of every write) makes the lock survive it too. Groups of shared
        // holders and permits need the fence counter's layout (not plain keys).
        let family = !node.config().plain_keys();
        let caps = Capabilities::new()
            .with_survives_restart(fencing == Fencing::Strict)
            .with_fencing(fencing)
            .with_inspect(true)
            .with_min_ttl(Duration::from_millis(10))
            .with_shared(family)
            .with_permits(family)
            // A leader's value beside its lock, its term the fence counter (`election.rs`).
            // Not behind sentinels or on a cluster: an observer's own connection would not
            // follow a failover or the slot.
            .with_election(fencing != Fencing::None && !node.config().fails_over());
        Ok(RedisLock {
            inner: Arc::new(Inner {
                nodes: Arc::from([node.clone()]),
                node,
                caps,
            }),
        })
    }

    /// [`connect`](Self::connect) from a URL (see [`RedisConfig::from_url`]).
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(RedisConfig::from_url(url)?).await
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &RedisConfig {
        self.inner.node.config()
    }

    /// A clone of the underlying connection, for operations outside the lock contract.
    pub fn connection(&self) -> Conn {
        self.inner.node.connection()
    }

    /// Elections need the fence counter for their terms: not with plain keys or eviction.
    fn elects(&self) -> Result<()> {
        if self.inner.caps.election {
            return Ok(());
        }
        Err(Error::Unsupported {
            backend: BACKEND,
            operation: "leader election (no fence counter to be a term)",
        })
    }

    fn keys(&self, name: &LockName) -> Arc<LockKeys> {
        let prefix = self.config().prefix();
        Arc::new(if self.config().plain_keys() {
            // A plain key has no hash tag that its channels could share: classic pub/sub.
            LockKeys::plain(prefix, name)
        } else {
            LockKeys::new(prefix, name).announced_by_shard(self.inner.node.announces_by_shard())
        })
    }

    /// One attempt: granted lease, or the holder's remaining TTL.
    async fn attempt(
        &self,
        name: &LockName,
        keys: &Arc<LockKeys>,
        ttl: Duration,
        opts: &LockOptions,
    ) -> Result<std::result::Result<Box<dyn Lease>, Busy>> {
        let mode = opts.mode;
        let node = &self.inner.node;
        let cfg = node.config();
        // After a reconnect the server may be another one (a failover, a restart with another
        // configuration): check it before granting on it.
        node.verify_for(cfg.request_timeout(), Some(&keys.lock))
            .await?;
        let token: Arc<str> = scripts::new_token().into();
        // Cancelled between sending and settling: release in the background (no ghost holder).
        let mut undo = ReleaseOnDrop::new(
            self.inner.nodes.clone(),
            keys.clone(),
            token.clone(),
            cfg.request_timeout(),
        )
        .of_mode(mode);
        // Subscribed before asking: a failover after this puts the grant in doubt at once.
        let doubts = node
            .config()
            .sentinels()
            .map(|_| node.target().switched.subscribe());
        let switches = node.switches();
        let start = Instant::now();
        // The grant and its WAIT (`wait_replicas`) in one pipeline, to one server.
        let mut conn = node.acknowledged();
        let asking = async {
            let reply = match mode {
                Mode::Exclusive => {
                    let value = opts.value.as_ref().map(|v| v.as_bytes());
                    scripts::acquire(&mut conn, keys, &token, ttl, value).await
                }
                mode => crate::family::acquire(&mut conn, keys, &token, ttl, mode).await,
            }?;
            Ok::<_, redis::RedisError>((reply, conn.replicated()))
        };
        let reply = tokio::time::timeout(cfg.request_timeout(), asking).await;
        let valid_until = lease_end(start, ttl);
        let failure = match reply {
            Ok(Ok((
                Acquired::Busy {
                    remaining, foreign, ..
                },
                _,
            ))) => {
                undo.disarm(); // refused: nothing of ours is stored
                return Ok(Err(Busy { remaining, foreign }));
            }
            Ok(Ok((Acquired::Mismatch { held }, _))) => {
                undo.disarm();
                return Err(Error::PermitsMismatch {
                    name: name.clone(),
                    held,
                    asked: mode.limit().unwrap_or(0),
                });
            }
            Ok(Ok((Acquired::Granted { .. }, _)))
                if doubts
                    .as_ref()
                    .is_some_and(|d| d.has_changed().unwrap_or(true)) =>
            {
                // Answered by a deposed master (the node moved since it asked): the new one
                // never saw this grant.
                node.unavailable("the master changed while the grant was on its way; undone")
            }
            Ok(Ok((Acquired::Granted { .. }, false))) => node.unavailable(&format!(
                "{} the grant in time; undone",
                crate::acknowledged::short_of(cfg)
            )),
            Ok(Ok((Acquired::Granted { fence }, true))) if Instant::now() < valid_until => {
                undo.disarm(); // the lease owns the token from here
                let token = match mode {
                    Mode::Exclusive => token,
                    _ => crate::family::member(fence, &token).into(),
                };
                let what = Renewable {
                    keys: keys.clone(),
                    token,
                    mode,
                    ttl,
                    valued: opts.value.is_some(),
                };
                // Renewed with the client's other leases but on a cluster (`renewals.rs`); on
                // their behalf only by a watchdog, and until `max_hold`.
                let ahead = match opts.renewal {
                    Renewal::Auto { max_hold } => Some(max_hold.and_then(|d| start.checked_add(d))),
                    _ => None,
                };
                let enrolled = cfg.cluster().is_none().then(|| {
                    let renewals = &node.target().renewals;
                    renewals.enrol(what.clone(), ahead, (start, switches))
                });
                let ops = RedisLeaseOps {
                    doubts,
                    what,
                    enrolled,
                    timeout: cfg.request_timeout(),
                    node: node.clone(),
                };
                let fenced = self.inner.caps.fencing != Fencing::None;
                return Ok(Ok(Box::new(ManagedLease::new(
                    name.clone(),
                    Grant {
                        token: fenced.then(|| FencingToken::new(fence)),
                        ttl,
                        valid_until,
                    },
                    opts.renewal,
                    ops,
                ))));
            }
            Ok(Ok((Acquired::Granted { .. }, true))) => {
                node.unavailable("the grant arrived after the lease's validity had passed")
            }
            Ok(Err(e)) => node.error(&e),
            Err(_) => node.unavailable("acquire timed out"),
        };
        // Ambiguous: the script may have run. Delete the lock if it is ours, then report.
        let cleanup = tokio::time::timeout(
            cfg.request_timeout(),
            release_any(&mut conn, keys, &token, mode),
        )
        .await;
        undo.disarm();
        if !matches!(cleanup, Ok(Ok(_))) {
            tracing::warn!(lock = %name, "could not clean up after an ambiguous acquire; the key expires after its TTL");
        }
        Err(failure)
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// The exclusive holder with its value (`election.rs`).
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.elects()?;
        crate::election::leader(&self.inner.node, &self.keys(name)).await
    }

    async fn watch(&self, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
        self.elects()?;
        crate::election::watch(&self.inner.node, &self.keys(name)).await
    }

    /// The newest of [`holders`](DistributedLock::holders): the exclusive holder, or the
    /// group's last granted member.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        Ok(self.holders(name).await?.pop())
    }

    /// The lock key, the fence counter (the exclusive holder's token is the last one handed
    /// out) and a group's live members, read in one script.
    async fn holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let keys = self.keys(name);
        let mut conn = self.inner.node.connection();
        let l = crate::family::list(&mut conn, &keys)
            .await
            .map_err(|e| self.inner.node.error(&e))?;
        let fenced = |f: Option<u64>| {
            f.filter(|_| self.inner.caps.fencing != Fencing::None)
                .map(FencingToken::new)
        };
        let remaining = u64::try_from(l.pttl).ok().map(Duration::from_millis);
        Ok(match l.value.as_deref() {
            _ if l.pttl == -2 => vec![], // no such key: free
            Some(v) => match crate::family::group_mode(v) {
                Some(mode) => (l.members.iter())
                    .map(|(m, left)| {
                        HolderInfo::new(fenced(crate::family::member_fence(m)), Some(*left))
                            .with_mode(mode)
                    })
                    .collect(),
                // The counter counts distlock's grants only: never show it for another client.
                None if v.starts_with(scripts::TOKEN_TAG) => {
                    vec![HolderInfo::new(fenced(l.fence), remaining)]
                }
                None => vec![HolderInfo::foreign(remaining)],
            },
            None => vec![HolderInfo::foreign(remaining)],
        })
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        let (name, ttl, opts, deadline) = (req.name(), req.ttl(), req.opts(), req.deadline());
        let keys = self.keys(name);
        if deadline == Deadline::Now {
            return Ok(self.attempt(name, &keys, ttl, opts).await?.ok());
        }
        let mut watch = None;
        let mut pauses = Backoff::transient();
        let mut first = true;
        loop {
            // The first attempt goes out alone (uncontended: one round trip). Later ones are
            // made only once subscribed, so a release between attempt and sleep wakes us.
            if watch.as_ref().is_some_and(ReleaseWatch::lapsed) {
                watch = None; // its slot moved: subscribe where it is now
            }
            if !first && watch.is_none() {
                match self.inner.node.watch_releases(&keys).await {
                    Ok(w) => watch = Some(w),
                    Err(e) => {
                        ride_out(e, &mut pauses, deadline).await?;
                        continue;
                    }
                }
            }
            first = false;
            // Registered before the attempt, so a release message that arrives during the
            // attempt is kept for this waiter instead of being lost.
            let mut notified = watch.as_ref().map(|w| Box::pin(w.notify().notified()));
            if let Some(n) = notified.as_mut() {
                n.as_mut().enable();
            }
            let busy = match self.attempt(name, &keys, ttl, opts).await {
                Ok(Ok(lease)) => return Ok(Some(lease)),
                Ok(Err(busy)) => {
                    req.queued();
                    pauses.reset();
                    busy
                }
                Err(e) => {
                    ride_out(e, &mut pauses, deadline).await?;
                    continue;
                }
            };
            if deadline.passed() {
                return Ok(None);
            }
            let Some(notified) = notified else {
                continue; // subscribe, then retry
            };
            // A lost message costs at most the holder's remaining TTL; a key without expiry
            // (-1: set by someone else) is re-checked every second.
            let sleep_for = match busy.remaining {
                Some(d) => d + Duration::from_millis(1),
                None => Duration::from_secs(1),
            };
            // Another client's release announces nothing: look again soon.
            let sleep_for = if busy.foreign {
                sleep_for.min(FOREIGN_POLL)
            } else {
                sleep_for
            };
            let wake = Instant::now() + sleep_for;
            let wake = deadline.at().map_or(wake, |d| wake.min(d));
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }
}

/// How long a waiter sleeps at most while another client than distlock holds the lock (it
/// publishes no release): redis-py's own `Lock` polls every 100 ms.
pub(crate) const FOREIGN_POLL: Duration = Duration::from_millis(100);

/// Why an attempt was refused.
struct Busy {
    /// The holder's remaining time, if it has one.
    remaining: Option<Duration>,
    /// Whether the holder is another client than distlock.
    foreign: bool,
}

/// A transient error while waiting is retried after the next of `pauses`
/// ([`Backoff::transient`]) as long as the wait allows; otherwise it is returned.
/// `Deadline::Now` never retries.
async fn ride_out(e: Error, pauses: &mut Backoff, deadline: Deadline) -> Result<()> {
    let pause = pauses.pause();
    if !e.is_retryable()
        || deadline == Deadline::Now
        || deadline.at().is_some_and(|d| Instant::now() + pause >= d)
    {
        return Err(e);
    }
    tracing::warn!(error = %e, retry_in = ?pause, "lock request failed; retrying while the wait allows");
    tokio::time::sleep(pause).await;
    Ok(())
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("config", self.config())
            .field("fencing", &self.inner.caps.fencing)
            .finish()
    }
}

/// Fencing is Strict only when the server fsyncs every write to its AOF (or, `wait_aof`, each
/// grant waits for its fsync): otherwise a restart forgets the counter (and the lock) and
/// tokens repeat. Unknown (CONFIG refused) → BestEffort.
async fn durable_fencing(conn: &Conn) -> Fencing {
    async fn read(conn: &Conn, param: &str) -> Option<String> {
        let reply: redis::RedisResult<std::collections::HashMap<String, String>> =
            redis::cmd("CONFIG")
                .arg("GET")
                .arg(param)
                .query_async(&mut conn.clone())
                .await;
        reply.ok()?.remove(param)
    }
    let aof = read(conn, "appendonly").await;
    let fsync = read(conn, "appendfsync").await;
    match (aof.as_deref(), fsync.as_deref()) {
        (Some("yes"), Some("always")) => Fencing::Strict,
        _ => Fencing::BestEffort,
    }
}

/// With `wait_aof`: fails with [`Error::Config`] where every grant would fail, the server
/// having no `WAITAOF` (before Redis 7.2 and Valkey 7.2) or no append-only file. On a cluster
/// every master is asked.
async fn check_wait_aof(node: &RedisNode) -> Result<()> {
    if node.config().wait_aof().is_none() {
        return Ok(());
    }
    let mut probe = redis::cmd("WAITAOF");
    probe.arg(1).arg(0).arg(1000);
    match probe
        .query_async::<redis::Value>(&mut node.connection())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.to_string().contains("appendonly") => Err(Error::config(format!(
            "wait_aof needs the server's append-only file (appendonly yes): {}",
            node.config().redacted_url()
        ))),
        Err(e)
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
                && e.to_string().to_lowercase().contains("unknown command") =>
        {
            Err(Error::config(format!(
                "wait_aof needs WAITAOF (Redis 7.2, Valkey 7.2 and later), which {} does not have",
                node.config().redacted_url()
            )))
        }
        Err(e) => Err(node.error(&e)),
    }
}
