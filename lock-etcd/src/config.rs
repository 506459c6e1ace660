//! `EtcdConfig`: endpoints, key prefix, credentials, timeouts.

use std::time::Duration;

use lock_core::driver::{percent_encode, redacted_url, MultiHostUrl, Param, Query, Secret, TlsCa};
use lock_core::{Error, Result};

/// The backend's name, as [`DistributedLock::backend`](lock_core::DistributedLock::backend)
/// and errors give it.
pub(crate) const BACKEND: &str = "etcd";

/// Where the cluster is and how this client talks to it.
///
/// ```
/// use std::time::Duration;
/// use lock_etcd::EtcdConfig;
/// let cfg = EtcdConfig::from_url("etcd://locker:s3cret@10.0.0.1:2379,10.0.0.2:2379/app/locks?timeout_ms=800")?;
/// assert_eq!(cfg.endpoints(), ["10.0.0.1:2379", "10.0.0.2:2379"]);
/// assert_eq!(cfg.prefix(), "/app/locks");
/// assert_eq!(cfg.request_timeout(), Duration::from_millis(800));
/// assert!(!format!("{cfg:?} {cfg}").contains("s3cret"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    prefix: String,
    user: Option<String>,
    password: Option<Secret>,
    tls: bool,
    tls_ca: Option<TlsCa>,
    request_timeout: Duration,
    connect_timeout: Duration,
    shared_lease: bool,
}

impl EtcdConfig {
    /// `endpoints` are `host:port` (or `http://host:port`). Prefix `/distlock`, request timeout
    /// 5 s, connect timeout 2 s, no credentials.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: "/distlock".into(),
            user: None,
            password: None,
            tls: false,
            tls_ca: None,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            shared_lease: false,
        }
    }

    /// Parses `etcd://[user:password@]h1:p1,h2:p2[/prefix][?prefix=P&timeout_ms=N&connect_timeout_ms=N&shared_lease=true&tls=true&tls_ca_file=PATH]`
    /// (`tls=true` needs this crate's `tls` feature). The path is an absolute prefix; the
    /// `prefix` parameter may also be relative or empty (`prefix=`: none, the key layout of
    /// `etcdctl lock <name>`), and not both.
    ///
    /// ```
    /// use lock_etcd::EtcdConfig;
    /// assert_eq!(EtcdConfig::from_url("etcd://h:1")?.prefix(), "/distlock");
    /// assert_eq!(EtcdConfig::from_url("etcd://h:1/team/locks")?.prefix(), "/team/locks");
    /// assert_eq!(EtcdConfig::from_url("etcd://h:1?prefix=")?.prefix(), "");
    /// assert_eq!(EtcdConfig::from_url("etcd://h:1?prefix=jobs")?.prefix(), "jobs");
    /// assert!(EtcdConfig::from_url("etcd://h:1/a?prefix=b").is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let u = MultiHostUrl::parse(url, "etcd", "etcd")?;
        let mut cfg = EtcdConfig::new(u.hosts);
        match (u.user, u.password) {
            (None, _) => {}
            (Some(user), Some(password)) if !user.is_empty() => {
                cfg = cfg.with_credentials(user, password)
            }
            _ => {
                return Err(Error::config(
                    "etcd URL: credentials are user:password with a non-empty user",
                ))
            }
        }
        if u.path.is_some() && u.query.iter().any(|(k, _)| k == "prefix") {
            return Err(Error::config(
                "etcd URL: the prefix is either the path or the `prefix` parameter, not both",
            ));
        }
        if let Some(p) = u.path {
            cfg = cfg.with_prefix(&p)?;
        }
        let cfg = Query::apply("etcd URL", u.query, Self::URL_PARAMS, cfg)?;
        if cfg.tls && !cfg!(feature = "tls") {
            return Err(Error::config(
                "etcd URL: tls=true needs the `tls` feature of lock-etcd",
            ));
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// What no request could succeed with: no endpoint, a zero timeout (checked again at
    /// connect, for configurations built by hand).
    pub(crate) fn check(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::config("etcd: no endpoint to connect to"));
        }
        self.check_timeouts()
    }

    // etcd's own authentication (the role needs read/write on the prefix): with_credentials,
    // user.
    lock_core::driver::credential_setters!();

    /// The query parameters of an etcd URL (lock-core's `Query::apply` reads them, in this
    /// order: `tls` before `tls_ca_file`, which needs it).
    pub const URL_PARAMS: &'static [Param<EtcdConfig>] = &[
        Param::new("prefix", |c: Self, v| c.with_prefix(v.raw())),
        Param::new("timeout_ms", |c: Self, v| {
            Ok(c.with_request_timeout(v.millis()?))
        }),
        Param::new("connect_timeout_ms", |c: Self, v| {
            Ok(c.with_connect_timeout(v.millis()?))
        }),
        Param::new("shared_lease", |c: Self, v| {
            Ok(c.with_shared_lease(v.flag()?))
        }),
        Param::new("tls", |c: Self, v| Ok(c.with_tls(v.flag()?))),
        Param::new("tls_ca_file", |c: Self, v| match c.tls {
            true => Ok(c.with_tls_ca_file(v.raw())),
            false => Err(Error::config("etcd URL: tls_ca_file needs tls=true")),
        }),
    ];
    /// Key prefix of every lock (default `/distlock`): keys are `<prefix>/<name>/<lease-hex>`,
    /// or `<name>/<lease-hex>` with the empty prefix, which is how `etcdctl lock <name>` and
    /// etcd's `Lock` RPC lay out theirs. Absolute (`/distlock`) or relative (`jobs`); no
    /// trailing or double slash, whitespace or control characters.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self> {
        let ok = prefix.is_empty()
            || (prefix != "/"
                && !prefix.ends_with('/')
                && !prefix.contains("//")
                && !prefix.chars().any(|c| c.is_control() || c.is_whitespace()));
        if !ok {
            return Err(Error::config(format!(
                "etcd key prefix {:?} must look like /distlock or jobs (no trailing slash; \
                 the empty prefix is none)",
                prefix.escape_debug().to_string()
            )));
        }
        self.prefix = prefix.to_string();
        Ok(self)
    }
    /// Where the keys of lock `name` go: `<prefix>/<name>/`, or `<name>/` without a prefix.
    pub(crate) fn name_dir(&self, name: &lock_core::LockName) -> String {
        if self.prefix.is_empty() {
            format!("{name}/")
        } else {
            format!("{}/{name}/", self.prefix)
        }
    }
    // Talks to the members over TLS (`https://`): with_tls, with_tls_ca_pem, ...
    lock_core::driver::tls_setters!();
    lock_core::driver::timeout_setters!();

    /// Whether the client's locks share one etcd lease per TTL (default: off, a lease per
    /// lock), as Go's `concurrency.Session` shares one among its mutexes: N held locks then
    /// cost one keep-alive per third of the TTL instead of N, and no grant or revoke per lock.
    /// The price: the locks of one TTL live and die together. A lease that cannot be kept
    /// alive (this client cut off from the cluster) loses every lock on it at once, and each
    /// lock's lease says so with its own `Lost`; with a lease per lock, only the locks whose
    /// renewals failed are lost. Use it for many locks of one process; keep the default where
    /// locks of one TTL must fail independently. Also `?shared_lease=true` in the URL.
    ///
    /// ```
    /// use lock_etcd::EtcdConfig;
    /// let cfg = EtcdConfig::from_url("etcd://10.0.0.1:2379?shared_lease=true")?;
    /// assert!(cfg.shared_lease());
    /// assert!(!EtcdConfig::new(["10.0.0.1:2379"]).shared_lease());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn with_shared_lease(mut self, shared: bool) -> Self {
        self.shared_lease = shared;
        self
    }
    /// Whether locks of one TTL share a lease ([`with_shared_lease`](Self::with_shared_lease)).
    pub fn shared_lease(&self) -> bool {
        self.shared_lease
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    pub(crate) fn credentials(&self) -> Option<(&str, &str)> {
        Some((self.user.as_deref()?, self.password.as_ref()?.expose()))
    }
    pub(crate) fn secret(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// The URL without the password.
    pub fn redacted_url(&self) -> String {
        // An absolute prefix is the path; a relative or empty one can only be a parameter.
        let absolute = self.prefix.starts_with('/');
        let path = (absolute && self.prefix != "/distlock").then_some(self.prefix.as_str());
        let mut query = Vec::new();
        if !absolute {
            query.push(format!("prefix={}", percent_encode(&self.prefix)));
        }
        if self.shared_lease {
            query.push("shared_lease=true".into());
        }
        if self.tls {
            query.push("tls=true".into());
        }
        let url = redacted_url("etcd", self.user.as_deref(), &self.endpoints, path);
        if query.is_empty() {
            url
        } else {
            format!("{url}?{}", query.join("&"))
        }
    }
}

lock_core::driver::redacted_config!(EtcdConfig {
    request_timeout,
    connect_timeout
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_urls_without_the_password() {
        conformance_tests::assert_bad_urls_rejected(
            EtcdConfig::from_url,
            &[
                "http://u:secretpw@a:1",
                "etcd://u:secretpw@a:1,,b:2",
                "etcd://u:secretpw@a:1/x/",
                "etcd://u:secretpw@a:1?timeout_ms=soon",
                "etcd://u:secretpw@a:1?what=1",
                "etcd://:secretpw@a:1",
                "etcd://u@a:1",
                "etcd://u:secretpw@a:1?tls=maybe",
                "etcd://u:secretpw@a:1?tls_ca_file=/ca.pem",
                "etcd://u:secretpw@a:1?timeout_ms=0",
                "etcd://u:secretpw@a:1?connect_timeout_ms=0",
            ],
            "secretpw",
        );
        // A relative prefix cannot be the URL's path (a path is absolute).
        conformance_tests::assert_bad_urls_rejected(
            EtcdConfig::from_url,
            &[
                "etcd://u:secretpw@a:1/x?prefix=y",
                "etcd://u:secretpw@a:1?prefix=/",
                "etcd://u:secretpw@a:1?prefix=a//b",
                "etcd://u:secretpw@a:1?prefix=a%20b",
                "etcd://u:secretpw@a:1?prefix=a&prefix=",
            ],
            "secretpw",
        );
        // A bare `/` is no path: the default prefix.
        let c = EtcdConfig::from_url("etcd://u:secretpw@a:1/").unwrap();
        assert_eq!(c.prefix(), "/distlock");
    }

    /// A configuration no request could succeed with is a Config error at connect, before any
    /// I/O, not an unreachable server: no endpoint, a zero timeout.
    #[tokio::test]
    async fn connect_refuses_what_no_request_could_succeed_with() {
        // Both timeouts are checked by `check_timeouts` (lock-core's `timeout_setters!`).
        let zero = EtcdConfig::new(["127.0.0.1:1"]).with_connect_timeout(Duration::ZERO);
        let none = EtcdConfig::new(Vec::<String>::new());
        let bad = vec![(none, "no endpoint"), (zero, "connect timeout 0")];
        conformance_tests::assert_refused_at_connect(crate::EtcdLock::connect, bad).await;
    }

    /// Every prefix prints as a URL that parses back to it, with its keys where `etcdctl lock`
    /// puts them when the prefix is empty.
    #[test]
    fn prefixes_round_trip_through_the_redacted_url() {
        let name = lock_core::LockName::new("mylock").unwrap();
        for (prefix, dir) in [
            ("/distlock", "/distlock/mylock/"),
            ("/team/jobs", "/team/jobs/mylock/"),
            ("jobs", "jobs/mylock/"),
            ("a&b=c%", "a&b=c%/mylock/"),
            ("a b", "a b/mylock/"),
            ("", "mylock/"),
        ] {
            // Spaces are refused; the rest round-trips.
            let Ok(c) = EtcdConfig::new(["h:1"]).with_prefix(prefix) else {
                assert!(prefix.contains(' '), "{prefix:?} refused");
                continue;
            };
            assert_eq!(c.name_dir(&name), dir);
            let again = EtcdConfig::from_url(&c.redacted_url()).unwrap();
            assert_eq!(again.prefix(), prefix, "{}", c.redacted_url());
        }
    }
}
