//! Connecting: TLS, opening a session and setting it up, making the fencing table; PostgreSQL
//! errors mapped onto the contract's variants without the password.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{CancelToken, Client, NoTls};

use lock_core::driver::ClientError;
use lock_core::{Error, Result};

use crate::config::BACKEND;
use crate::session::{Keepalive, ModeStatements, Pool, Session, Sql, Statements};
use crate::PgConfig;

/// How connections are made: plain, or TLS through rustls. Also sends cancel requests, which
/// open a connection of their own.
#[derive(Clone)]
pub(crate) enum Connector {
    Plain,
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Connector {
    pub(crate) async fn new(config: &PgConfig) -> Result<Self> {
        if !config.is_tls() && !config.tls_preferred() {
            return Ok(Connector::Plain);
        }
        #[cfg(feature = "tls")]
        {
            tls_connector(config).await
        }
        #[cfg(not(feature = "tls"))]
        {
            if config.is_tls() {
                return Err(Error::config(
                    "PostgreSQL URL asks for TLS (sslmode), but lock-postgres was built without \
                     its `tls` feature (distlock: feature `postgres-tls`)",
                ));
            }
            Ok(Connector::Plain) // `prefer`: plain is what there is
        }
    }

    async fn connect(
        &self,
        pg: &tokio_postgres::Config,
        notes: Option<Notes>,
    ) -> std::result::Result<(Client, Driven), tokio_postgres::Error> {
        match self {
            Connector::Plain => {
                let (client, conn) = pg.connect(NoTls).await?;
                Ok((client, drive(conn, notes)))
            }
            #[cfg(feature = "tls")]
            Connector::Rustls(tls) => {
                let (client, conn) = pg.connect(tls.clone()).await?;
                Ok((client, drive(conn, notes)))
            }
        }
    }

    pub(crate) async fn cancel(
        &self,
        token: &CancelToken,
    ) -> std::result::Result<(), tokio_postgres::Error> {
        match self {
            Connector::Plain => token.cancel_query(NoTls).await,
            #[cfg(feature = "tls")]
            Connector::Rustls(tls) => token.cancel_query(tls.clone()).await,
        }
    }

    /// Ends `session`, which may be waiting in the server's lock queue, in a task of its own
    /// that a cancelled caller does not stop: a cancel request interrupts the wait (the
    /// protocol's equivalent of `pg_cancel_backend`), and closing the connection ends the
    /// session, so a grant that raced the cancel is freed too.
    pub(crate) fn cancel_and_close(&self, session: Session) {
        let token: CancelToken = session.client.cancel_token();
        let connector = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let cancelled = tokio::time::timeout(
                        std::time::Duration::from_secs(10),
                        connector.cancel(&token),
                    )
                    .await;
                    if !matches!(cancelled, Ok(Ok(()))) {
                        tracing::debug!(
                            "cancel request not confirmed; the closed connection ends the wait"
                        );
                    }
                    drop(session);
                });
            }
            Err(_) => drop(session), // the runtime is gone, and the connection with it
        }
    }
}

/// A connection's task, and a flag it raises when the connection has closed.
pub(crate) type Driven = (JoinHandle<()>, watch::Receiver<bool>);

/// Where a listening connection's notifications go (`LISTEN`, an election's observer).
pub(crate) type Notes = tokio::sync::mpsc::UnboundedSender<tokio_postgres::Notification>;

/// The connection's own task: it carries every request and reply of the session, passes
/// notifications on to `notes` if given, and says when the connection closed (the server
/// ended the session, or the network dropped it).
fn drive<S, T>(mut conn: tokio_postgres::Connection<S, T>, notes: Option<Notes>) -> Driven
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (closed, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    if let Some(notes) = &notes {
                        let _ = notes.send(n);
                    }
                }
                Some(Ok(_)) => {} // a notice
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "PostgreSQL connection ended");
                    break;
                }
                None => break,
            }
        }
        closed.send_replace(true);
    });
    (task, rx)
}

#[cfg(feature = "tls")]
async fn tls_connector(config: &PgConfig) -> Result<Connector> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    match config.tls_ca() {
        Some(ca) => {
            let pem = ca.load().await?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    Error::config_with("PostgreSQL TLS CA: not a PEM certificate", e)
                })?;
                roots.add(cert).map_err(|e| {
                    Error::config_with("PostgreSQL TLS CA: unusable certificate", e)
                })?;
            }
            if roots.is_empty() {
                return Err(Error::config(
                    "PostgreSQL TLS CA: no certificate in the PEM",
                ));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config_with("PostgreSQL TLS", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Connector::Rustls(
        tokio_postgres_rustls::MakeRustlsConnect::new(tls),
    ))
}

/// What a PgLock needs to open sessions.
pub(crate) struct Opener {
    pub(crate) config: PgConfig,
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) connector: Connector,
    pub(crate) keepalive: Keepalive,
    pub(crate) sql: Sql,
    /// Sessions kept open between leases.
    pub(crate) idle: Pool,
    /// Sessions that locks granted at once share (`shared_sessions`; none by default).
    pub(crate) shared: crate::shared::SharedSessions,
}

/// A connection with its server settings made, not yet prepared.
pub(crate) struct Opened {
    pub(crate) client: Client,
    driven: Driven,
    /// The backend's pid, as the session set-up reported it.
    pub(crate) pid: i32,
    user_timeout: bool,
}

impl Opened {
    /// Whether its connection has closed (the server ended it, or the network dropped it).
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed() || self.driven.0.is_finished() || *self.driven.1.borrow()
    }
}

impl Opener {
    pub(crate) async fn new(config: PgConfig) -> Result<Self> {
        Ok(Opener {
            pg: config.client_config()?,
            connector: Connector::new(&config).await?,
            keepalive: Keepalive::for_bound(config.session_timeout()),
            // Until `ensure_table` has looked: elections only where the table has the column.
            sql: Sql::for_table(config.table(), false),
            idle: Pool::default(),
            shared: crate::shared::SharedSessions::new(config.shared_sessions()),
            config,
        })
    }

    /// `request`'s answer, or `Unavailable` once `bound` has passed without one. A frozen or
    /// partitioned server whose kernel still acknowledges the bytes (or a proxy in between)
    /// would otherwise keep the caller waiting for as long as TCP keeps trying; only the
    /// blocking wait in the server's lock queue goes without this bound.
    pub(crate) async fn answered<T>(
        &self,
        what: &str,
        bound: Duration,
        request: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        self.within(what, bound, async {
            request.await.map_err(|e| self.error(e))
        })
        .await
    }

    /// `work`'s result, or `Unavailable` once `bound` has passed without one.
    pub(crate) async fn within<T>(
        &self,
        what: &str,
        bound: Duration,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::time::timeout(bound, work).await.unwrap_or_else(|_| {
            Err(Error::unavailable(
                BACKEND,
                format!(
                    "{}: no answer to {what} within {bound:?}",
                    self.config.redacted_url()
                ),
            ))
        })
    }

    /// How long one request may go unanswered: the session timeout, after which the server
    /// may have ended the session anyway.
    pub(crate) fn request_bound(&self) -> Duration {
        self.config.session_timeout()
    }

    /// Connects and applies the session settings (one round trip after the login).
    pub(crate) async fn open(&self) -> Result<Opened> {
        self.open_with(None).await
    }

    /// [`open`](Self::open), passing the connection's notifications to `notes`.
    pub(crate) async fn open_with(&self, notes: Option<Notes>) -> Result<Opened> {
        let login = self.config.connect_timeout() + self.request_bound();
        let (client, driven) = self
            .answered("the login", login, self.connector.connect(&self.pg, notes))
            .await?;
        let batch = self
            .answered(
                "the session set-up",
                self.request_bound(),
                client.simple_query(&self.keepalive.setup_sql()),
            )
            .await?;
        let rows: Vec<&tokio_postgres::SimpleQueryRow> = batch
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .collect();
        self.check_applied(&rows);
        let row = rows
            .iter()
            .find(|r| r.len() == 3)
            .ok_or_else(|| self.odd("no pid in the session set-up's reply"))?;
        let pid: i32 = row
            .get(0)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| self.odd("unreadable backend pid"))?;
        if row.get(1) == Some("true") {
            return Err(Error::config(format!(
                "{} is a standby (in recovery): advisory locks there do not exclude the \
                 primary's clients; connect to the primary",
                self.config.redacted_url()
            )));
        }
        Ok(Opened {
            client,
            driven,
            pid,
            user_timeout: row.get(2) == Some("true"),
        })
    }

    /// Says so when the server's socket did not take a TCP setting as asked (the kernel
    /// refused it). That only lengthens how long a vanished client's session lives (the
    /// kernel's defaults are longer), never shortens it, so it is a warning, not an error.
    fn check_applied(&self, rows: &[&tokio_postgres::SimpleQueryRow]) {
        for (name, asked) in self.keepalive.tcp_settings() {
            let now = rows
                .iter()
                .find(|r| r.len() == 2 && r.get(0) == Some(name))
                .and_then(|r| r.get(1));
            if let Some(now) = now.filter(|v| *v != asked) {
                tracing::warn!(
                    url = %self.config.redacted_url(),
                    setting = name,
                    asked = %asked,
                    now = %now,
                    "the server did not apply a keepalive setting: a vanished client's lock \
                     may stay longer than the session timeout"
                );
            }
        }
    }

    /// A new session, prepared.
    pub(crate) async fn session(&self) -> Result<Session> {
        self.prepare(self.open().await?).await
    }

    pub(crate) async fn prepare(&self, o: Opened) -> Result<Session> {
        let c = &o.client;
        let prepared = async {
            tokio::try_join!(
                ModeStatements::prepare(c, &self.sql.exclusive),
                c.prepare(&self.sql.family_token),
                c.prepare(&self.sql.reader_try_grant),
                c.prepare(&self.sql.check),
            )
        };
        let (exclusive, family_token, reader_try_grant, check) = self
            .answered("preparing the statements", self.request_bound(), prepared)
            .await?;
        let (task, closed) = o.driven;
        Ok(Session {
            client: o.client,
            task,
            closed,
            pid: o.pid,
            stmts: Statements {
                exclusive,
                family_token,
                reader_try_grant,
                check,
            },
        })
    }

    /// Creates the fencing table if it is absent (concurrent creators are fine), and gives a
    /// table made by an earlier version the `value` column elections keep the leader's value
    /// in. `Ok(false)`: the table has no such column and this user may not add it — locks
    /// work, elections are `Unsupported`.
    pub(crate) async fn ensure_table(&self, o: &Opened) -> Result<bool> {
        let (exists, valued) = self.table_state(o).await?;
        if valued {
            return Ok(true);
        }
        if exists {
            let t = crate::session::quoted(self.config.table());
            let add = format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS value bytea");
            return Ok(match o.client.batch_execute(&add).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        table = self.config.table(),
                        error = %self.scrub(&e),
                        "the fencing table has no value column and it cannot be added: leader \
                         election is unsupported on it"
                    );
                    false
                }
            });
        }
        match o.client.batch_execute(&self.sql.create_table).await {
            Ok(()) => Ok(true),
            Err(e)
                if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                    || e.code() == Some(&SqlState::DUPLICATE_TABLE) =>
            {
                // Another client made it at the same moment: with the column, unless it is of
                // an earlier version.
                Ok(self.table_state(o).await?.1)
            }
            Err(e) => Err(self.error(e)),
        }
    }

    /// Whether the fencing table exists, and whether it has the `value` column.
    async fn table_state(&self, o: &Opened) -> Result<(bool, bool)> {
        let row = o
            .client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT 1 FROM pg_catalog.pg_attribute \
                 WHERE attrelid = to_regclass($1) AND attname = 'value' AND NOT attisdropped)",
                &[&self.config.table()],
            )
            .await
            .map_err(|e| self.error(e))?;
        let flag = |i| row.try_get::<_, bool>(i).unwrap_or(false);
        Ok((flag(0), flag(1)))
    }

    /// Whether this server drops a vanished client's session by `tcp_user_timeout` as well as
    /// by keepalives (PostgreSQL 12 and later on Linux).
    pub(crate) fn warn_unbounded(&self, o: &Opened) {
        if !o.user_timeout {
            tracing::info!(
                url = %self.config.redacted_url(),
                "server has no tcp_user_timeout: a vanished client's session ends by keepalives only"
            );
        }
    }

    pub(crate) fn scrub(&self, e: &tokio_postgres::Error) -> String {
        lock_core::driver::scrub(&e, self.config.secret())
    }

    pub(crate) fn odd(&self, what: &str) -> Error {
        Error::backend(BACKEND, format!("{what} ({})", self.config.redacted_url()))
    }

    pub(crate) fn error(&self, e: tokio_postgres::Error) -> Error {
        map_error(e, &self.config)
    }
}

/// PostgreSQL's errors onto the contract: refused logins and missing privileges are
/// `Unauthenticated`, a lost or refused connection `Unavailable`, anything else `Backend`; the
/// client's error kept whole (downcastable) behind a scrubbed message.
pub(crate) fn map_error(e: tokio_postgres::Error, config: &PgConfig) -> Error {
    let text = lock_core::driver::scrub(&e, config.secret());
    let cause = std::error::Error::source(&e)
        .map(|s| lock_core::driver::scrub(&s, config.secret()))
        .unwrap_or_default();
    let code = e.code().cloned();
    // tokio-postgres shows a server's error as just "db error": say what the server said.
    let said = e.as_db_error().map(|d| {
        let text = format!("{} {}: {}", d.severity(), d.code().code(), d.message());
        lock_core::driver::scrub(&text, config.secret())
    });
    let place = match &said {
        Some(said) => format!("{said}; {}", config.redacted_url()),
        None => config.redacted_url(),
    };
    let keep = |e| ClientError::new(e, config.secret()).context(place);
    match code {
        Some(c)
            if c == SqlState::INVALID_PASSWORD
                || c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                || c == SqlState::INSUFFICIENT_PRIVILEGE =>
        {
            let detail = e.as_db_error().map_or(text.clone(), |d| {
                lock_core::driver::scrub(&d.message(), config.secret())
            });
            Error::unauthenticated(
                BACKEND,
                format!(
                    "PostgreSQL refused user {:?}: {detail}",
                    config.user().unwrap_or("")
                ),
            )
        }
        Some(c)
            if c == SqlState::ADMIN_SHUTDOWN
                || c == SqlState::CRASH_SHUTDOWN
                || c == SqlState::CANNOT_CONNECT_NOW
                || c == SqlState::TOO_MANY_CONNECTIONS
                || c == SqlState::QUERY_CANCELED
                || c.code().starts_with("08") =>
        {
            Error::unavailable(BACKEND, keep(e))
        }
        // The URL names a database the server does not have: retrying cannot help.
        Some(c) if c == SqlState::INVALID_CATALOG_NAME => Error::config_with(
            format!(
                "PostgreSQL has no database {:?}",
                config.dbname().unwrap_or("")
            ),
            keep(e),
        ),
        // The fencing table cannot be one: its schema is missing, or it is some other table.
        Some(c)
            if c == SqlState::INVALID_SCHEMA_NAME
                || c == SqlState::UNDEFINED_COLUMN
                || c == SqlState::UNDEFINED_TABLE
                || c == SqlState::DATATYPE_MISMATCH
                || c == SqlState::WRONG_OBJECT_TYPE =>
        {
            Error::config_with(
                format!(
                    "PostgreSQL fencing table {:?} cannot be used: {}",
                    config.table(),
                    said.as_deref().unwrap_or(&text)
                ),
                keep(e),
            )
        }
        Some(_) => Error::backend(BACKEND, keep(e)),
        // The client asked for a password the URL does not have.
        None if cause.contains("password missing") => Error::unauthenticated(
            BACKEND,
            format!(
                "PostgreSQL asks user {:?} for a password and the URL has none",
                config.user().unwrap_or("")
            ),
        ),
        None => Error::unavailable(BACKEND, keep(e)),
    }
}
