//! What gets measured: a driver behind `Arc<dyn DistributedLock>`, or a baseline.
//!
//! A baseline is the floor the driver is compared with in the same run: for the memory driver,
//! a plain `tokio::sync::Mutex` per name. Driver issues add their backends and baselines here
//! (the raw client doing the same round trips, or another crate's lock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{DistributedLock, Lease, LockName, LockOptions};

/// Something that can lock and unlock a name.
#[async_trait]
pub(crate) trait Subject: Send + Sync {
    /// Row label.
    fn label(&self) -> String;
    /// Whether `lock` waits for a held lock (the handoff scenario needs it).
    fn waits(&self) -> bool {
        true
    }
    /// Waits for the lock on `name`.
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String>;
    /// One uncontended acquire + release.
    async fn cycle(&self, name: &str) -> Result<(), String> {
        self.lock(name).await?.unlock().await
    }
}

/// A held lock of a [`Subject`].
#[async_trait]
pub(crate) trait Guard: Send {
    async fn unlock(self: Box<Self>) -> Result<(), String>;
}

/// A distlock driver, used only through the public contract.
pub(crate) struct Driver {
    lock: Arc<dyn DistributedLock>,
    opts: LockOptions,
}

#[async_trait]
impl Subject for Driver {
    fn label(&self) -> String {
        match self.lock.backend() {
            "redis" => "distlock redis (1 node)".into(),
            "redlock" => "distlock redlock (5 masters)".into(),
            "zookeeper" => "distlock zookeeper".into(),
            other => format!("distlock {other}"),
        }
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let name = LockName::new(name).map_err(|e| e.to_string())?;
        let lease = self
            .lock
            .acquire(&name, &self.opts)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Box::new(lease))
    }
}

#[async_trait]
impl Guard for Box<dyn Lease> {
    async fn unlock(self: Box<Self>) -> Result<(), String> {
        (*self).release().await.map_err(|e| e.to_string())
    }
}

/// Floor for in-process locking: one `tokio::sync::Mutex` per name, FIFO like the memory
/// driver, no TTL, no tokens.
#[derive(Default)]
pub(crate) struct TokioMutex {
    names: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

struct TokioGuard(#[allow(dead_code)] tokio::sync::OwnedMutexGuard<()>);

#[async_trait]
impl Guard for TokioGuard {
    async fn unlock(self: Box<Self>) -> Result<(), String> {
        Ok(())
    }
}

#[async_trait]
impl Subject for TokioMutex {
    fn label(&self) -> String {
        "baseline: tokio Mutex per name".into()
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let m = {
            let mut names = self.names.lock().map_err(|e| e.to_string())?;
            names.entry(name.to_string()).or_default().clone()
        };
        Ok(Box::new(TokioGuard(m.lock_owned().await)))
    }
}

/// Settings the backends need.
#[derive(Clone)]
pub(crate) struct Endpoints {
    pub(crate) redis_url: String,
    pub(crate) redlock_url: String,
    pub(crate) zk_hosts: String,
    pub(crate) zk_ensemble_hosts: String,
    pub(crate) etcd_endpoints: String,
    pub(crate) etcd_cluster_endpoints: String,
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

/// Baselines measured beside `backend`, in the order they are listed.
pub(crate) async fn baselines_for(
    backend: &str,
    ep: &Endpoints,
) -> Result<Vec<Arc<dyn Subject>>, String> {
    match backend {
        "memory" => Ok(vec![Arc::new(TokioMutex::default())]),
        "redis" => Ok(vec![
            Arc::new(crate::redis_baselines::RawFloor::connect(&ep.redis_url).await?),
            Arc::new(crate::redis_baselines::Rslock::new(vec![ep
                .redis_url
                .clone()])),
        ]),
        "redlock" => {
            let masters = redlock_masters(&ep.redlock_url);
            let first = masters.first().cloned().unwrap_or_default();
            let single = distlock::connect(&first)
                .await
                .map_err(|e| e.to_string())?;
            Ok(vec![
                Arc::new(Driver {
                    lock: single,
                    opts: LockOptions::new(Duration::from_secs(10)),
                }),
                Arc::new(crate::redis_baselines::Rslock::new(masters)),
            ])
        }
        b if ep.zk(b).is_some() => {
            let (hosts, label) = ep.zk(b).unwrap_or_default();
            Ok(vec![Arc::new(crate::zk_baselines::ZkRecipe::connect(hosts, label).await?)])
        }
        b if ep.etcd(b).is_some() => {
            let (eps, label) = ep.etcd(b).unwrap_or_default();
            Ok(vec![
                Arc::new(crate::etcd_baselines::TxnFloor::connect(&eps, label).await?),
                Arc::new(crate::etcd_baselines::LockRpc::connect(&eps, label).await?),
            ])
        }
        other => Err(format!(
            "unknown backend {other:?} (available: memory, redis, redlock, zookeeper, zookeeper-ensemble, etcd, etcd-cluster)"
        )),
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
        "redlock" => ep.redlock_url.clone(),
        b if ep.zk(b).is_some() => format!("zk://{}", ep.zk(b).unwrap_or_default().0),
        b if ep.etcd(b).is_some() => {
            format!("etcd://{}", ep.etcd(b).unwrap_or_default().0.join(","))
        }
        other => {
            return Err(format!(
                "unknown backend {other:?} (available: memory, redis, redlock, zookeeper, zookeeper-ensemble, etcd, etcd-cluster)"
            ))
        }
    };
    let lock = distlock::connect(&url).await.map_err(|e| e.to_string())?;
    Ok(Arc::new(Driver {
        lock,
        opts: LockOptions::new(Duration::from_secs(10)),
    }))
}
