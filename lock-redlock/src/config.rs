//! `RedlockConfig`: the masters and the algorithm's knobs.

use std::fmt;
use std::time::Duration;

use lock_core::{Error, Result};
use lock_redis::RedisConfig;

/// Masters and timings for [`RedlockLock`](crate::RedlockLock).
///
/// ```
/// use lock_redlock::RedlockConfig;
/// let cfg = RedlockConfig::from_url("redlock://:pw@127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382?node_timeout_ms=30")?;
/// assert_eq!(cfg.masters().len(), 3);
/// assert_eq!(cfg.quorum(), 2);
/// assert!(!format!("{cfg:?}").contains("pw@"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone)]
pub struct RedlockConfig {
    masters: Vec<RedisConfig>,
    node_timeout: Duration,
    retry_delay: Duration,
    retry_count: u32,
    min_validity: Duration,
}

impl RedlockConfig {
    /// Independent masters (not replicas of each other). Per-node timeout 50 ms (never more than
    /// a quarter of the TTL), 3 attempts on a split vote with a random pause of up to 200 ms,
    /// minimum validity 1 ms.
    pub fn new(masters: Vec<RedisConfig>) -> Result<Self> {
        if masters.is_empty() {
            return Err(Error::Config("Redlock needs at least one master".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for m in &masters {
            if !seen.insert((m.host().to_string(), m.port(), m.db())) {
                return Err(Error::Config(format!(
                    "master {}:{} is listed twice: a repeated master would count twice towards the quorum",
                    m.host(),
                    m.port()
                )));
            }
        }
        Ok(RedlockConfig {
            masters,
            node_timeout: Duration::from_millis(50),
            retry_delay: Duration::from_millis(200),
            retry_count: 3,
            min_validity: Duration::from_millis(1),
        })
    }

    /// Parses `redlock://[user[:password]@]h1:p1,h2:p2,...[/db][?prefix=P&node_timeout_ms=N&retry_delay_ms=N&min_validity_ms=N]`.
    /// Credentials, database and prefix apply to every master. Errors never echo the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("redlock://").ok_or_else(|| {
            Error::Config("a Redlock URL starts with redlock://h1:p1,h2:p2,...".into())
        })?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut redis_query = Vec::new();
        let mut knobs = Vec::new();
        let mut retry_count = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "prefix" => redis_query.push(format!("prefix={v}")),
                "retry_count" => {
                    retry_count = Some(v.parse::<u32>().map_err(|_| {
                        Error::Config(format!("Redlock URL: retry_count={v:?} is not a number"))
                    })?);
                }
                "node_timeout_ms" | "retry_delay_ms" | "min_validity_ms" => {
                    let ms: u64 = v.parse().map_err(|_| {
                        Error::Config(format!("Redlock URL: {k}={v:?} is not a number of milliseconds"))
                    })?;
                    knobs.push((k, Duration::from_millis(ms)));
                }
                other => {
                    return Err(Error::Config(format!(
                        "Redlock URL: unknown parameter {other:?} (known: prefix, node_timeout_ms, retry_delay_ms, retry_count, min_validity_ms)"
                    )))
                }
            }
        }
        let mut masters = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(Error::Config("Redlock URL: empty master address".into()));
            }
            let mut u = String::from("redis://");
            if let Some(ui) = userinfo {
                u.push_str(ui);
                u.push('@');
            }
            u.push_str(host);
            if !path.is_empty() {
                u.push('/');
                u.push_str(path);
            }
            if !redis_query.is_empty() {
                u.push('?');
                u.push_str(&redis_query.join("&"));
            }
            masters.push(RedisConfig::from_url(&u)?);
        }
        let mut cfg = RedlockConfig::new(masters)?;
        if let Some(n) = retry_count {
            cfg = cfg.with_retry_count(n);
        }
        for (k, d) in knobs {
            cfg = match k {
                "node_timeout_ms" => cfg.with_node_timeout(d),
                "retry_delay_ms" => cfg.with_retry_delay(d),
                _ => cfg.with_min_validity(d),
            };
        }
        Ok(cfg)
    }

    /// Upper bound on each master's answer to one request; far below the TTL so a dead master
    /// costs little of the lease's validity.
    pub fn with_node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = d.max(Duration::from_millis(1));
        self
    }
    /// Largest random pause before retrying after a split vote.
    pub fn with_retry_delay(mut self, d: Duration) -> Self {
        self.retry_delay = d.max(Duration::from_millis(1));
        self
    }
    /// Attempts `try_acquire` makes when votes split (no majority for anyone), with a random
    /// pause between them. At least 1.
    pub fn with_retry_count(mut self, n: u32) -> Self {
        self.retry_count = n.max(1);
        self
    }
    /// A grant whose remaining validity is not above this is refused (and released).
    pub fn with_min_validity(mut self, d: Duration) -> Self {
        self.min_validity = d;
        self
    }

    /// The masters.
    pub fn masters(&self) -> &[RedisConfig] {
        &self.masters
    }
    /// Grants needed: a strict majority, N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.masters.len() / 2 + 1
    }
    /// Per-node timeout for a lock of this TTL.
    pub fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout.min(ttl / 4).max(Duration::from_millis(1))
    }
    /// Retry jitter bound.
    pub fn retry_delay(&self) -> Duration {
        self.retry_delay
    }
    /// Attempts on a split vote.
    pub fn retry_count(&self) -> u32 {
        self.retry_count
    }
    /// Minimum validity of a grant.
    pub fn min_validity(&self) -> Duration {
        self.min_validity
    }

    /// The URL with passwords replaced by `***`.
    pub fn redacted_url(&self) -> String {
        let hosts: Vec<String> = self
            .masters
            .iter()
            .map(|m| m.redacted_url().trim_start_matches("redis://").to_string())
            .collect();
        format!("redlock://{}", hosts.join(","))
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("masters", &self.masters)
            .field("node_timeout", &self.node_timeout)
            .field("retry_delay", &self.retry_delay)
            .field("retry_count", &self.retry_count)
            .field("min_validity", &self.min_validity)
            .finish()
    }
}

impl fmt::Display for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted_url())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_credentials_and_knobs() {
        let c = RedlockConfig::from_url(
            "redlock://u:p%40ss@a:1,b:2,c/3?prefix=x:&node_timeout_ms=20&retry_delay_ms=99",
        )
        .unwrap();
        assert_eq!(c.masters().len(), 3);
        assert_eq!(c.masters()[2].port(), 6379);
        assert_eq!(c.masters()[1].db(), 3);
        assert_eq!(c.masters()[0].prefix(), "x:");
        assert_eq!(c.quorum(), 2);
        assert_eq!(c.retry_delay(), Duration::from_millis(99));
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(10)),
            Duration::from_millis(20)
        );
        assert_eq!(
            c.node_timeout_for(Duration::from_millis(40)),
            Duration::from_millis(10)
        );
        let shown = format!("{c:?} {c}");
        assert!(
            !shown.contains("p%40ss") && !shown.contains("p@ss"),
            "{shown}"
        );
    }

    #[test]
    fn rejects_bad_urls_without_the_password() {
        for bad in [
            "redis://a:1",
            "redlock://:secretpw@a:1,,b:2",
            "redlock://:secretpw@a:1,a:1",
            "redlock://:secretpw@a:1?node_timeout_ms=fast",
            "redlock://:secretpw@a:1?what=1",
            "redlock://:secretpw@a:x",
        ] {
            let e = RedlockConfig::from_url(bad).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{bad}: {e:?}");
            assert!(!e.to_string().contains("secretpw"), "{bad}: {e}");
        }
    }
}
