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

    // etcd's own authentication (the role needs read/write on the prefix): with_credentials,
    // user.
    lock_core::driver::credential_setters!();
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
    // Talks to the members over TLS (`https://`): with_tls, with_tls_ca_pem, ...
    lock_core::driver::tls_setters!();
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
            ],
            "secretpw",
        );
        // A bare `/` is no path: the default prefix.
        let c = EtcdConfig::from_url("etcd://u:secretpw@a:1/").unwrap();
        assert_eq!(c.prefix(), "/distlock");
    }
}
