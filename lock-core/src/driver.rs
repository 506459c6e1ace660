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
pub use crate::authority::{host_port, split_userinfo, Userinfo};
pub use crate::backoff::{random_below, Backoff};
pub use crate::endpoint::{percent_decode, percent_encode, redacted_url, MultiHostUrl, TlsCa};
pub use crate::managed::{drift, lease_end, Grant, ManagedLease};
pub use crate::mode::{queue_turn, Admission, Turn};
pub use crate::ops::{release_with_retries, retry_in_background, LeaseOps};
pub use crate::params::{parse_bool_param, Param, Query, Value};
pub use crate::registry::{connecting, ConnectFuture, Driver};
pub use crate::secret::{scrub, ClientError, Secret};
pub use crate::state::LeaseTracker;
pub use crate::wakers::{Waker, Wakers};
pub use async_trait::async_trait;

/// Longest timeout a driver's configuration accepts (one day, as [`MAX_TTL`](crate::MAX_TTL)):
/// a timeout is added to clock readings and to other timeouts, and a `Duration::MAX` there
/// would overflow; no lock waits a day for one request.
pub const MAX_TIMEOUT: std::time::Duration = crate::MAX_TTL;

/// The one check of a configured timeout: a Config error, naming `what`, when `d` is zero
/// (every request would time out, as if the server were down) or above [`MAX_TIMEOUT`].
///
/// ```
/// use std::time::Duration;
/// use lock_core::driver::check_timeout;
///
/// assert!(check_timeout("request timeout", Duration::from_secs(5)).is_ok());
/// assert!(check_timeout("request timeout", Duration::ZERO).is_err());
/// assert!(check_timeout("request timeout", Duration::MAX).is_err());
/// ```
///
/// # Errors
/// [`Error::Config`](crate::Error::Config), as above.
pub fn check_timeout(what: &str, d: std::time::Duration) -> crate::Result<()> {
    if d.is_zero() {
        return Err(crate::Error::config(format!("the {what} is zero")));
    }
    if d > MAX_TIMEOUT {
        return Err(crate::Error::config(format!(
            "the {what} {d:?} is above the longest one accepted, {MAX_TIMEOUT:?}"
        )));
    }
    Ok(())
}

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

/// The TLS setters every TLS-capable driver's config has, with the same names and meaning:
/// `with_tls`, `with_tls_ca_pem`, `with_tls_ca_file`, `is_tls` and `tls_ca`. The config needs
/// the fields `tls: bool` and `tls_ca: Option<TlsCa>`.
///
/// ```
/// use lock_core::driver::TlsCa;
///
/// #[derive(Default)]
/// pub struct MyConfig {
///     tls: bool,
///     tls_ca: Option<TlsCa>,
/// }
/// impl MyConfig {
///     lock_core::driver::tls_setters!();
/// }
///
/// let c = MyConfig::default().with_tls_ca_file("/etc/ssl/my-ca.pem");
/// assert!(c.is_tls(), "a CA implies TLS");
/// assert_eq!(c.tls_ca(), Some(&TlsCa::File("/etc/ssl/my-ca.pem".into())));
/// ```
#[doc(inline)]
pub use crate::__tls_setters as tls_setters;

#[doc(hidden)]
#[macro_export]
macro_rules! __tls_setters {
    () => {
        /// Connects with TLS (needs the driver crate's `tls` feature). The server's
        /// certificate must chain to a public root unless a CA is set.
        pub fn with_tls(mut self, on: bool) -> Self {
            self.tls = on;
            self
        }
        /// Trusts the certificate authority in this PEM (instead of the public roots) to sign
        /// the server's certificate: a private CA, a managed service's own. Implies TLS.
        pub fn with_tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
            self.tls = true;
            self.tls_ca = Some($crate::driver::TlsCa::Pem(pem.into().into()));
            self
        }
        /// Like `with_tls_ca_pem`, read from this file when connecting (an unreadable file is
        /// an `Error::Config` then). Implies TLS.
        pub fn with_tls_ca_file(mut self, path: impl Into<::std::path::PathBuf>) -> Self {
            self.tls = true;
            self.tls_ca = Some($crate::driver::TlsCa::File(path.into()));
            self
        }
        /// Whether TLS is on.
        pub fn is_tls(&self) -> bool {
            self.tls
        }
        /// The certificate authority trusted instead of the public roots, if one is set.
        pub fn tls_ca(&self) -> Option<&$crate::driver::TlsCa> {
            self.tls_ca.as_ref()
        }
    };
}

/// The timeout setters and getters of a driver that talks to its server request by request:
/// `with_connect_timeout` / `connect_timeout()` and `with_request_timeout` /
/// `request_timeout()`. The config needs the fields `connect_timeout: Duration` and
/// `request_timeout: Duration`.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(Clone, Default)]
/// pub struct MyConfig {
///     connect_timeout: Duration,
///     request_timeout: Duration,
/// }
/// impl MyConfig {
///     lock_core::driver::timeout_setters!();
/// }
///
/// let c = MyConfig::default().with_request_timeout(Duration::from_secs(2));
/// assert_eq!(c.request_timeout(), Duration::from_secs(2));
/// assert_eq!(c.connect_timeout(), Duration::ZERO);
/// // For the driver's connect: a zero timeout, either one, is a Config error; so is one
/// // above a day (`MAX_TIMEOUT`).
/// assert!(matches!(c.check_timeouts(), Err(lock_core::Error::Config { .. })));
/// let c = c.with_connect_timeout(Duration::from_secs(1));
/// assert!(c.check_timeouts().is_ok());
/// assert!(c.clone().with_request_timeout(Duration::ZERO).check_timeouts().is_err());
/// assert!(c.with_request_timeout(Duration::MAX).check_timeouts().is_err());
/// ```
#[doc(inline)]
pub use crate::__timeout_setters as timeout_setters;

#[doc(hidden)]
#[macro_export]
macro_rules! __timeout_setters {
    () => {
        /// Deadline of each connection attempt. Zero, or above a day
        /// ([`MAX_TIMEOUT`]($crate::driver::MAX_TIMEOUT)), is refused at connect.
        pub fn with_connect_timeout(mut self, d: ::std::time::Duration) -> Self {
            self.connect_timeout = d;
            self
        }
        /// Deadline of each request. It does not bound the lock's own waiting (`LockOptions`
        /// does); an acquire whose request times out has an unknown outcome, which the driver
        /// cleans up. Zero, or above a day, is refused at connect.
        pub fn with_request_timeout(mut self, d: ::std::time::Duration) -> Self {
            self.request_timeout = d;
            self
        }
        /// Deadline of each connection attempt.
        pub fn connect_timeout(&self) -> ::std::time::Duration {
            self.connect_timeout
        }
        /// Deadline of each request.
        pub fn request_timeout(&self) -> ::std::time::Duration {
            self.request_timeout
        }
        /// A zero timeout would fail every request as if the server were down, and one above
        /// [`MAX_TIMEOUT`]($crate::driver::MAX_TIMEOUT) would overflow the clock arithmetic:
        /// refused (a Config error) when the driver connects, or parses a URL, instead.
        #[allow(dead_code)] // each driver calls it where it connects
        pub(crate) fn check_timeouts(&self) -> $crate::Result<()> {
            $crate::driver::check_timeout("connect timeout", self.connect_timeout)?;
            $crate::driver::check_timeout("request timeout", self.request_timeout)
        }
    };
}

/// The credential setter and getter of a driver whose server takes a user and a password:
/// `with_credentials(user, password)` and `user()`. The config needs the fields
/// `user: Option<String>` and `password: Option<Secret>` (a [`Secret`], so that no way of
/// printing the config shows it).
///
/// ```
/// use lock_core::driver::Secret;
///
/// #[derive(Default)]
/// pub struct MyConfig {
///     user: Option<String>,
///     password: Option<Secret>,
/// }
/// impl MyConfig {
///     lock_core::driver::credential_setters!();
/// }
///
/// let c = MyConfig::default().with_credentials("locker", "pw");
/// assert_eq!(c.user(), Some("locker"));
/// assert_eq!(c.password.as_ref().map(Secret::expose), Some("pw"));
/// ```
#[doc(inline)]
pub use crate::__credential_setters as credential_setters;

#[doc(hidden)]
#[macro_export]
macro_rules! __credential_setters {
    () => {
        /// Authenticates as `user` with `password` (kept as a `Secret`: never printed).
        pub fn with_credentials(
            mut self,
            user: impl Into<String>,
            password: impl Into<String>,
        ) -> Self {
            self.user = Some(user.into());
            self.password = Some($crate::driver::Secret::new(password));
            self
        }
        /// The user, if any.
        pub fn user(&self) -> Option<&str> {
            self.user.as_deref()
        }
    };
}
