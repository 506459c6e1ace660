//! The names of the telemetry convention (docs/observability.md) and the one switch of its
//! labels; `telemetry.rs` reports under them and re-exports them.

use std::sync::atomic::{AtomicBool, Ordering};

/// Metric names (units in the names' documentation; durations in seconds).
pub mod metric {
    /// Counter: acquisitions finished, by `lock.backend`, `lock.mode`, `lock.attempt`,
    /// `lock.outcome` (and `error.type` when the outcome is `error`).
    pub const ACQUISITIONS: &str = "lock.acquisitions";
    /// Histogram, seconds: how long an acquisition took, from the call to its outcome; with
    /// `lock.attempt = wait`, the time spent waiting for the lock. Same labels as
    /// [`ACQUISITIONS`].
    pub const ACQUIRE_DURATION: &str = "lock.acquire.duration";
    /// Gauge: acquisitions waiting now (`acquire` calls under way), by `lock.backend`.
    pub const WAITING: &str = "lock.waiting";
    /// Gauge: leases held now (granted, not yet released, abandoned, dropped or lost), by
    /// `lock.backend`.
    pub const HELD: &str = "lock.held";
    /// Histogram, seconds: from grant to the lease's end, by `lock.backend` and `lock.end`.
    pub const HOLD_DURATION: &str = "lock.hold.duration";
    /// Counter: renewal requests answered, by `lock.backend`, `lock.renewal` (auto or manual)
    /// and `lock.outcome` (`renewed`, `failed`: a failure that may pass, `refused`).
    pub const RENEWALS: &str = "lock.renewals";
    /// Counter: leases lost, by `lock.backend` and `lock.loss.reason`.
    pub const LOST: &str = "lock.lost";
    /// Counter: hand-offs — grants to an acquisition that found the lock held and waited for
    /// it (its holder released it, or its lease ended), by `lock.backend` and `lock.mode`.
    pub const HANDOFFS: &str = "lock.handoffs";
}

/// Label names, which are also the span fields' names.
pub mod label {
    /// The lock's name: a span field always, a metric label only with
    /// [`label_lock_names`](super::label_lock_names).
    pub const NAME: &str = "lock.name";
    /// The backend ([`DistributedLock::backend`](crate::DistributedLock::backend)).
    pub const BACKEND: &str = "lock.backend";
    /// `exclusive`, `shared` or `permits` ([`Mode::kind`](crate::Mode::kind)).
    pub const MODE: &str = "lock.mode";
    /// `try` (`try_acquire`) or `wait` (`acquire`).
    pub const ATTEMPT: &str = "lock.attempt";
    /// What an operation came to; its values are listed per metric and span.
    pub const OUTCOME: &str = "lock.outcome";
    /// The error's kind ([`Error::kind`](crate::Error::kind)) when the outcome is `error`.
    pub const ERROR: &str = "error.type";
    /// `auto` (the watchdog) or `manual` ([`Lease::renew`](crate::Lease::renew)).
    pub const RENEWAL: &str = "lock.renewal";
    /// Why a lease was lost ([`LossReason::as_str`](crate::telemetry::LossReason::as_str)).
    pub const LOSS_REASON: &str = "lock.loss.reason";
    /// How a lease ended: `released`, `abandoned`, `dropped` or `lost`.
    pub const END: &str = "lock.end";
}

/// Span names. Each span's fields are listed in the convention.
pub mod span {
    /// One `try_acquire` or `acquire`.
    pub const ACQUIRE: &str = "lock.acquire";
    /// One renewal: the watchdog's (all its tries) or a manual one.
    pub const RENEW: &str = "lock.renew";
    /// One release.
    pub const RELEASE: &str = "lock.release";
}

static NAMES_LABELLED: AtomicBool = AtomicBool::new(false);

/// Adds the lock's name as the `lock.name` label of every metric recorded from now on, in this
/// process. Off by default: every name becomes its own series, which a service with a lock per
/// tenant or per job cannot afford. Spans carry the name either way.
///
/// ```
/// lock_core::telemetry::label_lock_names(true);
/// assert!(lock_core::telemetry::lock_names_labelled());
/// # lock_core::telemetry::label_lock_names(false);
/// ```
pub fn label_lock_names(on: bool) {
    NAMES_LABELLED.store(on, Ordering::Relaxed);
}

/// Whether metrics carry the `lock.name` label ([`label_lock_names`]).
pub fn lock_names_labelled() -> bool {
    NAMES_LABELLED.load(Ordering::Relaxed)
}
