//! Negative controls: deliberately broken drivers that the suite must catch.
//!
//! Each [`Flaw`] breaks one promise of the contract on top of the (correct) in-memory driver.
//! The suite's own tests run the cases each flaw names in [`Flaw::caught_by`] and assert that at
//! least one fails — and that [`Flaw::None`], the same wrapper with nothing broken, passes every
//! case, so the failures come from the flaw alone. A suite that passes a broken driver is the
//! worst bug this project can have.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::memory::MemoryLock;
use lock_core::{
    Capabilities, DistributedLock, Error, FencingToken, Lease, LeaseState, LeaseTracker, LockName,
    LockOptions, LostSignal, Renewal, Result, MAX_TTL,
};

use crate::{BoxError, Delayed, Harness, Timing};

/// One broken promise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Flaw {
    /// Nothing broken: must pass every case.
    None,
    /// Every client has its own store: two clients can hold one name.
    NoMutualExclusion,
    /// Locks never expire, whatever the TTL.
    NoExpiry,
    /// Locks expire at half their TTL while `valid_until` claims the whole TTL.
    EarlyExpiry,
    /// Release deletes the lock whoever holds it.
    ReleaseWithoutOwnerCheck,
    /// Renew of a lost lease re-acquires the lock and reports success.
    RenewResurrects,
    /// After release of an auto-renewed lease, a leftover renewal re-acquires the lock.
    WatchdogResurrects,
    /// Fencing tokens go down.
    NonMonotonicFencing,
    /// The lost signal never fires and the state is always Held.
    LostSignalNeverFires,
    /// Waiting `acquire` calls `try_acquire` every 2 ms.
    SpinningWaiter,
    /// `acquire` ignores its bounded wait and waits forever.
    IgnoresWaitTimeout,
    /// A cancelled waiting `acquire` leaves a ghost holder behind for many TTLs.
    CancelLeavesGhost,
    /// `inspect` says every lock is free.
    InspectBlind,
    /// A `try_acquire` cancelled while its request is in flight leaves the grant that request
    /// still gets to a ghost, until the TTL.
    CancelInFlightLeavesGhost,
    /// At `max_hold` the lock is freed on the backend while the lease still says Held and its
    /// lost signal fires only at `valid_until` (a watchdog that deletes, then marks Lost).
    MaxHoldFreesBeforeLost,
}

impl Flaw {
    /// Every flaw, [`Flaw::None`] first.
    pub const ALL: &'static [Flaw] = &[
        Flaw::None,
        Flaw::NoMutualExclusion,
        Flaw::NoExpiry,
        Flaw::EarlyExpiry,
        Flaw::ReleaseWithoutOwnerCheck,
        Flaw::RenewResurrects,
        Flaw::WatchdogResurrects,
        Flaw::NonMonotonicFencing,
        Flaw::LostSignalNeverFires,
        Flaw::SpinningWaiter,
        Flaw::IgnoresWaitTimeout,
        Flaw::CancelLeavesGhost,
        Flaw::InspectBlind,
        Flaw::CancelInFlightLeavesGhost,
        Flaw::MaxHoldFreesBeforeLost,
    ];

    /// The cases written to catch this flaw (at least one must fail).
    pub fn caught_by(self) -> &'static [&'static str] {
        match self {
            Flaw::None => &[],
            Flaw::NoMutualExclusion => &[
                "exclusion::single_winner_among_racers",
                "exclusion::held_lock_refuses_others",
                "exclusion::counter_loses_no_update",
            ],
            Flaw::NoExpiry => &["expiry::abandoned_lease_frees_after_ttl"],
            Flaw::EarlyExpiry => &["expiry::abandoned_lease_frees_after_ttl"],
            Flaw::ReleaseWithoutOwnerCheck => &[
                "ownership::stale_release_keeps_successor",
                "ownership::broken_lock_release_is_not_held",
            ],
            Flaw::RenewResurrects => &["renewal::renew_after_expiry_fails_and_does_not_recreate"],
            Flaw::WatchdogResurrects => &["renewal::watchdog_stops_after_release"],
            Flaw::NonMonotonicFencing => &[
                "fencing::tokens_increase_across_holders",
                "fencing::tokens_follow_grant_order_under_contention",
            ],
            Flaw::LostSignalNeverFires => &[
                "lost::lost_fires_before_successor_is_granted",
                "expiry::unrenewed_lease_turns_lost_at_valid_until",
            ],
            Flaw::SpinningWaiter => &["waiting::waiting_is_idle"],
            Flaw::IgnoresWaitTimeout => &["waiting::wait_timeout_is_respected"],
            Flaw::CancelLeavesGhost => &["waiting::cancelled_waiter_does_not_block_others"],
            Flaw::InspectBlind => &["inspect::inspect_reports_the_holder"],
            Flaw::CancelInFlightLeavesGhost => &["waiting::cancelled_in_flight_leaves_no_holder"],
            Flaw::MaxHoldFreesBeforeLost => &["lost::lost_fires_before_max_hold_successor"],
        }
    }
}

/// A [`Harness`] over a [`FlawedLock`] with one [`Flaw`].
#[derive(Debug)]
pub struct FlawedHarness {
    flaw: Flaw,
    store: MemoryLock,
    ghosts: Ghosts,
    timing: Timing,
}

/// Names held by ghosts of cancelled acquires, until when.
type Ghosts = Arc<Mutex<HashMap<LockName, Instant>>>;

impl FlawedHarness {
    /// A harness whose clients all share one store (except under
    /// [`Flaw::NoMutualExclusion`]).
    pub fn new(flaw: Flaw) -> Self {
        FlawedHarness {
            flaw,
            store: MemoryLock::new(),
            ghosts: Ghosts::default(),
            timing: Timing::for_ttl(Duration::from_millis(200)),
        }
    }
}

#[async_trait]
impl Harness for FlawedHarness {
    async fn client(&self) -> std::result::Result<Arc<dyn DistributedLock>, BoxError> {
        let inner = match self.flaw {
            Flaw::NoMutualExclusion => MemoryLock::new(),
            _ => self.store.clone(),
        };
        Ok(Arc::new(FlawedLock {
            inner,
            flaw: self.flaw,
            ghosts: self.ghosts.clone(),
            delay: None,
        }))
    }
    /// The same store, with every `try_acquire` landing `delay` after it was made, whether or
    /// not its caller still waits — like a request on the wire.
    async fn delayed_client(
        &self,
        delay: Duration,
    ) -> Option<std::result::Result<Delayed, BoxError>> {
        Some(Ok(Delayed {
            lock: Arc::new(FlawedLock {
                inner: self.store.clone(),
                flaw: self.flaw,
                ghosts: self.ghosts.clone(),
                delay: Some(delay),
            }),
            keep: Vec::new(),
        }))
    }
    fn timing(&self) -> Timing {
        self.timing
    }
    async fn backend_requests(&self) -> Option<u64> {
        Some(self.store.operations())
    }
    async fn break_lock(&self, name: &LockName) -> Option<std::result::Result<(), BoxError>> {
        self.store.break_lock(name);
        Some(Ok(()))
    }
}

/// The in-memory driver with one flaw.
#[derive(Debug, Clone)]
pub struct FlawedLock {
    inner: MemoryLock,
    flaw: Flaw,
    ghosts: Ghosts,
    /// For delayed clients: how long a `try_acquire` takes to reach the store.
    delay: Option<Duration>,
}

impl FlawedLock {
    /// Until when a ghost holds `name`, if one does.
    fn ghost(&self, name: &LockName) -> Option<Instant> {
        let ghosts = self.ghosts.lock().ok()?;
        ghosts.get(name).copied().filter(|t| *t > Instant::now())
    }

    fn inner_opts(&self, opts: &LockOptions) -> LockOptions {
        match self.flaw {
            Flaw::NoExpiry => opts.clone().ttl(MAX_TTL),
            Flaw::EarlyExpiry => opts
                .clone()
                .ttl((opts.ttl / 2).max(Duration::from_millis(1))),
            _ => opts.clone(),
        }
    }

    /// A `try_acquire` sent over a slow wire: it lands after `delay` even if the caller has
    /// gone. A correct client then releases the grant nobody waits for; the flawed one leaves it.
    async fn in_flight(
        &self,
        delay: Duration,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (inner, name, opts, flaw) = (
            self.inner.clone(),
            name.clone(),
            self.inner_opts(opts),
            self.flaw,
        );
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let r = inner.try_acquire(&name, &opts).await;
            if let Err(Ok(Some(orphan))) = tx.send(r) {
                if flaw == Flaw::CancelInFlightLeavesGhost {
                    orphan.abandon();
                } else {
                    let _ = orphan.release().await;
                }
            }
        });
        rx.await
            .map_err(|_| Error::unavailable("flawed-memory", "the in-flight request vanished"))?
    }

    fn wrap(&self, lease: Box<dyn Lease>, opts: &LockOptions, started: Instant) -> Box<dyn Lease> {
        let claimed_valid_until = started + opts.ttl;
        if let (Flaw::MaxHoldFreesBeforeLost, Renewal::Auto { max_hold: Some(m) }) =
            (self.flaw, opts.renewal)
        {
            let (inner, name) = (self.inner.clone(), lease.name().clone());
            tokio::spawn(async move {
                tokio::time::sleep_until((started + m).into()).await;
                inner.break_lock(&name);
            });
        }
        Box::new(FlawedLease {
            never_lost: (self.flaw == Flaw::LostSignalNeverFires)
                .then(|| LeaseTracker::new(Instant::now() + MAX_TTL)),
            inner: lease,
            resurrected: Mutex::new(None),
            lock: self.clone(),
            opts: opts.clone(),
            claimed_valid_until,
        })
    }
}

#[async_trait]
impl DistributedLock for FlawedLock {
    fn backend(&self) -> &'static str {
        "flawed-memory"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        match self.flaw {
            Flaw::InspectBlind => Ok(None),
            _ => self.inner.inspect(name).await,
        }
    }
    async fn try_acquire(
        &self,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        opts.validate(&self.capabilities())?;
        if self.ghost(name).is_some() {
            return Ok(None);
        }
        let started = Instant::now();
        let lease = match self.delay {
            None => self.inner.try_acquire(name, &self.inner_opts(opts)).await?,
            Some(delay) => self.in_flight(delay, name, opts).await?,
        };
        Ok(lease.map(|l| self.wrap(l, opts, started)))
    }
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Box<dyn Lease>> {
        opts.validate(&self.capabilities())?;
        let started = Instant::now();
        match self.flaw {
            Flaw::SpinningWaiter => {
                let deadline = opts.wait.deadline(started);
                loop {
                    if let Some(l) = self.try_acquire(name, opts).await? {
                        return Ok(l);
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::Timeout {
                            name: name.clone(),
                            waited: started.elapsed(),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            Flaw::IgnoresWaitTimeout => {
                let l = self
                    .inner
                    .acquire(name, &opts.clone().wait_forever())
                    .await?;
                Ok(self.wrap(l, opts, started))
            }
            Flaw::CancelLeavesGhost => {
                // The ghost of an earlier cancelled acquire holds the lock first.
                if let Some(until) = self.ghost(name) {
                    let deadline = opts.wait.deadline(started).map_or(until, |d| d.min(until));
                    tokio::time::sleep_until(deadline.into()).await;
                    if self.ghost(name).is_some() {
                        return Err(Error::Timeout {
                            name: name.clone(),
                            waited: started.elapsed(),
                        });
                    }
                }
                let mut ghost = Ghost {
                    ghosts: self.ghosts.clone(),
                    name: name.clone(),
                    ttl: opts.ttl * 50,
                    armed: true,
                };
                let l = self.inner.acquire(name, &self.inner_opts(opts)).await;
                ghost.armed = false;
                Ok(self.wrap(l?, opts, started))
            }
            _ => {
                let l = self.inner.acquire(name, &self.inner_opts(opts)).await?;
                Ok(self.wrap(l, opts, started))
            }
        }
    }
}

/// On drop while armed (the acquire future was cancelled), leaves a ghost holder behind for
/// a long TTL, recorded at once so no later waiter can get ahead of it.
struct Ghost {
    ghosts: Ghosts,
    name: LockName,
    ttl: Duration,
    armed: bool,
}

impl Drop for Ghost {
    fn drop(&mut self) {
        if self.armed {
            if let Ok(mut g) = self.ghosts.lock() {
                g.insert(self.name.clone(), Instant::now() + self.ttl);
            }
        }
    }
}

#[derive(Debug)]
struct FlawedLease {
    inner: Box<dyn Lease>,
    resurrected: Mutex<Option<Box<dyn Lease>>>,
    never_lost: Option<LeaseTracker>,
    lock: FlawedLock,
    opts: LockOptions,
    claimed_valid_until: Instant,
}

#[async_trait]
impl Lease for FlawedLease {
    fn name(&self) -> &LockName {
        self.inner.name()
    }
    fn fencing_token(&self) -> Option<FencingToken> {
        let t = self.inner.fencing_token()?;
        Some(match self.lock.flaw {
            Flaw::NonMonotonicFencing => FencingToken::new(1_000_000u64.saturating_sub(t.get())),
            _ => t,
        })
    }
    fn ttl(&self) -> Duration {
        self.opts.ttl
    }
    fn valid_until(&self) -> Instant {
        match self.lock.flaw {
            Flaw::NoExpiry | Flaw::EarlyExpiry => self.claimed_valid_until,
            Flaw::LostSignalNeverFires => Instant::now() + self.opts.ttl,
            _ => self.inner.valid_until(),
        }
    }
    fn state(&self) -> LeaseState {
        match self.lock.flaw {
            Flaw::LostSignalNeverFires => LeaseState::Held,
            _ => self.inner.state(),
        }
    }
    fn lost(&self) -> LostSignal {
        match &self.never_lost {
            Some(t) => t.signal(),
            None => self.inner.lost(),
        }
    }
    async fn renew(&self) -> Result<()> {
        let r = self.inner.renew().await;
        if r.is_err() && self.lock.flaw == Flaw::RenewResurrects {
            let opts = self.lock.inner_opts(&self.opts).manual_renewal();
            if let Some(l) = self
                .lock
                .inner
                .try_acquire(self.inner.name(), &opts)
                .await?
            {
                if let Ok(mut slot) = self.resurrected.lock() {
                    *slot = Some(l);
                }
                return Ok(());
            }
        }
        r
    }
    async fn release(self: Box<Self>) -> Result<()> {
        let FlawedLease {
            inner, lock, opts, ..
        } = *self;
        let name = inner.name().clone();
        let r = inner.release().await;
        match lock.flaw {
            Flaw::ReleaseWithoutOwnerCheck if r.is_err() => {
                lock.inner.break_lock(&name);
                Ok(())
            }
            Flaw::WatchdogResurrects if matches!(opts.renewal, Renewal::Auto { .. }) => {
                // Like a watchdog task nobody stopped: it keeps "renewing" (re-setting the
                // lock) every TTL/3 for a while.
                tokio::spawn(async move {
                    for _ in 0..9 {
                        tokio::time::sleep(opts.ttl / 3).await;
                        if let Ok(Some(l)) = lock
                            .inner
                            .try_acquire(&name, &opts.clone().manual_renewal())
                            .await
                        {
                            l.abandon();
                        }
                    }
                });
                r
            }
            _ => r,
        }
    }
    fn abandon(self: Box<Self>) {
        self.inner.abandon();
    }
}
