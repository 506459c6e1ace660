//! `FileLock`: one advisory-locked file per name.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lock_core::driver::Acquisition;
use lock_core::{Capabilities, DistributedLock, ExpiryClock, Fencing, Lease, LockName, Result};
use tokio::sync::Notify;

use crate::config::BACKEND;
use crate::FileConfig;

/// Locks for the processes of one machine: `<dir>/<name>.lock`, held with an OS advisory lock.
///
/// Cheap to clone; clones share the in-process wake-ups. Two `FileLock`s (in one process or
/// in several) on the same directory exclude each other.
#[derive(Clone)]
pub struct FileLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: FileConfig,
    /// Wakes this process's waiters on a name when a lease of this process releases it.
    pub(crate) wakers: Mutex<HashMap<LockName, Arc<Notify>>>,
    /// `Strict`, or `BestEffort` on a directory that a reboot empties (a tmpfs).
    pub(crate) fencing: Fencing,
}

#[async_trait]
impl DistributedLock for FileLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_fencing(self.inner.fencing)
            .with_inspect(true)
            .with_per_lock_ttl(false)
            // The lock is the holder's open file: nothing restarts under a living holder, and
            // no clock ends it.
            .with_survives_restart(true)
            .with_expires_by(ExpiryClock::Elapsed)
    }

    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        self.contend(req).await
    }

    /// Held if the file's advisory lock cannot be taken; the token is the counter in the file.
    /// The lock lives as long as its process, so there is no remaining time to report.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        self.holder(name).await
    }
}

impl fmt::Debug for FileLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileLock")
            .field("dir", &self.inner.config.dir())
            .finish()
    }
}
