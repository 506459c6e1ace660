//! The shared conformance suite against a real etcd: the single member (`ETCD_URL`, default
//! `etcd://{etcd}`) and the 3-member cluster (`ETCD_CLUSTER_URL`, default
//! `etcd://{etcd-c1},{etcd-c2},{etcd-c3}`), both from `scripts/services.sh up`; and the single
//! member again with `shared_lease=true`, where the locks of a client and TTL share one lease.
//! Cases are listed three times, prefixed `single::`, `cluster::` and `shared_lease::`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{
    async_trait, BoxError, FaultProxy, Faulty, Harness, Secured, Servers, Timing, UrlParts,
};
use lock_core::driver::connecting;
use lock_core::{DistributedLock, LockName};
use lock_etcd::{EtcdConfig, EtcdLock};
use test_support::servers;
use test_support::ServicesSh;

struct Etcd {
    config: EtcdConfig,
    /// The server's minimum lease TTL, measured by a first connection.
    ttl: Duration,
    /// Its servers in services.sh, which the nemesis freezes and restarts.
    servers: Arc<ServicesSh>,
    /// Whether this run also covers the secured servers (once per binary).
    secured: bool,
}

#[async_trait]
impl Harness for Etcd {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        test_support::connected(
            EtcdLock::connect(self.config.clone()),
            "etcd etcd-c1 etcd-c2 etcd-c3",
        )
        .await
    }
    fn timing(&self) -> Timing {
        // etcd leases are whole seconds and the server revokes expired ones on a 500 ms tick.
        Timing::for_ttl(self.ttl).with_slack(Duration::from_millis(1500))
    }
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        Some(
            async {
                let lock = EtcdLock::connect(self.config.clone()).await?;
                let dir = format!("{}/{}/", self.config.prefix(), name);
                lock.client()
                    .delete(
                        dir,
                        Some(lock_etcd::etcd_client::DeleteOptions::new().with_prefix()),
                    )
                    .await?;
                Ok(())
            }
            .await,
        )
    }
    async fn key_exists(&self, key: &str) -> Option<Result<bool, BoxError>> {
        Some(
            async {
                let lock = EtcdLock::connect(self.config.clone()).await?;
                let got = lock.client().get(key, None).await?;
                Ok(!got.kvs().is_empty())
            }
            .await,
        )
    }
    async fn backend_requests(&self) -> Option<u64> {
        test_support::etcd_grpc_messages_received(self.config.endpoints()).await
    }
    fn servers(&self) -> Option<Arc<dyn Servers>> {
        Some(self.servers.clone())
    }
    /// `etcd-auth` and, with the `tls` feature, `etcd-tls` of
    /// `scripts/services.sh`.
    fn secured(&self) -> Option<Secured> {
        if !self.secured {
            return None;
        }
        let secured = Secured::new(lock_etcd::DRIVER.connect, |p: &UrlParts<'_>| {
            let query = p.query(&[], Some("tls"), "tls_ca_file");
            format!(
                "etcd://{}{}/distlock-auth{query}",
                p.userinfo_at(),
                p.server
            )
        });
        let tls = cfg!(feature = "tls").then_some("etcd-tls");
        let secured = test_support::secured_servers(secured, "etcd-auth", tls);
        Some(if tls.is_some() {
            secured.with_tls_ca_pem(|server, pem| {
                let config = EtcdConfig::new([server.to_string()]);
                connecting(EtcdLock::connect(config.with_tls_ca_pem(pem)))
            })
        } else {
            secured
        })
    }
    async fn faulty_client(&self, delay: Duration) -> Option<Result<Faulty, BoxError>> {
        Some(
            async {
                let servers = self.config.endpoints().iter();
                let keep = FaultProxy::in_front_of(
                    servers.map(|ep| ep.trim_start_matches("http://")),
                    delay,
                )?;
                let config = EtcdConfig::new(keep.iter().map(|p| p.addr().to_string()))
                    .with_prefix(self.config.prefix())?
                    .with_shared_lease(self.config.shared_lease())
                    .with_request_timeout(delay * 4 + Duration::from_secs(2));
                Ok(Faulty::new(
                    Arc::new(EtcdLock::connect(config).await?),
                    keep,
                ))
            }
            .await,
        )
    }
}

fn main() -> ExitCode {
    let single = std::env::var("ETCD_URL").unwrap_or_else(|_| servers::url("etcd://{etcd}"));
    let cluster = std::env::var("ETCD_CLUSTER_URL")
        .unwrap_or_else(|_| servers::url("etcd://{etcd-c1},{etcd-c2},{etcd-c3}"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut trials = Vec::new();
    let cluster_servers: &'static [&'static str] = &["etcd-c1", "etcd-c2", "etcd-c3"];
    let shared = format!(
        "{single}{}shared_lease=true",
        if single.contains('?') { '&' } else { '?' }
    );
    for (label, url, servers) in [
        ("single", single, &["etcd"][..]),
        ("cluster", cluster, cluster_servers),
        ("shared_lease", shared, &["etcd"][..]),
    ] {
        let config = EtcdConfig::from_url(&url).expect("etcd URL");
        let ttl = rt
            .block_on(EtcdLock::connect(config.clone()))
            .map(|l| l.capabilities().min_ttl)
            .unwrap_or(Duration::from_secs(2));
        trials.extend(conformance_tests::trials_prefixed(
            Arc::new(Etcd {
                servers: Arc::new(
                    ServicesSh::new(servers, true).etcd_leader(config.endpoints().iter().cloned()),
                ),
                config,
                ttl,
                secured: label == "single",
            }),
            label,
        ));
    }
    drop(rt);
    conformance_tests::run_trials(trials)
}
