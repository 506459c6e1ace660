//! # lock-etcd: distlock on etcd
//!
//! [`EtcdLock`] implements [`lock_core::DistributedLock`] with a lease per lock kept alive by
//! the driver, a queue ordered by `create_revision`, and a watch on the predecessor only.
//!
//! ## Algorithm
//!
//! Each acquisition grants its own etcd lease (TTL rounded *up* to whole seconds, at least the
//! server's minimum, measured at connect) and puts its key with it, only if that key does not
//! exist. The key with the lowest `create_revision` under the name holds the lock; every other
//! contender watches the deletion of the key just before its own, so a release wakes exactly
//! one waiter and waiters are served in revision order (FIFO). A waiter keeps its own lease
//! alive while it waits. **Renew** is a keep-alive plus a read of the lock key in one round
//! trip (a key deleted behind the holder's back is `NotHeld`); **release** deletes the key only
//! if it is still this grant's (compare on `create_revision`). A released lease is kept as a
//! spare for the next acquisition with the same TTL, saving two consensus writes per lock.
//! [`EtcdLock::guarded_txn`] writes only while a lease still holds its lock. Details on
//! [`EtcdLock`].
//!
//! ## Keys
//!
//! `<prefix>/<name>/<lease-id-hex>`, prefix `/distlock` by default; the value is empty. The
//! prefix may be relative (`?prefix=jobs`) or empty (`?prefix=`: keys `<name>/<lease-id-hex>`),
//! which is the layout of `etcdctl lock <name>`, etcd's `Lock` RPC and Go's
//! `concurrency.Mutex`: they and distlock then queue in one line, in order of creation.
//!
//! ## Fencing: `Strict`
//!
//! The key's `create_revision`: strictly increasing across the whole cluster, across restarts
//! (etcd persists it) and across holders of every name. It is also the fencing token across
//! clients: an `etcdctl lock` holder's key has one too. (etcdctl's `ETCD_LOCK_REV` is the
//! revision at which it saw its grant, not its key's `create_revision`: not comparable.)
//!
//! ## Failure modes
//!
//! **A holder that cannot reach the cluster** turns AtRisk when a keep-alive goes unanswered
//! and Lost at `valid_until`, before the lease can expire on the server; etcd then deletes the
//! key and the next waiter is woken. **A waiter whose keep-alives go unanswered** keeps
//! waiting: its lease guards nothing yet, and a new leader extends every lease, so it comes
//! through an election longer than its TTL. It asks again (each try bounded by half the TTL)
//! until the server says whether the lease lives, and fails with `Lost` when it does not; with
//! the backend's error (`Unavailable`) when the cluster has not answered for a request timeout
//! past the lease's validity, or at its deadline. It is never granted on an unconfirmed or
//! expired lease. **A cancelled, timed-out or failed
//! acquire** (say, one whose reply was lost with its connection) revokes its lease, so no key
//! of it stays in the queue; a revoke that fails is sent again until it is answered or the
//! lease has expired by itself. **Requests** are bounded by the request
//! timeout and retried only when they were certainly not sent. **Leader elections** make
//! requests fail transiently (`Unavailable`); a waiting `acquire` re-checks its place.
//! **A stalled leader that resumes** can, on etcd older than the fix of etcd-io/etcd#15247
//! (3.4.23 here), revoke a lease the new leader has just renewed: the key is deleted early and
//! another client granted while the holder still believes, until its watch sees the deletion
//! (2.8 ms in the one case seen). Fencing tokens still order the two; see RELIABILITY.md,
//! "etcd: a lease revoked by a leader that had been frozen".
//!
//! ## URL
//!
//! `etcd://[user:password@]h1:p1,h2:p2[/prefix][?prefix=P&timeout_ms=N&connect_timeout_ms=N&tls=true&tls_ca_file=PATH]`
//! (`tls=true` needs this crate's `tls` feature). Unknown or repeated parameters are refused;
//! the password never shows.
//!
//! ## Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_etcd::{EtcdLock, lock_core::{DistributedLock, LockName, LockOptions}};
//! # async fn demo() -> lock_core::Result<()> {
//! let locks = EtcdLock::from_url("etcd://127.0.0.1:2379").await?;
//! let name = LockName::new("nightly-report")?;
//! let lease = locks.acquire(&name, &LockOptions::new(Duration::from_secs(10))).await?;
//! let token = lease.fencing_token(); // Some(create_revision)
//! lease.release().await?;
//! # let _ = token; Ok(()) }
//! ```

mod client;
mod config;
mod grant;
mod guarded;
mod lease;
mod lock;
mod queue;
mod revoke;
mod spares;
mod term;
mod waiting;

pub use config::EtcdConfig;
pub use etcd_client;
pub use lock::EtcdLock;
pub use lock_core;

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`EtcdLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: config::BACKEND,
    schemes: &["etcd"],
    connect: |url| lock_core::driver::connecting(async move { EtcdLock::from_url(&url).await }),
};
