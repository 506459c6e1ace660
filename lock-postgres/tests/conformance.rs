//! The shared conformance suite against a real PostgreSQL 15 (`PG_URL`, default
//! `postgres://locker@{pg}/postgres`, from `scripts/services.sh up`), with the
//! password server `pg-auth` and, with the `tls` feature, the TLS-only `pg-tls` for the
//! `security` cases. Run twice: a session per lock (the default, unprefixed) and
//! `shared_sessions::`, where locks granted at once share at most 2 sessions, a client's
//! waiters of one name take turns on one waiting session (`shared_waits`), and one waiter
//! at a time waits on the server while the others poll (`wait_sessions=1`; no FIFO promise
//! between clients, so the FIFO cases run only in the default run).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{
    async_trait, BoxError, FaultProxy, Faulty, Harness, Secured, Servers, Timing, UrlParts,
};
use lock_core::driver::connecting;
use lock_core::{DistributedLock, LockName};
use lock_postgres::{advisory_key, PgConfig, PgLock};
use test_support::servers;
use test_support::ServicesSh;

const SESSION: Duration = Duration::from_millis(2000);

struct Pg {
    config: PgConfig,
    servers: Arc<ServicesSh>,
    /// Reads of the statement counter so far (each one is a statement).
    reads: AtomicU64,
    /// The `security` cases' servers: run once, by the default configuration.
    secured: bool,
}

/// How many sessions the `shared_sessions::` run's locks share: two, so that grants meet
/// both on one session and across sessions.
const SHARED: usize = 2;

/// How many of a client's waiters wait on the server in the `shared_sessions::` run: one,
/// so that a case with two waiters has one of each kind.
const WAITING: usize = 1;

/// Where the harness's own statements go: the server, without TLS.
fn admin_conninfo(config: &PgConfig) -> String {
    let host = &config.hosts()[0];
    let (h, p) = host.rsplit_once(':').unwrap_or((host, "5432"));
    let user = config.user().unwrap_or("postgres");
    let db = config.dbname().unwrap_or("postgres");
    format!("host={h} port={p} user={user} dbname={db}")
}

/// A plain connection for the harness's own statements.
async fn admin(config: &PgConfig) -> Result<tokio_postgres::Client, BoxError> {
    Ok(test_support::pg_client(&admin_conninfo(config)).await?)
}

#[async_trait]
impl Harness for Pg {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        test_support::connected(PgLock::connect(self.config.clone()), "pg").await
    }
    fn timing(&self) -> Timing {
        // The lock's TTL cannot be below the session timeout.
        Timing::for_ttl(SESSION)
    }
    /// Statements the server ran, minus this counter's own reads. A waiter sits in one
    /// `pg_advisory_lock`, which counts once it ends; a polling driver would count every try.
    async fn backend_requests(&self) -> Option<u64> {
        let total = test_support::pg_statements(&admin_conninfo(&self.config)).await?;
        let reads = self.reads.fetch_add(1, Ordering::Relaxed);
        Some(total.saturating_sub(reads))
    }
    /// An operator's `pg_terminate_backend` of the session that holds the lock.
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        Some(
            async {
                let admin = admin(&self.config).await?;
                let rows = admin
                    .query(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = \
                         'advisory' AND granted AND objsubid = 1 \
                         AND ((classid::int8 << 32) | objid::int8) = $1",
                        &[&advisory_key(name)],
                    )
                    .await?;
                if rows.is_empty() {
                    return Err(format!("nobody holds {name}").into());
                }
                Ok(())
            }
            .await,
        )
    }
    /// The key is the advisory lock's 64-bit key; it exists while a session holds it.
    async fn key_exists(&self, key: &str) -> Option<Result<bool, BoxError>> {
        Some(
            async {
                let key: i64 = key.parse()?;
                let admin = admin(&self.config).await?;
                let rows = admin
                    .query(
                        "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
                         AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = $1",
                        &[&key],
                    )
                    .await?;
                Ok(!rows.is_empty())
            }
            .await,
        )
    }
    fn servers(&self) -> Option<Arc<dyn Servers>> {
        Some(self.servers.clone())
    }
    /// Advisory locks do not survive a restart (the sessions end), but the fencing counters
    /// must: the restart case checks that tokens keep increasing.
    fn can_restart_backend(&self) -> bool {
        true
    }
    /// `pg-auth` (scram) and, with the `tls` feature, the TLS-only `pg-tls`.
    fn secured(&self) -> Option<Secured> {
        if !self.secured {
            return None;
        }
        let secured = Secured::new(lock_postgres::DRIVER.connect, |p: &UrlParts<'_>| {
            let extra: &[&str] = if p.tls {
                &["session_timeout_ms=2000", "sslmode=verify-full"]
            } else {
                &["session_timeout_ms=2000", "sslmode=disable"]
            };
            let query = p.query(extra, None, "sslrootcert");
            // services.sh's servers know only the user `locker`.
            let user = p
                .userinfo
                .map_or("locker@".to_string(), |u| format!("{u}@"));
            format!("postgres://{user}{}/postgres{query}", p.server)
        });
        let tls = cfg!(feature = "tls").then_some("pg-tls");
        let secured = test_support::secured_servers(secured, "pg-auth", tls);
        Some(if tls.is_some() {
            secured.with_tls_ca_pem(|server, pem| {
                let config = PgConfig::new(server.to_string())
                    .with_credentials("locker", "")
                    .with_dbname("postgres")
                    .with_tls_ca_pem(pem);
                connecting(PgLock::connect(config))
            })
        } else {
            secured
        })
    }
    async fn faulty_client(&self, delay: Duration) -> Option<Result<Faulty, BoxError>> {
        Some(
            async {
                let keep = FaultProxy::in_front_of(self.config.hosts(), delay)?;
                // The earliest the server's keepalive could end a partitioned session.
                for proxy in &keep {
                    proxy.server_keepalive(Some(self.config.session_timeout()));
                }
                let mut config = self.config.clone();
                let hosts: Vec<String> = keep.iter().map(|p| p.addr().to_string()).collect();
                config = PgConfig::from_url(&format!(
                    "postgres://locker@{}/postgres?sslmode=disable&session_timeout_ms={}\
                     &shared_sessions={}&shared_waits={}{}",
                    hosts.join(","),
                    config.session_timeout().as_millis(),
                    config.shared_sessions(),
                    config.shared_waits(),
                    (config.wait_sessions())
                        .map(|n| format!("&wait_sessions={n}"))
                        .unwrap_or_default()
                ))?;
                Ok(Faulty::new(Arc::new(PgLock::connect(config).await?), keep))
            }
            .await,
        )
    }
}

fn main() -> ExitCode {
    let url = std::env::var("PG_URL")
        .unwrap_or_else(|_| servers::url("postgres://locker@{pg}/postgres?sslmode=disable"));
    let config = PgConfig::from_url(&url)
        .expect("PostgreSQL URL")
        .with_session_timeout(SESSION)
        .expect("session timeout");
    let servers = Arc::new(ServicesSh::new(&["pg"], false).with_children());
    let mut trials = conformance_tests::trials(Arc::new(Pg {
        config: config.clone(),
        servers: servers.clone(),
        reads: AtomicU64::new(0),
        secured: true,
    }));
    trials.extend(conformance_tests::trials_prefixed(
        Arc::new(Pg {
            config: config
                .with_shared_sessions(SHARED)
                .expect("shared sessions")
                .with_shared_waits(true)
                .with_wait_sessions(WAITING)
                .expect("wait sessions"),
            servers,
            reads: AtomicU64::new(0),
            secured: false,
        }),
        "shared_sessions",
    ));
    conformance_tests::run_trials(trials)
}
