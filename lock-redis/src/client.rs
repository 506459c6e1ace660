//! `RedisNode`: one Redis server as the drivers see it — a self-reconnecting RESP3 connection
//! that carries lock commands and release announcements. `RedisLock` uses one; the Redlock
//! driver uses one per master.

use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::driver::{scrub, ClientError};
use lock_core::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::acknowledged::Acknowledged;
use crate::config::BACKEND;
use crate::conn::Conn;
use crate::facts::ServerFacts;
use crate::scripts::LockKeys;
use crate::wakeup::{ReleaseDedup, ReleaseWatch, Wakeups};
use crate::RedisConfig;

/// A connection to one Redis server plus the registry that turns its release announcements
/// into wake-ups. Cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct RedisNode {
    config: RedisConfig,
    /// The connection, which a Sentinel deployment's follower moves to a new master.
    target: Arc<Target>,
    /// The connections' settings with the wake-ups' push handler, for a new master's.
    manager_config: ConnectionManagerConfig,
    /// Kept alive with the node and its leases (behind sentinels: the task that follows the
    /// master, stopped when the last of them is dropped).
    follower: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// For connections of their own (an election's observers): the client and the manager's
    /// settings, without the wake-ups' push handler.
    client: redis::Client,
    feed_config: ConnectionManagerConfig,
    wakeups: Arc<Wakeups>,
    /// What every connection of the node does with a push message (a release announcement, a
    /// disconnection): the wake-ups, and the count of drops that makes the next grant check.
    on_push: PushHandler,
    backend: &'static str,
    check: Arc<Mutex<Check>>,
}

/// A connection's handler of push messages, shared by the node's connections.
pub(crate) type PushHandler = Arc<dyn Fn(redis::PushInfo) + Send + Sync>;

/// The server a node talks to now: one for good, or a Sentinel deployment's current master.
pub(crate) struct Target {
    conn: parking_lot::RwLock<Conn>,
    /// Counts the switches to a new master: a lease granted before one is in doubt until it
    /// is confirmed on the new master.
    pub(crate) switched: tokio::sync::watch::Sender<u64>,
    /// Notified when the connection drops: behind sentinels, ask them again.
    pub(crate) dropped: Arc<tokio::sync::Notify>,
    /// Release announcements go by sharded pub/sub (a cluster whose masters all have it at
    /// connect): fixed for the client's life, so that its waiters and releasers agree.
    sharded: std::sync::atomic::AtomicBool,
    /// The leases that renew together on this server (`renewals.rs`).
    pub(crate) renewals: Arc<crate::renewals::Renewals>,
}

/// How often a connection that never dropped is checked again anyway: an operator's
/// `CONFIG SET maxmemory-policy` reaches the driver within this long.
const RECHECK_EVERY: Duration = Duration::from_secs(60);

/// The last [`RedisNode::verify`] of this server, and whether the connection dropped since.
#[derive(Debug, Default)]
struct Check {
    /// Connection drops so far.
    drops: u64,
    /// `drops` when the last successful check started; `None`: never checked.
    verified_drops: Option<u64>,
    verified_at: Option<Instant>,
    attempted_at: Option<Instant>,
    run_id: Option<Arc<str>>,
    /// Whether every server the last full check read has sharded pub/sub.
    sharded_pubsub: bool,
}

impl Check {
    /// The connection dropped since the last successful check (or there was none): the server
    /// behind it may be another one.
    fn stale(&self) -> bool {
        self.verified_drops != Some(self.drops)
    }
}

impl RedisNode {
    pub(crate) async fn build(
        config: RedisConfig,
        backend: &'static str,
        dedup: Option<ReleaseDedup>,
    ) -> Result<(Self, redis::Client, ConnectionManagerConfig)> {
        let info = config.connection_info()?;
        let ca = if config.is_tls() {
            config.tls_ca_pem().await?
        } else {
            None
        };
        let client = open_client(info, ca).map_err(|e| {
            Error::config(format!(
                "Redis {}: {}",
                config.redacted_url(),
                scrub(&e, config.secret())
            ))
        })?;
        let wakeups = Arc::new(Wakeups::with_dedup(dedup));
        let w = wakeups.clone();
        let check = Arc::new(Mutex::new(Check::default()));
        let c = check.clone();
        let dropped = Arc::new(tokio::sync::Notify::new());
        let d = dropped.clone();
        let feed_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout()))
            .set_response_timeout(Some(config.request_timeout()))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
            .set_automatic_resubscription();
        let on_push: PushHandler = Arc::new(move |info: redis::PushInfo| {
            if info.kind == redis::PushKind::Disconnection {
                c.lock().drops += 1; // the next connection is checked before any grant
                d.notify_one();
            }
            w.on_push(info);
        });
        let handler = on_push.clone();
        let manager_config = feed_config
            .clone()
            .set_push_sender(move |info: redis::PushInfo| {
                handler(info);
                Ok::<(), std::convert::Infallible>(())
            });
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
            .map_err(|e| {
                Error::config(format!(
                    "Redis {}: {}",
                    config.redacted_url(),
                    scrub(&e, config.secret())
                ))
            })?;
        Ok((
            RedisNode {
                config,
                target: Arc::new(Target {
                    conn: parking_lot::RwLock::new(Conn::Server(conn)),
                    switched: tokio::sync::watch::Sender::new(0),
                    dropped,
                    sharded: std::sync::atomic::AtomicBool::new(false),
                    renewals: Arc::default(),
                }),
                manager_config: manager_config.clone(),
                follower: None,
                client: client.clone(),
                feed_config,
                wakeups,
                on_push,
                backend,
                check,
            },
            client,
            manager_config,
        ))
    }

    /// Connects and authenticates now: [`Error::Unauthenticated`] for rejected credentials,
    /// [`Error::Unavailable`] when the server cannot be reached.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        Self::connect_as(config, BACKEND).await
    }

    /// [`connect`](Self::connect), naming `backend` in errors (`"redlock"` for its masters).
    pub async fn connect_as(config: RedisConfig, backend: &'static str) -> Result<Self> {
        config.check_timeouts()?;
        let (node, client, manager_config) = Self::build(config, backend, None).await?;
        let conn = tokio::time::timeout(
            node.config.connect_timeout() + node.config.request_timeout(),
            ConnectionManager::new_with_config(client, manager_config),
        )
        .await
        .map_err(|_| node.unavailable("connection attempt timed out"))?
        .map_err(|e| node.connect_error(&e))?;
        *node.target.conn.write() = Conn::Server(conn);
        node.verify(node.config.request_timeout()).await?;
        Ok(node)
    }

    /// Whether [`verify`](Self::verify) has work to do: the connection dropped since the last
    /// check (the server behind it may be another one now), or that check is a minute old.
    pub fn needs_verify(&self) -> bool {
        let c = self.check.lock();
        c.stale() || c.verified_at.map_or(true, |t| t.elapsed() >= RECHECK_EVERY)
    }

    /// Whether the connection dropped since the last successful [`verify`](Self::verify), or
    /// there was none: until checked, the server behind it may be another one.
    pub fn is_stale(&self) -> bool {
        self.check.lock().stale()
    }

    /// When the last [`verify`](Self::verify) of a node that needed one was attempted.
    pub fn last_verify_attempt(&self) -> Option<Instant> {
        self.check.lock().attempted_at
    }

    /// Checks, if [`needs_verify`](Self::needs_verify), that this server cannot evict the
    /// lock's keys, and learns its identity (`run_id`); one `INFO` request bounded by
    /// `timeout`. The drivers call it at connect and before granting on a connection that
    /// dropped since.
    ///
    /// [`Error::Config`] when the server is a replica or a Redis Cluster node, when `maxmemory`
    /// is set with an evicting `maxmemory-policy` (unless
    /// [`RedisConfig::with_allow_eviction`]), or when the server rejects the credentials;
    /// [`Error::Unavailable`] when it does not answer. On a Redis Cluster: every master.
    pub async fn verify(&self, timeout: Duration) -> Result<()> {
        self.verify_for(timeout, None).await
    }

    /// [`verify`](Self::verify) before a grant on `key`: on a Redis Cluster, of the master of
    /// its slot only (the one the grant goes to), so that a shard down or failing over
    /// holds up no grant on another; elsewhere the same as `verify`.
    pub(crate) async fn verify_for(&self, timeout: Duration, key: Option<&str>) -> Result<()> {
        if !self.needs_verify() {
            return Ok(());
        }
        let started = Instant::now();
        let drops = {
            let mut c = self.check.lock();
            c.attempted_at = Some(started);
            c.drops
        };
        let reply = tokio::time::timeout(timeout, self.connection().info(key))
            .await
            .map_err(|_| self.unavailable("no answer to INFO within the timeout"))?
            .map_err(|e| self.info_error(&e))?;
        // One server's INFO, or each master's of a cluster: every one must pass.
        let (mut run_id, mut sharded_pubsub) = (None, true);
        for text in ServerFacts::texts(reply) {
            let text = text.map_err(|e| self.unavailable(&format!("INFO answered {e}")))?;
            let facts = ServerFacts::parse(&text);
            self.check_facts(&facts)?;
            sharded_pubsub &= facts.sharded_pubsub();
            run_id = facts.run_id;
        }
        if self.config.cluster().is_some() {
            run_id = None; // several servers: none is "the" server
        }
        let mut c = self.check.lock();
        // A drop while INFO was on its way leaves the node stale: the next call checks again.
        c.verified_drops = Some(drops);
        c.verified_at = Some(started);
        c.run_id = run_id.map(Arc::from);
        if key.is_none() {
            c.sharded_pubsub = sharded_pubsub;
        }
        Ok(())
    }

    /// From now on, release announcements go by sharded pub/sub if every master the last full
    /// [`verify`](Self::verify) read has it (a cluster's, at connect).
    pub(crate) fn announce_by_shard_if_every_master_can(&self) {
        let all = self.check.lock().sharded_pubsub;
        (self.target.sharded).store(all, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether release announcements go by sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`).
    pub(crate) fn announces_by_shard(&self) -> bool {
        self.target
            .sharded
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn info_error(&self, e: &redis::RedisError) -> Error {
        if e.to_string().contains("NOPERM") {
            Error::config(format!(
                "Redis at {}: user {:?} may not run INFO, which the driver needs to check \
                 that the server cannot evict lock keys; grant it +info",
                self.config.endpoint(),
                self.config.user().unwrap_or("default")
            ))
        } else {
            self.connect_error(e)
        }
    }

    /// A server whose `INFO` says this may not hold locks: a cluster node where one server was
    /// named, a replica, or a server that can evict keys.
    fn check_facts(&self, facts: &ServerFacts) -> Result<()> {
        if facts.cluster && self.config.cluster().is_none() {
            // Its slots live on other nodes (MOVED) or nowhere yet (CLUSTERDOWN), and move.
            return Err(Error::config(format!(
                "Redis at {} runs in cluster mode: a redis:// URL speaks to one server. Name \
                 the cluster's nodes in a redis+cluster:// URL",
                self.config.endpoint()
            )));
        }
        if let (Some(master), Some(_)) = (facts.replica_of(), self.config.sentinels()) {
            // The sentinels named it, and it has been demoted since (a failover).
            self.target.dropped.notify_one();
            return Err(self.unavailable(&format!(
                "the master the sentinels named is a replica now (of {master}): a failover is \
                 under way"
            )));
        }
        if facts.replica_of().is_some() && self.config.cluster().is_some() {
            // The client's map of the slots still names a master deposed since (a failover):
            // the grant, sent there too, is redirected (`MOVED`) and corrects the map.
        } else if let Some(master) = facts.replica_of() {
            // Read-only, it refuses every grant; writable, it erases them at its next sync.
            return Err(Error::config(format!(
                "Redis at {} is a replica (of {master}): a read-only one refuses every lock, a \
                 writable one loses them when it syncs with its master. Point distlock at a \
                 master",
                self.config.endpoint()
            )));
        }
        if let Some(risk) = facts.eviction_risk() {
            if !self.config.allow_eviction() {
                return Err(Error::config(format!(
                    "Redis at {} can evict {risk} (maxmemory {} bytes, maxmemory-policy {}): a \
                     lock could vanish while held and be granted twice{}. Set \
                     maxmemory-policy noeviction, or accept this with allow_eviction=true in \
                     the URL (fencing tokens are then off)",
                    self.config.endpoint(),
                    facts.maxmemory,
                    facts.policy,
                    if risk.contains("counter") {
                        ", and fencing tokens could restart at 1"
                    } else {
                        ""
                    }
                )));
            }
        }
        Ok(())
    }

    /// The server's `run_id` (unique per server process) as of the last
    /// [`verify`](Self::verify): what tells two names of one server apart from two servers.
    pub fn run_id(&self) -> Option<Arc<str>> {
        self.check.lock().run_id.clone()
    }

    /// A node that connects on first use and reconnects by itself, one of several that announce
    /// the same releases (Redlock's masters, which tolerate a minority of them being down when
    /// the client starts): nodes sharing `dedup` wake a local waiter once per release, not once
    /// per node.
    pub async fn lazy_shared(
        config: RedisConfig,
        backend: &'static str,
        dedup: ReleaseDedup,
    ) -> Result<Self> {
        Ok(Self::build(config, backend, Some(dedup)).await?.0)
    }

    /// The node's configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The node's handler of push messages, for a connection made elsewhere (a cluster's).
    pub(crate) fn push_handler(&self) -> PushHandler {
        self.on_push.clone()
    }

    /// Puts `conn` in place of the node's connection (a cluster's, made by `cluster.rs`).
    pub(crate) fn install(&self, conn: Conn) {
        *self.target.conn.write() = conn;
    }

    /// A handle on the connection (clones share it).
    pub fn connection(&self) -> Conn {
        self.target.conn.read().clone()
    }

    /// How many times the node moved to a new master so far (0 but behind sentinels): an
    /// answer to a request sent before a move came from a deposed master and confirms nothing.
    pub(crate) fn switches(&self) -> u64 {
        *self.target.switched.borrow()
    }

    /// The node's server behind its switches (see [`Target`]).
    pub(crate) fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// The node's connection for a write that counts only once
    /// [`RedisConfig::with_wait_replicas`]`(n)` replicas acknowledged it (and, with
    /// [`RedisConfig::with_wait_aof`], once the master and that many replicas fsynced it):
    /// each command goes with its waits, a quarter of the request timeout at most together, to the same
    /// server (see [`Acknowledged`]). Waiting for nothing, the connection itself.
    pub(crate) fn acknowledged(&self) -> Acknowledged {
        let (replicas, aof) = (self.config.wait_replicas(), self.config.wait_aof());
        // The waits of one pipeline within a quarter of the request timeout together: a
        // script the server forgot (a restarted or promoted master) costs two pipelines, the
        // first answered `NOSCRIPT` after its waits, and both must fit in the request timeout
        // (with half of it each, such a grant timed out instead of saying what it was short of).
        let waits = 1 + u32::from(replicas > 0 && aof.is_some());
        let ms = (self.config.request_timeout() / 4 / waits)
            .as_millis()
            .max(1);
        let ms = u64::try_from(ms).unwrap_or(u64::MAX);
        Acknowledged::new(self.connection(), replicas, aof, ms)
    }

    /// This node, keeping `guard` alive as long as it or a clone lives.
    pub(crate) fn keeping(mut self, guard: Arc<dyn std::any::Any + Send + Sync>) -> RedisNode {
        self.follower = Some(guard);
        self
    }

    /// This node without its follower: what the follower itself holds (holding its own
    /// handle, it would never stop).
    pub(crate) fn detached(&self) -> RedisNode {
        RedisNode {
            follower: None,
            ..self.clone()
        }
    }

    /// Moves this node to the master at `host:port` (a Sentinel failover): connects, checks
    /// that the server answers as a master itself, then swaps the connection, resubscribes the
    /// waiters' channels there (and wakes them: announcements may have been lost) and counts the
    /// switch, which puts every lease granted before it in doubt until it is confirmed there.
    pub(crate) async fn switch_to(&self, host: &str, port: u16) -> Result<()> {
        let config = self.config.at(host, port);
        // The CA file is read again: a switch is rare, and a rotated CA is then trusted.
        let ca = match config.is_tls() {
            true => config.tls_ca_pem().await?,
            false => None,
        };
        let client = open_client(config.connection_info()?, ca)
            .map_err(|e| Error::config(scrub(&e, config.secret())))?;
        let limit = config.connect_timeout() + config.request_timeout();
        let connecting = ConnectionManager::new_with_config(client, self.manager_config.clone());
        let conn = tokio::time::timeout(limit, connecting)
            .await
            .map_err(|_| self.unavailable("the new master did not answer"))?
            .map_err(|e| self.connect_error(&e))?;
        let mut role = redis::cmd("INFO");
        role.arg("replication");
        let info = tokio::time::timeout(limit, role.query_async::<String>(&mut conn.clone()))
            .await
            .map_err(|_| self.unavailable("the new master did not answer INFO"))?
            .map_err(|e| self.error(&e))?;
        if let Some(of) = ServerFacts::parse(&info).replica_of() {
            return Err(self.unavailable(&format!(
                "{host}:{port}, named by the sentinels, is still a replica (of {of})"
            )));
        }
        let conn = Conn::Server(conn);
        *self.target.conn.write() = conn.clone();
        self.check.lock().drops += 1; // the next grant checks the new server first
        self.wakeups.moved_to(&conn).await;
        self.target.switched.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Subscribes (once per lock, however many wait) to `keys`' release announcements; returns
    /// after the server confirmed the subscription.
    pub async fn watch_releases(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        self.wakeups
            .watch(&self.connection(), &keys.channel, keys.sharded)
            .await
            .map_err(|e| self.error(&e))
    }

    /// A connection of its own subscribed to `channels`, whose messages (and disconnections:
    /// messages may have been lost) arrive on the receiver; it resubscribes when it reconnects.
    pub(crate) async fn subscriber(
        &self,
        channels: &[&str],
    ) -> Result<(
        ConnectionManager,
        tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
    )> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let config = self.feed_config.clone().set_push_sender(tx);
        let connecting = ConnectionManager::new_with_config(self.client.clone(), config);
        let limit = self.config.connect_timeout() + self.config.request_timeout();
        let mut conn = tokio::time::timeout(limit, connecting)
            .await
            .map_err(|_| self.unavailable("connection attempt timed out"))?
            .map_err(|e| self.connect_error(&e))?;
        for ch in channels {
            conn.subscribe(ch).await.map_err(|e| self.error(&e))?;
        }
        Ok((conn, rx))
    }

    /// Maps a failed request to the contract's errors: transient (connection, timeout,
    /// loading, failover) → `Unavailable`; anything else → `Backend`. Never contains secrets.
    pub fn error(&self, e: &redis::RedisError) -> Error {
        let transient = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(
                e.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::BusyLoading
                        | redis::ServerErrorKind::TryAgain
                        | redis::ServerErrorKind::ClusterDown
                        | redis::ServerErrorKind::MasterDown
                )
            );
        let source =
            ClientError::new(e.clone(), self.config.secret()).context(self.config.redacted_url());
        if transient {
            Error::unavailable(self.backend, source)
        } else {
            Error::backend(self.backend, source)
        }
    }

    /// `Unavailable` naming this node.
    pub fn unavailable(&self, what: &str) -> Error {
        Error::unavailable(
            self.backend,
            format!("{what} at {}", self.config.redacted_url()),
        )
    }

    fn connect_error(&self, e: &redis::RedisError) -> Error {
        let text = scrub(e, self.config.secret());
        let auth = matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
            || text.contains("WRONGPASS")
            || text.contains("NOAUTH")
            || text.contains("NOPERM");
        if auth {
            Error::unauthenticated(
                self.backend,
                format!(
                    "Redis at {} rejected the credentials of user {:?}: {text}",
                    self.config.endpoint(),
                    self.config.user().unwrap_or("default")
                ),
            )
        } else if text.contains("DB index is out of range") {
            // The URL names a database the server does not have: retrying cannot help.
            Error::config(format!(
                "Redis at {} has no database {}: {text}",
                self.config.endpoint(),
                self.config.db()
            ))
        } else {
            Error::unavailable(
                self.backend,
                format!("cannot connect to {}: {text}", self.config.redacted_url()),
            )
        }
    }
}

impl fmt::Debug for RedisNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisNode")
            .field("config", &self.config)
            .finish()
    }
}

/// A client for `info`, trusting `ca` (PEM) for TLS if given.
pub(crate) fn open_client(
    info: redis::ConnectionInfo,
    ca: Option<Vec<u8>>,
) -> redis::RedisResult<redis::Client> {
    #[cfg(feature = "tls")]
    {
        // redis-rs brings rustls without a crypto provider; rustls panics at the first TLS
        // handshake unless one is installed. Ours only if the application installed none.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if let Some(pem) = ca {
            return redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            );
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = ca; // a CA without TLS support: connection_info() already refused TLS
    redis::Client::open(info)
}
