//! The shared conformance suite against five real, independent redis-server masters.
//!
//! Masters: `REDLOCK_URL` (default `redlock://{redlock1},...,{redlock5}`, started by
//! `scripts/services.sh up`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{
    async_trait, BoxError, FaultProxy, Faulty, Harness, Secured, Servers, Timing, UrlParts,
};
use lock_core::{DistributedLock, LockName};
use lock_redis::raw::scripts::LockKeys;
use lock_redlock::{RedlockConfig, RedlockLock};
use test_support::servers;
use test_support::ServicesSh;

/// A per-node timeout of 150 ms rather than the driver's 50 ms: the suite runs beside seven
/// other lanes on two cores, where a loopback answer can take longer than 50 ms, and the
/// eight racers of `exclusion::single_winner_among_racers` then all missed their quorum
/// three times (clean run of `c22238e`: `QuorumNotReached { granted: 0 }`).
fn default_url() -> String {
    servers::url(
        "redlock://{redlock1},{redlock2},{redlock3},{redlock4},{redlock5}?node_timeout_ms=150",
    )
}

struct Redlock {
    config: RedlockConfig,
    reads: AtomicU64,
    /// The masters in services.sh. They keep no data on disk, so a restarted master forgets
    /// its locks and counters (Redlock then needs a delayed restart): the nemesis only
    /// freezes them.
    masters: Arc<ServicesSh>,
}

impl Redlock {
    /// The masters, without TLS or credentials: for the harness's own commands.
    fn raw_urls(&self) -> impl Iterator<Item = String> + '_ {
        let masters = self.config.masters().iter();
        masters.map(|m| format!("redis://{}:{}/{}", m.host(), m.port(), m.db()))
    }
}

#[async_trait]
impl Harness for Redlock {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        test_support::connected(
            RedlockLock::connect(self.config.clone()),
            "redlock1 redlock2 redlock3 redlock4 redlock5",
        )
        .await
    }
    fn timing(&self) -> Timing {
        Timing::for_ttl(Duration::from_millis(500))
    }
    /// Commands processed by all masters, minus the INFO commands this counter itself sent.
    async fn backend_requests(&self) -> Option<u64> {
        let mut total = 0;
        for url in self.raw_urls() {
            total += test_support::redis_commands_processed(&url).await?;
        }
        let reads = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
        Some(total.saturating_sub(reads * self.config.masters().len() as u64))
    }
    fn servers(&self) -> Option<Arc<dyn Servers>> {
        Some(self.masters.clone())
    }
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        let keys = LockKeys::new(self.config.masters()[0].prefix(), name);
        Some(
            test_support::redis_del(self.raw_urls(), &keys.lock)
                .await
                .map_err(Into::into),
        )
    }
    /// On a majority of the masters, as a grant sets it.
    async fn key_exists(&self, key: &str) -> Option<Result<bool, BoxError>> {
        let urls: Vec<String> = self.raw_urls().collect();
        let majority = urls.len() / 2 + 1;
        let found = test_support::redis_exists(urls, key).await;
        Some(found.map(|n| n >= majority).map_err(Into::into))
    }
    /// `redis-auth` and, with the `tls` feature, `redis-tls` of
    /// `scripts/services.sh`, each as a one-master Redlock.
    fn secured(&self) -> Option<Secured> {
        let secured = Secured::new(lock_redlock::DRIVER.connect, |p: &UrlParts<'_>| {
            let query = p.query(&[], Some("tls"), "tls_ca_file");
            format!("redlock://{}{}{query}", p.userinfo_at(), p.server)
        });
        let tls = cfg!(feature = "tls").then_some("redis-tls");
        // Redis's default user too: an empty user name with the `requirepass` password.
        Some(
            test_support::secured_servers(secured, "redis-auth", tls)
                .with_account("", "distlock-test-pw"),
        )
    }
    async fn faulty_client(&self, delay: Duration) -> Option<Result<Faulty, BoxError>> {
        Some(
            async {
                let mut keep = Vec::new();
                let mut masters = Vec::new();
                for m in self.config.masters() {
                    let proxy = FaultProxy::start(format!("{}:{}", m.host(), m.port()).parse()?)?;
                    proxy.delay(delay);
                    let a = proxy.addr();
                    masters.push(
                        lock_redis::RedisConfig::new(a.ip().to_string(), a.port())
                            .with_database(m.db())
                            .with_prefix(m.prefix())?,
                    );
                    keep.push(proxy);
                }
                // The per-node timeout must outlast the delay, or every master counts as down:
                // two round trips (a script's first call on a server that lost its script
                // cache takes two) plus slack.
                let config = RedlockConfig::new(masters)?
                    .with_node_timeout(delay * 6 + Duration::from_millis(50));
                Ok(Faulty::new(
                    Arc::new(RedlockLock::connect(config).await?),
                    keep,
                ))
            }
            .await,
        )
    }
}

fn main() -> ExitCode {
    let url = std::env::var("REDLOCK_URL").unwrap_or_else(|_| default_url());
    let config = RedlockConfig::from_url(&url).expect("REDLOCK_URL");
    conformance_tests::run(Redlock {
        config,
        reads: AtomicU64::new(0),
        masters: Arc::new(ServicesSh::new(
            &["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"],
            false,
        )),
    })
}
