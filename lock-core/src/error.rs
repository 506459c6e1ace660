//! The one error type every driver returns.

use std::time::Duration;

use crate::LockName;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock, split by what the caller must do about it.
///
/// Match on the variant, not on the message: messages are for humans and may change.
/// Use [`Error::is_retryable`] to decide whether trying the same call again later can succeed.
///
/// ```
/// use lock_core::{Error, LockName};
/// let err = LockName::new("").unwrap_err();
/// assert!(matches!(err, Error::InvalidName { .. }));
/// assert!(!err.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name was rejected before anything was sent to a backend.
    #[error("invalid lock name {name}: {reason}")]
    InvalidName {
        /// The offending name, escaped and shortened for display.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The [`LockOptions`](crate::LockOptions) were rejected (zero or absurd TTL, TTL below the
    /// backend's minimum, zero `max_hold`, ...).
    #[error("invalid lock options: {0}")]
    InvalidOptions(String),
    /// `acquire` waited as long as [`Wait`](crate::Wait) allowed and did not get the lock: it
    /// is busy (with [`Wait::No`](crate::Wait::No) that is all it says).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use lock_core::{Error, LockName};
    /// let e = Error::Timeout { name: LockName::new("jobs")?, waited: Duration::from_millis(3) };
    /// assert_eq!(e.to_string(), "lock jobs is busy: not acquired within 3ms");
    /// # Ok::<(), Error>(())
    /// ```
    #[error("lock {name} is busy: not acquired within {waited:?}")]
    Timeout {
        /// The lock that was waited for.
        name: LockName,
        /// How long the call waited.
        waited: Duration,
    },
    /// Renew or release of a lease the backend no longer holds for this owner: it expired, or a
    /// successor holds the lock now. The successor was not touched.
    #[error("lock {name} is not held by this lease (it expired or another owner holds it)")]
    NotHeld {
        /// The lock whose lease is gone.
        name: LockName,
    },
    /// The lease is known to be lost (its session or lease expired, or its validity passed
    /// without a confirmed renewal). Lost is final: acquire again.
    #[error("lease on lock {name} was lost: {reason}")]
    Lost {
        /// The lock whose lease was lost.
        name: LockName,
        /// What the driver observed.
        reason: String,
    },
    /// The backend could not be reached or did not answer in time. Transient: retry later.
    /// After an ambiguous failure during acquire the driver has already tried to clean up.
    ///
    /// Its `cause` is said in its message and is not its
    /// [`source`](std::error::Error::source), so a reporter that prints the chain of sources
    /// (anyhow's `{:#}`) says it once; match the variant to reach it.
    #[error("{backend} backend unavailable: {cause}")]
    Unavailable {
        /// Which backend (`"redis"`, `"etcd"`, ...).
        backend: &'static str,
        /// The client library's error, whole (for `downcast_ref`). Never contains credentials.
        cause: BoxError,
    },
    /// A quorum-based backend did not collect enough grants or confirmations.
    #[error("quorum not reached: {granted} granted, {needed} needed")]
    QuorumNotReached {
        /// Nodes that granted.
        granted: usize,
        /// Nodes needed for a majority.
        needed: usize,
    },
    /// The backend cannot do this at all (for example a fencing token where none is safe).
    #[error("{backend} backend does not support {operation}")]
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// What was asked for.
        operation: &'static str,
    },
    /// A semaphore's holders or waiters use `name` with `held` permits, and this request asked
    /// with `asked`: one name has one limit. Not transient while they hold or wait.
    #[error("lock {name} is used with {held} permits, asked with {asked}")]
    PermitsMismatch {
        /// The semaphore.
        name: LockName,
        /// The number of permits its current holders or waiters use.
        held: u32,
        /// The number this request asked with.
        asked: u32,
    },
    /// A configuration or URL problem. Never contains secrets.
    #[error("configuration error: {message}")]
    Config {
        /// What is wrong, for a human.
        message: String,
        /// The underlying error (a file that could not be read, a certificate that did not
        /// parse), when there is one. Never contains secrets.
        #[source]
        source: Option<BoxError>,
    },
    /// The backend rejected the credentials, or the user lacks a permission the driver needs.
    /// Not transient: fix the password, user or role.
    #[error("{backend} refused access: {message}")]
    Unauthenticated {
        /// Which backend.
        backend: &'static str,
        /// What was refused, for a human. Never contains the password.
        message: String,
    },
    /// The backend answered with something the driver did not expect (a protocol or script
    /// error). Not transient: retrying the same call will most likely fail the same way.
    ///
    /// Its `cause` is said in its message, not repeated as its `source()` (as for
    /// [`Error::Unavailable`]).
    #[error("{backend} backend error: {cause}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// What it said, whole.
        cause: BoxError,
    },
}

impl Error {
    /// True when the same call may succeed later without changing anything: the backend was
    /// unavailable, a quorum was not reached, or the lock was busy for the whole wait.
    ///
    /// ```
    /// use lock_core::Error;
    /// let e = Error::QuorumNotReached { granted: 2, needed: 3 };
    /// assert!(e.is_retryable());
    /// assert!(!Error::config("bad url").is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::QuorumNotReached { .. } | Error::Timeout { .. }
        )
    }

    /// The variant's name in snake case, a bounded set: the `error.type` of spans and metrics
    /// (`docs/observability.md`). Never says more than the kind (no names, no servers).
    ///
    /// ```
    /// use lock_core::Error;
    /// assert_eq!(Error::QuorumNotReached { granted: 1, needed: 2 }.kind(), "quorum_not_reached");
    /// assert_eq!(Error::config("bad url").kind(), "config");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidName { .. } => "invalid_name",
            Error::InvalidOptions(_) => "invalid_options",
            Error::Timeout { .. } => "timeout",
            Error::NotHeld { .. } => "not_held",
            Error::Lost { .. } => "lost",
            Error::Unavailable { .. } => "unavailable",
            Error::QuorumNotReached { .. } => "quorum_not_reached",
            Error::Unsupported { .. } => "unsupported",
            Error::PermitsMismatch { .. } => "permits_mismatch",
            Error::Config { .. } => "config",
            Error::Unauthenticated { .. } => "unauthenticated",
            Error::Backend { .. } => "backend",
        }
    }

    /// [`Error::NotHeld`] for `name`: the lease's owner check failed.
    ///
    /// ```
    /// use lock_core::{Error, LockName};
    /// let name: LockName = "jobs.nightly".parse()?;
    /// assert!(matches!(Error::not_held(&name), Error::NotHeld { name: n } if n == name));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn not_held(name: &LockName) -> Self {
        Error::NotHeld { name: name.clone() }
    }

    /// A [`Error::Config`] without an underlying error.
    ///
    /// ```
    /// let e = lock_core::Error::config("a redis URL starts with redis://");
    /// assert_eq!(e.to_string(), "configuration error: a redis URL starts with redis://");
    /// ```
    pub fn config(message: impl Into<String>) -> Self {
        Error::Config {
            message: message.into(),
            source: None,
        }
    }

    /// A [`Error::Config`] caused by `source`, which callers can reach through
    /// [`std::error::Error::source`].
    ///
    /// ```
    /// use std::error::Error as _;
    /// let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
    /// let e = lock_core::Error::config_with("TLS CA file /etc/ca.pem", io);
    /// let cause = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
    /// assert_eq!(cause.map(|c| c.kind()), Some(std::io::ErrorKind::NotFound));
    /// ```
    pub fn config_with(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Config {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Shorthand for [`Error::Unauthenticated`].
    ///
    /// ```
    /// let e = lock_core::Error::unauthenticated("etcd", "user app: invalid password");
    /// assert!(!e.is_retryable());
    /// ```
    pub fn unauthenticated(backend: &'static str, message: impl Into<String>) -> Self {
        Error::Unauthenticated {
            backend,
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::Unavailable`].
    ///
    /// ```
    /// use std::error::Error as _;
    /// let e = lock_core::Error::unavailable("redis", std::io::Error::other("connection refused"));
    /// assert_eq!(e.to_string(), "redis backend unavailable: connection refused");
    /// // Said once: a reporter walking the sources adds nothing (anyhow's `{:#}` printed it twice).
    /// assert!(e.source().is_none());
    /// if let lock_core::Error::Unavailable { cause, .. } = &e {
    ///     assert!(cause.downcast_ref::<std::io::Error>().is_some()); // still whole
    /// }
    /// ```
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            backend,
            cause: source.into(),
        }
    }

    /// Shorthand for [`Error::Backend`].
    ///
    /// ```
    /// let e = lock_core::Error::backend("etcd", "unexpected reply");
    /// assert!(!e.is_retryable());
    /// ```
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            cause: source.into(),
        }
    }
}
