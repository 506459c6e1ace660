//! The in-process link of a faulty control client: what a fault proxy does to a networked
//! driver's traffic, acted out on its calls; and the leases whose renewals cross it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{drift, release_with_retries, LeaseOps};
use lock_core::{Error, Lease, LockName, Result};
use tokio::sync::watch;

use super::Flaw;
use crate::safety::CUT_NOTICE;
use crate::witness::Witness;
use crate::{Fault, Link};

/// One client's link: the fault in force, and what happened to it so far.
#[derive(Debug)]
pub(super) struct Wire {
    fault: watch::Sender<Fault>,
    cuts: AtomicU64,
    /// The same count, for the leases that wait for a cut ([`Flaw::SessionLostLate`]).
    cut: watch::Sender<u64>,
    /// Ever blackholed ([`Flaw::NeverReconnects`] stays down after that).
    partitioned: AtomicBool,
    /// Cut since the last crossing: the next one reconnects ([`Flaw::BlocksOnReconnect`]).
    reconnecting: AtomicBool,
    /// Told of every cut of this link, with every other client's ([`Flaw::CutGrantsTwoWaiters`]).
    cut_anywhere: Arc<tokio::sync::Notify>,
    /// When each request set out, oldest first ([`Link::first_sent_since`]).
    sent: parking_lot::Mutex<Vec<Instant>>,
}

impl Wire {
    pub(super) fn new(fault: Fault, cut_anywhere: Arc<tokio::sync::Notify>) -> Arc<Self> {
        Arc::new(Wire {
            fault: watch::channel(fault).0,
            cuts: AtomicU64::new(0),
            cut: watch::channel(0).0,
            partitioned: AtomicBool::new(false),
            reconnecting: AtomicBool::new(false),
            cut_anywhere,
            sent: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// How many times this link was cut so far.
    pub(super) fn cut_count(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }

    /// The delay in force, if any.
    pub(super) fn delay(&self) -> Option<Duration> {
        match *self.fault.borrow() {
            Fault::Delay(d) => Some(d),
            _ => None,
        }
    }

    /// Resolves at the next cut of this link.
    pub(super) fn next_cut(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut cut = self.cut.subscribe();
        let at = *cut.borrow();
        async move {
            let _ = cut.wait_for(|n| *n != at).await;
        }
    }

    fn down(&self) -> bool {
        *self.fault.borrow() == Fault::Blackhole
    }

    /// Crossing the link: held while it is blackholed (it flows once healed, as a
    /// TCP retransmission would); under [`Flaw::NeverReconnects`], refused for good once the
    /// link has been down.
    pub(super) async fn cross(&self, flaw: Flaw) -> Result<()> {
        self.sent.lock().push(Instant::now());
        if flaw == Flaw::NeverReconnects && self.partitioned.load(Ordering::Relaxed) {
            return Err(Error::unavailable(
                "flawed-memory",
                "the connection broke and this client never reconnects",
            ));
        }
        if flaw == Flaw::BlocksOnReconnect && self.reconnecting.swap(false, Ordering::Relaxed) {
            std::thread::sleep(super::BLOCKING_CALL); // a blocking dial
        }
        let mut rx = self.fault.subscribe();
        let _ = rx.wait_for(|f| *f != Fault::Blackhole).await;
        Ok(())
    }

    /// A request crossing the link that gives up, as a networked driver's does, after
    /// [`REQUEST_TIMEOUT`] of a blackholed link; under [`Flaw::HangsWhileUnreachable`] it
    /// waits for the link however long that takes.
    pub(super) async fn request(&self, flaw: Flaw) -> Result<()> {
        if flaw == Flaw::HangsWhileUnreachable {
            return self.cross(flaw).await;
        }
        tokio::time::timeout(REQUEST_TIMEOUT, self.cross(flaw))
            .await
            .map_err(|_| {
                Error::unavailable(
                    "flawed-memory",
                    "no reply within the request timeout: the link is down",
                )
            })?
    }
}

/// How long a linked client's request waits for a blackholed link before it fails.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// The [`Link`] a faulty control client hands to the suite.
#[derive(Debug)]
pub(super) struct WireLink(pub(super) Arc<Wire>);

impl Link for WireLink {
    fn first_sent_since(&self, since: Instant) -> Option<Instant> {
        // Pushed from any thread: not sorted for sure.
        let sent = self.0.sent.lock();
        sent.iter().filter(|t| **t >= since).min().copied()
    }

    fn set(&self, fault: Fault) {
        match fault {
            Fault::Cut => {
                self.0.cuts.fetch_add(1, Ordering::Relaxed);
                self.0.reconnecting.store(true, Ordering::Relaxed);
                self.0.cut.send_modify(|n| *n += 1);
                self.0.cut_anywhere.notify_waiters();
            }
            f => {
                if f == Fault::Blackhole {
                    self.0.partitioned.store(true, Ordering::Relaxed);
                }
                self.0.fault.send_replace(f);
            }
        }
    }

    /// When this process could first have recorded a notice of the next cut, its stalls
    /// included: a task woken by the cut wakes a second task (the holder's notice takes the
    /// same two wake-ups: the lease's task marks it Lost, the history's recorder is woken by
    /// its lost signal), which then ticks every millisecond for [`CUT_NOTICE`]; the time the
    /// ticks took beyond that is time the runtime did not run, and moves the moment seen on by
    /// as much. On a loaded machine the operating system deschedules the whole process: the
    /// unbroken session-bound wrapper, on one thread, was granted away 15 ms after its
    /// witness saw the cut, and noticed 0.3 ms after that (a clean run's lanes, 2026-11-30); a
    /// window fixed from the witness's wake-up charged that stall to the driver. A driver that
    /// notices later than its runtime could (`Flaw::SessionLostByPolling`,
    /// `Flaw::SessionLostLate`) is still caught: its lateness is not a stall.
    fn witness(&self) -> Option<Witness> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let (seen_tx, seen) = tokio::sync::oneshot::channel();
        let (woken_tx, woken) = tokio::sync::oneshot::channel::<()>();
        let next = self.0.next_cut();
        rt.spawn(async move {
            // Within a second, as a socket's witness: a cut comes right after arming.
            if tokio::time::timeout(Duration::from_secs(1), next)
                .await
                .is_ok()
            {
                let _ = woken_tx.send(());
            }
        });
        rt.spawn(async move {
            if woken.await.is_ok() {
                let at = Instant::now();
                let _ = seen_tx.send(at + stalls_within(CUT_NOTICE).await);
            }
        });
        Some(Witness::of_parts(seen))
    }
}

/// The time the runtime did not run while this task ticked through `window` of the time it
/// did: each millisecond tick is measured from the one before, and what one took beyond two
/// ticks (a timer rounds a sleep up to its next millisecond) was a stall. Ticks measured
/// against fixed due times hid a stall inside the window: the ticks after it were due
/// already, and returned at once (a clean run of `dc548bb`: a 10 ms stall right after the
/// cut, the holder's notice 10.6 ms after the witness, no stall counted).
async fn stalls_within(window: Duration) -> Duration {
    let tick = Duration::from_millis(1);
    let (mut ran, mut stalled) = (Duration::ZERO, Duration::ZERO);
    let mut last = Instant::now();
    while ran < window {
        tokio::time::sleep(tick).await;
        let now = Instant::now();
        let step = now - last;
        let late = step.saturating_sub(tick * 2);
        (ran, stalled, last) = (ran + (step - late), stalled + late, now);
    }
    stalled
}

/// A store lease whose renewals and release cross a [`Wire`], tracked by a
/// [`ManagedLease`](lock_core::driver::ManagedLease) as a networked driver's would be.
#[derive(Debug)]
pub(super) struct WiredOps {
    pub(super) store: Arc<tokio::sync::Mutex<Option<Box<dyn Lease>>>>,
    pub(super) wire: Arc<Wire>,
    pub(super) flaw: Flaw,
    pub(super) name: LockName,
    pub(super) ttl: Duration,
    /// The wire's cuts when the lock was granted.
    pub(super) cuts: u64,
    /// The lock is the connection's session: a cut frees it.
    session_bound: bool,
    /// Renewed by the watchdog ([`Flaw::AutoRenewValidityFromReply`]).
    auto: bool,
}

impl WiredOps {
    /// `ttl`: the TTL the client asked for (what it believes it renews by).
    pub(super) fn new(
        lease: Box<dyn Lease>,
        ttl: Duration,
        wire: Arc<Wire>,
        flaw: Flaw,
        session_bound: bool,
        auto: bool,
    ) -> Self {
        let ops = WiredOps {
            auto,
            name: lease.name().clone(),
            ttl,
            store: Arc::new(tokio::sync::Mutex::new(Some(lease))),
            cuts: wire.cuts.load(Ordering::Relaxed),
            wire,
            flaw,
            session_bound,
        };
        if session_bound {
            // The backend ends the session with the connection: the lock is freed at once.
            let (store, mut cut) = (Arc::downgrade(&ops.store), ops.wire.cut.subscribe());
            tokio::spawn(async move {
                if cut.changed().await.is_ok() {
                    if let Some(store) = store.upgrade() {
                        if let Some(l) = store.lock().await.take() {
                            let _ = l.release().await;
                        }
                    }
                }
            });
        }
        ops
    }
}

#[async_trait]
impl LeaseOps for WiredOps {
    fn backend(&self) -> &'static str {
        if self.flaw == Flaw::LeaseReportsAsAnotherBackend {
            "memory"
        } else {
            "flawed-memory"
        }
    }

    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        if self.flaw == Flaw::RenewsBlindWhilePartitioned && self.wire.down() {
            return Ok(start + self.ttl);
        }
        if self.flaw == Flaw::CutLosesLease && self.wire.cuts.load(Ordering::Relaxed) != self.cuts {
            // Like a driver whose leases die with their connection: the lock is let go.
            if let Some(l) = self.store.lock().await.take() {
                let _ = l.release().await;
            }
            return Err(Error::not_held(&self.name));
        }
        self.wire.request(self.flaw).await?;
        // Through a delayed link the request takes the delay to arrive, the reply again.
        let delay = self.wire.delay();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        {
            let store = self.store.lock().await;
            let lease = store.as_ref().ok_or_else(|| Error::not_held(&self.name))?;
            lease.renew().await?;
        }
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        if self.auto && self.flaw == Flaw::AutoRenewValidityFromReply {
            return Ok(Instant::now() + self.ttl - drift(self.ttl));
        }
        Ok(start + self.ttl - drift(self.ttl))
    }

    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        self.wire.request(self.flaw).await?;
        let store = self.store.lock().await;
        let lease = store.as_ref().ok_or_else(|| Error::not_held(&self.name))?;
        lease.proclaim(value).await
    }

    /// Through a delayed link the request takes the delay to arrive, and a cut meanwhile loses
    /// it: an error, the lock still held, for the caller's retries (under
    /// [`Flaw::FailedReleaseLeftToTtl`], left to expire).
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        self.wire.request(self.flaw).await?;
        if let Some(delay) = self.wire.delay() {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.wire.next_cut() => {
                    if self.flaw == Flaw::FailedReleaseLeftToTtl {
                        if let Some(l) = self.store.lock().await.take() {
                            l.abandon();
                        }
                    }
                    return Err(Error::unavailable(
                        "flawed-memory",
                        "the connection dropped with the release on its way",
                    ));
                }
            }
        }
        let lease = self.store.lock().await.take();
        lease
            .ok_or_else(|| Error::not_held(&self.name))?
            .release()
            .await
    }

    /// A session-bound lease learns of a cut at once, except under
    /// [`Flaw::SessionLostLate`], where only its next renewal finds the lock gone, and under
    /// [`Flaw::SessionLostByPolling`], where it looks every sixth of the TTL from its grant.
    fn ended(&self) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        if !self.session_bound || self.flaw == Flaw::SessionLostLate {
            return None;
        }
        let at_grant = self.cuts;
        if self.flaw == Flaw::SessionLostByPolling {
            let (wire, every) = (self.wire.clone(), self.ttl / 6);
            return Some(Box::pin(async move {
                loop {
                    tokio::time::sleep(every).await;
                    if wire.cuts.load(Ordering::Relaxed) != at_grant {
                        return;
                    }
                }
            }));
        }
        let mut cut = self.wire.cut.subscribe();
        Some(Box::pin(async move {
            let _ = cut.wait_for(|n| *n != at_grant).await;
        }))
    }

    /// Sent again until it gets through, as by default, except under
    /// [`Flaw::DroppedReleaseSentOnce`].
    fn release_on_drop(self: Arc<Self>, until: Instant) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            if self.flaw == Flaw::DroppedReleaseSentOnce {
                if self.release(until).await.is_err() {
                    // Nobody sends it again: on a server the lock would wait out its TTL (the
                    // store lease must not be dropped, which would release it).
                    if let Some(l) = self.store.lock().await.take() {
                        l.abandon();
                    }
                }
            } else {
                let _ = release_with_retries(self, until).await;
            }
        });
    }

    fn abandon(&self) {
        if let Ok(mut store) = self.store.try_lock() {
            if let Some(l) = store.take() {
                l.abandon();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire's witness sees the cut that follows it, promptly, and nothing when no cut
    /// comes (a witness that saw the arming, or a heal, would excuse any late notice).
    #[tokio::test]
    async fn a_wire_witness_sees_a_cut_and_nothing_else() {
        let link = WireLink(Wire::new(
            Fault::Healed,
            Arc::new(tokio::sync::Notify::new()),
        ));
        let mut w = link
            .witness()
            .unwrap_or_else(|| panic!("no witness on a runtime"));
        assert!(w.armed().await);
        let cut = Instant::now();
        link.set(Fault::Cut);
        let seen = w
            .seen()
            .await
            .unwrap_or_else(|| panic!("the cut was not seen"));
        assert!(seen >= cut && seen - cut < Duration::from_millis(500));
        let mut w = link
            .witness()
            .unwrap_or_else(|| panic!("no witness on a runtime"));
        assert!(w.armed().await);
        link.set(Fault::Blackhole);
        link.set(Fault::Healed);
        assert!(
            w.seen().await.is_none(),
            "a witness saw a cut that never came"
        );
    }

    /// A stall in the middle of the window is counted (fixed due times hid it: every tick after
    /// it was due already). That a runtime that runs counts too little to excuse a late
    /// notice is the negative controls' (`SessionLostByPolling` is caught).
    #[tokio::test(flavor = "current_thread")]
    async fn a_stall_inside_the_window_is_counted() {
        let ticking = tokio::spawn(stalls_within(CUT_NOTICE));
        tokio::time::sleep(Duration::from_millis(2)).await;
        // The whole runtime stops, as when the operating system deschedules the process, and
        // resumes before the window's 10 ms are over.
        std::thread::sleep(Duration::from_millis(6));
        let stalled = ticking.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            stalled >= Duration::from_millis(3),
            "a 6 ms stall inside the window counted as {stalled:?}"
        );
    }
}
