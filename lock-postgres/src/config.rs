//! `PgConfig`: server, credentials, database, TLS, the session bound, the fencing table.

use std::time::Duration;

use lock_core::driver::{host_port, redacted_url, MultiHostUrl, Param, Query, Secret, TlsCa};
use lock_core::{Error, Result};

/// The backend's name, as [`DistributedLock::backend`](lock_core::DistributedLock::backend)
/// and errors give it.
pub(crate) const BACKEND: &str = "postgres";

/// The URL schemes this driver serves.
pub(crate) const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// Where the server is, who to log in as, and how long a vanished client's session may live.
///
/// ```
/// use std::time::Duration;
/// use lock_postgres::PgConfig;
/// let cfg = PgConfig::from_url(
///     "postgres://locker:s3cret@10.0.0.1:5432/jobs?session_timeout_ms=3000&table=ops.fences",
/// )?;
/// assert_eq!(cfg.hosts(), ["10.0.0.1:5432"]);
/// assert_eq!(cfg.dbname(), Some("jobs"));
/// assert_eq!(cfg.session_timeout(), Duration::from_secs(3));
/// assert_eq!(cfg.table(), "ops.fences");
/// assert!(!format!("{cfg:?} {cfg}").contains("s3cret"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone)]
pub struct PgConfig {
    hosts: Vec<String>,
    user: Option<String>,
    password: Option<Secret>,
    dbname: Option<String>,
    tls: bool,
    tls_preferred: bool,
    tls_ca: Option<TlsCa>,
    application_name: String,
    connect_timeout: Duration,
    session_timeout: Duration,
    table: String,
    shared_sessions: usize,
    shared_waits: bool,
    wait_sessions: Option<usize>,
}

impl PgConfig {
    /// `hosts` is `host[:port]` (port 5432 by default). User `postgres`, the database of the
    /// same name as the user, no TLS, session timeout 6 s, fencing table `distlock_fencing`.
    pub fn new(host: impl Into<String>) -> Self {
        PgConfig {
            hosts: vec![host.into()],
            user: Some("postgres".into()),
            password: None,
            dbname: None,
            tls: false,
            tls_preferred: false,
            tls_ca: None,
            application_name: "distlock".into(),
            connect_timeout: Duration::from_secs(10),
            session_timeout: Duration::from_secs(6),
            table: "distlock_fencing".into(),
            shared_sessions: 0,
            shared_waits: false,
            wait_sessions: None,
        }
    }

    /// Parses a libpq-style URL:
    /// `postgres[ql]://[user[:password]@]host[:port][,host2[:port]][/dbname][?param=value&...]`
    /// (user `postgres` if none is given; the database named like the user if none is).
    ///
    /// Parameters: `sslmode` (`disable`, `prefer` — the default —, `require`, `verify-ca`,
    /// `verify-full`), `tls_ca_file` or libpq's `sslrootcert` (a PEM file),
    /// `connect_timeout_ms`, or libpq's `connect_timeout` in seconds (up to a day: libpq's 0
    /// for "no limit" is refused), `application_name`, and distlock's own
    /// `session_timeout_ms` (how long the server keeps the session, and its locks, of a
    /// client that vanished), `table` (the fencing counter's table, `[schema.]name`) and
    /// `shared_sessions` (see [`with_shared_sessions`](Self::with_shared_sessions)) and
    /// `shared_waits` (see [`with_shared_waits`](Self::with_shared_waits)) and `wait_sessions`
    /// (see [`with_wait_sessions`](Self::with_wait_sessions)); the
    /// table is [`PgConfig::URL_PARAMS`]. Unknown or repeated parameters are refused, and so is
    /// one given under both its spellings.
    ///
    /// **TLS is always verified**: every mode that uses TLS checks the certificate's chain and
    /// host name (libpq's `require` and `prefer` do not), against the public roots or
    /// `sslrootcert`. `prefer` uses TLS when the server offers it (and the crate's `tls`
    /// feature is on), else plain TCP.
    ///
    /// ```
    /// use lock_postgres::PgConfig;
    /// let c = PgConfig::from_url("postgresql://app@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ca.pem")?;
    /// assert!(c.is_tls());
    /// assert!(PgConfig::from_url("postgres://app@h?sslmode=allow").is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let scheme = SCHEMES
            .iter()
            .rev() // "postgresql" before its prefix "postgres"
            .find(|s| url.strip_prefix(**s).is_some_and(|r| r.starts_with("://")))
            .copied()
            .unwrap_or("postgres");
        let u = MultiHostUrl::parse(url, scheme, "PostgreSQL")?;
        for h in &u.hosts {
            valid_host(h)?;
        }
        let mut cfg = PgConfig::new(String::new());
        cfg.hosts = u.hosts;
        match (u.user, u.password) {
            (Some(user), _) if user.is_empty() => {
                return Err(Error::config("PostgreSQL URL: empty user name"))
            }
            (Some(user), Some(password)) => cfg = cfg.with_credentials(user, password),
            (Some(user), None) => cfg.user = Some(user),
            (None, _) => {} // user `postgres`
        }
        if let Some(path) = u.path {
            let db = path.trim_start_matches('/');
            if db.is_empty() || db.contains('/') || db.chars().any(char::is_control) {
                return Err(Error::config(format!(
                    "PostgreSQL URL: {:?} is not a database name",
                    path.escape_debug().to_string()
                )));
            }
            cfg.dbname = Some(db.to_string());
        }
        // libpq's default sslmode.
        cfg.tls_preferred = true;
        let cfg = Query::apply("PostgreSQL URL", u.query, Self::URL_PARAMS, cfg)?;
        cfg.check_waits()?;
        Ok(cfg)
    }

    /// The query parameters of a PostgreSQL URL (lock-core's `Query::apply` reads them, in
    /// this order: `sslmode` before the CA, which needs TLS). libpq's own spellings are
    /// aliases of the names every distlock driver uses: `sslrootcert` of `tls_ca_file`,
    /// `connect_timeout` (whole seconds) of `connect_timeout_ms`.
    pub const URL_PARAMS: &'static [Param<PgConfig>] = &[
        Param::new("sslmode", |mut c: Self, v| {
            let modes = ["disable", "prefer", "require", "verify-ca", "verify-full"];
            (c.tls, c.tls_preferred) = match v.choice(&modes)? {
                "disable" => (false, false),
                "prefer" => (false, true),
                _ => (true, false),
            };
            Ok(c)
        }),
        Param::new("tls_ca_file", |c: Self, v| {
            if !c.tls && !c.tls_preferred {
                return Err(Error::config(format!(
                    "PostgreSQL URL: {} with sslmode=disable",
                    v.key()
                )));
            }
            Ok(c.with_tls_ca_file(v.raw()))
        })
        .alias(&["sslrootcert"]),
        Param::new("connect_timeout_ms", |c: Self, v| {
            let d = match v.key() {
                "connect_timeout" => v.secs()?,
                _ => v.millis()?,
            };
            let c = c.with_connect_timeout(d);
            c.check_connect_timeout()?;
            Ok(c)
        })
        .alias(&["connect_timeout"]),
        Param::new("application_name", |mut c: Self, v| {
            c.application_name = v.raw().to_string();
            Ok(c)
        }),
        Param::new("session_timeout_ms", |c: Self, v| {
            c.with_session_timeout(v.millis()?)
        }),
        Param::new("table", |c: Self, v| c.with_table(v.raw())),
        Param::new("shared_sessions", |c: Self, v| {
            c.with_shared_sessions(v.number()?)
        }),
        Param::new("shared_waits", |c: Self, v| {
            Ok(c.with_shared_waits(v.flag()?))
        }),
        Param::new("wait_sessions", |c: Self, v| {
            c.with_wait_sessions(v.number()?)
        }),
    ];

    // with_credentials and user: a password login (scram-sha-256 or md5, as the server asks).
    lock_core::driver::credential_setters!();
    // with_tls, with_tls_ca_pem, with_tls_ca_file, is_tls, tls_ca: TLS is then required.
    lock_core::driver::tls_setters!();

    /// The database (default: the user's name, as the server decides).
    pub fn with_dbname(mut self, dbname: impl Into<String>) -> Self {
        self.dbname = Some(dbname.into());
        self
    }
    /// How long the server keeps the session, and with it every lock, of a client that
    /// vanished (crashed host, cut network): the driver sets the server's TCP keepalive and
    /// user-timeout settings for its sessions to this, and a lease's TTL may not be shorter.
    /// At least 1 s (the keepalive settings count whole seconds).
    pub fn with_session_timeout(mut self, d: Duration) -> Result<Self> {
        if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
            return Err(Error::config(format!(
                "PostgreSQL session timeout {d:?} is outside 1 s ..= 1 h"
            )));
        }
        self.session_timeout = d;
        Ok(self)
    }
    /// How long to wait for a connection (default 10 s). Zero, or above a day, is refused at
    /// connect.
    pub fn with_connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
    /// The table of fencing counters, `name` or `schema.name` (letters, digits, `_`; created
    /// if absent). Default `distlock_fencing`.
    pub fn with_table(mut self, table: &str) -> Result<Self> {
        let ok = table.split('.').count() <= 2
            && table.split('.').all(|part| {
                let mut chars = part.chars();
                chars
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                    && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    && part.len() <= 63
            });
        if !ok {
            return Err(Error::config(format!(
                "PostgreSQL fencing table {:?}: use name or schema.name in lower-case letters, \
                 digits and _",
                table.escape_debug().to_string()
            )));
        }
        self.table = table.to_string();
        Ok(self)
    }

    /// `host[:port]` entries, in the order tried.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }
    /// The database, if named.
    pub fn dbname(&self) -> Option<&str> {
        self.dbname.as_deref()
    }
    /// The session timeout asked for.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }
    /// How long a TCP connection attempt may take (the login after it gets the session
    /// timeout on top).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    /// How many sessions the locks this client takes without waiting share (0: a session per
    /// lock). See [`with_shared_sessions`](Self::with_shared_sessions).
    pub fn shared_sessions(&self) -> usize {
        self.shared_sessions
    }

    /// Locks granted at once (a `try_acquire`, or an `acquire` that finds the lock free), in
    /// every mode, are taken on one of at most `n` sessions that they share, instead of a
    /// session each: a service holding 1,000 locks needs `n` connections, not 1,000. An
    /// `acquire` that has to wait still waits on a session of its own (the server's lock queue blocks the session
    /// that waits) and keeps it while it holds the lock. The price: when a shared session
    /// ends (its connection cut, its backend terminated, a request on it unanswered), every
    /// lock on it is lost at once, and each of their leases says so. `0` (the default): a
    /// session per lock. At most [`MAX_SHARED_SESSIONS`](Self::MAX_SHARED_SESSIONS).
    ///
    /// ```
    /// use lock_postgres::PgConfig;
    /// let c = PgConfig::from_url("postgres://app@db/app?shared_sessions=4")?;
    /// assert_eq!(c.shared_sessions(), 4);
    /// assert!(PgConfig::from_url("postgres://app@db/app?shared_sessions=1000").is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn with_shared_sessions(mut self, n: usize) -> Result<Self> {
        if n > Self::MAX_SHARED_SESSIONS {
            return Err(Error::config(format!(
                "PostgreSQL shared_sessions={n}: at most {} (each is a server connection; 0 \
                 gives each lock a session of its own)",
                Self::MAX_SHARED_SESSIONS
            )));
        }
        self.shared_sessions = n;
        Ok(self)
    }

    /// Whether a client's waiters of one name take turns on one waiting session. See
    /// [`with_shared_waits`](Self::with_shared_waits).
    pub fn shared_waits(&self) -> bool {
        self.shared_waits
    }

    /// A client's waiters of one name take turns: at most one of them waits on the server (on
    /// a session, which the server's lock queue blocks), the others queue in the client in
    /// the order they came, and each goes to the server once the one before it was granted or
    /// gave up. Waiters cost a session per name waited on, not a session each: 50 tasks
    /// waiting for one job's lock take one connection, not 50. A granted waiter still keeps
    /// its session while it holds the lock. The price is the order between clients: a
    /// client's next waiter joins the server's queue only when the one before it was granted,
    /// so another client's waiter that came in between goes first, and
    /// [`Capabilities::fifo`](lock_core::Capabilities) is `false`. Off by default.
    ///
    /// ```
    /// use lock_postgres::PgConfig;
    /// let c = PgConfig::from_url("postgres://app@db/app?shared_waits=true")?;
    /// assert!(c.shared_waits());
    /// assert!(!PgConfig::new("db").shared_waits());
    /// assert!(PgConfig::from_url("postgres://app@db/app?shared_waits=maybe").is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn with_shared_waits(mut self, on: bool) -> Self {
        self.shared_waits = on;
        self
    }

    /// How many sessions a client's waiters may wait on at once, if bounded. See
    /// [`with_wait_sessions`](Self::with_wait_sessions).
    pub fn wait_sessions(&self) -> Option<usize> {
        self.wait_sessions
    }

    /// At most `n` of a client's waiters (in any mode) wait on the server at once, each on a
    /// session of its own that it keeps while it holds the lock it was granted there; the
    /// others poll, trying on the shared sessions (pauses of 10 ms doubling to 500 ms),
    /// woken at once by this client's own release of the name and by another client's that
    /// announces it: with this option a client's releases `pg_notify` the key's
    /// channel, which one listening connection of the client `LISTEN`s to while the key has
    /// pollers. With [`with_shared_sessions`](Self::with_shared_sessions), a client's
    /// connections are then bounded however many locks it holds and waits for: the shared
    /// sessions, `n`, the listening one and a few idle ones. A waiter never waits for a
    /// session to wait on, so the bound adds no deadlock. The price: a polling waiter sees a
    /// release that was not announced (a client without the option, another program, a
    /// holder's end) at its next try, not at once, and pollers come before or after the
    /// server's queue as their tries fall, so [`Capabilities::fifo`](lock_core::Capabilities)
    /// is `false`. Needs `shared_sessions` (the
    /// tries' sessions). Unbounded by default; at most [`MAX_SHARED_SESSIONS`](Self::MAX_SHARED_SESSIONS), and `0` polls
    /// always.
    ///
    /// ```
    /// use lock_postgres::PgConfig;
    /// let c = PgConfig::from_url("postgres://app@db/app?shared_sessions=4&wait_sessions=8")?;
    /// assert_eq!(c.wait_sessions(), Some(8));
    /// assert_eq!(PgConfig::new("db").wait_sessions(), None);
    /// // Polling waiters try on the shared sessions: none, nothing to try on.
    /// assert!(PgConfig::from_url("postgres://app@db/app?wait_sessions=8").is_err());
    /// assert!(PgConfig::from_url("postgres://app@db/app?shared_sessions=4&wait_sessions=65").is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn with_wait_sessions(mut self, n: usize) -> Result<Self> {
        if n > Self::MAX_SHARED_SESSIONS {
            return Err(Error::config(format!(
                "PostgreSQL wait_sessions={n}: at most {} (each is a server connection)",
                Self::MAX_SHARED_SESSIONS
            )));
        }
        self.wait_sessions = Some(n);
        Ok(self)
    }

    /// Bounded waits poll on the shared sessions: there must be some.
    fn check_waits(&self) -> Result<()> {
        match (self.wait_sessions, self.shared_sessions) {
            (Some(n), 0) => Err(Error::config(format!(
                "PostgreSQL wait_sessions={n} needs shared_sessions (its polling waiters try on \
                 them)"
            ))),
            _ => Ok(()),
        }
    }

    /// The most sessions [`with_shared_sessions`](Self::with_shared_sessions) takes: the
    /// point is a few connections, not a pool the size of the server's limit.
    pub const MAX_SHARED_SESSIONS: usize = 64;

    /// The fencing counters' table.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// Whether TLS is used when the server offers it (`sslmode=prefer`).
    pub fn tls_preferred(&self) -> bool {
        self.tls_preferred
    }
    pub(crate) fn secret(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// libpq reads `connect_timeout=0` as "no limit", which would let a login hang; a zero
    /// limit would fail every login as if the server were down; one above
    /// [`MAX_TIMEOUT`](lock_core::driver::MAX_TIMEOUT) overflows. None is offered.
    fn check_connect_timeout(&self) -> Result<()> {
        lock_core::driver::check_timeout("PostgreSQL connect timeout", self.connect_timeout)
    }

    /// The client library's configuration (TLS is chosen by the connector).
    pub(crate) fn client_config(&self) -> Result<tokio_postgres::Config> {
        self.check_connect_timeout()?;
        self.check_waits()?;
        // The startup message carries these as C strings: a NUL can never be sent.
        let sent = [
            ("user", self.user.as_deref()),
            ("password", self.password.as_ref().map(Secret::expose)),
            ("database", self.dbname.as_deref()),
            ("application_name", Some(&self.application_name)),
        ];
        if let Some((what, _)) = sent
            .iter()
            .find(|(_, v)| v.is_some_and(|v| v.contains('\0')))
        {
            return Err(Error::config(format!(
                "PostgreSQL: the {what} contains a NUL byte, which the protocol cannot send"
            )));
        }
        let mut c = tokio_postgres::Config::new();
        for h in &self.hosts {
            let (host, port) = split_host(h)?;
            c.host(host).port(port);
        }
        if let Some(u) = &self.user {
            c.user(u);
        }
        if let Some(p) = &self.password {
            c.password(p.expose());
        }
        if let Some(db) = &self.dbname {
            c.dbname(db);
        }
        c.application_name(&self.application_name)
            .connect_timeout(self.connect_timeout)
            // A standby would grant locks its primary's clients cannot see.
            .target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite)
            .ssl_mode(if self.tls {
                tokio_postgres::config::SslMode::Require
            } else if self.tls_preferred {
                tokio_postgres::config::SslMode::Prefer
            } else {
                tokio_postgres::config::SslMode::Disable
            })
            // The client side notices a vanished server too (its own keepalives).
            .keepalives(true)
            .keepalives_idle((self.session_timeout / 3).max(Duration::from_secs(1)));
        Ok(c)
    }

    /// The URL without the password (and without the query).
    pub fn redacted_url(&self) -> String {
        let path = self.dbname.as_ref().map(|d| format!("/{d}"));
        redacted_url(
            "postgres",
            self.user.as_deref(),
            &self.hosts,
            path.as_deref(),
        )
    }
}

fn valid_host(h: &str) -> Result<()> {
    split_host(h).map(|_| ())
}

/// `host[:port]` or `[v6]:port`; a Unix socket path is not accepted (its URL form is too easy
/// to get wrong, and the keepalive bound does not apply to it).
/// `h` as host and port (5432 when absent), or a Config error that shows it.
fn split_host(h: &str) -> Result<(&str, u16)> {
    host_port(h, 5432).ok_or_else(|| {
        Error::config(format!(
            "PostgreSQL URL: {:?} is not host[:port]",
            h.escape_debug().to_string()
        ))
    })
}

lock_core::driver::redacted_config!(PgConfig {
    tls,
    tls_preferred,
    session_timeout,
    table
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_urls_without_the_password() {
        conformance_tests::assert_bad_urls_rejected(
            PgConfig::from_url,
            &[
                "redis://h:1",
                "postgres://u:topsecret@",
                "postgres://u:topsecret@h:notaport/db",
                "postgres://u:topsecret@h:0/db",
                "postgres://u:topsecret@h/db/extra",
                "postgres://u:topsecret@h?sslmode=allow",
                "postgres://u:topsecret@h?sslmode=disable&sslrootcert=/ca.pem",
                "postgres://u:topsecret@h?session_timeout_ms=soon",
                "postgres://u:topsecret@h?session_timeout_ms=10",
                "postgres://u:topsecret@h?table=Robert');DROP",
                "postgres://u:topsecret@h?table=a.b.c",
                "postgres://u:topsecret@h?x=1",
                "postgres://u:topsecret@h?sslmode=disable&sslmode=require",
                "postgres://:topsecret@h/db",
                "postgres://u:topsecret@h?connect_timeout=0",
            ],
            "topsecret",
        );
    }

    /// The protocol sends names and the password as C strings: a NUL byte in one can never
    /// reach the server, so it is a Config error at connect, before any I/O, not an
    /// unreachable server (69). Through the URL and through the setters alike.
    #[tokio::test]
    async fn connect_refuses_a_nul_byte_in_what_the_login_sends() {
        let url = |q: &str| PgConfig::from_url(&format!("postgres://{q}")).unwrap();
        let base = || PgConfig::new("127.0.0.1:1");
        let bad = vec![
            (
                url("u@127.0.0.1:1/db?application_name=a%00b"),
                "application_name",
            ),
            (url("u%00x@127.0.0.1:1/db"), "user in the URL"),
            (url("u:p%00w@127.0.0.1:1/db"), "password in the URL"),
            (base().with_credentials("u\0x", "pw"), "user"),
            (base().with_credentials("u", "p\0w"), "password"),
            (base().with_dbname("d\0b"), "dbname"),
        ];
        conformance_tests::assert_refused_at_connect(crate::PgLock::connect, bad).await;
    }

    /// A zero connect timeout would fail every login at once, as if the server were down (in
    /// the URL, `connect_timeout=0` was silently 1 s; libpq reads it as "no limit", which
    /// would let a login hang): a Config error, at parse or at connect, before any I/O.
    #[tokio::test]
    async fn a_zero_connect_timeout_is_refused() {
        let c = PgConfig::new("127.0.0.1:1").with_connect_timeout(Duration::ZERO);
        conformance_tests::assert_refused_at_connect(crate::PgLock::connect, vec![(c, "0 s")])
            .await;
    }

    #[test]
    fn parses_libpq_urls() {
        let c =
            PgConfig::from_url("postgresql://a%3Ab:p%40w@h1:1,[::1]:2/db?sslmode=require").unwrap();
        assert_eq!(c.user(), Some("a:b"));
        assert_eq!(c.secret().map(Secret::expose), Some("p@w"));
        assert_eq!(c.hosts(), ["h1:1", "[::1]:2"]);
        assert!(c.is_tls());
        assert_eq!(c.redacted_url(), "postgres://a:b:***@h1:1,[::1]:2/db");
        let c = PgConfig::from_url("postgres://u@h").unwrap();
        assert!(c.tls_preferred() && !c.is_tls());
        assert_eq!(split_host("h").unwrap(), ("h", 5432));
        assert_eq!(split_host("[::1]").unwrap(), ("::1", 5432));
        assert_eq!(c.table(), "distlock_fencing");
    }

    /// libpq's spellings are aliases of distlock's shared keys: either works, both at once is
    /// a typed error (which value was meant cannot be known), and the units follow the key.
    #[test]
    fn libpq_spellings_are_aliases_of_the_shared_keys() {
        let by = |q: &str| PgConfig::from_url(&format!("postgres://u@h/db?{q}"));
        for q in ["tls_ca_file=/ca.pem", "sslrootcert=/ca.pem"] {
            let c = by(q).unwrap();
            assert!(matches!(&c.tls_ca, Some(TlsCa::File(p)) if p.to_str() == Some("/ca.pem")));
        }
        assert!(by("sslrootcert=/a&tls_ca_file=/b").is_err());
        assert!(by("sslmode=disable&tls_ca_file=/a").is_err());
        assert_eq!(
            by("connect_timeout=3").unwrap().connect_timeout,
            Duration::from_secs(3)
        );
        assert_eq!(
            by("connect_timeout_ms=300").unwrap().connect_timeout,
            Duration::from_millis(300)
        );
        assert!(by("connect_timeout=3&connect_timeout_ms=300").is_err());
        assert!(by("connect_timeout=0").is_err());
    }
}
