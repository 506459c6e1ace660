//! `FileLock`: one advisory-locked file per name.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::driver::Acquisition;
use lock_core::{
    Capabilities, DistributedLock, Error, ExpiryClock, Fencing, Lease, LockName, Result,
};

use crate::client::{blocking, forgets_at_boot, holders};
use crate::config::BACKEND;
use crate::flock::contend;
use crate::wakeup::Wakers;
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
    pub(crate) wakers: Arc<Wakers>,
    /// `Strict`, or `BestEffort` on a directory that a reboot empties (a tmpfs).
    pub(crate) fencing: Fencing,
}

impl FileLock {
    /// Uses `config.dir()` (created if missing) for the lock files. A relative directory is
    /// made absolute here, once, against the current directory, so that a later `chdir` of
    /// the process does not move its locks; an empty one is a Config error (an unset variable,
    /// most likely, which would otherwise lock in whatever the current directory is).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
    /// let rel = std::path::Path::new("../target/lock-file-relative-doc");
    /// let locks = lock_file::FileLock::open(rel).await?;
    /// assert!(locks.dir().is_absolute());
    /// assert_eq!(locks.dir(), std::env::current_dir().unwrap().join(rel));
    /// let empty = lock_file::FileLock::open("").await;
    /// assert!(matches!(empty, Err(lock_core::Error::Config { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: FileConfig) -> Result<Self> {
        if config.dir().as_os_str().is_empty() {
            return Err(Error::config("the lock directory is empty"));
        }
        let d = config.dir().to_path_buf();
        let dir = blocking(move || {
            let dir = std::path::absolute(&d)?;
            std::fs::create_dir_all(&dir).map(|()| dir)
        })
        .await?
        .map_err(|e| {
            Error::config_with(
                format!(
                    "cannot use {} as the lock directory: {e}",
                    config.dir().display()
                ),
                e,
            )
        })?;
        let fencing = if forgets_at_boot(&dir) {
            Fencing::BestEffort
        } else {
            Fencing::Strict
        };
        let config = FileConfig::new(dir);
        Ok(FileLock {
            inner: Arc::new(Inner {
                config,
                wakers: Arc::default(),
                fencing,
            }),
        })
    }

    /// [`connect`](Self::connect) with lock files in `dir`.
    pub async fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        Self::connect(FileConfig::new(dir)).await
    }

    /// [`connect`](Self::connect) from a `file:///absolute/dir` URL ([`FileConfig::from_url`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
    /// let dir = std::env::temp_dir().join("lock-file-url-doc");
    /// let locks = lock_file::FileLock::from_url(&format!("file://{}", dir.display())).await?;
    /// assert_eq!(locks.dir(), dir);
    /// assert!(lock_file::FileLock::from_url("file://elsewhere/x").await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(FileConfig::from_url(url)?).await
    }

    /// The configuration this lock was made from.
    pub fn config(&self) -> &FileConfig {
        &self.inner.config
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        self.inner.config.dir()
    }

    /// How many names this `FileLock` (and its clones) keeps a wake-up entry for: one per
    /// name with a waiter or a held lease, none for names merely used before. A diagnostic.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
    /// let locks = lock_file::FileLock::open(std::env::temp_dir().join("lock-file-tracked")).await?;
    /// assert_eq!(locks.tracked_names(), 0);
    /// # Ok(()) }
    /// ```
    pub fn tracked_names(&self) -> usize {
        self.inner.wakers.len()
    }

    /// The file that holds `name`'s lock and fencing counter.
    pub fn path_of(&self, name: &LockName) -> PathBuf {
        self.inner.config.dir().join(format!("{name}.lock"))
    }
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
            // `flock(LOCK_SH)`; the counter's writes among readers are serialised by a lock
            // that only Linux has per open file (see `counter::bump_shared`).
            .with_shared(cfg!(target_os = "linux"))
            // Byte-range locks beside the `flock` (see `family`), which only Linux keeps per
            // open file.
            .with_permits(cfg!(target_os = "linux"))
            // A value in the lock file, and inotify to hear it change (`election`).
            .with_election(cfg!(target_os = "linux"))
    }

    /// The exclusive holder, with the value written for its token (`election.rs`).
    #[cfg(target_os = "linux")]
    async fn leader(&self, name: &LockName) -> Result<Option<lock_core::Leader>> {
        crate::election::leader(self.path_of(name)).await
    }

    #[cfg(target_os = "linux")]
    async fn watch(&self, name: &LockName) -> Result<Box<dyn lock_core::ChangeFeed>> {
        crate::election::watch(self.path_of(name)).await
    }

    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        let path = self.path_of(req.name());
        contend(&self.inner.wakers, path, req).await
    }

    /// Held if the file's advisory lock is taken; an exclusive holder's token is the counter
    /// in the file; a shared holder's is its own (not reported). The lock lives as long as its
    /// process, so there is no remaining time to report.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        Ok(holders(self.path_of(name)).await?.pop())
    }

    /// The exclusive holder, or every shared holder (counted by the kernel, without tokens).
    async fn holders(&self, name: &LockName) -> Result<Vec<lock_core::HolderInfo>> {
        holders(self.path_of(name)).await
    }
}

impl fmt::Debug for FileLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileLock")
            .field("dir", &self.inner.config.dir())
            .finish()
    }
}
