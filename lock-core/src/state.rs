//! Lease state and the lost-lease signal.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Instant;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// When work run under a lease ([`while_held`](crate::while_held),
/// [`LockExt::with_lock`](crate::LockExt::with_lock),
/// [`LostSignal::cancellation_token`]) is stopped.
///
/// ```
/// use lock_core::{LeaseState, StopOn};
/// assert_eq!(StopOn::default(), StopOn::Lost);
/// assert!(StopOn::AtRisk.stops(LeaseState::AtRisk) && !StopOn::Lost.stops(LeaseState::AtRisk));
/// assert!(StopOn::Lost.stops(LeaseState::Lost) && !StopOn::AtRisk.stops(LeaseState::Held));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopOn {
    /// When the lease turns [`LeaseState::Lost`]: from then on another client may hold the
    /// lock.
    #[default]
    Lost,
    /// Already when it turns [`LeaseState::AtRisk`]: a renewal or the connection failed, and
    /// the lock may be lost at `valid_until` if the driver's retries do not get through. For
    /// work that is cheaper to redo than to finish unsure.
    AtRisk,
}

impl StopOn {
    /// Whether work must stop in `state`.
    pub fn stops(self, state: LeaseState) -> bool {
        match self {
            StopOn::Lost => state == LeaseState::Lost,
            StopOn::AtRisk => state != LeaseState::Held,
        }
    }
}

/// What the holder can currently assume about its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Held and confirmed: valid until [`Lease::valid_until`](crate::Lease::valid_until).
    Held,
    /// Possibly still held, but the last renewal or the connection failed. Finish or pause
    /// work that needs the lock; the driver keeps trying until `valid_until`.
    AtRisk,
    /// Gone, or may be gone: another client may hold the lock now. Final.
    Lost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Held,
    AtRisk,
    Lost,
    Released,
}

#[derive(Clone, Copy, Debug)]
struct Status {
    phase: Phase,
    valid_until: Instant,
}

impl Status {
    fn state_at(&self, now: Instant) -> LeaseState {
        match self.phase {
            Phase::Lost | Phase::Released => LeaseState::Lost,
            _ if now >= self.valid_until => LeaseState::Lost,
            Phase::AtRisk => LeaseState::AtRisk,
            Phase::Held => LeaseState::Held,
        }
    }
}

/// The state machine behind one lease, for driver authors: it owns the conservative
/// `valid_until`, turns into [`LeaseState::Lost`] by itself when that instant passes, and feeds
/// every [`LostSignal`]. Lost is sticky: no later renewal brings a lease back.
///
/// Most drivers do not use it directly: [`ManagedLease`](crate::driver::ManagedLease) wraps it together
/// with the watchdog.
///
/// ```
/// use std::time::{Duration, Instant};
/// use lock_core::{driver::LeaseTracker, LeaseState};
/// let tracker = LeaseTracker::new(Instant::now() + Duration::from_secs(5));
/// assert_eq!(tracker.state(), LeaseState::Held);
/// tracker.at_risk();
/// assert_eq!(tracker.state(), LeaseState::AtRisk);
/// assert!(tracker.renewed(Instant::now() + Duration::from_secs(5)));
/// assert_eq!(tracker.state(), LeaseState::Held);
/// tracker.mark_lost();
/// assert!(!tracker.renewed(Instant::now() + Duration::from_secs(5)));
/// assert_eq!(tracker.state(), LeaseState::Lost);
/// ```
pub struct LeaseTracker {
    shared: Arc<Shared>,
}

/// A lease's status and what wakes its signals. A mutex and one `Notify`, not a
/// `tokio::sync::watch` channel: a watch wakes its eight notifiers at every send and when its
/// sender drops, listened to or not (about 450 instructions of every lease's life, a twentieth
/// of the memory driver's acquire+release cycle); `Notify::notify_waiters` with nobody waiting
/// is a few dozen.
struct Shared {
    status: Mutex<Status>,
    /// Woken at every change of `status` and when the tracker is dropped.
    changed: Notify,
    /// The tracker was dropped: the lease is gone.
    closed: AtomicBool,
}

impl Shared {
    fn status(&self) -> Status {
        *self.status.lock()
    }
}

impl LeaseTracker {
    /// A held lease valid until `valid_until` (already conservative: drift subtracted).
    pub fn new(valid_until: Instant) -> Self {
        let status = Status {
            phase: Phase::Held,
            valid_until,
        };
        LeaseTracker {
            shared: Arc::new(Shared {
                status: Mutex::new(status),
                changed: Notify::new(),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// The current conservative end of validity.
    pub fn valid_until(&self) -> Instant {
        self.shared.status().valid_until
    }

    /// The state now, taking the clock into account.
    pub fn state(&self) -> LeaseState {
        self.shared.status().state_at(Instant::now())
    }

    /// Records a confirmed renewal. Returns false, and changes nothing but marking the lease
    /// lost, when the lease was already lost (explicitly, or because `valid_until` passed before
    /// the confirmation arrived).
    pub fn renewed(&self, valid_until: Instant) -> bool {
        let now = Instant::now();
        let mut ok = false;
        self.update(|s| {
            if s.state_at(now) == LeaseState::Lost {
                if s.phase != Phase::Released {
                    s.phase = Phase::Lost;
                }
                return true;
            }
            ok = true;
            s.phase = Phase::Held;
            s.valid_until = s.valid_until.max(valid_until);
            true
        });
        ok
    }

    /// A renewal or the connection failed transiently: Held becomes AtRisk. True if it was
    /// Held.
    pub fn at_risk(&self) -> bool {
        self.move_to(Phase::AtRisk, |p| p == Phase::Held)
    }

    /// The backend said the lease is gone (or the driver knows it may be). Final. True if it
    /// was Held or AtRisk until now.
    pub fn mark_lost(&self) -> bool {
        self.move_to(Phase::Lost, |p| matches!(p, Phase::Held | Phase::AtRisk))
    }

    /// The holder released the lease; signals resolve.
    pub fn mark_released(&self) {
        self.move_to(Phase::Released, |p| p != Phase::Released);
    }

    /// Moves to `to` from any phase `from` accepts; watchers hear only of a real change, which
    /// is what it returns.
    fn move_to(&self, to: Phase, from: impl Fn(Phase) -> bool) -> bool {
        let mut moved = false;
        self.update(|s| {
            moved = from(s.phase);
            if moved {
                s.phase = to;
            }
            moved
        });
        moved
    }

    /// Changes the status by `change` (which says whether it changed anything) and wakes the
    /// signals waiting now; one that looks later reads the new status first.
    fn update(&self, change: impl FnOnce(&mut Status) -> bool) {
        let changed = change(&mut self.shared.status.lock());
        if changed {
            self.wake_signals();
        }
    }

    /// Wakes the signals that wait. Only a [`LostSignal`] waits, and each holds a count of
    /// `shared`: with none out there is nobody to wake (a lock of the `Notify` less, twice per
    /// lease). A signal made meanwhile, on another thread, looks at the status after this
    /// change's unlock, so it needs no wake-up.
    fn wake_signals(&self) {
        if Arc::strong_count(&self.shared) > 1 {
            self.shared.changed.notify_waiters();
        }
    }

    /// A signal that resolves when this lease is lost, released or dropped.
    pub fn signal(&self) -> LostSignal {
        LostSignal {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for LeaseTracker {
    /// The lease is gone: every signal resolves.
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.wake_signals();
    }
}

impl fmt::Debug for LeaseTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.shared.status();
        f.debug_struct("LeaseTracker")
            .field("phase", &s.phase)
            .field("state", &s.state_at(Instant::now()))
            .finish()
    }
}

/// Resolves when a lease is lost — the backend refused a renewal, the session or lease
/// expired, or `valid_until` passed without a confirmed renewal — and also once the lease has
/// been released, abandoned or dropped, so a task waiting on it never outlives the lease.
///
/// Await it (it implements [`IntoFuture`]) next to the protected work:
///
/// ```
/// # use std::time::Duration;
/// # use lock_core::{DistributedLock, LockName, LockOptions, memory::MemoryLock};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// let locks = MemoryLock::new();
/// let name = LockName::new("report")?;
/// let lease = locks.acquire(&name, &LockOptions::new(Duration::from_secs(5))).await?;
/// let lost = lease.lost();
/// tokio::select! {
///     _ = lost => eprintln!("lock lost: stop writing"),
///     _ = async { /* protected work */ } => {}
/// }
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LostSignal {
    shared: Arc<Shared>,
}

impl LostSignal {
    /// True once the lease is lost, released or dropped, without waiting.
    pub fn is_lost(&self) -> bool {
        if self.shared.closed.load(Ordering::Acquire) {
            return true;
        }
        self.shared.status().state_at(Instant::now()) == LeaseState::Lost
    }

    /// The lease's state now, as [`Lease::state`](crate::Lease::state) says it: `Lost` too
    /// once the lease was released, abandoned or dropped. For work that holds only this
    /// signal (a [`Scope`](crate::Scope), a spawned task) and checks before each protected
    /// step.
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// use lock_core::{driver::LeaseTracker, LeaseState};
    /// let tracker = LeaseTracker::new(Instant::now() + Duration::from_secs(5));
    /// let signal = tracker.signal();
    /// tracker.at_risk();
    /// assert_eq!(signal.state(), LeaseState::AtRisk);
    /// drop(tracker); // the lease is gone
    /// assert_eq!(signal.state(), LeaseState::Lost);
    /// ```
    pub fn state(&self) -> LeaseState {
        if self.is_lost() {
            return LeaseState::Lost;
        }
        self.shared.status().state_at(Instant::now())
    }

    /// Waits until the lease is lost, released or dropped.
    pub async fn wait(self) {
        self.until(StopOn::Lost).await
    }

    /// Waits until the lease is in a state `stop` names (or lost, released or dropped).
    pub(crate) async fn until(self, stop: StopOn) {
        loop {
            // Listening before looking: a change between the look and the wait still wakes it.
            let changed = self.shared.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if self.shared.closed.load(Ordering::Acquire) {
                return; // the lease is gone
            }
            let status = self.shared.status();
            if stop.stops(status.state_at(Instant::now())) {
                return;
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(status.valid_until.into()) => {}
            }
        }
    }
}

impl LostSignal {
    /// A [`CancellationToken`] cancelled once the lease is in a state `stop` names, or is
    /// released, abandoned or dropped: for work spawned on other tasks, and for libraries
    /// that take a token. A task of the current Tokio runtime watches the lease for it and ends
    /// with the lease (or when the token is cancelled by hand), never later.
    ///
    /// An [`Error::Config`](crate::Error::Config) outside a Tokio runtime, where nothing could
    /// watch the lease.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use lock_core::{memory::MemoryLock, DistributedLock, LockName, LockOptions, StopOn};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// let locks = MemoryLock::new();
    /// let lease = locks.acquire(&LockName::new("export")?, &LockOptions::new(Duration::from_secs(5))).await?;
    /// let cancel = lease.lost().cancellation_token(StopOn::Lost)?;
    /// let worker = tokio::spawn({
    ///     let cancel = cancel.clone();
    ///     async move { cancel.cancelled().await } // a real worker selects on it between steps
    /// });
    /// lease.release().await?; // released: the worker is told to stop too
    /// worker.await.map_err(|e| lock_core::Error::config_with("worker", e))?;
    /// assert!(cancel.is_cancelled());
    /// # Ok(()) }
    /// ```
    pub fn cancellation_token(&self, stop: StopOn) -> crate::Result<CancellationToken> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            crate::Error::config(
                "a lease's cancellation token needs a Tokio runtime to watch the lease: \
                 ask for it inside one (where the lease was acquired)",
            )
        })?;
        let token = CancellationToken::new();
        if stop.stops(self.state()) {
            token.cancel();
            return Ok(token);
        }
        let (signal, watcher) = (self.clone(), token.clone());
        runtime.spawn(async move {
            tokio::select! {
                () = signal.until(stop) => watcher.cancel(),
                () = watcher.cancelled() => {}
            }
        });
        Ok(token)
    }
}

impl IntoFuture for LostSignal {
    type Output = ();
    type IntoFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.wait())
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("lost", &self.is_lost())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// A change made while no signal listens wakes nobody (nobody to wake), and loses
    /// nothing: a signal made after it sees it at once, and one made before a later change
    /// is woken by that change.
    #[tokio::test]
    async fn a_change_nobody_listens_to_is_seen_by_the_next_signal() {
        let tracker = LeaseTracker::new(Instant::now() + Duration::from_secs(60));
        assert!(tracker.at_risk());
        let late = tracker.signal();
        assert_eq!(late.state(), LeaseState::AtRisk, "missed the silent change");
        let waiting = tokio::spawn(late.clone().wait());
        tokio::task::yield_now().await;
        assert!(tracker.mark_lost());
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap_or_else(|_| panic!("a listening signal was not woken by the loss"))
            .unwrap_or_else(|e| panic!("{e}"));
        let released = LeaseTracker::new(Instant::now() + Duration::from_secs(60));
        released.mark_released();
        let after = released.signal();
        assert!(after.is_lost(), "a signal made after the release");
        tokio::time::timeout(Duration::from_secs(5), after.wait())
            .await
            .unwrap_or_else(|_| panic!("a signal made after the release waited"));
    }
}
