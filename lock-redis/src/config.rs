//! `RedisConfig`: where the server is, how to log in, how keys are named.

use std::time::Duration;

use lock_core::driver::{host_port, MultiHostUrl, Param, Query, Secret, TlsCa};
use lock_core::{Error, Result};

/// The backend's name, as [`DistributedLock::backend`](lock_core::DistributedLock::backend)
/// and errors give it.
pub(crate) const BACKEND: &str = "redis";

/// Default key prefix: keys are `distlock:{<name>}` and `distlock:{<name>}:fence`.
pub const DEFAULT_PREFIX: &str = "distlock:";

/// Connection and naming settings for [`RedisLock`](crate::RedisLock).
///
/// Build it from a URL or with the builder methods. `Debug` and [`RedisConfig::redacted_url`]
/// never show the password.
///
/// ```
/// use std::time::Duration;
/// use lock_redis::RedisConfig;
/// let cfg = RedisConfig::from_url("redis://locker:s3cret@10.0.0.1:6379/2?prefix=app:")?
///     .with_request_timeout(Duration::from_millis(500));
/// assert_eq!(cfg.host(), "10.0.0.1");
/// assert_eq!(cfg.db(), 2);
/// assert_eq!(cfg.prefix(), "app:");
/// assert!(!format!("{cfg:?}").contains("s3cret"));
/// assert_eq!(cfg.redacted_url(), "redis://locker:***@10.0.0.1:6379/2");
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    host: String,
    port: u16,
    db: i64,
    user: Option<String>,
    password: Option<Secret>,
    tls: bool,
    tls_ca: Option<TlsCa>,
    prefix: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    allow_eviction: bool,
    plain_keys: bool,
    /// Replicas that must acknowledge a grant or renewal (`WAIT`) before it counts.
    wait_replicas: u32,
    /// Replicas that must have fsynced a grant or renewal to their AOF, besides the master,
    /// before it counts (`WAITAOF 1 N`); `None`: no such wait.
    wait_aof: Option<u32>,
    /// Where the master is: the one server at `host:port`, the one the sentinels name, or
    /// the cluster's master of each lock's slot.
    deployment: Deployment,
}

/// How the servers are deployed (the URL's scheme).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Deployment {
    /// One server, at `host:port` (`redis://`, `rediss://`).
    Server,
    /// The master the sentinels name (`redis+sentinel://`).
    Sentinels(std::sync::Arc<Sentinels>),
    /// A Redis Cluster, found from these of its nodes (`redis+cluster://`).
    Cluster(std::sync::Arc<[(String, u16)]>),
}

/// A Sentinel deployment: the sentinels to ask, and the name they know the master by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sentinels {
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) master: String,
    /// The sentinels' own login, if they want one (their `requirepass`, or an ACL user): not
    /// the Redis servers', which the URL's user info gives.
    pub(crate) user: Option<String>,
    pub(crate) password: Option<Secret>,
}

/// Sentinels listen on 26379 unless told otherwise.
const SENTINEL_PORT: u16 = 26379;

impl RedisConfig {
    /// `host:port`, database 0, no credentials, prefix [`DEFAULT_PREFIX`], 2 s connect timeout,
    /// 1 s response timeout.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        RedisConfig {
            host: host.into(),
            port,
            db: 0,
            user: None,
            password: None,
            tls: false,
            tls_ca: None,
            prefix: DEFAULT_PREFIX.to_string(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(1),
            allow_eviction: false,
            plain_keys: false,
            wait_replicas: 0,
            wait_aof: None,
            deployment: Deployment::Server,
        }
    }

    /// Parses `redis://[user[:password]@]host[:port][/db][?key=value&...]` (port 6379 by
    /// default; the keys are [`RedisConfig::URL_PARAMS`]: `keys=tagged|plain`, `prefix`,
    /// `allow_eviction`, `tls_ca_file`, `timeout_ms`, `connect_timeout_ms`)
    /// or `rediss://...[?tls_ca_file=/path/ca.pem]` (TLS; needs this crate's `tls` feature;
    /// without `tls_ca_file` the server's certificate must chain to a public root). User and
    /// password are percent-decoded. Errors are [`Error::Config`] and never echo the password.
    ///
    /// `redis+sentinel://[user[:password]@]s1[:p1],s2[:p2],.../MASTER[/db][?...]` finds the
    /// master named `MASTER` through the sentinels listed (port 26379 by default), follows it
    /// when they fail it over, and never writes to a replica; the credentials are the Redis
    /// servers', and the same query keys apply, with `sentinel_password` (and `sentinel_user`)
    /// for sentinels that want a login of their own
    /// ([`with_sentinel_password`](Self::with_sentinel_password)).
    /// `rediss+sentinel://…[?tls_ca_file=/path/ca.pem]` speaks TLS to the sentinels and to the
    /// servers alike (their `tls-port`s, as sentinels with `tls-replication yes` name them).
    pub fn from_url(url: &str) -> Result<Self> {
        let (scheme, tls) = match url.split_once("://").map(|(s, _)| s) {
            Some("redis") => ("redis", false),
            Some("rediss") => ("rediss", true),
            Some(s @ ("redis+sentinel" | "rediss+sentinel")) => {
                return Self::from_sentinel_url(url, s)
            }
            Some(s @ ("redis+cluster" | "rediss+cluster")) => {
                return Self::from_cluster_url(url, s)
            }
            _ => {
                return Err(Error::config(
                    "a Redis URL starts with redis://, rediss://, redis+sentinel://, \
                     rediss+sentinel://, redis+cluster:// or rediss+cluster:// (several \
                     independent masters: redlock://)",
                ))
            }
        };
        let parsed = MultiHostUrl::parse(url, scheme, "Redis")?;
        let [server] = parsed.hosts.as_slice() else {
            return Err(Error::config(format!(
                "Redis URL {}: one server only (several masters: redlock://)",
                parsed.redacted(scheme)
            )));
        };
        let (host, port) = host_port(server, 6379).ok_or_else(|| {
            Error::config(format!(
                "Redis URL {}: {server:?} is not host[:port] or [IPv6][:port]",
                parsed.redacted(scheme)
            ))
        })?;
        let mut cfg = RedisConfig::new(host, port);
        cfg.tls = tls;
        cfg.user = parsed.user.clone().filter(|u| !u.is_empty());
        cfg.password = parsed.password.clone().map(Secret::new);
        if let Some(path) = parsed.path.as_deref() {
            let db = path.trim_start_matches('/');
            cfg.db = db.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(|| {
                Error::config(format!(
                    "Redis URL {}: database {db:?} is not a non-negative number",
                    parsed.redacted(scheme)
                ))
            })?;
        }
        let cfg = Query::apply("Redis URL", parsed.query, Self::URL_PARAMS, cfg)?;
        tls_built(tls, scheme)?;
        Ok(cfg)
    }

    fn from_sentinel_url(url: &str, scheme: &str) -> Result<Self> {
        let tls = scheme.starts_with("rediss");
        let parsed = MultiHostUrl::parse(url, scheme, "Redis Sentinel")?;
        let bad = |what: String| {
            Error::config(format!(
                "Redis Sentinel URL {}: {what}",
                parsed.redacted(scheme)
            ))
        };
        let hosts = parsed.host_ports(SENTINEL_PORT).map_err(bad)?;
        let path = parsed.path.as_deref().unwrap_or("");
        let mut parts = path.trim_start_matches('/').split('/');
        let master = parts.next().unwrap_or_default().to_string();
        if master.is_empty() || master.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("the path names the master as the sentinels know it: \
                 redis+sentinel://s1,s2,s3/MASTER[/db]"
                .into()));
        }
        let (host, port) = hosts[0].clone();
        let mut cfg = RedisConfig::new(host, port);
        if let Some(db) = parts.next() {
            cfg.db = db
                .parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| bad(format!("database {db:?} is not a non-negative number")))?;
        }
        if parts.next().is_some() {
            return Err(bad("the path is /MASTER or /MASTER/db".into()));
        }
        cfg.user = parsed.user.clone().filter(|u| !u.is_empty());
        cfg.password = parsed.password.clone().map(Secret::new);
        cfg.deployment = Deployment::Sentinels(std::sync::Arc::new(Sentinels {
            hosts,
            master,
            user: None,
            password: None,
        }));
        cfg.tls = tls;
        let cfg = Query::apply("Redis Sentinel URL", parsed.query, Self::URL_PARAMS, cfg)?;
        tls_built(tls, scheme)?;
        Ok(cfg)
    }

    fn from_cluster_url(url: &str, scheme: &str) -> Result<Self> {
        let tls = scheme.starts_with("rediss");
        let parsed = MultiHostUrl::parse(url, scheme, "Redis Cluster")?;
        let bad = |what: String| {
            Error::config(format!(
                "Redis Cluster URL {}: {what}",
                parsed.redacted(scheme)
            ))
        };
        let hosts = parsed.host_ports(6379).map_err(bad)?;
        // A cluster has database 0 only.
        if !matches!(parsed.path.as_deref().unwrap_or(""), "" | "/" | "/0") {
            return Err(bad(
                "a cluster has database 0 only: the URL has no path (redis+cluster://n1,n2,n3)"
                    .into(),
            ));
        }
        let (host, port) = hosts[0].clone();
        let mut cfg = RedisConfig::new(host, port);
        cfg.user = parsed.user.clone().filter(|u| !u.is_empty());
        cfg.password = parsed.password.clone().map(Secret::new);
        cfg.deployment = Deployment::Cluster(hosts.into());
        cfg.tls = tls;
        let cfg = Query::apply("Redis Cluster URL", parsed.query, Self::URL_PARAMS, cfg)?;
        tls_built(tls, scheme)?;
        Ok(cfg)
    }

    /// Whether a replica can be promoted in place of the master (Sentinel, Cluster): then
    /// replication, which is asynchronous, can forget the last writes.
    pub(crate) fn fails_over(&self) -> bool {
        self.deployment != Deployment::Server
    }

    /// The nodes a `redis+cluster://` configuration starts from.
    pub(crate) fn cluster(&self) -> Option<&[(String, u16)]> {
        match &self.deployment {
            Deployment::Cluster(nodes) => Some(nodes),
            _ => None,
        }
    }

    /// The same settings for the server at `host:port` (the master the sentinels named).
    pub(crate) fn at(&self, host: &str, port: u16) -> RedisConfig {
        let mut c = self.clone();
        c.host = host.to_string();
        c.port = port;
        c
    }

    /// The sentinels, for a `redis+sentinel://` configuration.
    pub(crate) fn sentinels(&self) -> Option<&std::sync::Arc<Sentinels>> {
        match &self.deployment {
            Deployment::Sentinels(s) => Some(s),
            _ => None,
        }
    }

    /// The query parameters of a Redis URL (lock-core's `Query::apply` reads them).
    pub const URL_PARAMS: &'static [Param<RedisConfig>] = &[
        Param::new("keys", |c: Self, v| {
            Ok(c.with_plain_keys(v.choice(&["tagged", "plain"])? == "plain"))
        }),
        Param::new("prefix", |c: Self, v| c.with_prefix(v.raw())),
        Param::new("allow_eviction", |c: Self, v| {
            Ok(c.with_allow_eviction(v.flag()?))
        }),
        Param::new("tls_ca_file", |c: Self, v| match c.tls {
            true => Ok(c.with_tls_ca_file(v.raw())),
            false => Err(Error::config(
                "Redis URL: tls_ca_file needs a rediss:// URL",
            )),
        }),
        Param::new("wait_replicas", |c: Self, v| {
            Ok(c.with_wait_replicas(v.number::<u32>()?))
        }),
        Param::new("wait_aof", |c: Self, v| {
            Ok(c.with_wait_aof(Some(v.number::<u32>()?)))
        }),
        Param::new("sentinel_user", |c: Self, v| c.with_sentinel_user(v.raw())),
        Param::new("sentinel_password", |c: Self, v| {
            c.with_sentinel_password(v.raw())
        }),
        Param::new("timeout_ms", |c: Self, v| {
            Ok(c.with_request_timeout(v.millis()?))
        }),
        Param::new("connect_timeout_ms", |c: Self, v| {
            Ok(c.with_connect_timeout(v.millis()?))
        }),
    ];

    // An ACL user and its password: with_credentials, user.
    lock_core::driver::credential_setters!();
    /// The password of the `default` user (`requirepass`), or of the user already set.
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(Secret::new(password));
        self
    }
    /// Selects a database number.
    pub fn with_database(mut self, db: i64) -> Self {
        self.db = db;
        self
    }
    lock_core::driver::tls_setters!();
    lock_core::driver::timeout_setters!();
    /// The PEM of the configured TLS certificate authority, if any, read from its file off the
    /// runtime's threads.
    pub(crate) async fn tls_ca_pem(&self) -> Result<Option<Vec<u8>>> {
        match &self.tls_ca {
            None => Ok(None),
            Some(ca) => ca.load().await.map(Some),
        }
    }
    /// Sets the key prefix. It may not contain `{`, `}`, whitespace or control characters
    /// (they would break the Cluster hash tag or the key's meaning).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let p = prefix.into();
        if p.len() > 64
            || p.chars()
                .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
        {
            return Err(Error::config(format!(
                "key prefix \"{}\" must be at most 64 characters without braces, spaces or control characters",
                p.escape_debug()
            )));
        }
        self.prefix = p;
        Ok(self)
    }
    /// Accepts a server that may evict keys under memory pressure (`maxmemory` with a
    /// `volatile-*` or `allkeys-*` policy), which the drivers refuse by default: a held lock's
    /// key can then vanish and the lock be granted twice. With this on, `RedisLock` declares
    /// `Fencing::None` (an evicted counter would restart tokens at 1). URL:
    /// `allow_eviction=true`.
    pub fn with_allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }
    /// Plain-key mode (URL: `keys=plain`), to share locks with redis-py's `Lock`, redsync,
    /// node-redlock and the redis.io single-instance recipe: the lock is the key
    /// `<prefix><name>` (no hash tag) holding the owner's token, as they lay it out. With the
    /// empty prefix (`prefix=`), distlock's lock `jobs` is their lock `jobs`. There is no
    /// fencing counter: the foreign clients would not advance it, so `RedisLock` declares
    /// `Fencing::None`.
    pub fn with_plain_keys(mut self, on: bool) -> Self {
        self.plain_keys = on;
        self
    }
    /// Waits for `n` replicas to acknowledge each grant and renewal (`WAIT n`, at most a
    /// quarter of the request timeout: 250 ms by default, which replicas on a busy machine can
    /// miss, then raise `timeout_ms`) before it counts; a grant fewer acknowledged is undone
    /// and the acquisition fails with `Unavailable`, a renewal so is retried (the lease
    /// AtRisk). URL:
    /// `wait_replicas=N`. What it buys on a Sentinel deployment: a failover that promotes a
    /// replica which acknowledged keeps the grant. What it does not: the master may still
    /// have passed it to a replica other than the one promoted, and the replicas keep it in
    /// memory only — `WAIT` makes no write durable, and Redis says it does not make it
    /// strongly consistent. Each request and its `WAIT` go as one pipeline to one server (on a
    /// cluster, the master of the lock's slot), so a refused attempt waits too while a replica
    /// lags. 0 (the default): no waiting.
    pub fn with_wait_replicas(mut self, n: u32) -> Self {
        self.wait_replicas = n;
        self
    }
    /// Waits for the master to fsync each grant and renewal to its append-only file, and for
    /// `n` replicas to do the same to theirs (`WAITAOF 1 n`, at most a quarter of the request
    /// timeout, shared with `wait_replicas`'s), before it counts; as with [`with_wait_replicas`](Self::with_wait_replicas), a grant
    /// short of it is undone and fails with `Unavailable`, a renewal so is retried. URL:
    /// `wait_aof=N` (`wait_aof=0`: the master's own fsync only). The server must have
    /// `WAITAOF` (Redis 7.2, Valkey 7.2 and later) and `appendonly yes`, or connecting fails
    /// with `Error::Config`. What it buys on one server: a lock counted as granted survives a
    /// crash of the machine, whatever `appendfsync` says, so its fencing is `Strict` (without
    /// it, only `appendfsync always` is). Behind sentinels or on a cluster it narrows a
    /// failover's loss no further than `wait_replicas` does: fencing stays `BestEffort`.
    /// `None` (the default): no waiting.
    pub fn with_wait_aof(mut self, n: Option<u32>) -> Self {
        self.wait_aof = n;
        self
    }
    /// The password the sentinels want (their own `requirepass`, or their ACL user's), which
    /// is not the Redis servers' (the URL's user info): `sentinel_password=` in a
    /// `redis+sentinel://` URL. [`Error::Config`] on a configuration without sentinels.
    ///
    /// ```
    /// let c = lock_redis::RedisConfig::from_url("redis+sentinel://s1/m?sentinel_password=pw")?;
    /// assert_eq!(c.redacted_url(), "redis+sentinel://s1:26379/m?sentinel_password=***");
    /// assert!(lock_redis::RedisConfig::new("h", 6379).with_sentinel_password("pw").is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn with_sentinel_password(self, password: impl Into<String>) -> Result<Self> {
        let password = Some(Secret::new(password));
        self.with_sentinels_login(|s| s.password = password)
    }

    /// The ACL user the sentinels know this client as (`sentinel_user=` in the URL), with
    /// [`with_sentinel_password`](Self::with_sentinel_password).
    pub fn with_sentinel_user(self, user: impl Into<String>) -> Result<Self> {
        let user = Some(user.into()).filter(|u| !u.is_empty());
        self.with_sentinels_login(|s| s.user = user)
    }

    fn with_sentinels_login(mut self, set: impl FnOnce(&mut Sentinels)) -> Result<Self> {
        match &mut self.deployment {
            Deployment::Sentinels(s) => {
                set(std::sync::Arc::make_mut(s));
                Ok(self)
            }
            _ => Err(Error::config(
                "the sentinels' user and password go with a redis+sentinel:// URL only (a \
                 Redis server's own are the URL's user info)",
            )),
        }
    }

    /// Replicas each grant waits for to fsync it, besides the master
    /// ([`with_wait_aof`](Self::with_wait_aof)).
    pub fn wait_aof(&self) -> Option<u32> {
        self.wait_aof
    }
    /// Replicas each grant waits for ([`with_wait_replicas`](Self::with_wait_replicas)).
    pub fn wait_replicas(&self) -> u32 {
        self.wait_replicas
    }
    /// Whether [`with_plain_keys`](Self::with_plain_keys) is on.
    pub fn plain_keys(&self) -> bool {
        self.plain_keys
    }
    /// Whether [`with_allow_eviction`](Self::with_allow_eviction) is on.
    pub fn allow_eviction(&self) -> bool {
        self.allow_eviction
    }

    /// Server host.
    pub fn host(&self) -> &str {
        &self.host
    }
    /// Server port.
    pub fn port(&self) -> u16 {
        self.port
    }
    /// Database number.
    pub fn db(&self) -> i64 {
        self.db
    }
    /// Key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    pub(crate) fn secret(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// The URL with the password replaced by `***`: safe for logs and errors.
    pub fn redacted_url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let auth = match (&self.user, &self.password) {
            (Some(u), Some(_)) => format!("{u}:***@"),
            (Some(u), None) => format!("{u}@"),
            (None, Some(_)) => ":***@".to_string(),
            (None, None) => String::new(),
        };
        let list = |hosts: &[(String, u16)]| -> String {
            let hosts: Vec<String> = hosts.iter().map(|(h, p)| bracketed(h, *p)).collect();
            hosts.join(",")
        };
        match &self.deployment {
            Deployment::Sentinels(s) => {
                let hosts = list(&s.hosts);
                let mut url = format!("{scheme}+sentinel://{auth}{hosts}/{}", s.master);
                if self.db != 0 {
                    url.push_str(&format!("/{}", self.db));
                }
                let login = [
                    s.user.as_ref().map(|u| format!("sentinel_user={u}")),
                    s.password
                        .as_ref()
                        .map(|_| "sentinel_password=***".to_string()),
                ];
                let login: Vec<String> = login.into_iter().flatten().collect();
                if !login.is_empty() {
                    url.push('?');
                    url.push_str(&login.join("&"));
                }
                return url;
            }
            Deployment::Cluster(nodes) => {
                return format!("{scheme}+cluster://{auth}{}", list(nodes));
            }
            Deployment::Server => {}
        }
        let mut s = format!("{scheme}://{auth}{}", bracketed(&self.host, self.port));
        if self.db != 0 {
            s.push_str(&format!("/{}", self.db));
        }
        s
    }

    /// `host:port`, for messages (and which master, behind sentinels).
    pub(crate) fn endpoint(&self) -> String {
        match &self.deployment {
            Deployment::Sentinels(s) => {
                format!("{}:{} (master {:?})", self.host, self.port, s.master)
            }
            Deployment::Cluster(_) => format!("the cluster of {}:{}", self.host, self.port),
            Deployment::Server => format!("{}:{}", self.host, self.port),
        }
    }

    pub(crate) fn connection_info(&self) -> Result<redis::ConnectionInfo> {
        use redis::IntoConnectionInfo;
        let addr = if self.tls {
            #[cfg(feature = "tls")]
            {
                redis::ConnectionAddr::TcpTls {
                    host: self.host.clone(),
                    port: self.port,
                    insecure: false,
                    tls_params: None,
                }
            }
            #[cfg(not(feature = "tls"))]
            {
                return Err(Error::config("TLS needs the `tls` feature of lock-redis"));
            }
        } else {
            redis::ConnectionAddr::Tcp(self.host.clone(), self.port)
        };
        let info = addr
            .into_connection_info()
            .map_err(|e| Error::config(format!("Redis address {}: {e}", self.endpoint())))?;
        let mut settings = redis::RedisConnectionInfo::default()
            .set_db(self.db)
            .set_protocol(redis::ProtocolVersion::RESP3);
        if let Some(u) = &self.user {
            settings = settings.set_username(u);
        }
        if let Some(p) = &self.password {
            settings = settings.set_password(p.expose());
        }
        Ok(info.set_redis_settings(settings))
    }
}

/// `host:port`, an IPv6 host in brackets.
fn bracketed(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

lock_core::driver::redacted_config!(RedisConfig {
    prefix,
    connect_timeout,
    request_timeout,
    allow_eviction,
    plain_keys,
    wait_replicas,
    wait_aof
});

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

/// A `scheme` that speaks TLS (`tls`) is for a build with the `tls` feature only.
fn tls_built(tls: bool, scheme: &str) -> Result<()> {
    if tls && !cfg!(feature = "tls") {
        return Err(Error::config(format!(
            "{scheme}:// needs TLS support: enable the `tls` feature of lock-redis"
        )));
    }
    Ok(())
}
