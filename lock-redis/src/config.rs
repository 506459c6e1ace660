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
}

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
        }
    }

    /// Parses `redis://[user[:password]@]host[:port][/db][?key=value&...]` (port 6379 by
    /// default; the keys are [`RedisConfig::URL_PARAMS`]: `keys=tagged|plain`, `prefix`,
    /// `allow_eviction`, `tls_ca_file`, `timeout_ms`, `connect_timeout_ms`)
    /// or `rediss://...[?tls_ca_file=/path/ca.pem]` (TLS; needs this crate's `tls` feature;
    /// without `tls_ca_file` the server's certificate must chain to a public root). User and
    /// password are percent-decoded. Errors are [`Error::Config`] and never echo the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let (scheme, tls) =
            match url.split_once("://").map(|(s, _)| s) {
                Some("redis") => ("redis", false),
                Some("rediss") => ("rediss", true),
                _ => return Err(Error::config(
                    "a Redis URL starts with redis:// or rediss:// (several masters: redlock://)",
                )),
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
        if tls && !cfg!(feature = "tls") {
            return Err(Error::config(
                "rediss:// needs TLS support: enable the `tls` feature of lock-redis",
            ));
        }
        Ok(cfg)
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
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let mut s = format!("{scheme}://{auth}{host}:{}", self.port);
        if self.db != 0 {
            s.push_str(&format!("/{}", self.db));
        }
        s
    }

    /// `host:port`, for messages.
    pub(crate) fn endpoint(&self) -> String {
        format!("{}:{}", self.host, self.port)
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

lock_core::driver::redacted_config!(RedisConfig {
    prefix,
    connect_timeout,
    request_timeout,
    allow_eviction,
    plain_keys
});

#[cfg(test)]
mod tests {
    use super::*;

    /// A zero timeout fails every request as if the server were down: a Config error at
    /// connect, before any I/O.
    #[tokio::test]
    async fn connect_refuses_a_zero_timeout() {
        // Both timeouts are checked by `check_timeouts` (lock-core's `timeout_setters!`).
        let zero = RedisConfig::new("127.0.0.1", 1).with_request_timeout(Duration::ZERO);
        let bad = vec![(zero, "request timeout 0")];
        conformance_tests::assert_refused_at_connect(crate::RedisLock::connect, bad).await;
    }

    #[test]
    fn parses_every_part() {
        let c = RedisConfig::from_url("redis://u%40x:p%3Aw@h.example:7000/3?prefix=p:").unwrap();
        assert_eq!((c.host(), c.port(), c.db()), ("h.example", 7000, 3));
        assert_eq!(c.user(), Some("u@x"));
        assert_eq!(c.secret().map(Secret::expose), Some("p:w"));
        assert_eq!(c.prefix(), "p:");
        let d = RedisConfig::from_url("redis://127.0.0.1").unwrap();
        assert_eq!((d.port(), d.db(), d.prefix()), (6379, 0, DEFAULT_PREFIX));
        let t = RedisConfig::from_url("redis://h?timeout_ms=250&connect_timeout_ms=750").unwrap();
        assert_eq!(t.request_timeout, Duration::from_millis(250));
        assert_eq!(t.connect_timeout, Duration::from_millis(750));
        assert!(RedisConfig::from_url("redis://h?timeout_ms=soon").is_err());
        assert!(RedisConfig::from_url("redis://h?tls_ca_file=/ca.pem").is_err());
        for (url, host, port) in [
            ("redis://[::1]:7000/1", "::1", 7000),
            ("redis://[fe80::1]", "fe80::1", 6379),
            ("redis://user@h", "h", 6379),
        ] {
            let c = RedisConfig::from_url(url).unwrap();
            assert_eq!((c.host(), c.port()), (host, port), "{url}");
        }
        assert_eq!(
            RedisConfig::from_url("redis://[::1]:7000")
                .unwrap()
                .redacted_url(),
            "redis://[::1]:7000"
        );
    }

    #[test]
    fn rejects_bad_urls_without_leaking_the_password() {
        conformance_tests::assert_bad_urls_rejected(
            RedisConfig::from_url,
            &[
                "http://h:1",
                "redis://:hunter2@h:1/notanumber",
                "redis://:hunter2@h:1/-1",
                "redis://:hunter2@h:1/0?nope=1",
                "redis://:hunter2@h:1/0?prefix={x}",
                "redis://:hunter2@",
                "not a url hunter2@",
                "redis://:hunter2@a:1,b:2",
                "redis://:hunter2@h:port",
                "redis://:hunter2@h:99999",
                "redis://:hunter2@[::1",
                "redis://:hunter2@[::1]x",
                "redis://:hunter2@:1",
                "redis://:hunter2@h:1?keys=flat",
            ],
            "hunter2",
        );
    }

    #[test]
    fn plain_keys_with_the_empty_prefix() {
        let c = RedisConfig::from_url("redis://h:1?keys=plain&prefix=").unwrap();
        assert!(c.plain_keys());
        assert_eq!(c.prefix(), "");
        assert!(!RedisConfig::from_url("redis://h:1").unwrap().plain_keys());
    }

    #[test]
    fn debug_and_display_redact() {
        let c = RedisConfig::new("h", 1).with_credentials("u", "hunter2");
        for s in [format!("{c:?}"), c.to_string(), c.redacted_url()] {
            assert!(!s.contains("hunter2"), "{s}");
            assert!(s.contains("***"), "{s}");
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_names_the_feature() {
        let e = RedisConfig::from_url("rediss://h:1").unwrap_err();
        assert!(e.to_string().contains("`tls` feature"), "{e}");
    }
}
