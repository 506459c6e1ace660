//! `RedlockConfig`: the masters and the algorithm's knobs.

use std::time::Duration;

use lock_core::driver::{check_timeout, MultiHostUrl, Param, Query};
use lock_core::{Error, Result, MAX_TTL};
use lock_redis::RedisConfig;

/// The backend's name, as [`DistributedLock::backend`](lock_core::DistributedLock::backend)
/// and errors give it.
pub(crate) const BACKEND: &str = "redlock";

/// Masters and timings for [`RedlockLock`](crate::RedlockLock).
///
/// ```
/// use lock_redlock::RedlockConfig;
/// let cfg = RedlockConfig::from_url("redlock://:pw@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?node_timeout_ms=30")?;
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
    drift_factor: f64,
}

impl RedlockConfig {
    /// Independent masters (not replicas of each other). Per-node timeout 50 ms (never more than
    /// a quarter of the TTL), 3 attempts on a split vote with a random pause of up to 200 ms,
    /// minimum validity 1 ms, drift allowance TTL × 0.01 + 2 ms.
    pub fn new(masters: Vec<RedisConfig>) -> Result<Self> {
        if masters.is_empty() {
            return Err(Error::config("Redlock needs at least one master"));
        }
        // Same address = same server, whatever the database number. Two names of one server
        // (`localhost` and `127.0.0.1`) are caught at connect, by the server's run_id.
        let mut seen = std::collections::HashSet::new();
        for m in &masters {
            if !seen.insert((m.host().to_ascii_lowercase(), m.port())) {
                return Err(Error::config(format!(
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
            drift_factor: 0.01,
        })
    }

    /// Parses `redlock://[user[:password]@]h1:p1,h2:p2,...[/db][?prefix=P&node_timeout_ms=N&retry_delay_ms=N&retry_count=N&min_validity_ms=N&drift_factor=F&tls=true&tls_ca_file=PATH]`.
    /// Credentials, database, prefix and TLS apply to every master (TLS needs the `tls`
    /// feature). Errors never echo the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let u = MultiHostUrl::parse(url, "redlock", "Redlock")?;
        let mut masters = Vec::with_capacity(u.hosts.len());
        for host in &u.hosts {
            // Host, port and database go through the Redis driver's own parser; the
            // credentials (already percent-decoded) are set directly, never re-encoded.
            let m = RedisConfig::from_url(&format!(
                "redis://{host}{}",
                u.path.as_deref().unwrap_or("")
            ))
            .map_err(|e| Error::config(format!("Redlock URL: {e}")))?;
            let m = match (u.user.as_deref(), &u.password) {
                (Some(user), Some(pw)) if !user.is_empty() => m.with_credentials(user, pw.clone()),
                (_, Some(pw)) => m.with_password(pw.clone()),
                // A user without a password sends no AUTH: nothing to set.
                (_, None) => m,
            };
            masters.push(m);
        }
        let cfg = RedlockConfig::new(masters)?;
        let cfg = Query::apply("Redlock URL", u.query, Self::URL_PARAMS, cfg)?;
        if cfg.masters.iter().any(RedisConfig::is_tls) && !lock_redis::raw::TLS {
            return Err(Error::config(
                "Redlock URL: tls=true needs TLS support: enable the `tls` feature of lock-redlock",
            ));
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// The query parameters of a Redlock URL (lock-core's `Query::apply` reads them, in this
    /// order: `tls` before `tls_ca_file`, which needs it). `prefix`, `allow_eviction`, `tls`
    /// and `tls_ca_file` apply to every master.
    pub const URL_PARAMS: &'static [Param<RedlockConfig>] = &[
        Param::new("prefix", |c: Self, v| {
            c.each_master(|m| m.with_prefix(v.raw()))
        }),
        Param::new("allow_eviction", |c: Self, v| {
            let allow = v.flag()?;
            c.each_master(|m| Ok(m.with_allow_eviction(allow)))
        }),
        Param::new("tls", |c: Self, v| {
            let on = v.flag()?;
            c.each_master(|m| Ok(m.with_tls(on)))
        }),
        Param::new("tls_ca_file", |c: Self, v| {
            if !c.masters.iter().all(RedisConfig::is_tls) {
                return Err(Error::config("Redlock URL: tls_ca_file needs tls=true"));
            }
            c.each_master(|m| Ok(m.with_tls_ca_file(v.raw())))
        }),
        Param::new("retry_count", |c: Self, v| {
            Ok(c.with_retry_count(v.number()?))
        }),
        Param::new("drift_factor", |c: Self, v| {
            c.with_drift_factor(v.number()?)
        }),
        Param::new("node_timeout_ms", |c: Self, v| {
            Ok(c.with_node_timeout(v.millis()?))
        }),
        Param::new("retry_delay_ms", |c: Self, v| {
            Ok(c.with_retry_delay(v.millis()?))
        }),
        Param::new("min_validity_ms", |c: Self, v| {
            Ok(c.with_min_validity(v.millis()?))
        }),
    ];

    /// `f` applied to every master's configuration.
    fn each_master(mut self, f: impl Fn(RedisConfig) -> Result<RedisConfig>) -> Result<Self> {
        self.masters = self.masters.into_iter().map(f).collect::<Result<_>>()?;
        Ok(self)
    }

    /// Upper bound on each master's answer to one request; far below the TTL so a dead master
    /// costs little of the lease's validity. Zero is refused at connect (every request would
    /// time out as if the master were down), and so is one above a day
    /// ([`MAX_TIMEOUT`](lock_core::driver::MAX_TIMEOUT)).
    pub fn with_node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = d;
        self
    }
    /// What no setter can refuse on its own: a zero per-node timeout (every request would
    /// time out), and durations so long that adding them to a clock reading overflows (a
    /// timeout or retry delay above [`MAX_TIMEOUT`](lock_core::driver::MAX_TIMEOUT), a
    /// minimum validity above [`MAX_TTL`], which no lease could reach). Checked when a URL is
    /// parsed and at connect.
    pub(crate) fn check(&self) -> Result<()> {
        check_timeout("Redlock per-node timeout", self.node_timeout)?;
        // Never zero: its setter raises it to 1 ms.
        check_timeout("Redlock retry delay", self.retry_delay)?;
        if self.min_validity > MAX_TTL {
            return Err(Error::config(format!(
                "Redlock minimum validity {:?} is above the longest TTL, {MAX_TTL:?}",
                self.min_validity
            )));
        }
        Ok(())
    }
    /// Largest random pause before retrying after a split vote (at least 1 ms; above a day is
    /// refused at connect).
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
    /// The clock-drift allowance as a fraction of the TTL (default 0.01): a grant's validity is
    /// TTL − elapsed − (TTL × factor + 2 ms). Raise it when the masters' clocks may run fast
    /// (Redis expires keys by its own clock). A factor outside `0.0..0.5` is a
    /// [`Error::Config`]: beyond half the TTL a lease would be mostly allowance.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let cfg = lock_redlock::RedlockConfig::from_url("redlock://a:1,b:2,c:3")?.with_drift_factor(0.05)?;
    /// assert_eq!(cfg.drift(Duration::from_secs(10)), Duration::from_millis(502));
    /// assert!(cfg.with_drift_factor(f64::NAN).is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn with_drift_factor(mut self, factor: f64) -> Result<Self> {
        if !(0.0..0.5).contains(&factor) {
            return Err(Error::config(format!(
                "Redlock drift factor {factor} is outside 0.0..0.5"
            )));
        }
        self.drift_factor = factor;
        Ok(self)
    }
    /// A grant whose remaining validity is not above this is refused (and released). Above
    /// [`MAX_TTL`](lock_core::MAX_TTL), which no lease could meet, it is refused at connect.
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
    /// The clock-drift allowance for a lock of this TTL: TTL × drift factor + 2 ms.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }
    /// Minimum validity of a grant.
    pub fn min_validity(&self) -> Duration {
        self.min_validity
    }
    /// The shortest TTL a grant can have: one whose validity after the drift allowance exceeds
    /// [`min_validity`](Self::min_validity) at all; 20 ms at least. A shorter TTL could never
    /// be granted (every grant would be released as too short, however fast the masters), so
    /// it is refused as an option. A TTL above it can still lose a grant to a slow round:
    /// that grant is released, and the attempt is `Unavailable`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_redlock::RedlockConfig;
    /// let c = RedlockConfig::from_url("redlock://a:1,b:2,c:3")?;
    /// assert_eq!(c.min_ttl(), Duration::from_millis(20));
    /// let c = RedlockConfig::from_url("redlock://a:1,b:2,c:3?min_validity_ms=5000")?;
    /// assert!(c.min_ttl() > Duration::from_millis(5050));
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn min_ttl(&self) -> Duration {
        // validity = ttl - (ttl * factor + 2 ms) - the round's time, which is at least zero.
        let need = (self.min_validity + Duration::from_millis(2)).as_secs_f64();
        Duration::try_from_secs_f64(need / (1.0 - self.drift_factor))
            .map_or(Duration::MAX, |d| {
                d.saturating_add(Duration::from_millis(1))
            })
            .max(Duration::from_millis(20))
    }

    /// The URL with passwords replaced by `***`.
    pub fn redacted_url(&self) -> String {
        let hosts: Vec<String> = self
            .masters
            .iter()
            .map(|m| {
                let u = m.redacted_url();
                u.split_once("://")
                    .map_or(u.clone(), |(_, rest)| rest.to_string())
            })
            .collect();
        let tls = if self.masters.iter().any(|m| m.is_tls()) {
            "?tls=true"
        } else {
            ""
        };
        format!("redlock://{}{tls}", hosts.join(","))
    }
}

lock_core::driver::redacted_config!(RedlockConfig {
    masters,
    node_timeout,
    retry_delay,
    retry_count,
    min_validity,
    drift_factor
});

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
        assert_eq!(c.drift(Duration::from_secs(1)), Duration::from_millis(12));
        let shown = format!("{c:?} {c}");
        assert!(
            !shown.contains("p%40ss") && !shown.contains("p@ss"),
            "{shown}"
        );
    }

    #[test]
    fn tls_applies_to_every_master_and_shows() {
        let r = RedlockConfig::from_url("redlock://a:1,b:2?tls=true&tls_ca_file=/ca.pem");
        // lock-redis may have TLS through another crate's features (cargo unifies them).
        if RedisConfig::from_url("rediss://a:1").is_ok() {
            let c = r.unwrap();
            assert!(c.masters().iter().all(|m| m.is_tls()));
            assert_eq!(c.redacted_url(), "redlock://a:1,b:2?tls=true");
        } else {
            assert!(matches!(r, Err(Error::Config { .. })));
        }
    }

    #[test]
    fn credentials_apply_to_every_master() {
        let c = RedlockConfig::from_url("redlock://locker:p%40ss%2Fw@a:1,b:2?drift_factor=0.02")
            .unwrap();
        for m in c.masters() {
            assert_eq!(m.user(), Some("locker"));
        }
        let shown = format!("{c:?} {c}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );
        assert_eq!(c.drift(Duration::from_secs(1)), Duration::from_millis(22));
    }

    #[test]
    fn rejects_bad_urls_without_the_password() {
        conformance_tests::assert_bad_urls_rejected(
            RedlockConfig::from_url,
            &[
                "redis://a:1",
                "redlock://:secretpw@a:1,,b:2",
                "redlock://:secretpw@a:1,a:1",
                "redlock://:secretpw@a:1?node_timeout_ms=fast",
                "redlock://:secretpw@a:1?what=1",
                "redlock://:secretpw@a:x",
                "redlock://:secretpw@a:1?drift_factor=0.7",
                "redlock://:secretpw@a:1?drift_factor=much",
                "redlock://:secretpw@a:1/x",
                "redlock://:secretpw@a:1?tls=maybe",
                "redlock://:secretpw@a:1?tls_ca_file=/ca.pem",
                "redlock://:secretpw@a:1?node_timeout_ms=0",
            ],
            "secretpw",
        );
    }

    /// A zero per-node timeout would fail every request as if the master were down (it was
    /// once raised to 1 ms without a word): a Config error at connect, before any I/O.
    #[tokio::test]
    async fn connect_refuses_a_zero_node_timeout() {
        let c = RedlockConfig::from_url("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3").unwrap();
        conformance_tests::assert_refused_at_connect(
            crate::RedlockLock::connect,
            vec![(c.with_node_timeout(Duration::ZERO), "node timeout 0")],
        )
        .await;
    }
}
