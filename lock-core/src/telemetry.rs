//! Spans and metrics, recorded in one place: the trait's `try_acquire`/`acquire` and
//! [`ManagedLease`](crate::driver::ManagedLease), under the names of the published convention
//! ([`docs/observability.md`](https://github.com/distlock/distlock/blob/main/docs/observability.md)).
//!
//! Spans go through [`tracing`], metrics through the [`metrics`] facade: the application
//! installs a subscriber and a recorder (any exporter); with neither installed, nothing is
//! recorded. The lock name is a span field always, and a metric label only after
//! [`label_lock_names`]`(true)`: one label value per name is a series per name.
//!
//! Built without the `telemetry` cargo feature (on by default in every crate of distlock; off
//! with `default-features = false` on each that the application depends on), no span is made
//! and no metric recorded, whatever is installed; the AtRisk and Lost events are still logged.
//!
//! ```
//! use lock_core::telemetry::{self, metric, label};
//! assert_eq!(metric::ACQUISITIONS, "lock.acquisitions");
//! assert_eq!(label::BACKEND, "lock.backend");
//! assert!(!telemetry::lock_names_labelled()); // off by default: bounded cardinality
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram};
use tracing::Span;

pub use crate::convention::{label, label_lock_names, lock_names_labelled, metric, span};
use crate::handles;
use crate::{Error, FencingToken, LockName, LockOptions};

/// The outcome of most acquisitions and the end of most leases, whose handles are looked up
/// with the gauges they come with (`handles::start`, `handles::grant`).
const GRANTED: &str = "granted";
const RELEASED: &str = "released";

/// Whether a span can reach anyone: a `tracing` subscriber was ever set, globally or for a
/// scope. With none, no span is built: `tracing`'s `log` fallback (on whenever any crate of
/// the build enables `tracing/log`, as sqlx does) would otherwise build each one and ask `log`
/// at its every enter, exit and drop — a third of what the memory driver's cycle cost over
/// its cycle without telemetry. Events (AtRisk, Lost) still reach `log`.
fn spans_on() -> bool {
    cfg!(feature = "telemetry") && tracing::dispatcher::has_been_set()
}

/// Why a lease was lost: the `lock.loss.reason` label and event field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The backend refused a renewal: the lock is gone or another's (key deleted or evicted,
    /// etcd lease revoked, ZooKeeper session expired or node deleted, lock file replaced).
    Refused,
    /// No renewal was confirmed before `valid_until` (the backend did not answer in time, or
    /// the lease was not renewed at all).
    Expired,
    /// The connection that was the lock's session closed (PostgreSQL): the server freed it.
    ConnectionClosed,
    /// `max_hold` was reached on a backend whose lock lives as long as its session: the
    /// watchdog let go.
    MaxHold,
}

impl LossReason {
    /// The label value: `refused`, `expired`, `connection_closed`, `max_hold`.
    ///
    /// ```
    /// assert_eq!(lock_core::telemetry::LossReason::ConnectionClosed.as_str(), "connection_closed");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::Refused => "refused",
            LossReason::Expired => "expired",
            LossReason::ConnectionClosed => "connection_closed",
            LossReason::MaxHold => "max_hold",
        }
    }
}

/// How an acquisition ended, for [`AcquireReport::finish`].
#[derive(Debug)]
pub enum Acquired<'a> {
    /// Granted, with the grant's fencing token if the backend fences.
    Granted(Option<FencingToken>),
    /// `try_acquire` found it held.
    Busy,
    /// `acquire` was not granted within its wait.
    Timeout,
    /// Failed with this error.
    Failed(&'a Error),
}

/// One acquisition being reported: its span, its clock, and the waiting gauge while it waits.
/// Dropped without [`finish`](Self::finish), it was cancelled, and says so.
///
/// The trait's `try_acquire` and `acquire` make one for every call; only a driver that
/// overrides them needs it.
///
/// ```
/// use std::time::Duration;
/// use lock_core::telemetry::{AcquireReport, Acquired};
/// use lock_core::{LockName, LockOptions};
/// let name = LockName::new("jobs")?;
/// let report = AcquireReport::start("my", &name, &LockOptions::new(Duration::from_secs(5)), false);
/// // ... the attempt, run inside `report.span()` ...
/// report.finish(Acquired::Busy);
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Debug)]
pub struct AcquireReport {
    span: Span,
    backend: &'static str,
    name: LockName,
    mode: &'static str,
    attempt: &'static str,
    started: Instant,
    finished: bool,
    /// Raised by the driver ([`Acquisition::queued`](crate::driver::Acquisition::queued)).
    queued: AtomicBool,
    /// The waiting gauge, while an `acquire` waits.
    waiting: Option<Gauge>,
    /// The acquisitions counter and duration histogram of the outcome `granted`.
    granted: (Counter, Histogram),
}

impl AcquireReport {
    /// Starts observing an acquisition of `name`; `waits` for `acquire`, not `try_acquire`.
    pub fn start(backend: &'static str, name: &LockName, opts: &LockOptions, waits: bool) -> Self {
        let attempt = if waits { "wait" } else { "try" };
        let mode = opts.mode.kind();
        let span = if spans_on() {
            tracing::debug_span!(
                "lock.acquire",
                lock.name = %name,
                lock.backend = backend,
                lock.mode = mode,
                lock.attempt = attempt,
                lock.outcome = tracing::field::Empty,
                lock.fencing_token = tracing::field::Empty,
                lock.waited_ms = tracing::field::Empty,
                lock.queued = tracing::field::Empty,
                "error.type" = tracing::field::Empty,
            )
        } else {
            Span::none()
        };
        // Kept to the end: the decrement and a grant need no second look-up.
        let granted = [
            (label::MODE, mode),
            (label::ATTEMPT, attempt),
            (label::OUTCOME, GRANTED),
        ];
        let (waiting, count, duration) = handles::start(backend, name, &granted);
        let waiting = waits.then_some(waiting);
        if let Some(g) = &waiting {
            g.increment(1.0);
        }
        AcquireReport {
            span,
            backend,
            name: name.clone(),
            mode,
            attempt,
            started: Instant::now(),
            finished: false,
            queued: AtomicBool::new(false),
            waiting,
            granted: (count, duration),
        }
    }

    /// The span to run the acquisition in.
    pub fn span(&self) -> Span {
        self.span.clone()
    }

    /// The flag an [`Acquisition`](crate::driver::Acquisition) reported by this raises when it
    /// waits.
    pub(crate) fn queue_flag(&self) -> &AtomicBool {
        &self.queued
    }

    /// Says that this acquisition found the lock held and waits for it: a grant after this
    /// is a hand-off. For a driver that overrides `acquire`; one that implements
    /// `acquire_until` calls [`Acquisition::queued`](crate::driver::Acquisition::queued).
    pub fn queued(&self) {
        self.queued.store(true, Ordering::Relaxed);
    }

    /// Whether the driver said this acquisition waited for a holder.
    pub fn was_queued(&self) -> bool {
        self.queued.load(Ordering::Relaxed)
    }

    /// Records how the acquisition ended.
    pub fn finish(mut self, how: Acquired<'_>) {
        self.finished = true;
        let (outcome, error) = match how {
            Acquired::Granted(token) => {
                let queued = self.was_queued();
                if !self.span.is_disabled() {
                    if let Some(t) = token {
                        self.span.record("lock.fencing_token", t.get());
                    }
                    self.span.record("lock.queued", queued);
                }
                if queued {
                    handles::counter(
                        metric::HANDOFFS,
                        self.backend,
                        &self.name,
                        &[(label::MODE, self.mode)],
                    )
                    .increment(1);
                }
                (GRANTED, None)
            }
            Acquired::Busy => ("busy", None),
            Acquired::Timeout => ("timeout", None),
            Acquired::Failed(e) => ("error", Some(e.kind())),
        };
        self.record(outcome, error);
    }

    /// When the acquisition started (read once by [`start`](Self::start)): the moment its
    /// wait counts from.
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// # use lock_core::{telemetry::AcquireReport, LockName, LockOptions};
    /// let before = Instant::now();
    /// let name = LockName::new("jobs")?;
    /// let report = AcquireReport::start("memory", &name, &LockOptions::new(Duration::from_secs(1)), true);
    /// assert!(report.started() >= before && report.started() <= Instant::now());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn started(&self) -> Instant {
        self.started
    }

    fn record(&self, outcome: &'static str, error: Option<&'static str>) {
        if !cfg!(feature = "telemetry") {
            return; // no span, no metric: not even the clock reading
        }
        let waited = self.started.elapsed();
        // A span nobody listens to records nothing, but asking it still costs (the `log`
        // fallback): skipped.
        let listened = !self.span.is_disabled();
        if listened {
            self.span.record("lock.outcome", outcome);
            self.span
                .record("lock.waited_ms", waited.as_secs_f64() * 1e3);
        }
        let all = [
            (label::MODE, self.mode),
            (label::ATTEMPT, self.attempt),
            (label::OUTCOME, outcome),
            (label::ERROR, error.unwrap_or_default()),
        ];
        let more = match error {
            Some(kind) => {
                if listened {
                    self.span.record("error.type", kind);
                }
                &all[..]
            }
            None => &all[..3],
        };
        let looked_up;
        let (count, duration) = if error.is_none() && outcome == GRANTED {
            &self.granted
        } else {
            looked_up = handles::outcome(self.backend, &self.name, more);
            &looked_up
        };
        count.increment(1);
        duration.record(waited.as_secs_f64());
    }
}

impl Drop for AcquireReport {
    fn drop(&mut self) {
        if !self.finished {
            self.record("cancelled", None);
        }
        if let Some(g) = &self.waiting {
            g.decrement(1.0);
        }
    }
}

/// What one lease reports, from its grant to its end: the held gauge, renewals, the AtRisk
/// and Lost events, the loss counter and the hold time.
///
/// [`ManagedLease`](crate::driver::ManagedLease) keeps one; only a driver with a `Lease` of its
/// own needs it.
///
/// ```
/// use lock_core::telemetry::{LeaseReport, LossReason};
/// let name = lock_core::LockName::new("jobs")?;
/// let report = LeaseReport::granted("my", &name);
/// report.renewal("manual", "refused");
/// report.lost(LossReason::Refused, None);
/// report.ended("released"); // already ended by the loss: not counted twice
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Debug)]
pub struct LeaseReport {
    /// The held gauge, kept from the grant to the end.
    held: Gauge,
    /// The hold-time histogram of the end `released`.
    released: Histogram,
    backend: &'static str,
    name: LockName,
    granted_at: Instant,
    /// Set by the first end (release, abandon, drop, loss): the held gauge and the hold time
    /// are recorded once.
    ended: AtomicBool,
    /// Renewals the backend confirmed ([`Lease::renewals`](crate::Lease::renewals)).
    renewed: AtomicU64,
}

impl LeaseReport {
    /// A lease granted now: counted as held.
    pub fn granted(backend: &'static str, name: &LockName) -> Self {
        Self::granted_at(backend, name, Instant::now())
    }

    /// A lease granted at `at` (a clock reading the caller already took): counted as held.
    pub(crate) fn granted_at(backend: &'static str, name: &LockName, at: Instant) -> Self {
        let (held, released) = handles::grant(backend, name, &[(label::END, RELEASED)]);
        held.increment(1.0);
        LeaseReport {
            held,
            released,
            backend,
            name: name.clone(),
            granted_at: at,
            ended: AtomicBool::new(false),
            renewed: AtomicU64::new(0),
        }
    }

    /// The lease ended `how` (`released`, `abandoned`, `dropped`, `lost`); only the first end
    /// counts.
    pub fn ended(&self, how: &'static str) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        self.record_end(how);
    }

    /// The held gauge and the hold time, for an end already claimed.
    fn record_end(&self, how: &'static str) {
        if !cfg!(feature = "telemetry") {
            return; // no metric: not even the clock reading
        }
        self.held.decrement(1.0);
        let held_for = self.granted_at.elapsed().as_secs_f64();
        if how == RELEASED {
            self.released.record(held_for);
        } else {
            let labels = [(label::END, how)];
            handles::histogram(metric::HOLD_DURATION, self.backend, &self.name, &labels)
                .record(held_for);
        }
    }

    /// The span of one renewal, `auto` or `manual`.
    pub fn renew_span(&self, renewal: &'static str) -> Span {
        if !spans_on() {
            return Span::none();
        }
        tracing::debug_span!(
            "lock.renew",
            lock.name = %self.name,
            lock.backend = self.backend,
            lock.renewal = renewal,
            lock.outcome = tracing::field::Empty,
        )
    }

    /// One renewal request answered: `renewed`, `failed` (may pass) or `refused`.
    pub fn renewal(&self, renewal: &'static str, outcome: &'static str) {
        if outcome == "renewed" {
            self.renewed.fetch_add(1, Ordering::Relaxed);
        }
        Span::current().record("lock.outcome", outcome);
        handles::counter(
            metric::RENEWALS,
            self.backend,
            &self.name,
            &[(label::RENEWAL, renewal), (label::OUTCOME, outcome)],
        )
        .increment(1);
    }

    /// How many renewals were reported `renewed` so far.
    pub fn renewed(&self) -> u64 {
        self.renewed.load(Ordering::Relaxed)
    }

    /// The lease turned AtRisk (`why` says what failed): an event.
    pub fn at_risk(&self, why: &str) {
        tracing::warn!(
            lock.name = %self.name,
            lock.backend = self.backend,
            lock.state = "at_risk",
            "lease at risk: {why}"
        );
    }

    /// The lease turned Lost for `reason`: an event, the counter, and its end; nothing if it
    /// had ended already.
    pub fn lost(&self, reason: LossReason, error: Option<&Error>) {
        // A lease ends once: a loss after its release (or a second loss) is not one.
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        match error {
            Some(e) => tracing::warn!(
                lock.name = %self.name,
                lock.backend = self.backend,
                lock.state = "lost",
                lock.loss.reason = reason.as_str(),
                error = %e,
                "lease lost"
            ),
            None => tracing::warn!(
                lock.name = %self.name,
                lock.backend = self.backend,
                lock.state = "lost",
                lock.loss.reason = reason.as_str(),
                "lease lost"
            ),
        }
        handles::counter(
            metric::LOST,
            self.backend,
            &self.name,
            &[(label::LOSS_REASON, reason.as_str())],
        )
        .increment(1);
        self.record_end("lost");
    }

    /// The span of the release.
    pub fn release_span(&self) -> Span {
        if !spans_on() {
            return Span::none();
        }
        tracing::debug_span!(
            "lock.release",
            lock.name = %self.name,
            lock.backend = self.backend,
            lock.outcome = tracing::field::Empty,
            lock.held_ms = self.granted_at.elapsed().as_secs_f64() * 1e3,
            "error.type" = tracing::field::Empty,
        )
    }
}

#[cfg(all(test, feature = "telemetry"))]
#[path = "telemetry_tests.rs"]
mod tests;
