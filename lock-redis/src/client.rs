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

use crate::config::BACKEND;
use crate::scripts::LockKeys;
use crate::wakeup::{ReleaseDedup, Wakeups, Watch};
use crate::RedisConfig;

/// A connection to one Redis server plus the registry that turns its release announcements
/// into wake-ups. Cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct RedisNode {
    config: RedisConfig,
    conn: ConnectionManager,
    /// For connections of their own (an election's observers): the client and the manager's
    /// settings, without the wake-ups' push handler.
    client: redis::Client,
    feed_config: ConnectionManagerConfig,
    wakeups: Arc<Wakeups>,
    backend: &'static str,
    check: Arc<Mutex<Check>>,
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
}

impl Check {
    /// The connection dropped since the last successful check (or there was none): the server
    /// behind it may be another one.
    fn stale(&self) -> bool {
        self.verified_drops != Some(self.drops)
    }
}

/// A waiter's registration for one lock's release announcements on one node. Keep it while
/// waiting; dropping the last one of a lock unsubscribes.
pub struct ReleaseWatch(Watch);

impl ReleaseWatch {
    /// Notified once per release announcement (one local waiter per message) and for every
    /// waiter when the connection drops (messages may have been lost). Create the `notified()`
    /// future and `enable()` it before checking the lock, then await it.
    pub fn notify(&self) -> &tokio::sync::Notify {
        self.0.notify()
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReleaseWatch")
    }
}

impl RedisNode {
    async fn build(
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
        let feed_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout()))
            .set_response_timeout(Some(config.request_timeout()))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
            .set_automatic_resubscription();
        let manager_config = feed_config
            .clone()
            .set_push_sender(move |info: redis::PushInfo| {
                if info.kind == redis::PushKind::Disconnection {
                    c.lock().drops += 1; // the next connection is checked before any grant
                }
                w.on_push(info);
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
                conn,
                client: client.clone(),
                feed_config,
                wakeups,
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
        let (mut node, client, manager_config) = Self::build(config, backend, None).await?;
        let conn = tokio::time::timeout(
            node.config.connect_timeout() + node.config.request_timeout(),
            ConnectionManager::new_with_config(client, manager_config),
        )
        .await
        .map_err(|_| node.unavailable("connection attempt timed out"))?
        .map_err(|e| node.connect_error(&e))?;
        node.conn = conn;
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
    /// [`Error::Unavailable`] when it does not answer.
    pub async fn verify(&self, timeout: Duration) -> Result<()> {
        if !self.needs_verify() {
            return Ok(());
        }
        let started = Instant::now();
        let drops = {
            let mut c = self.check.lock();
            c.attempted_at = Some(started);
            c.drops
        };
        let reply = tokio::time::timeout(
            timeout,
            redis::cmd("INFO").query_async::<String>(&mut self.conn.clone()),
        )
        .await
        .map_err(|_| self.unavailable("no answer to INFO within the timeout"))?
        .map_err(|e| {
            if e.to_string().contains("NOPERM") {
                Error::config(format!(
                    "Redis at {}: user {:?} may not run INFO, which the driver needs to check \
                     that the server cannot evict lock keys; grant it +info",
                    self.config.endpoint(),
                    self.config.user().unwrap_or("default")
                ))
            } else {
                self.connect_error(&e)
            }
        })?;
        let facts = ServerFacts::parse(&reply);
        if facts.cluster {
            // Its slots live on other nodes (MOVED) or nowhere yet (CLUSTERDOWN), and move.
            return Err(Error::config(format!(
                "Redis at {} runs in cluster mode: the driver speaks to one server and does not \
                 follow a cluster's slots (MOVED) or failovers. Point distlock at a standalone \
                 master",
                self.config.endpoint()
            )));
        }
        if let Some(master) = facts.replica_of() {
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
        let mut c = self.check.lock();
        // A drop while INFO was on its way leaves the node stale: the next call checks again.
        c.verified_drops = Some(drops);
        c.verified_at = Some(started);
        c.run_id = facts.run_id.map(Arc::from);
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

    /// A handle on the connection (clones share it).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Subscribes (once per lock, however many wait) to `keys`' release announcements; returns
    /// after the server confirmed the subscription.
    pub async fn watch_releases(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        self.wakeups
            .watch(&self.conn, &keys.channel)
            .await
            .map(ReleaseWatch)
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

/// What `INFO` says about a server that matters for locks.
#[derive(Debug, Default, PartialEq, Eq)]
struct ServerFacts {
    run_id: Option<String>,
    maxmemory: u64,
    policy: String,
    /// `master` or `slave` (Redis's word for a replica).
    role: String,
    /// The master of a replica, `host:port` as `INFO` gives them.
    master: [Option<String>; 2],
    /// `cluster_enabled:1`: a Redis Cluster node.
    cluster: bool,
}

impl ServerFacts {
    fn parse(info: &str) -> Self {
        let mut f = ServerFacts {
            policy: "noeviction".into(),
            ..ServerFacts::default()
        };
        for line in info.lines() {
            match line.trim_end().split_once(':') {
                Some(("run_id", v)) => f.run_id = Some(v.to_string()),
                Some(("maxmemory", v)) => f.maxmemory = v.parse().unwrap_or(u64::MAX),
                Some(("maxmemory_policy", v)) => f.policy = v.to_string(),
                Some(("role", v)) => f.role = v.to_string(),
                Some(("master_host", v)) => f.master[0] = Some(v.to_string()),
                Some(("master_port", v)) => f.master[1] = Some(v.to_string()),
                Some(("cluster_enabled", v)) => f.cluster = v == "1",
                _ => {}
            }
        }
        f
    }

    /// The master of a server that is a replica (`?` for what `INFO` leaves out).
    fn replica_of(&self) -> Option<String> {
        (self.role != "master" && !self.role.is_empty()).then(|| {
            let [host, port] = self.master.clone().map(|v| v.unwrap_or_else(|| "?".into()));
            format!("{host}:{port}")
        })
    }

    /// Which of the lock's keys the server may evict, if any. No `maxmemory` means no eviction
    /// whatever the policy; `volatile-*` evicts keys with a TTL (a held lock's), `allkeys-*`
    /// any key (also the fencing counter); an unknown policy is assumed to evict anything.
    fn eviction_risk(&self) -> Option<&'static str> {
        if self.maxmemory == 0 || self.policy == "noeviction" {
            None
        } else if self.policy.starts_with("volatile-") {
            Some("held locks' keys")
        } else {
            Some("held locks' keys and the fencing counter")
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
fn open_client(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(maxmemory: u64, policy: &str) -> ServerFacts {
        ServerFacts::parse(&format!(
            "# Server\r\nrun_id:abc\r\n# Memory\r\nmaxmemory:{maxmemory}\r\nmaxmemory_policy:{policy}\r\n"
        ))
    }

    #[test]
    fn reads_identity_and_memory_policy() {
        let f = facts(67108864, "allkeys-lru");
        assert_eq!(f.run_id.as_deref(), Some("abc"));
        assert_eq!((f.maxmemory, f.policy.as_str()), (67108864, "allkeys-lru"));
    }

    #[test]
    fn reads_whether_the_server_is_a_replica() {
        let replica = "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.5\r\nmaster_port:6379\r\n";
        let f = ServerFacts::parse(replica);
        assert_eq!(f.replica_of().as_deref(), Some("10.0.0.5:6379"));
        let master = ServerFacts::parse("# Replication\r\nrole:master\r\nconnected_slaves:1\r\n");
        assert_eq!(master.replica_of(), None);
        assert_eq!(
            facts(0, "noeviction").replica_of(),
            None,
            "no role line: not a replica"
        );
    }

    #[test]
    fn eviction_risk_follows_maxmemory_and_policy() {
        assert_eq!(facts(0, "allkeys-lru").eviction_risk(), None);
        assert_eq!(facts(1 << 20, "noeviction").eviction_risk(), None);
        // Every evicting policy is a risk; the counter is at risk unless only volatile keys
        // (those with a TTL) can be evicted, and an unknown policy is assumed the worst.
        let policies = [
            ("volatile-lru", false),
            ("volatile-lfu", false),
            ("volatile-random", false),
            ("volatile-ttl", false),
            ("allkeys-lru", true),
            ("allkeys-lfu", true),
            ("allkeys-random", true),
            ("something-new", true),
        ];
        for (p, counter) in policies {
            let r = facts(1 << 20, p).eviction_risk();
            assert!(
                r.is_some_and(|r| r.contains("counter") == counter),
                "{p}: {r:?}"
            );
        }
    }
}
