//! What gets measured: a [`Subject`] locks and unlocks a name — a distlock driver behind
//! `Arc<dyn DistributedLock>` ([`Driver`]), or a baseline (`*_baselines.rs`). Which subjects a
//! backend has is in `catalog.rs`.

use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{DistributedLock, Lease, LockName, LockOptions, Mode};

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
    pub(crate) lock: Arc<dyn DistributedLock>,
    pub(crate) opts: LockOptions,
    /// Row label, where the backend's name does not say enough.
    pub(crate) label: Option<&'static str>,
}

impl Driver {
    /// The row label of a driver of `backend` taking its locks in `mode`.
    fn backend_label(backend: &str, mode: Mode) -> String {
        let base = match backend {
            "redis" => "distlock redis (1 node)".into(),
            "redlock" => "distlock redlock (5 masters)".into(),
            "zookeeper" => "distlock zookeeper".into(),
            other => format!("distlock {other}"),
        };
        match mode {
            Mode::Exclusive => base,
            m => format!("{base}, {m}"),
        }
    }
}

#[async_trait]
impl Subject for Driver {
    fn label(&self) -> String {
        if let Some(l) = self.label {
            return l.into();
        }
        Self::backend_label(self.lock.backend(), self.opts.mode)
    }
    /// A reader never waits for another reader: the hand-off scenarios are for the modes that
    /// wait for each other.
    fn waits(&self) -> bool {
        self.opts.mode != Mode::Shared
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
