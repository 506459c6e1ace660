//! # lock-core: the distlock contract
//!
//! One distributed-lock contract, many backends. This crate holds what every driver shares:
//!
//! - the traits [`DistributedLock`] (a lock service) and [`Lease`] (a held lock), object safe so
//!   applications hold an `Arc<dyn DistributedLock>` and pick the backend from configuration;
//! - validated [`LockName`]s, [`LockOptions`] (TTL, [`Wait`], [`Renewal`], [`Mode`]: exclusive,
//!   shared or one of K permits), [`FencingToken`]s,
//!   [`Capabilities`] and one [`Error`] enum;
//! - the lease states a holder watches ([`LeaseState`], [`LostSignal`], and its
//!   `CancellationToken`), and scoped use that stops work when its lease is lost
//!   ([`LockExt::with_lock`], [`while_held`]);
//! - [`memory::MemoryLock`], the in-memory reference driver;
//! - [`driver`]: what only driver authors need — the one watchdog, packaged as
//!   [`ManagedLease`](driver::ManagedLease) around a driver's [`LeaseOps`](driver::LeaseOps),
//!   the lease state machine, multi-host URLs, TLS material.
//!
//! ```
//! use std::time::Duration;
//! use lock_core::{DistributedLock, LockName, LockOptions, memory::MemoryLock};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lock_core::Result<()> {
//! let locks = MemoryLock::new();
//! let name = LockName::new("invoices")?;
//! let opts = LockOptions::new(Duration::from_secs(10)).auto_renew(None);
//! let lease = locks.acquire(&name, &opts).await?;
//! let token = lease.fencing_token().expect("the memory driver fences");
//! // write to storage with `token`; the storage rejects lower tokens
//! # let _ = token;
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Guarantees and their limits
//!
//! A lease is valid until [`Lease::valid_until`], a conservative instant on the local monotonic
//! clock. A process that pauses (GC, swap, a stopped VM) past that instant may still believe it
//! holds the lock while another client holds it: no lock service can prevent that. Check
//! [`Lease::state`] before each protected step, watch [`Lease::lost`], and pass the
//! [`FencingToken`] to storage that rejects stale tokens where correctness matters.

mod acquisition;
mod authority;
mod backoff;
mod caps;
mod convention;
pub mod driver;
mod election;
mod endpoint;
mod error;
mod feed;
mod handles;
mod managed;
pub mod memory;
mod mode;
mod name;
mod name_rules;
mod observe;
mod ops;
mod options;
mod params;
mod registry;
mod scope;
mod secret;
mod state;
pub mod telemetry;
mod token;
mod traits;
mod value;
mod wakers;
mod watchdog;

// The guide's Rust examples are compiled and run as this crate's doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/lock-family.md")]
struct LockFamilyGuide;

#[cfg(doctest)]
#[doc = include_str!("../../docs/election.md")]
struct ElectionGuide;

pub use async_trait::async_trait;
pub use caps::{Capabilities, ExpiryClock, Fencing, MAX_TTL};
pub use election::{Election, Leadership};
pub use error::{BoxError, Error, Result};
pub use feed::{Change, ChangeFeed};
pub use mode::Mode;
pub use name::{LockName, MAX_NAME_LEN, NAME_PUNCTUATION};
pub use observe::{Observation, Observer};
pub use options::{Deadline, LockOptions, Renewal, Wait};
pub use scope::{while_held, LockExt, Scope};
pub use state::{LeaseState, LostSignal, StopOn};
pub use token::FencingToken;
pub use traits::{DistributedLock, HolderInfo, Lease};
pub use value::{Leader, LeaderValue, MAX_VALUE_LEN};
