//! `EtcdConfig`: endpoints, key prefix, credentials, timeouts.

use std::time::Duration;

use lock_core::driver::{redacted_url, MultiHostUrl, Query, Secret, TlsCa};
use lock_core::{Error, Result};

/// Where the cluster is and how this client talks to it.
///
/// ```
/// use std::time::Duration;
/// use lock_etcd::EtcdConfig;
/// let cfg = EtcdConfig::from_url("etcd://locker:s3cret@127.0.0.1:12479,127.0.0.1:12579/app/locks?timeout_ms=800")?;
/// assert_eq!(cfg.endpoints(), ["127.0.0.1:12479", "127.0.0.1:12579"]);
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
        }
    }

    /// Parses `etcd://[user:password@]h1:p1,h2:p2[/prefix][?timeout_ms=N&connect_timeout_ms=N&tls=true&tls_ca_file=PATH]`
    /// (`tls=true` needs this crate's `tls` feature).
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
        if let Some(p) = u.path {
            cfg = cfg.with_prefix(&p)?;
        }
        let q = Query::new(
            "etcd URL",
            u.query,
            &["timeout_ms", "connect_timeout_ms", "tls", "tls_ca_file"],
        )?;
        if let Some(d) = q.millis("timeout_ms")? {
            cfg = cfg.with_request_timeout(d);
        }
        if let Some(d) = q.millis("connect_timeout_ms")? {
            cfg = cfg.with_connect_timeout(d);
        }
        if let Some(tls) = q.flag("tls")? {
            cfg = cfg.with_tls(tls);
        }
        if let Some(path) = q.get("tls_ca_file") {
            if !cfg.tls {
                return Err(Error::config("etcd URL: tls_ca_file needs tls=true"));
            }
            cfg = cfg.with_tls_ca_file(path);
        }
        if cfg.tls && !cfg!(feature = "tls") {
            return Err(Error::config(
                "etcd URL: tls=true needs the `tls` feature of lock-etcd",
            ));
        }
        Ok(cfg)
    }

    /// User and password (etcd's own authentication; the role needs read/write on the prefix).
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.user = Some(user.into());
        self.password = Some(Secret::new(password));
        self
    }
    /// Key prefix of every lock (default `/distlock`): keys are `<prefix>/<name>/<lease-hex>`.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self> {
        let ok = prefix.starts_with('/')
            && prefix.len() > 1
            && !prefix.ends_with('/')
            && !prefix.contains("//")
            && !prefix.chars().any(|c| c.is_control() || c.is_whitespace());
        if !ok {
            return Err(Error::config(format!(
                "etcd key prefix {:?} must look like /distlock (absolute, no trailing slash)",
                prefix.escape_debug().to_string()
            )));
        }
        self.prefix = prefix.to_string();
        Ok(self)
    }
    /// Talks to the members over TLS (`https://`; needs this crate's `tls` feature). The
    /// members' certificates must chain to a public root unless a CA is set.
    pub fn with_tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }
    /// Trusts the certificate authority in this PEM for the members' certificates (implies
    /// TLS).
    pub fn with_tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls = true;
        self.tls_ca = Some(TlsCa::Pem(pem.into().into()));
        self
    }
    /// Like [`with_tls_ca_pem`](Self::with_tls_ca_pem), read from this file when connecting.
    pub fn with_tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls = true;
        self.tls_ca = Some(TlsCa::File(path.into()));
        self
    }
    /// Whether TLS is on.
    pub fn is_tls(&self) -> bool {
        self.tls
    }
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn tls_ca(&self) -> Option<&TlsCa> {
        self.tls_ca.as_ref()
    }
    /// Deadline of each request (the lock's own waiting is bounded by `LockOptions`, not this).
    pub fn with_request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }
    /// Deadline of connecting (and of the health check `connect` runs).
    pub fn with_connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The user, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }
    /// Request deadline.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }
    /// Connect deadline.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    pub(crate) fn credentials(&self) -> Option<(&str, &str)> {
        Some((self.user.as_deref()?, self.password.as_ref()?.expose()))
    }
    pub(crate) fn secret(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// The URL without the password.
    pub fn redacted_url(&self) -> String {
        let path = (self.prefix != "/distlock").then_some(self.prefix.as_str());
        let url = redacted_url("etcd", self.user.as_deref(), &self.endpoints, path);
        if self.tls {
            url + "?tls=true"
        } else {
            url
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
        for bad in [
            "http://u:secretpw@a:1",
            "etcd://u:secretpw@a:1,,b:2",
            "etcd://u:secretpw@a:1/",
            "etcd://u:secretpw@a:1/x/",
            "etcd://u:secretpw@a:1?timeout_ms=soon",
            "etcd://u:secretpw@a:1?what=1",
            "etcd://:secretpw@a:1",
            "etcd://u@a:1",
            "etcd://u:secretpw@a:1?tls=maybe",
            "etcd://u:secretpw@a:1?tls_ca_file=/ca.pem",
        ] {
            match EtcdConfig::from_url(bad) {
                Err(e) => {
                    assert!(matches!(e, Error::Config { .. }), "{bad}: {e:?}");
                    assert!(!e.to_string().contains("secretpw"), "{e}");
                }
                Ok(c) if bad == "etcd://u:secretpw@a:1/" => assert_eq!(c.prefix(), "/distlock"),
                Ok(c) => panic!("{bad} parsed: {c:?}"),
            }
        }
    }
}
