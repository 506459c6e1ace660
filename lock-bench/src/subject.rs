//! What gets measured: a driver behind `Arc<dyn DistributedLock>`, or a baseline.
//!
//! A baseline is the floor the driver is compared with in the same run: for the memory driver,
//! a plain `tokio::sync::Mutex` per name. Driver issues add their backends and baselines here
//! (the raw client doing the same round trips, or another crate's lock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::memory::MemoryLock;
use lock_core::{DistributedLock, Lease, LockName, LockOptions};

/// Something that can lock and unlock a name.
#[async_trait]
pub(crate) trait Subject: Send + Sync {
    /// Row label.
    fn label(&self) -> String;
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
        format!("distlock {}", self.lock.backend())
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

/// Baselines measured beside `backend`, first one is the ratio's denominator.
pub(crate) fn baselines_for(backend: &str) -> Result<Vec<Arc<dyn Subject>>, String> {
    match backend {
        "memory" => Ok(vec![Arc::new(TokioMutex::default())]),
        other => Err(format!("unknown backend {other:?} (available: memory)")),
    }
}

/// The driver for `backend`.
pub(crate) async fn driver_subject(backend: &str) -> Result<Arc<dyn Subject>, String> {
    let lock: Arc<dyn DistributedLock> = match backend {
        "memory" => Arc::new(MemoryLock::new()),
        other => return Err(format!("unknown backend {other:?} (available: memory)")),
    };
    Ok(Arc::new(Driver {
        lock,
        opts: LockOptions::new(Duration::from_secs(10)),
    }))
}
