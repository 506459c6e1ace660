//! The flawed leases, and the ghosts a cancelled acquire or a dropped lease leaves behind.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::LeaseTracker;
use lock_core::{
    DistributedLock, Error, FencingToken, Lease, LeaseState, LockName, LockOptions, LostSignal,
    Renewal, Result, MAX_TTL,
};
use tracing::Instrument;

use super::harness::*;
use super::report::Reports;
use super::*;

/// On drop while armed (the acquire future was cancelled), leaves a ghost holder behind for
/// a long TTL, recorded at once so no later waiter can get ahead of it.
pub(super) struct Ghost {
    pub(super) shared: Arc<Shared>,
    pub(super) name: LockName,
    pub(super) ttl: Duration,
    pub(super) armed: bool,
}

impl Drop for Ghost {
    fn drop(&mut self) {
        if self.armed {
            self.shared
                .ghosts
                .lock()
                .insert(self.name.clone(), Instant::now() + self.ttl);
        }
    }
}

/// [`Flaw::DropKeepsLock`]: a lease dropped without release leaves a ghost holder.
#[derive(Debug)]
pub(super) struct DropGhost {
    pub(super) armed: bool,
    pub(super) shared: Arc<Shared>,
    pub(super) ttl: Duration,
}

/// Which way the wire moved `valid_until` from the store's view.
#[derive(Debug, Clone, Copy)]
pub(super) enum Shift {
    Earlier(Duration),
    Later(Duration),
}

#[derive(Debug)]
pub(super) struct FlawedLease {
    pub(super) inner: Box<dyn Lease>,
    pub(super) resurrected: Mutex<Option<Box<dyn Lease>>>,
    pub(super) never_lost: Option<LeaseTracker>,
    /// The flaw's lost signal in place of the store's ([`FlawedLock::own_lost`]).
    pub(super) own_lost: Option<LostSignal>,
    pub(super) lock: FlawedLock,
    pub(super) opts: LockOptions,
    pub(super) claimed_valid_until: Instant,
    pub(super) shift: Shift,
    /// Subtracted from the store's token ([`Flaw::CounterForgetsIdleNames`]).
    pub(super) offset: u64,
    pub(super) drop_ghost: DropGhost,
    /// Ended by `abandon`.
    pub(super) abandoned: bool,
    /// Ended by `release`.
    pub(super) released: bool,
    /// Renewed by hand at least once.
    pub(super) renewed: AtomicBool,
    /// `renew` calls the store confirmed ([`Flaw::ManualRenewalsUncounted`] leaves them out).
    pub(super) manual_renewals: AtomicU64,
    /// A renewal is under way ([`Flaw::CancelledRenewLeavesAtRisk`]).
    pub(super) renewing: AtomicBool,
    /// Struck by [`Flaw::IntermittentSilentLoss`]: Held, its signal pending, whatever happens.
    pub(super) silent: bool,
    /// What this lease reports ([`FlawedLock::wrap`] sets it once the lease is made).
    pub(super) reports: Option<Reports>,
}

impl Drop for FlawedLease {
    fn drop(&mut self) {
        let live = !self.released && !self.abandoned;
        if let (true, Some(r)) = (live, &self.reports) {
            r.ended("dropped");
        }
        if self.lock.flaw == Flaw::DropReleasesByName && live {
            self.lock.inner.break_lock(self.inner.name());
        }
        if let (Flaw::DroppedLeaseKeepsRenewing, true, Renewal::Auto { .. }, Ok(rt)) = (
            self.lock.flaw,
            live,
            self.opts.renewal,
            tokio::runtime::Handle::try_current(),
        ) {
            // The store lease, auto-renewed, outlives its handle by ten TTLs.
            let name = self.inner.name().clone();
            let zombie = std::mem::replace(&mut self.inner, Box::new(Released(name)));
            let ttl = self.opts.ttl;
            rt.spawn(async move {
                tokio::time::sleep(ttl * 10).await;
                let _ = zombie.release().await;
            });
        }
        if self.drop_ghost.armed {
            let s = &self.drop_ghost.shared;
            s.ghosts.lock().insert(
                self.inner.name().clone(),
                Instant::now() + self.drop_ghost.ttl,
            );
        }
        if let Some(t) = self.never_lost.take() {
            let keep = match self.lock.flaw {
                Flaw::LostSignalNeverFires => true,
                Flaw::AbandonKeepsLostPending => self.abandoned,
                Flaw::ReleaseLeavesLostPending => self.released,
                _ => false,
            };
            if keep {
                // Kept alive, so the signal never resolves.
                self.lock.shared.kept.lock().push(t);
            } else {
                t.mark_released();
            }
        }
    }
}

impl FlawedLease {
    /// The current grant of this lease's name is its client's (this lease's or a newer one).
    fn own_client_holds(&self) -> bool {
        self.lock
            .shared
            .grants
            .lock()
            .get(self.inner.name())
            .is_some_and(|g| g.client == self.lock.id)
    }

    /// The `valid_until` of the lock a resurrecting renewal re-took, while it lasts.
    fn resurrected_valid_until(&self) -> Option<Instant> {
        let slot = self.resurrected.lock();
        let until = slot.as_ref()?.valid_until();
        (until > Instant::now()).then_some(until)
    }
}

#[async_trait]
impl Lease for FlawedLease {
    fn name(&self) -> &LockName {
        self.inner.name()
    }
    /// The store lease renews (by its watchdog, and for every `renew` that reaches it).
    fn renewals(&self) -> Option<u64> {
        let n = self.inner.renewals()?;
        if self.lock.flaw == Flaw::ManualRenewalsUncounted {
            return Some(n.saturating_sub(self.manual_renewals.load(Ordering::Relaxed)));
        }
        Some(n)
    }
    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        self.lock.proclaim_flawed(&*self.inner, value).await
    }
    /// The store says nothing; the control names a key as a driver would.
    fn backend_key(&self) -> Option<String> {
        Some(match self.lock.flaw {
            Flaw::BackendKeyIgnoresName => "flawed:locks".to_string(),
            Flaw::BackendKeyWithoutNamespace => format!("locks/{}", self.inner.name()),
            Flaw::BackendKeyTruncated => {
                let n = self.inner.name().as_str();
                format!("flawed:locks/{}", &n[..n.len().min(100)])
            }
            _ => format!("flawed:locks/{}", self.inner.name()),
        })
    }
    fn fencing_token(&self) -> Option<FencingToken> {
        let t = self.inner.fencing_token()?;
        let t = FencingToken::new(t.get().saturating_sub(self.offset).max(1));
        Some(match self.lock.flaw {
            Flaw::NonMonotonicFencing => FencingToken::new(1_000_000u64.saturating_sub(t.get())),
            Flaw::TokensFollowTheClock => FencingToken::new(
                t.get()
                    .saturating_add(super::harness::time_of_day_ms(&self.lock.shared)),
            ),
            // As if the renewal ran the counter's increment again.
            Flaw::TokenChangesOnRenew if self.renewed.load(Ordering::Relaxed) => {
                FencingToken::new(t.get().saturating_add(1))
            }
            _ => t,
        })
    }
    fn ttl(&self) -> Duration {
        match self.lock.flaw {
            Flaw::GrantedTtlRoundedDown => {
                let tenths = self.opts.ttl.as_millis() / 100;
                Duration::from_millis(
                    u64::try_from(tenths)
                        .unwrap_or(u64::MAX)
                        .saturating_mul(100),
                )
            }
            Flaw::TtlInflated => inflated(self.opts.ttl),
            _ => self.opts.ttl,
        }
    }
    fn valid_until(&self) -> Instant {
        // A resurrecting renewal reports the validity of the lock it re-took, as a driver
        // that re-acquires would.
        if let Some(until) = self.resurrected_valid_until() {
            return until;
        }
        match self.lock.flaw {
            // A linked lease already claims the full TTL from before each request (and keeps
            // claiming it as it renews); an in-process one claims it once, at the grant.
            Flaw::NoExpiry | Flaw::EarlyExpiry | Flaw::TtlRoundedDown
                if self.lock.link.is_none() =>
            {
                self.claimed_valid_until
            }
            Flaw::LostSignalNeverFires => Instant::now() + self.opts.ttl,
            // A networked driver's conservative validity, the drift allowance before the end
            // of the TTL it asked for, while the store keeps the grant a TTL longer; its
            // renewals are sent without a look at it (the store's lease renews until its own
            // expiry). The drift alone (4 ms at this TTL) was a window a loaded machine's
            // timer overshot in 3 of 10 runs, and the control passed.
            Flaw::RenewInDriftRevives => self
                .inner
                .valid_until()
                .checked_sub(self.opts.ttl + lock_core::driver::drift(self.opts.ttl))
                .unwrap_or_else(Instant::now),
            Flaw::ValidityBeyondTtl => self.inner.valid_until() + self.opts.ttl / 2,
            // Once renewed, the claim runs a third of a TTL past what the store granted.
            Flaw::RenewOverstatesValidity if self.renewed.load(Ordering::Relaxed) => {
                self.inner.valid_until() + self.opts.ttl / 3
            }
            _ => match self.shift {
                Shift::Earlier(d) => self.inner.valid_until() - d,
                Shift::Later(d) => self.inner.valid_until() + d,
            },
        }
    }
    fn state(&self) -> LeaseState {
        if self.resurrected_valid_until().is_some() {
            return LeaseState::Held;
        }
        if self.silent {
            return LeaseState::Held;
        }
        match self.lock.flaw {
            Flaw::LostSignalNeverFires => LeaseState::Held,
            Flaw::CancelledRenewLeavesAtRisk if self.renewing.load(Ordering::SeqCst) => {
                LeaseState::AtRisk
            }
            _ => self.inner.state(),
        }
    }
    fn lost(&self) -> LostSignal {
        if let Some(own) = &self.own_lost {
            return own.clone();
        }
        match &self.never_lost {
            Some(t) => t.signal(),
            None => self.inner.lost(),
        }
    }
    async fn renew(&self) -> Result<()> {
        let Some(reports) = &self.reports else {
            return self.renew_flawed().await;
        };
        let span = reports.report.renew_span("manual");
        let r = self.renew_flawed().instrument(span.clone()).await;
        let outcome = match &r {
            Ok(()) => "renewed",
            Err(e) if e.is_retryable() => "failed",
            Err(_) => "refused",
        };
        span.in_scope(|| reports.report.renewal("manual", outcome));
        r
    }
    async fn release(self: Box<Self>) -> Result<()> {
        let Some(reports) = &self.reports else {
            return self.release_flawed().await;
        };
        let span = reports.report.release_span();
        // Ended before the store's lease is released, whose signal would read as a loss.
        reports.ended("released");
        let r = self.release_flawed().instrument(span.clone()).await;
        span.record(
            "lock.outcome",
            match &r {
                Ok(()) => "released",
                Err(Error::NotHeld { .. }) => "not_held",
                Err(_) => "error",
            },
        );
        r
    }
    fn abandon(self: Box<Self>) {
        if let Some(r) = &self.reports {
            r.ended("abandoned");
        }
        self.abandon_flawed();
    }
}

impl FlawedLease {
    /// `renew` under the flaw (the trait's reports around it).
    async fn renew_flawed(&self) -> Result<()> {
        if self.lock.flaw == Flaw::RenewIsANoOp {
            return Ok(());
        }
        // Reported AtRisk until the renewal ends, which a cancelled one never does.
        self.renewing.store(true, Ordering::SeqCst);
        if self.lock.flaw == Flaw::CancelledRenewLeavesAtRisk {
            tokio::task::yield_now().await;
        }
        let r = self.inner.renew().await;
        self.renewing.store(false, Ordering::SeqCst);
        if r.is_ok() {
            self.renewed.store(true, Ordering::Relaxed);
            self.manual_renewals.fetch_add(1, Ordering::Relaxed);
        }
        let resurrect = match self.lock.flaw {
            Flaw::RenewResurrects => true,
            Flaw::StaleRenewExtendsSameClient => self.own_client_holds(),
            // Refused before any request once expired by its own clock, as most drivers do.
            Flaw::BrokenRenewExtendsSameClient => {
                self.inner.valid_until() > Instant::now() && self.own_client_holds()
            }
            _ => false,
        };
        if r.is_err()
            && self.lock.flaw == Flaw::RenewWithoutOwnerCheck
            && self.lock.inner.inspect(self.inner.name()).await?.is_some()
        {
            return Ok(());
        }
        if r.is_err() && resurrect {
            let opts = self.lock.inner_opts(&self.opts).manual_renewal();
            // Both set the lock blindly (a SET without a check of who holds it), over
            // whoever took it meanwhile.
            self.lock.inner.break_lock(self.inner.name());
            if let Some(l) = self
                .lock
                .inner
                .try_acquire(self.inner.name(), &opts)
                .await?
            {
                {
                    let mut slot = self.resurrected.lock();
                    *slot = Some(l);
                }
                return Ok(());
            }
        }
        r
    }

    /// `release` under the flaw (the trait's reports around it).
    async fn release_flawed(mut self: Box<Self>) -> Result<()> {
        self.drop_ghost.armed = false;
        self.released = true;
        let lock = self.lock.clone();
        let opts = self.opts.clone();
        let name = self.inner.name().clone();
        let mut inner = std::mem::replace(&mut self.inner, Box::new(Released(name.clone())));
        if lock.flaw == Flaw::CancelledReleaseKeepsLock {
            // Finished before the request goes out: dropped here, the lease is abandoned.
            let mut parked = AbandonOnDrop(Some(inner));
            tokio::task::yield_now().await;
            inner = parked
                .0
                .take()
                .unwrap_or_else(|| Box::new(Released(name.clone())));
        }
        let valid_until = inner.valid_until();
        let r = if lock.flaw == Flaw::ReleaseOnlyStopsRenewal {
            inner.abandon();
            Ok(())
        } else {
            inner.release().await
        };
        if r.is_ok() {
            lock.released(&name, opts.ttl, valid_until);
        }
        match lock.flaw {
            Flaw::ReleaseWithoutOwnerCheck if r.is_err() => {
                lock.inner.break_lock(&name);
                Ok(())
            }
            // A stale release of a reader or a permit takes every holder of the name with it.
            Flaw::StaleReleaseFreesAll if r.is_err() && opts.mode != lock_core::Mode::Exclusive => {
                lock.inner.break_lock(&name);
                r
            }
            Flaw::OwnerIsTheClient
                if r.is_err()
                    && lock
                        .shared
                        .grants
                        .lock()
                        .get(&name)
                        .is_some_and(|g| g.client == lock.id) =>
            {
                lock.inner.break_lock(&name);
                Ok(())
            }
            Flaw::ReleaseByPrefix if r.is_ok() => {
                // A delete by pattern (`name*`): every lock whose name extends this one goes
                // too.
                let longer: Vec<LockName> = lock
                    .shared
                    .grants
                    .lock()
                    .keys()
                    .filter(|k| k.as_str().starts_with(name.as_str()) && **k != name)
                    .cloned()
                    .collect();
                for k in &longer {
                    lock.inner.break_lock(k);
                }
                r
            }
            Flaw::ReleaseOfExpiredIsOk if r.is_err() => match lock.inner.inspect(&name).await? {
                None => Ok(()),
                Some(_) => r,
            },
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
    /// `abandon` under the flaw (the trait's reports around it).
    fn abandon_flawed(mut self: Box<Self>) {
        self.drop_ghost.armed = false;
        self.abandoned = true;
        let name = self.inner.name().clone();
        let inner = std::mem::replace(&mut self.inner, Box::new(Released(name)));
        match (self.lock.flaw, tokio::runtime::Handle::try_current()) {
            // Frees the lock at once: a crash simulated by `abandon` is not one.
            (Flaw::AbandonReleases, Ok(rt)) => {
                rt.spawn(async move {
                    let _ = inner.release().await;
                });
            }
            _ => inner.abandon(),
        }
    }
}

/// What is left in a [`FlawedLease`] once its store lease was released or abandoned.
#[derive(Debug)]
pub(super) struct Released(LockName);

#[async_trait]
impl Lease for Released {
    fn name(&self) -> &LockName {
        &self.0
    }
    fn fencing_token(&self) -> Option<FencingToken> {
        None
    }
    fn ttl(&self) -> Duration {
        Duration::ZERO
    }
    fn valid_until(&self) -> Instant {
        Instant::now()
    }
    fn state(&self) -> LeaseState {
        LeaseState::Lost
    }
    fn lost(&self) -> LostSignal {
        LeaseTracker::new(Instant::now()).signal()
    }
    async fn renew(&self) -> Result<()> {
        Err(Error::not_held(&self.0))
    }
    async fn release(self: Box<Self>) -> Result<()> {
        Ok(())
    }
    fn abandon(self: Box<Self>) {}
}

/// [`Flaw::CancelledReleaseKeepsLock`], [`Flaw::CancelledGrantStays`]: a lease that, dropped,
/// is abandoned instead.
pub(super) struct AbandonOnDrop(pub(super) Option<Box<dyn Lease>>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        if let Some(l) = self.0.take() {
            l.abandon();
        }
    }
}

/// The TTL [`Flaw::TtlInflated`] grants for `ttl`, and honestly reports.
pub(super) fn inflated(ttl: Duration) -> Duration {
    (ttl * 3).min(MAX_TTL)
}
