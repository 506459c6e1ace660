//! The shared conformance suite against the file driver, on a fresh temporary directory (or
//! `LOCK_FILE_DIR`). No server: the OS's advisory locks are the backend.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{async_trait, BoxError, Harness, Timing};
use lock_core::{DistributedLock, LockName};
use lock_file::FileLock;

struct Files {
    dir: PathBuf,
}

#[async_trait]
impl Harness for Files {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        Ok(Arc::new(FileLock::open(&self.dir).await?))
    }
    fn timing(&self) -> Timing {
        // No TTL on this backend; this paces the cases' waits.
        Timing::for_ttl(Duration::from_millis(1000))
    }
    /// Lock attempts of this process: every client here is its own `FileLock`, so a waiter
    /// that polls shows up as dozens of attempts, one woken by inotify as one per release.
    async fn backend_requests(&self) -> Option<u64> {
        Some(lock_file::attempts())
    }
    /// No server: the counters live in the lock files, and every client is a new `FileLock`
    /// reading them afresh — what a restarted process sees.
    fn can_restart_backend(&self) -> bool {
        true
    }
    async fn restart_backend(&self) -> Result<(), BoxError> {
        Ok(())
    }
    async fn key_exists(&self, key: &str) -> Option<Result<bool, BoxError>> {
        Some(std::path::Path::new(key).try_exists().map_err(Into::into))
    }
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        let path = self.dir.join(format!("{name}.lock"));
        Some(std::fs::remove_file(path).map_err(Into::into))
    }
}

fn main() -> ExitCode {
    let dir = std::env::var_os("LOCK_FILE_DIR").map_or_else(
        || std::env::temp_dir().join(format!("lock-file-conformance-{}", std::process::id())),
        PathBuf::from,
    );
    let trials = conformance_tests::trials(Arc::new(Files { dir: dir.clone() }));
    let code = conformance_tests::run_trials(trials);
    let _ = std::fs::remove_dir_all(&dir);
    code
}
