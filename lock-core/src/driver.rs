//! For driver authors only: what a backend needs to implement the contract, and nothing an
//! application calls. A driver implements [`DistributedLock::acquire_until`] for an
//! [`Acquisition`] (whose TTL is validated already) and returns
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

pub use crate::acquisition::Acquisition;
pub use crate::endpoint::{
    parse_bool_param, percent_decode, redacted_url, MultiHostUrl, Query, TlsCa,
};
pub use crate::managed::{drift, Grant, LeaseOps, ManagedLease};
pub use crate::registry::{connecting, ConnectFuture, Driver};
pub use crate::secret::{scrub, ClientError, Secret};
pub use crate::state::LeaseTracker;
pub use async_trait::async_trait;

/// `Display` and `Debug` for a driver's config, both built on its `redacted_url()` method, so
/// that no way of printing a config shows its password: `Display` is the redacted URL, `Debug`
/// the redacted URL and then the named fields (which must not hold secrets).
///
/// ```
/// use std::time::Duration;
///
/// pub struct MyConfig {
///     host: String,
///     password: Option<lock_core::driver::Secret>,
///     request_timeout: Duration,
/// }
/// impl MyConfig {
///     pub fn redacted_url(&self) -> String {
///         let auth = if self.password.is_some() { ":***@" } else { "" };
///         format!("my://{auth}{}", self.host)
///     }
/// }
/// lock_core::driver::redacted_config!(MyConfig { request_timeout });
///
/// let c = MyConfig {
///     host: "h:1".into(),
///     password: Some(lock_core::driver::Secret::new("pw")),
///     request_timeout: Duration::from_secs(1),
/// };
/// assert_eq!(c.to_string(), "my://:***@h:1");
/// assert_eq!(
///     format!("{c:?}"),
///     r#"MyConfig { url: "my://:***@h:1", request_timeout: 1s }"#
/// );
/// ```
#[doc(inline)]
pub use crate::__redacted_config as redacted_config;

#[doc(hidden)]
#[macro_export]
macro_rules! __redacted_config {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.redacted_url())
            }
        }
        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("url", &self.redacted_url())
                    $(.field(stringify!($field), &self.$field))*
                    .finish()
            }
        }
    };
}
