//! The conformance harness of a Redis-protocol server: the suite's view of one server (Redis or
//! Valkey) in one key layout, shared by `tests/conformance.rs` and `tests/valkey.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use conformance_tests::{
    async_trait, BoxError, FaultProxy, Faulty, Harness, Secured, Servers, Timing, UrlParts,
};
use lock_core::driver::connecting;
use lock_core::{DistributedLock, LockName};
use lock_redis::raw::scripts::LockKeys;
use lock_redis::{RedisConfig, RedisLock};
use test_support::ServicesSh;

/// The cases' TTL on a Redis server.
pub(crate) const TTL: Duration = Duration::from_millis(500);

pub(crate) struct Redis {
    pub(crate) config: RedisConfig,
    /// Its servers in services.sh: frozen by the safety nemesis, and crashed and restarted
    /// where it syncs every write (`redis-aof`); `None`: the nemesis leaves them alone.
    pub(crate) servers: Option<Arc<ServicesSh>>,
    /// Whether this run also covers the secured servers (the main server's run).
    pub(crate) secured: bool,
    /// What to start when it cannot connect (`scripts/services.sh up …`).
    pub(crate) up: &'static str,
    /// How the servers are deployed: where the harness's own commands go.
    pub(crate) at: At,
    /// The cases' TTL (500 ms; the failover soaks' 2 s, so that the nemesis's freezes of ½ to
    /// 2 TTLs outlast the sentinels' 1 s and fail the master over).
    pub(crate) ttl: Duration,
}

/// How the servers of a run are deployed.
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // each test binary that includes the harness builds some of them
pub(crate) enum At {
    /// One server, the config's.
    Server,
    /// Behind sentinels (`redis+sentinel://`): the harness's own commands and the fault proxy
    /// go to the master the sentinels name now.
    Sentinels,
    /// The Redis Cluster of services.sh (`cluster1` to `6`): a key's commands go to the node
    /// of its slot, and server-wide counts add up every node's.
    Cluster,
}

impl Redis {
    /// The servers that may hold `key`, without TLS or credentials: for the harness's own
    /// commands (on a cluster, the master of its slot).
    async fn raw_urls(&self, key: &str) -> Result<Vec<String>, BoxError> {
        Ok(match self.at {
            At::Cluster => vec![test_support::redis_cluster_owner(key).await?],
            _ => vec![format!(
                "redis://{}/{}",
                self.addr().await,
                self.config.db()
            )],
        })
    }

    /// The server's `host:port` (behind sentinels, the master's now).
    async fn addr(&self) -> String {
        match self.at {
            At::Sentinels => test_support::sentinel_master().await.unwrap_or_default(),
            _ => format!("{}:{}", self.config.host(), self.config.port()),
        }
    }
}

#[async_trait]
impl Harness for Redis {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        test_support::connected(RedisLock::connect(self.config.clone()), self.up).await
    }
    fn timing(&self) -> Timing {
        Timing::for_ttl(self.ttl)
    }
    async fn backend_requests(&self) -> Option<u64> {
        if self.at == At::Cluster {
            let mut sum = 0;
            for port in test_support::servers::numbered::<6>("cluster") {
                let url = format!("redis://127.0.0.1:{port}");
                sum += test_support::redis_commands_processed(&url).await?;
            }
            return Some(sum);
        }
        let url = format!("redis://{}/{}", self.addr().await, self.config.db());
        test_support::redis_commands_processed(&url).await
    }
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        let keys = if self.config.plain_keys() {
            LockKeys::plain(self.config.prefix(), name)
        } else {
            LockKeys::new(self.config.prefix(), name)
        };
        Some(
            async {
                let urls = self.raw_urls(&keys.lock).await?;
                Ok(test_support::redis_del(urls, &keys.lock).await?)
            }
            .await,
        )
    }
    async fn key_exists(&self, key: &str) -> Option<Result<bool, BoxError>> {
        Some(
            async {
                let urls = self.raw_urls(key).await?;
                Ok(test_support::redis_exists(urls, key).await? > 0)
            }
            .await,
        )
    }
    fn servers(&self) -> Option<Arc<dyn Servers>> {
        let servers = self.servers.clone()?;
        Some(servers)
    }
    /// `redis-auth` and, with the `tls` feature, `redis-tls` of
    /// `scripts/services.sh`; for the main server's run only.
    fn secured(&self) -> Option<Secured> {
        if !self.secured {
            return None;
        }
        let secured = Secured::new(lock_redis::DRIVER.connect, |p: &UrlParts<'_>| {
            let scheme = if p.tls { "rediss" } else { "redis" };
            let query = p.query(&[], None, "tls_ca_file");
            format!("{scheme}://{}{}{query}", p.userinfo_at(), p.server)
        });
        let tls = cfg!(feature = "tls").then_some("redis-tls");
        // Redis's default user too: an empty user name with the `requirepass` password.
        let secured = test_support::secured_servers(secured, "redis-auth", tls)
            .with_account("", "distlock-test-pw");
        Some(if tls.is_some() {
            secured.with_tls_ca_pem(|server, pem| {
                let config = RedisConfig::new(server.ip().to_string(), server.port());
                connecting(RedisLock::connect(config.with_tls_ca_pem(pem)))
            })
        } else {
            secured
        })
    }
    async fn faulty_client(&self, delay: Duration) -> Option<Result<Faulty, BoxError>> {
        if self.at == At::Cluster {
            // A client behind a proxy follows the cluster's redirections to the nodes
            // themselves, around the proxy.
            return None;
        }
        if self.at == At::Sentinels && self.servers.is_some() {
            // Where the nemesis fails the master over, none: a client behind a proxy is a
            // plain client of one master, which does not follow a failover, and its grants
            // on a deposed master would be counted against the Sentinel driver.
            return None;
        }
        Some(
            async {
                // Behind sentinels too, a plain client of the master: the sentinels would
                // name the master, not the proxy.
                let proxy = FaultProxy::start(self.addr().await.parse()?)?;
                proxy.delay(delay);
                let a = proxy.addr();
                let config = RedisConfig::new(a.ip().to_string(), a.port())
                    .with_database(self.config.db())
                    .with_plain_keys(self.config.plain_keys())
                    .with_prefix(self.config.prefix())?;
                let lock = RedisLock::connect(config).await?;
                Ok(Faulty::new(Arc::new(lock), vec![proxy]))
            }
            .await,
        )
    }
}

/// `config` waiting for `n` replicas (`wait_replicas`), with a request timeout of 4 s: the
/// replicas' acknowledgements get a quarter of it, 1 s. The default 1 s (250 ms for them) was
/// too short on the test lanes' machine: a clean run's Sentinel grant, with both replicas in
/// sync just before, was refused as short of them.
#[allow(dead_code)] // the Sentinel and Cluster binaries only
pub(crate) fn waiting_for(config: RedisConfig, n: u32) -> RedisConfig {
    config
        .with_wait_replicas(n)
        .with_request_timeout(Duration::from_secs(4))
}

/// A trial that runs `test` on a runtime of its own.
#[allow(dead_code)] // the binaries with trials of their own (not conformance.rs)
pub(crate) fn trial<F: Future<Output = Result<(), Failed>> + 'static>(
    name: &'static str,
    test: fn() -> F,
) -> Trial {
    Trial::test(name, move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(test())
    })
}
