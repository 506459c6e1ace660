//! # lock-file: distlock for the processes of one machine
//!
//! [`FileLock`] implements [`lock_core::DistributedLock`] with one advisory-locked file per
//! name: no server.
//!
//! ## Algorithm
//!
//! Each name is a file held with an exclusive OS advisory lock (`flock` on Unix), taken off
//! the runtime's threads. The kernel releases it when the holder's process dies, however it
//! dies, so a crashed holder frees its locks at once and there is no TTL:
//! `Capabilities::per_lock_ttl` is false and the lease lives as long as the process holds it.
//! **Waiting**: a waiter in the same process is woken by the release itself. Across processes
//! (and across `FileLock`s of one process), no portable notification exists for the release
//! of an advisory lock, so the driver makes one: a holder keeps a writable handle on the file
//! and closes it on release — and the kernel closes it when the holder dies — while attempts
//! use read-only handles. On Linux a waiter watches the file with inotify for that close
//! (`IN_CLOSE_WRITE`) and retries when it comes, with a jittered retry every 0.5–1 s as the
//! safety net. Elsewhere, or when inotify is unavailable (its per-user instance limit, 128 by
//! default, is one per waiting `acquire`), waiters poll with a jittered back-off from 5 ms up
//! to 100 ms. [`attempts`] counts this process's lock attempts.
//!
//! ## Shared mode (Linux)
//!
//! [`Mode::Shared`](lock_core::Mode::Shared) is `flock(LOCK_SH)` on the same file, so
//! util-linux's `flock -s FILE` / `flock -x FILE` and distlock's shared and exclusive modes are
//! one lock (`tests/flock_interop.rs`). Readers each take a token: the counter's writes among
//! them are serialised by an open-file-description lock on a byte past the counter
//! (`F_OFD_SETLKW`, which no `flock` touches), so tokens stay strictly increasing and unique.
//! `holders` counts the readers from the kernel's lock table (`/proc/locks`); a reader's token
//! is its own to know (the file keeps only the newest), so it is not reported. `flock` keeps
//! no queue: a stream of readers can keep a writer waiting (`Capabilities::fifo` is false).
//!
//! ## Permits (Linux)
//!
//! [`Mode::Permits`](lock_core::Mode::Permits)`(k)`: a permit holder takes the same
//! `flock(LOCK_SH)` (so writers and `flock -x` exclude it, both ways), and open-file-description
//! byte-range locks on the same file, far past the counter and never touching `flock`, keep
//! it apart from readers and count the permits: each holder marks its count and write-locks
//! one of `k` slot bytes; a reader marks its own byte. Each marks its class before testing for
//! the other (`F_OFD_GETLK`), so a reader and a permit holder never both get in; another count
//! marked is [`Error::PermitsMismatch`](lock_core::Error::PermitsMismatch). Every mark is the
//! kernel's, dropped with the holder's file, also when it dies, so a crashed permit comes back
//! at once. Waiters are woken by the same `IN_CLOSE_WRITE`. A `flock -s` of another program
//! makes no mark: it is a reader that permit holders do not see.
//!
//! ## Keys
//!
//! `<dir>/<name>.lock`, one file per name ever used; it stays after release (it holds the
//! counter).
//!
//! ## Fencing: `Strict` on this machine (`BestEffort` on a tmpfs)
//!
//! The file stores the name's fencing counter, incremented and flushed to disk before a grant
//! returns, so tokens strictly increase across processes and restarts — unless someone deletes
//! the lock files, which starts the count again. A directory on a tmpfs (`$XDG_RUNTIME_DIR`,
//! often `/tmp`) is emptied at every boot, counters and all: there `Capabilities::fencing`
//! says `BestEffort`, as tokens increase only while the machine runs. **The counter survives
//! crashes**: it is written in place in one of two checksummed slots (never truncated),
//! alternately, and flushed before the grant; a new lock file is written completely under a temporary name,
//! hard-linked into place and the directory flushed. A crash at any point leaves the last
//! granted value readable.
//!
//! ## Failure modes
//!
//! A counter that is empty or not one of ours is an
//! [`Error::Backend`](lock_core::Error::Backend) for `acquire` and `inspect`, never a restart
//! at token 1; the file is left untouched for the operator. **Deleting a held lock file** (an
//! operator "breaking" the lock) is detected: the holder checks that the path still names the
//! file it locked, on every renewal and on release, and reports `Lost` / `NotHeld`. A network
//! file system may not honour `flock`: use a local directory. **Only a regular file is a lock
//! file**: a symbolic link at a lock's path (in a directory others can write to, it would
//! point the lock and the counter's writes at another file), a FIFO (whose open would block)
//! or a directory is an [`Error::Config`](lock_core::Error::Config), and nothing is opened
//! through it. **A directory shared by several users**: a lock file is created with its
//! creator's umask, and every later holder needs to write to it (the counter); with the usual
//! umask 022 another user's acquisition is refused (`Config`, permission denied). Share one
//! with umask 002 and a common group, or give each user its own directory.
//!
//! ## URL
//!
//! `file:///absolute/dir` ([`FileConfig::from_url`]): a local directory, no query.
//!
//! ## Example
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
//! # let _ = std::fs::remove_dir_all(&dir);
//! # Ok(()) }
//! ```

mod client;
mod config;
mod counter;
#[cfg(target_os = "linux")]
mod election;
#[cfg(target_os = "linux")]
mod family;
mod flock;
mod lease;
mod lock;
#[cfg(target_os = "linux")]
mod value;
mod wakeup;

pub use client::attempts;
pub use config::FileConfig;
pub use lock::FileLock;
pub use lock_core;

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`FileLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: config::BACKEND,
    schemes: &["file"],
    connect: |url| lock_core::driver::connecting(async move { FileLock::from_url(&url).await }),
};
