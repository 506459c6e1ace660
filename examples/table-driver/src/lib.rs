//! An example distlock driver, written the way an out-of-tree driver would be: it depends only
//! on `lock-core`, implements `DistributedLock`, lets `ManagedLease` build the `Lease` from two
//! backend operations (`LeaseOps::renew` / `release`), and proves itself with the shared
//! conformance suite (`tests/conformance.rs`). Guide: `docs/writing-a-driver.md`.
//!
//! Its "server" is a table shared by the clients of one [`Table`]: each entry holds the owner's
//! random token, the expiry, and a fencing counter per name. Replace the table's three
//! operations (`client.rs`) with requests to your backend and the rest stays as it is.
//!
//! The files are those of every built-in driver: `config.rs` (the URL and the backend's
//! name), `client.rs` (the requests to the server), `lock.rs` (`DistributedLock`), `lease.rs`
//! (`LeaseOps`), and this one (docs and [`DRIVER`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{DistributedLock, LockName, LockOptions};
//! let table = table_driver::Table::default();
//! let (a, b) = (table.client(), table.client());
//! let name = LockName::new("demo")?;
//! let lease = a.acquire(&name, &LockOptions::new(Duration::from_secs(5))).await?;
//! assert!(b.try_acquire(&name, &LockOptions::new(Duration::from_secs(5))).await?.is_none());
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod client;
mod config;
mod lease;
mod lock;

use lock_core::driver::{connecting, Driver};

pub use client::Table;
pub use config::TableConfig;
pub use lock::TableLock;

/// This driver for `distlock::connect`: the schemes it serves and how it connects from a URL.
/// An application registers it once with `distlock::register_driver(table_driver::DRIVER)`.
pub const DRIVER: Driver = Driver {
    backend: config::BACKEND,
    schemes: &["table"],
    connect: |url| connecting(async move { TableLock::from_url(&url) }),
};
