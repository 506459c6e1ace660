//! A complete [`Lease`] built from a driver's two backend operations and the one watchdog.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::ops::{release_with_retries, LeaseOps};
use crate::state::LeaseTracker;
use crate::telemetry::{LeaseReport, LossReason};
use crate::watchdog::{watchdog, Shared};
use crate::{Error, FencingToken, Lease, LeaseState, LockName, LostSignal, Renewal, Result};

/// A [`Lease`] made from a driver's [`LeaseOps`]: tracks Held/AtRisk/Lost, runs the watchdog for
/// [`Renewal::Auto`], serialises renewals against release, and releases in the background on drop.
///
/// Drivers return `Box::new(ManagedLease::new(...))` from `acquire_until`.
pub struct ManagedLease<O: LeaseOps> {
    name: LockName,
    token: Option<FencingToken>,
    ttl: Duration,
    shared: Place<Shared<O>>,
    /// The watchdog, which also marks the lease Lost when [`LeaseOps::ended`] resolves.
    watchdog: Option<JoinHandle<()>>,
    finished: bool,
}

/// Where a lease keeps its state: in itself, or, where a background task (the watchdog, the
/// watch on its connection) works on it too, shared with that task. In itself when there is
/// none: an allocation less per lease (callgrind, BENCHMARKS.md).
enum Place<T> {
    Here(T),
    Shared(Arc<T>),
}

impl<T> std::ops::Deref for Place<T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Place::Here(t) => t,
            Place::Shared(t) => t,
        }
    }
}

/// What the backend granted: the facts of a fresh lease, for [`ManagedLease::new`].
///
/// ```
/// use std::time::{Duration, Instant};
/// use lock_core::{driver::{drift, Grant}, FencingToken};
/// let ttl = Duration::from_secs(10);
/// let sent = Instant::now(); // read before the request went out
/// let grant = Grant {
///     token: Some(FencingToken::new(42)),
///     ttl,
///     valid_until: sent + ttl - drift(ttl),
/// };
/// assert!(grant.valid_until < sent + ttl);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// This grant's fencing token; `None` only for a driver declaring `Fencing::None`.
    pub token: Option<FencingToken>,
    /// The TTL the backend granted (the validated one, rounded up to its granularity).
    pub ttl: Duration,
    /// The conservative end of validity: measured from before the request was sent, plus
    /// `ttl`, minus [`drift`].
    pub valid_until: Instant,
}

impl<O: LeaseOps> ManagedLease<O> {
    /// Wraps a fresh grant. With [`Renewal::Auto`] the watchdog starts here.
    pub fn new(name: LockName, grant: Grant, renewal: Renewal, ops: O) -> Self {
        Self::granted_at(name, grant, renewal, ops, Instant::now())
    }

    /// [`new`](Self::new) for a driver that read the clock at the grant already.
    pub(crate) fn granted_at(
        name: LockName,
        grant: Grant,
        renewal: Renewal,
        ops: O,
        granted_at: Instant,
    ) -> Self {
        let Grant {
            token,
            ttl,
            valid_until,
        } = grant;
        // One background task per lease: the watchdog (with `Renewal::Auto`), watching for the
        // end of the lock's connection beside it where the driver has one to watch.
        let ended = ops.ended();
        let doubts = ops.doubts();
        let stop_at = match renewal {
            Renewal::Manual => None,
            Renewal::Auto { max_hold } => Some(max_hold.and_then(|d| granted_at.checked_add(d))),
        };
        let shared = |ops: O| Shared {
            telemetry: LeaseReport::granted_at(ops.backend(), &name, granted_at),
            ops: Arc::new(ops),
            tracker: LeaseTracker::new(valid_until),
            released: AtomicBool::new(false),
            gate: tokio::sync::Mutex::new(()),
        };
        if stop_at.is_none() && ended.is_none() && doubts.is_none() {
            // Built in place: the state is a large part of the lease, and moved twice it cost
            // as much as an allocation.
            return ManagedLease {
                shared: Place::Here(shared(ops)),
                name,
                token,
                ttl,
                watchdog: None,
                finished: false,
            };
        }
        let (shared, watchdog) = {
            let shared = Arc::new(shared(ops));
            let task = match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    // Paced on the validity window actually granted, not the TTL asked for:
                    // they differ where the lease is a session (ZooKeeper) or after drift.
                    let window = valid_until
                        .saturating_duration_since(granted_at)
                        .max(Duration::from_millis(3));
                    let (shared, name) = (shared.clone(), name.clone());
                    // Renew now: the server changed under the lease (`LeaseOps::doubts`).
                    // Made here: a lease without a watchdog needs none (an allocation less).
                    let poke = Arc::new(tokio::sync::Notify::new());
                    Some(rt.spawn(async move {
                        let renewing = async {
                            match stop_at {
                                Some(stop_at) => {
                                    let (s, n, p) = (shared.clone(), name.clone(), poke.clone());
                                    watchdog(s, window, stop_at, n, p).await
                                }
                                None => std::future::pending().await,
                            }
                        };
                        let doubting = async {
                            let Some(mut doubts) = doubts else {
                                return std::future::pending().await;
                            };
                            while doubts.changed().await.is_ok() {
                                shared.at_risk(format_args!(
                                    "the backend's server changed under the lease (a \
                                     failover): not yet confirmed there"
                                ));
                                poke.notify_one();
                            }
                            std::future::pending().await
                        };
                        let ending = async {
                            match ended {
                                Some(ended) => ended.await,
                                None => std::future::pending().await,
                            }
                        };
                        tokio::select! {
                            _ = renewing => {}
                            () = doubting => {}
                            _ = ending => {
                                if !shared.released.load(Ordering::SeqCst) {
                                    // The lock went with its session.
                                    shared.lost(LossReason::ConnectionClosed, None);
                                }
                            }
                        }
                    }))
                }
                Err(_) => {
                    tracing::warn!(lock = %name, "no tokio runtime: automatic renewal disabled");
                    None
                }
            };
            (Place::Shared(shared), task)
        };
        ManagedLease {
            name,
            token,
            ttl,
            shared,
            watchdog,
            finished: false,
        }
    }

    /// The driver's backend operations.
    pub fn ops(&self) -> &O {
        &self.shared.ops
    }

    /// A manual renewal ([`Lease::renew`]), in its span.
    async fn renew_now(&self) -> Result<()> {
        let shared = &self.shared;
        let lost = || Error::Lost {
            name: self.name.clone(),
            reason: "the lease expired or was refused before this renewal".into(),
        };
        if shared.tracker.state() == LeaseState::Lost {
            shared.telemetry.lost(LossReason::Expired, None);
            return Err(lost());
        }
        let _gate = shared.gate.lock().await;
        // A confirmation after `valid_until` could not save the lease: a renewal that hangs
        // (a frozen server, a driver without a request timeout) ends there, as the
        // watchdog's does.
        let deadline = shared.tracker.valid_until();
        let Ok(renewed) = tokio::time::timeout_at(deadline.into(), shared.ops.renew()).await else {
            shared.lost(LossReason::Expired, None);
            return Err(Error::Lost {
                name: self.name.clone(),
                reason: "no renewal confirmed before valid_until".into(),
            });
        };
        match renewed {
            Ok(valid_until) => {
                shared.telemetry.renewal("manual", "renewed");
                if shared.tracker.renewed(valid_until) {
                    Ok(())
                } else {
                    shared.telemetry.lost(LossReason::Expired, None);
                    Err(lost())
                }
            }
            // Reported (an event) as well as returned: a caller that drops the result still
            // leaves a trace before its release finds the lease gone.
            Err(e) if e.is_retryable() => {
                shared.telemetry.renewal("manual", "failed");
                shared.at_risk(format_args!("manual renewal failed: {e}"));
                Err(e)
            }
            Err(e) => {
                shared.telemetry.renewal("manual", "refused");
                shared.lost(LossReason::Refused, Some(&e));
                Err(e)
            }
        }
    }

    /// Stops the watchdog; returns whether the lease had one.
    fn stop_watchdog(&mut self) -> bool {
        match self.watchdog.take() {
            Some(h) => {
                h.abort();
                true
            }
            None => false,
        }
    }
}

#[async_trait]
impl<O: LeaseOps> Lease for ManagedLease<O> {
    fn name(&self) -> &LockName {
        &self.name
    }
    fn fencing_token(&self) -> Option<FencingToken> {
        self.token
    }
    fn ttl(&self) -> Duration {
        self.ttl
    }
    fn valid_until(&self) -> Instant {
        self.shared.tracker.valid_until()
    }
    fn state(&self) -> LeaseState {
        self.shared.tracker.state()
    }
    fn lost(&self) -> LostSignal {
        self.shared.tracker.signal()
    }

    async fn renew(&self) -> Result<()> {
        let span = self.shared.telemetry.renew_span("manual");
        self.renew_now().instrument(span).await
    }

    async fn release(mut self: Box<Self>) -> Result<()> {
        let span = self.shared.telemetry.release_span();
        self.shared.released.store(true, Ordering::SeqCst);
        let watched = self.stop_watchdog();
        if self.shared.tracker.state() == LeaseState::Lost {
            // Lost by the clock alone (no watchdog saw it): said now, before the release.
            self.shared.telemetry.lost(LossReason::Expired, None);
        }
        let result = async {
            // After a renewal in flight, never across it. Only the watchdog renews beside
            // the lease's owner, who gave the lease up to call this: without one there is
            // nothing to wait for (and a lock of the gate less per cycle).
            let _gate = match watched {
                true => Some(self.shared.gate.lock().await),
                false => None,
            };
            // Read once the watchdog stopped: a renewal it finished counts.
            let until = self.shared.tracker.valid_until();
            release_with_retries(self.shared.ops.clone(), until).await
        }
        .instrument(span.clone())
        .await;
        self.finished = true;
        self.shared.tracker.mark_released();
        self.shared.telemetry.ended("released");
        match &result {
            Ok(()) => {
                span.record("lock.outcome", "released");
            }
            Err(e) => {
                span.record(
                    "lock.outcome",
                    if matches!(e, Error::NotHeld { .. }) {
                        "not_held"
                    } else {
                        "error"
                    },
                );
                span.record("error.type", e.kind());
                if e.is_retryable() {
                    tracing::warn!(parent: &span, lock = %self.name, error = %e, "release failed; sending it again in the background");
                }
            }
        }
        result
    }

    async fn proclaim(&self, value: &crate::LeaderValue) -> Result<()> {
        if self.shared.tracker.state() == LeaseState::Lost {
            return Err(Error::Lost {
                name: self.name.clone(),
                reason: "the lease ended before this proclaim".into(),
            });
        }
        // Beside a renewal, never across it; and never past the lease's validity.
        let _gate = self.shared.gate.lock().await;
        let deadline = self.shared.tracker.valid_until();
        match tokio::time::timeout_at(deadline.into(), self.shared.ops.proclaim(value)).await {
            Ok(Err(e)) if matches!(e, Error::NotHeld { .. } | Error::Lost { .. }) => {
                self.shared.lost(LossReason::Refused, Some(&e));
                Err(e)
            }
            Ok(done) => done,
            Err(_) => Err(Error::Lost {
                name: self.name.clone(),
                reason: "no proclaim confirmed before valid_until".into(),
            }),
        }
    }

    fn renewals(&self) -> Option<u64> {
        Some(self.shared.telemetry.renewed())
    }

    fn backend_key(&self) -> Option<String> {
        self.shared.ops.backend_key()
    }

    #[cfg(unix)]
    fn inheritable_fds(&self) -> Vec<std::os::fd::OwnedFd> {
        self.shared.ops.inheritable_fds()
    }

    fn abandon(mut self: Box<Self>) {
        self.shared.released.store(true, Ordering::SeqCst);
        self.stop_watchdog();
        self.finished = true;
        self.shared.ops.abandon();
        self.shared.tracker.mark_released();
        self.shared.telemetry.ended("abandoned");
    }
}

impl<O: LeaseOps> Drop for ManagedLease<O> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.shared.released.store(true, Ordering::SeqCst);
        self.stop_watchdog();
        let until = self.shared.tracker.valid_until();
        self.shared.tracker.mark_released();
        self.shared.telemetry.ended("dropped");
        self.shared.ops.clone().release_on_drop(until);
    }
}

impl<O: LeaseOps> fmt::Debug for ManagedLease<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

/// Clock-drift allowance every driver subtracts from a lease's validity: 1 % of the TTL plus
/// 2 ms (the Redlock paper's figure; it also covers servers' own 1 ms expiry precision).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(lock_core::driver::drift(Duration::from_secs(10)), Duration::from_millis(102));
/// ```
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The conservative end of a lease that a request sent at `start` was granted (or renewed) for
/// `ttl`: the server's clock may have started the TTL any time after `start`, and the clocks
/// may drift apart by [`drift`] meanwhile.
///
/// ```
/// use std::time::{Duration, Instant};
/// let start = Instant::now();
/// let end = lock_core::driver::lease_end(start, Duration::from_secs(10));
/// assert_eq!(end - start, Duration::from_millis(9898));
/// ```
pub fn lease_end(start: Instant, ttl: Duration) -> Instant {
    start + ttl.saturating_sub(drift(ttl))
}

#[cfg(test)]
#[path = "managed_tests.rs"]
mod tests;
