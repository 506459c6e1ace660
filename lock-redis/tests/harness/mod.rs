//! The conformance harness of a Redis-protocol server: the suite's view of one server (Redis or
//! Valkey) in one key layout, shared by `tests/conformance.rs` and `tests/valkey.rs`.

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{
    async_trait, BoxError, FaultProxy, Faulty, Harness, Secured, Servers, Timing, UrlParts,
};
use lock_core::driver::connecting;
use lock_core::{DistributedLock, LockName};
use lock_redis::raw::scripts::LockKeys;
use lock_redis::{RedisConfig, RedisLock};
use test_support::ServicesSh;

pub(crate) struct Redis {
    pub(crate) config: RedisConfig,
    /// Its server in services.sh: frozen by the safety nemesis, and crashed and restarted
    /// where it syncs every write (`redis-aof`).
    pub(crate) servers: Arc<ServicesSh>,
    /// Whether this run also covers the secured servers (the main server's run).
    pub(crate) secured: bool,
    /// What to start when it cannot connect (`scripts/services.sh up …`).
    pub(crate) up: &'static str,
}

impl Redis {
    /// The server, without TLS or credentials: for the harness's own commands.
    fn raw_url(&self) -> String {
        let c = &self.config;
        format!("redis://{}:{}/{}", c.host(), c.port(), c.db())
    }
}

#[async_trait]
impl Harness for Redis {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        test_support::connected(RedisLock::connect(self.config.clone()), self.up).await
    }
    fn timing(&self) -> Timing {
        Timing::for_ttl(Duration::from_millis(500))
    }
    async fn backend_requests(&self) -> Option<u64> {
        test_support::redis_commands_processed(&self.raw_url()).await
    }
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        let keys = if self.config.plain_keys() {
            LockKeys::plain(self.config.prefix(), name)
        } else {
            LockKeys::new(self.config.prefix(), name)
        };
        Some(
            test_support::redis_del([self.raw_url()], &keys.lock)
                .await
                .map_err(Into::into),
        )
    }
    async fn key_exists(&self, key: &str) -> Option<Result<bool, BoxError>> {
        let found = test_support::redis_exists([self.raw_url()], key).await;
        Some(found.map(|n| n > 0).map_err(Into::into))
    }
    fn servers(&self) -> Option<Arc<dyn Servers>> {
        Some(self.servers.clone())
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
        Some(
            async {
                let proxy = FaultProxy::start(
                    format!("{}:{}", self.config.host(), self.config.port()).parse()?,
                )?;
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
