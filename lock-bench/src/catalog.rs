//! Which subjects each backend has: the distlock driver, reached through `distlock::connect`
//! as an application reaches it, and the baselines measured beside it in the same run. Adding
//! a backend: its URL here, its baselines in a `*_baselines.rs` of their own.

use std::sync::Arc;
use std::time::Duration;

use lock_core::LockOptions;

use crate::memory_baselines::TokioMutex;
use crate::subject::{Driver, Subject};

/// Settings the backends need.
#[derive(Clone)]
pub(crate) struct Endpoints {
    pub(crate) redis_url: String,
    pub(crate) redlock_url: String,
    pub(crate) zk_hosts: String,
    pub(crate) zk_ensemble_hosts: String,
    pub(crate) etcd_endpoints: String,
    pub(crate) etcd_cluster_endpoints: String,
    pub(crate) pg_url: String,
}

impl Endpoints {
    fn zk(&self, backend: &str) -> Option<(&str, &'static str)> {
        match backend {
            "zookeeper" => Some((&self.zk_hosts, "single node")),
            "zookeeper-ensemble" => Some((&self.zk_ensemble_hosts, "3-node ensemble")),
            _ => None,
        }
    }

    /// The members and row label of an etcd backend.
    pub(crate) fn etcd(&self, backend: &str) -> Option<(Vec<String>, &'static str)> {
        let (eps, label) = match backend {
            "etcd" => (&self.etcd_endpoints, "single member"),
            "etcd-cluster" => (&self.etcd_cluster_endpoints, "3-member cluster"),
            _ => return None,
        };
        Some((eps.split(',').map(str::to_string).collect(), label))
    }
}

/// The masters of a `redlock://h1:p1,h2:p2` URL as `redis://` URLs (for the baselines).
fn redlock_masters(url: &str) -> Vec<String> {
    let hosts = url.trim_start_matches("redlock://");
    let hosts = hosts.split(['/', '?']).next().unwrap_or("");
    hosts.split(',').map(|h| format!("redis://{h}")).collect()
}

const BACKENDS: &str = "memory, redis, redis-plain, redlock, zookeeper, zookeeper-ensemble, \
                        etcd, etcd-cluster, postgres";

/// Baselines measured beside `backend`, in the order they are listed.
pub(crate) async fn baselines_for(
    backend: &str,
    ep: &Endpoints,
) -> Result<Vec<Arc<dyn Subject>>, String> {
    match backend {
        "memory" => Ok(vec![Arc::new(TokioMutex::default())]),
        "redis-plain" => Ok(vec![Arc::new(
            crate::redis_baselines::RawFloor::redis_py(&ep.redis_url, PLAIN_PREFIX).await?,
        )]),
        "redis" => Ok(vec![
            Arc::new(crate::redis_baselines::RawFloor::connect(&ep.redis_url).await?),
            Arc::new(crate::redis_baselines::Rslock::new(vec![ep
                .redis_url
                .clone()])),
        ]),
        "redlock" => {
            let masters = redlock_masters(&ep.redlock_url);
            let first = masters.first().cloned().unwrap_or_default();
            let single = distlock::connect(&first).await.map_err(|e| e.to_string())?;
            Ok(vec![
                Arc::new(Driver {
                    lock: single,
                    opts: LockOptions::new(Duration::from_secs(10)),
                    label: None,
                }),
                Arc::new(crate::redis_baselines::Rslock::new(masters)),
            ])
        }
        b if ep.zk(b).is_some() => {
            let (hosts, label) = ep.zk(b).unwrap_or_default();
            Ok(vec![Arc::new(
                crate::zk_baselines::ZkRecipe::connect(hosts, label).await?,
            )])
        }
        b if ep.etcd(b).is_some() => {
            let (eps, label) = ep.etcd(b).unwrap_or_default();
            Ok(vec![
                Arc::new(crate::etcd_baselines::TxnFloor::connect(&eps, label).await?),
                Arc::new(crate::etcd_baselines::LockRpc::connect(&eps, label).await?),
            ])
        }
        "postgres" => Ok(vec![
            Arc::new(crate::pg_baselines::PgFloor::connect(&ep.pg_url).await?),
            Arc::new(crate::pg_baselines::SqlxLock::connect(&ep.pg_url).await?),
        ]),
        other => Err(format!("unknown backend {other:?} (available: {BACKENDS})")),
    }
}

/// The driver for `backend`.
pub(crate) async fn driver_subject(
    backend: &str,
    ep: &Endpoints,
) -> Result<Arc<dyn Subject>, String> {
    // Through the facade, as an application would: the URL picks the driver.
    let url = match backend {
        "memory" => "memory://lock-bench".to_string(),
        "redis" => ep.redis_url.clone(),
        "redis-plain" => format!("{}?keys=plain&prefix={PLAIN_PREFIX}", ep.redis_url),
        "redlock" => ep.redlock_url.clone(),
        b if ep.zk(b).is_some() => format!("zk://{}", ep.zk(b).unwrap_or_default().0),
        b if ep.etcd(b).is_some() => {
            format!("etcd://{}", ep.etcd(b).unwrap_or_default().0.join(","))
        }
        "postgres" => format!("{}?sslmode=disable", ep.pg_url),
        other => return Err(format!("unknown backend {other:?} (available: {BACKENDS})")),
    };
    let lock = distlock::connect(&url).await.map_err(|e| e.to_string())?;
    Ok(Arc::new(Driver {
        lock,
        opts: LockOptions::new(Duration::from_secs(10)),
        label: (backend == "redis-plain").then_some("distlock redis, plain keys (keys=plain)"),
    }))
}

/// The key prefix of the `redis-plain` backend: distlock and redis-py's algorithm on the same
/// keys.
const PLAIN_PREFIX: &str = "bench-plain:";

/// Another client than distlock on the same keys, to hold the lock in the `foreign-handoff`
/// scenario; only backends that share their layout with one have it.
pub(crate) async fn foreign_holder(
    backend: &str,
    ep: &Endpoints,
) -> Result<Option<Arc<dyn Subject>>, String> {
    Ok(match backend {
        "redis-plain" => Some(Arc::new(
            crate::redis_baselines::RawFloor::redis_py(&ep.redis_url, PLAIN_PREFIX).await?,
        )),
        _ => None,
    })
}
