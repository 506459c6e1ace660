//! The one watchdog: renews a lease with `Renewal::Auto`, and marks it Lost (and, where the
//! lock lives as long as a session, frees it) when a renewal is refused or comes too late.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::ops::{release_with_retries, LeaseOps};
use crate::state::LeaseTracker;
use crate::telemetry::{LeaseReport, LossReason};
use crate::{Error, LockName};

/// What a [`ManagedLease`](crate::driver::ManagedLease) shares with its watchdog.
pub(crate) struct Shared<O> {
    pub(crate) ops: Arc<O>,
    pub(crate) tracker: LeaseTracker,
    /// Set before release starts; the watchdog checks it under `gate`, so no renewal can be
    /// sent once a release has begun (no resurrection race).
    pub(crate) released: AtomicBool,
    pub(crate) gate: tokio::sync::Mutex<()>,
    pub(crate) telemetry: LeaseReport,
}

impl<O> Shared<O> {
    /// Marks the lease Lost for `reason`, and reports it (once, and not after its release).
    pub(crate) fn lost(&self, reason: LossReason, error: Option<&Error>) {
        self.tracker.mark_lost();
        self.telemetry.lost(reason, error);
    }

    /// Marks the lease AtRisk, and reports it if it was Held.
    pub(crate) fn at_risk(&self, why: std::fmt::Arguments<'_>) {
        if self.tracker.at_risk() {
            self.telemetry.at_risk(&why.to_string());
        }
    }
}

/// Renews when a third of the validity window has passed (`ttl` here is that window), or at
/// once when `poke` is notified, each
/// time a [`renewal`] tried until `valid_until`; on refusal or when `valid_until` passes marks
/// Lost and stops.
pub(crate) async fn watchdog<O: LeaseOps>(
    shared: Arc<Shared<O>>,
    ttl: Duration,
    stop_at: Option<Instant>,
    name: LockName,
    poke: Arc<tokio::sync::Notify>,
) {
    let lead = ttl * 2 / 3;
    let mut next = shared.tracker.valid_until().checked_sub(lead);
    loop {
        if let Some(at) = next {
            // Early when poked: the server changed under the lease (`LeaseOps::doubts`).
            tokio::select! {
                () = tokio::time::sleep_until(at.into()) => {}
                () = poke.notified() => {}
            }
        }
        if stop_at.is_some_and(|s| Instant::now() >= s) {
            tracing::debug!(lock = %name, "max_hold reached: watchdog stops renewing");
            if !shared.ops.lapses_without_renewal() {
                lose(&shared, ttl, &name, LossReason::MaxHold, None).await;
            }
            return;
        }
        let valid_until = shared.tracker.valid_until();
        let _gate = shared.gate.lock().await;
        if shared.released.load(Ordering::SeqCst) {
            return;
        }
        let outcome = renewal(&shared, ttl, valid_until, stop_at, &name)
            .instrument(shared.telemetry.renew_span("auto"))
            .await;
        drop(_gate);
        match outcome {
            Ok(new_valid_until) => {
                if !shared.tracker.renewed(new_valid_until) {
                    // Confirmed after `valid_until`: too late to keep the lease.
                    shared.telemetry.lost(LossReason::Expired, None);
                    return;
                }
                next = new_valid_until.checked_sub(lead);
            }
            Err(Some(e)) => {
                lose(&shared, ttl, &name, LossReason::Refused, Some(&e)).await;
                return;
            }
            Err(None) => {
                lose(&shared, ttl, &name, LossReason::Expired, None).await;
                return;
            }
        }
    }
}

/// Marks the lease Lost; where the lock does not end by itself
/// ([`LeaseOps::lapses_without_renewal`] is `false`: it lives as long as the client's session),
/// then releases it, sending the release again for up to one more `window` after a failure that may
/// pass. A session can outlive a lease that could not be confirmed in time (it moved to another
/// server), and its lock would otherwise stay held, by nobody who knows it, until the lease is
/// dropped. Lost first: a successor can be granted as soon as the lock is freed, and by then the
/// holder's signal must have fired. The release is owner-checked, so a lock already gone is
/// untouched.
async fn lose<O: LeaseOps>(
    shared: &Arc<Shared<O>>,
    window: Duration,
    name: &LockName,
    reason: LossReason,
    error: Option<&Error>,
) {
    shared.lost(reason, error);
    if shared.ops.lapses_without_renewal() {
        return;
    }
    let _gate = shared.gate.lock().await;
    if !shared.released.swap(true, Ordering::SeqCst) {
        let until = Instant::now() + window;
        if let Err(e) = release_with_retries(shared.ops.clone(), until).await {
            tracing::warn!(lock = %name, error = %e, "release of a lost lease failed");
        }
    }
}

/// One renewal of the watchdog's, for a lease of validity `window`: tries until one is
/// confirmed (`Ok`), one is refused (`Err(Some)`), or `valid_until` passes (`Err(None)`). The
/// lease turns AtRisk when no try is confirmed after a sixth of the window, or one fails for a
/// reason that may pass.
///
/// A try that hangs is not given up, for a slow answer still counts; but once it has had half
/// of the validity left (at least a sixth of the window), another is sent beside it. A request
/// that went to a server cut off by a partition is neither answered nor refused, and the next
/// try may reach one that answers. A try that fails for a reason that may pass is followed by
/// another after `retry`. No try starts once a release has begun or after `stop_at`
/// (`max_hold`), and dropping this future drops every try. Renewals are owner-checked
/// extensions, so tries that land together change nothing.
async fn renewal<O: LeaseOps>(
    shared: &Shared<O>,
    window: Duration,
    valid_until: Instant,
    stop_at: Option<Instant>,
    name: &LockName,
) -> std::result::Result<Instant, Option<Error>> {
    let started = Instant::now();
    let slow = window / 6;
    let retry = (window / 10).clamp(Duration::from_millis(5), Duration::from_secs(1));
    let beside = |now: Instant| now + (valid_until.saturating_duration_since(now) / 2).max(slow);
    let mut tries = vec![shared.ops.renew_due()];
    let mut next_try = beside(started);
    let (at_risk_at, mut at_risk) = (started + slow, false);
    loop {
        let answer = std::future::poll_fn(|cx| {
            let ready = tries
                .iter_mut()
                .enumerate()
                .find_map(|(i, t)| match t.as_mut().poll(cx) {
                    std::task::Poll::Ready(r) => Some((i, r)),
                    std::task::Poll::Pending => None,
                });
            match ready {
                Some((i, r)) => {
                    drop(tries.swap_remove(i));
                    std::task::Poll::Ready(r)
                }
                None => std::task::Poll::Pending,
            }
        });
        tokio::select! {
            // Checked first: at valid_until the lease has expired, also when a driver that
            // gives up on its unanswered renewal at the same instant answers with an error in
            // the same poll (a refusal before it still counts as one).
            biased;
            _ = tokio::time::sleep_until(valid_until.into()) => return Err(None),
            r = answer => match r {
                Ok(t) => {
                    shared.telemetry.renewal("auto", "renewed");
                    return Ok(t);
                }
                Err(e) if e.is_retryable() => {
                    shared.telemetry.renewal("auto", "failed");
                    tracing::debug!(lock = %name, error = %e, "renewal failed");
                    shared.at_risk(format_args!("renewal failed: {e}"));
                    next_try = next_try.min(Instant::now() + retry);
                }
                Err(e) => {
                    shared.telemetry.renewal("auto", "refused");
                    return Err(Some(e));
                }
            },
            _ = tokio::time::sleep_until(next_try.into()) => {
                let now = Instant::now();
                let stopped = stop_at.is_some_and(|s| now >= s)
                    || shared.released.load(Ordering::SeqCst);
                // Stopped: no more tries; the ones under way may still answer.
                next_try = if stopped { valid_until + window } else { beside(now) };
                if !stopped {
                    if !tries.is_empty() {
                        tracing::warn!(lock = %name, "renewal unanswered; sending another beside it");
                    }
                    tries.push(shared.ops.renew_due());
                }
            }
            _ = tokio::time::sleep_until(at_risk_at.into()), if !at_risk => {
                at_risk = true;
                shared.at_risk(format_args!("renewal unconfirmed after {slow:?}"));
            }
        }
    }
}
