//! The etcd driver for distlock: a lease per lock kept alive by the driver, a queue ordered by
//! `create_revision`, a watch on the predecessor only, and `create_revision` as the fencing
//! token.
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
mod guarded;
mod lease;
mod lock;
mod queue;
mod spares;
mod waiting;

pub use config::EtcdConfig;
pub use etcd_client;
pub use lock::EtcdLock;
pub use lock_core;

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`EtcdLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: "etcd",
    schemes: &["etcd"],
    connect: |url| lock_core::driver::connecting(async move { EtcdLock::from_url(&url).await }),
};
