//! A complete [`Lease`] built from a driver's two backend operations, with the one watchdog.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::state::LeaseTracker;
use tokio::task::JoinHandle;

use crate::{Error, FencingToken, Lease, LeaseState, LockName, LostSignal, Renewal, Result};

/// The backend half of a lease: what a driver must do on the server. Everything else — state,
/// lost signal, watchdog, the release/renew ordering, drop — is [`ManagedLease`]'s job.
///
/// ```
/// use std::time::{Duration, Instant};
/// use lock_core::{async_trait, driver::LeaseOps, Result};
///
/// struct MyOps { ttl: Duration }
///
/// #[async_trait]
/// impl LeaseOps for MyOps {
///     async fn renew(&self) -> Result<Instant> {
///         let start = Instant::now();
///         // compare-owner-and-extend on the server, then:
///         Ok(start + self.ttl)
///     }
///     async fn release(&self) -> Result<()> {
///         // compare-owner-and-delete on the server
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait LeaseOps: Send + Sync + 'static {
    /// Extends the lease on the backend if this owner still holds it, and returns the new
    /// conservative `valid_until` (measured from before the request was sent, drift
    /// subtracted). Must never recreate a lock that is gone: `Err(NotHeld)` or `Err(Lost)`.
    async fn renew(&self) -> Result<Instant>;

    /// Deletes the lock on the backend if this owner still holds it; `Err(NotHeld)` otherwise.
    async fn release(&self) -> Result<()>;

    /// Called when the lease is dropped without `release` or `abandon`, with the lease's
    /// `valid_until`. The default releases in a background task on the current Tokio runtime,
    /// as [`release_with_retries`] does (sent again after a failure that may pass, until
    /// `until`); without a runtime the lock expires. Never block here.
    fn release_on_drop(self: Arc<Self>, until: Instant)
    where
        Self: Sized,
    {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = release_with_retries(self, until).await {
                    tracing::debug!(error = %e, "background release of a dropped lease failed");
                }
            });
        }
    }

    /// Called by [`Lease::abandon`]. The default does nothing: the lock expires.
    fn abandon(&self) {}

    /// For a lock that is its connection's session (PostgreSQL): a future that resolves once
    /// that connection has closed, which has freed the lock on the server. The lease then
    /// turns Lost at once instead of at its next renewal. The default: none.
    fn ended(&self) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        None
    }

    /// What [`Lease::backend_key`] returns; the default: none.
    fn backend_key(&self) -> Option<String> {
        None
    }

    /// What [`Lease::inheritable_fds`] returns; the default: none.
    #[cfg(unix)]
    fn inheritable_fds(&self) -> Vec<std::os::fd::OwnedFd> {
        Vec::new()
    }

    /// Whether the lock ends by itself once renewals stop (a TTL). Backends where it lives as
    /// long as the client's session (ZooKeeper) return `false`; the watchdog then releases
    /// actively at `max_hold`, and once the lease has turned Lost, instead of just ceasing to
    /// renew.
    fn lapses_without_renewal(&self) -> bool {
        true
    }
}

struct Shared<O> {
    ops: Arc<O>,
    tracker: LeaseTracker,
    /// Set before release starts; the watchdog checks it under `gate`, so no renewal can be
    /// sent once a release has begun (no resurrection race).
    released: AtomicBool,
    gate: tokio::sync::Mutex<()>,
}

/// A [`Lease`] made from a driver's [`LeaseOps`]: tracks Held/AtRisk/Lost, runs the watchdog for
/// [`Renewal::Auto`], serialises renewals against release, and releases in the background on drop.
///
/// Drivers return `Box::new(ManagedLease::new(...))` from `acquire_until`.
pub struct ManagedLease<O: LeaseOps> {
    name: LockName,
    token: Option<FencingToken>,
    ttl: Duration,
    shared: Arc<Shared<O>>,
    /// The watchdog, which also marks the lease Lost when [`LeaseOps::ended`] resolves.
    watchdog: Option<JoinHandle<()>>,
    finished: bool,
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
        let Grant {
            token,
            ttl,
            valid_until,
        } = grant;
        let granted_at = Instant::now();
        let shared = Arc::new(Shared {
            ops: Arc::new(ops),
            tracker: LeaseTracker::new(valid_until),
            released: AtomicBool::new(false),
            gate: tokio::sync::Mutex::new(()),
        });
        // One background task per lease: the watchdog (with `Renewal::Auto`), watching for the
        // end of the lock's connection beside it where the driver has one to watch.
        let ended = shared.ops.ended();
        let stop_at = match renewal {
            Renewal::Manual => None,
            Renewal::Auto { max_hold } => Some(max_hold.and_then(|d| granted_at.checked_add(d))),
        };
        let watchdog = if stop_at.is_none() && ended.is_none() {
            None
        } else {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    // Paced on the validity window actually granted, not the TTL asked for:
                    // they differ where the lease is a session (ZooKeeper) or after drift.
                    let window = valid_until
                        .saturating_duration_since(granted_at)
                        .max(Duration::from_millis(3));
                    let (shared, name) = (shared.clone(), name.clone());
                    Some(rt.spawn(async move {
                        let renewing = async {
                            match stop_at {
                                Some(stop_at) => {
                                    watchdog(shared.clone(), window, stop_at, name.clone()).await
                                }
                                None => std::future::pending().await,
                            }
                        };
                        let ending = async {
                            match ended {
                                Some(ended) => ended.await,
                                None => std::future::pending().await,
                            }
                        };
                        tokio::select! {
                            _ = renewing => {}
                            _ = ending => {
                                if !shared.released.load(Ordering::SeqCst) {
                                    tracing::warn!(
                                        lock = %name,
                                        "connection closed: the lock went with its session"
                                    );
                                    shared.tracker.mark_lost();
                                }
                            }
                        }
                    }))
                }
                Err(_) => {
                    tracing::warn!(lock = %name, "no tokio runtime: automatic renewal disabled");
                    None
                }
            }
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

    fn stop_watchdog(&mut self) {
        if let Some(h) = self.watchdog.take() {
            h.abort();
        }
    }
}

/// Renews when a third of the validity window has passed (`ttl` here is that window), each
/// time a [`renewal`] tried until `valid_until`; on refusal or when `valid_until` passes marks
/// Lost and stops.
async fn watchdog<O: LeaseOps>(
    shared: Arc<Shared<O>>,
    ttl: Duration,
    stop_at: Option<Instant>,
    name: LockName,
) {
    let lead = ttl * 2 / 3;
    let mut next = shared.tracker.valid_until().checked_sub(lead);
    loop {
        if let Some(at) = next {
            tokio::time::sleep_until(at.into()).await;
        }
        if stop_at.is_some_and(|s| Instant::now() >= s) {
            tracing::debug!(lock = %name, "max_hold reached: watchdog stops renewing");
            if !shared.ops.lapses_without_renewal() {
                lose(&shared, ttl, &name).await;
            }
            return;
        }
        let valid_until = shared.tracker.valid_until();
        let _gate = shared.gate.lock().await;
        if shared.released.load(Ordering::SeqCst) {
            return;
        }
        let outcome = renewal(&shared, ttl, valid_until, stop_at, &name).await;
        drop(_gate);
        match outcome {
            Ok(new_valid_until) => {
                if !shared.tracker.renewed(new_valid_until) {
                    return;
                }
                next = new_valid_until.checked_sub(lead);
            }
            Err(Some(e)) => {
                tracing::warn!(lock = %name, error = %e, "renewal refused; lease lost");
                lose(&shared, ttl, &name).await;
                return;
            }
            Err(None) => {
                tracing::warn!(lock = %name, "no renewal confirmed before valid_until; lease lost");
                lose(&shared, ttl, &name).await;
                return;
            }
        }
    }
}

/// Marks the lease Lost; where the lock does not end by itself ([`LeaseOps::lapses_without_renewal`]
/// is `false`: it lives as long as the client's session), then releases it, sending the
/// release again for up to one more `window` after a failure that may pass. A session can
/// outlive a lease that could not be confirmed in time (it moved to another server), and its
/// lock would otherwise stay held, by nobody who knows it, until the lease is dropped. Lost
/// first: a successor can be granted as soon as the lock is freed, and by then the holder's
/// signal must have fired. The release is owner-checked, so a lock already gone is untouched.
async fn lose<O: LeaseOps>(shared: &Arc<Shared<O>>, window: Duration, name: &LockName) {
    shared.tracker.mark_lost();
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
    let mut tries = vec![shared.ops.renew()];
    let mut next_try = beside(started);
    let mut unconfirmed = Some(started + slow);
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
            r = answer => match r {
                Ok(t) => return Ok(t),
                Err(e) if e.is_retryable() => {
                    tracing::warn!(lock = %name, error = %e, "renewal failed; lease at risk");
                    shared.tracker.at_risk();
                    next_try = next_try.min(Instant::now() + retry);
                }
                Err(e) => return Err(Some(e)),
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
                    tries.push(shared.ops.renew());
                }
            }
            _ = tokio::time::sleep_until(unconfirmed.unwrap_or(valid_until).into()),
                if unconfirmed.is_some() =>
            {
                unconfirmed = None;
                tracing::warn!(lock = %name, "renewal unconfirmed after {slow:?}; lease at risk");
                shared.tracker.at_risk();
            }
            _ = tokio::time::sleep_until(valid_until.into()) => return Err(None),
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
        let lost = || Error::Lost {
            name: self.name.clone(),
            reason: "the lease expired or was refused before this renewal".into(),
        };
        if self.shared.tracker.state() == LeaseState::Lost {
            return Err(lost());
        }
        let _gate = self.shared.gate.lock().await;
        // A confirmation after `valid_until` could not save the lease: a renewal that hangs
        // (a frozen server, a driver without a request timeout) ends there, as the
        // watchdog's does.
        let deadline = self.shared.tracker.valid_until();
        let Ok(renewed) = tokio::time::timeout_at(deadline.into(), self.shared.ops.renew()).await
        else {
            self.shared.tracker.mark_lost();
            return Err(Error::Lost {
                name: self.name.clone(),
                reason: "no renewal confirmed before valid_until".into(),
            });
        };
        match renewed {
            Ok(valid_until) => {
                if self.shared.tracker.renewed(valid_until) {
                    Ok(())
                } else {
                    Err(lost())
                }
            }
            Err(e) if e.is_retryable() => {
                self.shared.tracker.at_risk();
                Err(e)
            }
            Err(e) => {
                self.shared.tracker.mark_lost();
                Err(e)
            }
        }
    }

    async fn release(mut self: Box<Self>) -> Result<()> {
        self.shared.released.store(true, Ordering::SeqCst);
        self.stop_watchdog();
        let until = self.shared.tracker.valid_until();
        let result = {
            let _gate = self.shared.gate.lock().await;
            release_with_retries(self.shared.ops.clone(), until).await
        };
        self.finished = true;
        self.shared.tracker.mark_released();
        if let Err(e) = &result {
            if e.is_retryable() {
                tracing::warn!(lock = %self.name, error = %e, "release failed; sending it again in the background");
            }
        }
        result
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

/// Sends `ops`'s release and returns its answer; after a failure that may pass (its
/// connection dropped), sends it again in the background ([`retry_in_background`]) until it
/// gets through or `until` (the lease's `valid_until`) has passed. The caller cannot retry: a
/// released or dropped lease is gone. Owner-checked like every release, so a retry after a
/// first attempt that did land touches nothing. What [`ManagedLease`]'s `release` and the
/// default [`LeaseOps::release_on_drop`] do.
///
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
/// use lock_core::{async_trait, driver::LeaseOps, Result};
///
/// struct Ops;
/// #[async_trait]
/// impl LeaseOps for Ops {
///     async fn renew(&self) -> Result<Instant> { Ok(Instant::now()) }
///     async fn release(&self) -> Result<()> { Ok(()) } // an owner-checked delete
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<()> {
/// let until = Instant::now() + Duration::from_secs(5);
/// lock_core::driver::release_with_retries(Arc::new(Ops), until).await?;
/// # Ok(())
/// # }
/// ```
pub async fn release_with_retries<O: LeaseOps>(ops: Arc<O>, until: Instant) -> Result<()> {
    let result = ops.release().await;
    if matches!(&result, Err(e) if e.is_retryable()) {
        retry_in_background(until, move || {
            let ops = ops.clone();
            async move { ops.release().await }
        });
    }
    result
}

/// Runs `attempt` in the background, at once and then again after each failure that may pass
/// ([`Error::is_retryable`]), pausing 50 ms, doubling to 1 s, until one succeeds, one fails for
/// good, or `until` has passed — so the task cannot outlive the lease it cleans up after. For
/// what a caller cannot retry itself: a release whose lease is gone, the undo of an acquisition
/// that failed. Without a Tokio runtime nothing runs (the lock then expires by itself).
///
/// ```
/// use std::time::{Duration, Instant};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // An idempotent cleanup, retried for at most the lease's remaining validity.
/// lock_core::driver::retry_in_background(Instant::now() + Duration::from_secs(5), || async {
///     Ok(()) // say, an owner-checked delete of the lock key
/// });
/// # }
/// ```
pub fn retry_in_background<F, Fut>(until: Instant, mut attempt: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut pause = Duration::from_millis(50);
        loop {
            match tokio::time::timeout_at(until.into(), attempt()).await {
                Ok(Err(e)) if e.is_retryable() && Instant::now() + pause < until => {
                    tracing::debug!(error = %e, "background retry failed; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                _ => return,
            }
        }
    });
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
