//! For driver authors only: what a backend needs to implement the contract, and nothing an
//! application calls. A driver implements [`DistributedLock::acquire_until`] and returns
//! [`ManagedLease`]s made from its [`LeaseOps`]; the watchdog, the lease states and the
//! release/renew ordering are shared here.
//!
//! [`DistributedLock::acquire_until`]: crate::DistributedLock::acquire_until
//!
//! ```
//! use std::time::{Duration, Instant};
//! use lock_core::driver::{drift, Grant, LeaseTracker};
//! let ttl = Duration::from_secs(5);
//! let grant = Grant { token: None, ttl, valid_until: Instant::now() + ttl - drift(ttl) };
//! let tracker = LeaseTracker::new(grant.valid_until);
//! assert_eq!(tracker.state(), lock_core::LeaseState::Held);
//! ```

pub use crate::endpoint::{
    parse_bool_param, percent_decode, redacted_url, MultiHostUrl, Query, TlsCa,
};
pub use crate::managed::{drift, Grant, LeaseOps, ManagedLease};
pub use crate::registry::{connecting, ConnectFuture, Driver};
pub use crate::secret::{scrub, ClientError, Secret};
pub use crate::state::LeaseTracker;
pub use async_trait::async_trait;
