//! The `file://` driver for distlock: locks for processes of one machine, with no server.
//!
//! Each name is a file `<dir>/<name>.lock` held with an exclusive OS advisory lock (`flock`
//! on Unix). The kernel releases it when the holder's process dies, however it dies, so a
//! crashed holder frees its locks at once and there is no TTL: `Capabilities::per_lock_ttl` is
//! false and the lease lives as long as the process holds it. The file stores the name's
//! fencing counter, incremented and flushed to disk before a grant returns, so tokens strictly
//! increase across processes and restarts (`Fencing::Strict` on this machine — unless someone
//! deletes the lock files, which starts the count again).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{DistributedLock, LockName, LockOptions};
//! let dir = std::env::temp_dir().join(format!("lock-file-doc-{}", std::process::id()));
//! let locks = lock_file::FileLock::open(&dir).await?;
//! let name = LockName::new("nightly-report")?;
//! let lease = locks.acquire(&name, &LockOptions::new(Duration::from_secs(30))).await?;
//! assert!(lease.fencing_token().is_some());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! **Waiting**: a waiter in the same process is woken by the release itself; a waiter in
//! another process polls the file with a jittered back-off from 5 ms up to 100 ms, as no
//! portable notification exists for the release of an advisory lock.
//!
//! **Deleting a held lock file** (an operator "breaking" the lock) is detected: the holder
//! checks that the path still names the file it locked, on every renewal and on release, and
//! reports `Lost` / `NotHeld`.

mod lock;

pub use lock::FileLock;
pub use lock_core;
