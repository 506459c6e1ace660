//! [`FlawedLock`]: the in-memory driver with one flaw acted out on its acquisition paths.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{self, Acquisition, LeaseTracker};
use lock_core::telemetry::{AcquireReport, Acquired};
use lock_core::{
    Capabilities, Deadline, DistributedLock, Error, Fencing, FencingToken, Lease, LockName,
    LockOptions, LostSignal, Renewal, Result, MAX_NAME_LEN, MAX_TTL,
};
use tracing::Instrument;

use super::harness::*;
use super::lease::*;
use super::pace::PacedLease;
use super::report::Reports;
use super::wire::{Wire, WiredOps};
use super::*;

impl FlawedLock {
    /// The backend key of `name` under this flaw.
    pub(super) fn key(&self, name: &LockName) -> Result<LockName> {
        let raw = name.as_str();
        match self.flaw {
            Flaw::NameTruncated if raw.len() >= MAX_NAME_LEN => {
                LockName::new(&raw[..MAX_NAME_LEN - 1])
            }
            Flaw::EscapingNotInjective if raw.contains('.') => {
                let escaped = raw.replace('.', "__");
                LockName::new(&escaped[..escaped.len().min(MAX_NAME_LEN)])
            }
            Flaw::NamesFoldCase => LockName::new(raw.to_lowercase()),
            _ => Ok(name.clone()),
        }
    }

    /// The delay on this client's link, if any.
    pub(super) fn delay(&self) -> Option<Duration> {
        self.link.as_ref().and_then(|w| w.delay())
    }

    /// A request crossing this client's link, if it has one ([`Wire::request`]).
    pub(super) async fn cross(&self) -> Result<()> {
        match &self.link {
            Some(w) => w.request(self.flaw).await,
            None => Ok(()),
        }
    }

    pub(super) fn capabilities_declared(&self) -> Capabilities {
        let caps = self
            .inner
            .capabilities()
            .with_max_ttl(Duration::from_secs(12 * 60 * 60))
            .with_outlives_connection(!self.shared.session_bound);
        match self.flaw {
            Flaw::FencingUndeclared => caps.with_fencing(Fencing::None),
            Flaw::ModeServedExclusive => caps.with_shared(false).with_permits(false),
            Flaw::ElectionUndeclared => caps.with_election(false),
            _ => caps,
        }
    }

    pub(super) fn inner_opts(&self, opts: &LockOptions) -> LockOptions {
        // A linked client's lease renews across its link, not straight on the store.
        let opts = match self.link {
            Some(_) => opts.clone().manual_renewal(),
            None => opts.clone(),
        };
        match self.flaw {
            Flaw::NoExpiry => opts.clone().ttl(MAX_TTL),
            Flaw::EarlyExpiry => opts
                .clone()
                .ttl((opts.ttl / 2).max(Duration::from_millis(1))),
            Flaw::TtlRoundedDown => {
                let tenths = (opts.ttl.as_millis() / 100).max(1);
                opts.clone().ttl(Duration::from_millis(
                    u64::try_from(tenths).unwrap_or(1) * 100,
                ))
            }
            Flaw::TtlInflated => opts.clone().ttl(inflated(opts.ttl)),
            // The store keeps each grant a TTL longer than the lease claims (as a server that
            // rounds a TTL up to whole seconds does): a window no scheduler delay closes.
            Flaw::RenewInDriftRevives => opts.clone().ttl((opts.ttl * 2).min(MAX_TTL)),
            Flaw::AutoRenewNeverRuns => opts.clone().manual_renewal(),
            // Renewed by the control's own watchdog instead ([`PacedLease`]).
            Flaw::WatchdogRenewsLate | Flaw::WatchdogSpins | Flaw::WatchdogBlocksTheRuntime
                if matches!(opts.renewal, Renewal::Auto { .. }) =>
            {
                opts.clone().manual_renewal()
            }
            Flaw::MaxHoldIgnored if matches!(opts.renewal, Renewal::Auto { .. }) => {
                opts.clone().auto_renew(None)
            }
            _ => self.election_opts(self.family_opts(&opts)),
        }
    }

    /// A grant of the store, wrapped: recorded, and given the flaw's behaviour.
    /// `landed`: when the request reached the store (later than `started` for a delayed
    /// client).
    pub(super) fn wrap(
        &self,
        lease: Box<dyn Lease>,
        opts: &LockOptions,
        started: Instant,
        landed: Instant,
    ) -> Box<dyn Lease> {
        let lease = match (&self.link, self.flaw, opts.renewal) {
            (Some(wire), _, _) => self.wired(lease, opts, started, wire.clone()),
            (
                None,
                Flaw::WatchdogRenewsLate | Flaw::WatchdogSpins | Flaw::WatchdogBlocksTheRuntime,
                Renewal::Auto { max_hold },
            ) => Box::new(PacedLease::new(lease, self.flaw, max_hold)),
            (None, _, _) => lease,
        };
        let name = lease.name().clone();
        let claimed_valid_until = started + opts.ttl;
        if let (Flaw::MaxHoldFreesBeforeLost, Renewal::Auto { max_hold: Some(m) }) =
            (self.flaw, opts.renewal)
        {
            let (inner, name) = (self.inner.clone(), name.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until((started + m).into()).await;
                inner.break_lock(&name);
            });
        }
        // Tokens restart at 1 for a name idle for two TTLs (the counter key expired).
        let mut offset = 0;
        if let Some(t) = lease.fencing_token() {
            self.shared.tokens.lock().insert(name.clone(), t.get());
            let mut idle = self.shared.idle.lock();
            let entry = idle.entry(name.clone()).or_insert((Instant::now(), 0));
            if self.flaw == Flaw::CounterForgetsIdleNames && entry.0 + opts.ttl * 2 < Instant::now()
            {
                entry.1 = t.get().saturating_sub(1);
            }
            offset = entry.1;
        }
        if let (
            Flaw::TakeoverKeepsToken,
            Some(t),
            Some(Grant {
                token: Some(prev), ..
            }),
        ) = (self.flaw, lease.fencing_token(), self.expired_grant(&name))
        {
            offset = t.get().saturating_sub(prev.get());
        }
        // A fast path that hands a client back the grant it has just released, token and all.
        if let (Flaw::RegrantKeepsToken, Some(t), Some((client, Some(prev)))) = (
            self.flaw,
            lease.fencing_token(),
            self.shared.released_by.lock().get(&name).copied(),
        ) {
            if client == self.id && t.get() == prev.get() + offset + 1 {
                offset += 1;
            }
        }
        let store_token = lease.fencing_token().map(|t| t.get());
        offset += self.family_offset(&name, opts.mode, store_token);
        let token = lease
            .fencing_token()
            .map(|t| FencingToken::new(t.get().saturating_sub(offset).max(1)));
        if token.is_some() {
            *self.shared.newest_token.lock() = token;
        }
        self.shared.grants.lock().insert(
            name,
            Grant {
                expires: started + opts.ttl,
                ttl: opts.ttl,
                token,
                client: self.id,
            },
        );
        let struck = self.strikes_this_grant();
        if struck && self.flaw == Flaw::IntermittentRepeatedToken {
            offset += 1;
        }
        // The store's validity starts when the request landed; the wire took `delay` each way.
        let shift = match (self.delay(), self.flaw) {
            _ if struck && self.flaw == Flaw::IntermittentOverstatedValidity => {
                Shift::Later(opts.ttl / 2)
            }
            (Some(_), Flaw::ValidUntilFromReply) => Shift::Later(landed.elapsed()),
            (_, Flaw::RegrantOverstatesValidity) => match self.fresh_release(opts.ttl, started) {
                // Counted from the end of the released lease's validity, not from `started`.
                Some(until) => Shift::Later(until.saturating_duration_since(started)),
                None => Shift::Earlier(landed.saturating_duration_since(started)),
            },
            _ => Shift::Earlier(landed.saturating_duration_since(started)),
        };
        let own_lost = self.own_lost(lease.as_ref(), opts.ttl);
        let silent = struck && self.flaw == Flaw::IntermittentSilentLoss;
        let mut flawed = FlawedLease {
            own_lost,
            never_lost: (matches!(
                self.flaw,
                Flaw::LostSignalNeverFires
                    | Flaw::AbandonKeepsLostPending
                    | Flaw::ReleaseLeavesLostPending
            ) || silent)
                .then(|| LeaseTracker::new(Instant::now() + MAX_TTL)),
            silent,
            inner: lease,
            resurrected: parking_lot::Mutex::new(None),
            lock: self.clone(),
            opts: opts.clone(),
            claimed_valid_until,
            shift,
            offset,
            drop_ghost: DropGhost {
                armed: self.flaw == Flaw::DropKeepsLock,
                shared: self.shared.clone(),
                ttl: opts.ttl * 50,
            },
            abandoned: false,
            released: false,
            renewed: AtomicBool::new(false),
            manual_renewals: std::sync::atomic::AtomicU64::new(0),
            renewing: AtomicBool::new(false),
            reports: None,
        };
        // A wired lease is a `ManagedLease` over the wire, which reports for itself.
        if self.link.is_none() {
            let named = flawed.inner.name().clone();
            flawed.reports = Some(Reports::granted(
                self.backend(),
                &named,
                self.flaw,
                flawed.lost(),
                flawed.valid_until(),
            ));
        }
        Box::new(flawed)
    }

    /// The lost signal a flaw puts in place of the store lease's, driven by a task that
    /// watches the store's: [`Flaw::RefusalNoticedLate`] fires a TTL after it,
    /// [`Flaw::LostTimerNotRenewed`] at the first `valid_until` whatever renewals came since.
    fn own_lost(&self, lease: &dyn Lease, ttl: Duration) -> Option<LostSignal> {
        if let (Flaw::LostSignalForgottenOnReconnect, Some(wire)) = (self.flaw, &self.link) {
            // The signal belongs to the connection it was made on: after a cut, a loss is
            // never told (its sender kept, so it never resolves).
            let (wire, at_grant, shared) = (wire.clone(), wire.cut_count(), self.shared.clone());
            let tracker = LeaseTracker::new(Instant::now() + MAX_TTL);
            let signal = tracker.signal();
            let store_lost = lease.lost();
            tokio::spawn(async move {
                store_lost.wait().await;
                if wire.cut_count() == at_grant {
                    tracker.mark_lost();
                } else {
                    shared.kept.lock().push(tracker);
                }
            });
            return Some(signal);
        }
        let first_expiry = match self.flaw {
            Flaw::RefusalNoticedLate => None,
            Flaw::LostTimerNotRenewed => Some(lease.valid_until()),
            _ => return None,
        };
        let tracker = LeaseTracker::new(Instant::now() + MAX_TTL);
        let signal = tracker.signal();
        let store_lost = lease.lost();
        tokio::spawn(async move {
            match first_expiry {
                None => {
                    store_lost.wait().await;
                    tokio::time::sleep(ttl).await;
                    tracker.mark_lost();
                }
                Some(at) => tokio::select! {
                    () = store_lost.wait() => tracker.mark_released(),
                    () = tokio::time::sleep_until(at.into()) => {
                        tracker.mark_lost();
                    }
                },
            }
        });
        Some(signal)
    }

    /// A store lease whose renewals cross `wire`, tracked as a networked driver's would be.
    /// Its validity is what a networked driver computes: from before the request, for the TTL
    /// it asked for, drift subtracted — so a flaw that makes the store expire sooner
    /// ([`Flaw::EarlyExpiry`], [`Flaw::TtlRoundedDown`]) is invisible to the holder, as it
    /// would be.
    fn wired(
        &self,
        lease: Box<dyn Lease>,
        opts: &LockOptions,
        started: Instant,
        wire: Arc<Wire>,
    ) -> Box<dyn Lease> {
        let grant = driver::Grant {
            token: lease.fencing_token(),
            ttl: opts.ttl,
            valid_until: started + opts.ttl - driver::drift(opts.ttl),
        };
        let name = lease.name().clone();
        let auto = matches!(opts.renewal, Renewal::Auto { .. });
        let ops = WiredOps::new(
            lease,
            opts.ttl,
            wire,
            self.flaw,
            self.shared.session_bound,
            auto,
        );
        Box::new(driver::ManagedLease::new(name, grant, opts.renewal, ops))
    }

    /// Forgets `name`'s grant after a release of a lease of `ttl`, valid until `valid_until`.
    pub(super) fn released(&self, name: &LockName, ttl: Duration, valid_until: Instant) {
        let s = &self.shared;
        if let Some(g) = s.grants.lock().remove(name) {
            let by = (self.id, g.token);
            s.released_by.lock().insert(name.clone(), by);
        }
        s.last_released.lock().insert(self.id, (ttl, valid_until));
        if let Some(e) = s.idle.lock().get_mut(name) {
            e.0 = Instant::now();
        }
    }

    /// The validity of the lease of `ttl` this client released last, if that lease was
    /// confirmed less than a tenth of the TTL before `started` (taken: used once).
    fn fresh_release(&self, ttl: Duration, started: Instant) -> Option<Instant> {
        let (t, until) = self.shared.last_released.lock().remove(&self.id)?;
        let confirmed = until.checked_sub(t)?;
        (t == ttl && started < confirmed + ttl / 10).then_some(until)
    }

    /// An expired grant of `name` that nobody released or replaced, if any.
    pub(super) fn expired_grant(&self, name: &LockName) -> Option<Grant> {
        let grants = self.shared.grants.lock();
        grants
            .get(name)
            .copied()
            .filter(|g| g.expires <= Instant::now())
    }

    /// Checks `opts` as this flaw does, for an acquisition of `key`.
    pub(super) async fn validate(&self, key: &LockName, opts: &LockOptions) -> Result<()> {
        let caps = match self.flaw {
            Flaw::MaxTtlNotEnforced => self.inner.capabilities(),
            _ => self.capabilities_declared(),
        };
        let checked = match self.flaw {
            Flaw::MinTtlRefused if opts.ttl == caps.min_ttl => Err(Error::InvalidOptions(format!(
                "ttl must be above {:?}",
                caps.min_ttl
            ))),
            Flaw::MinTtlUnavailable if opts.ttl == caps.min_ttl => Err(Error::unavailable(
                self.inner.backend(),
                "the grant arrived after the lease's validity had passed",
            )),
            Flaw::MinTtlAlwaysLate if opts.ttl == caps.min_ttl => {
                tokio::time::sleep(caps.min_ttl).await;
                Err(Error::unavailable(
                    self.inner.backend(),
                    "the grant arrived after the lease's validity had passed",
                ))
            }
            _ => opts.validate(&caps),
        };
        if checked.is_err() && self.flaw == Flaw::ValidatesAfterLocking {
            // The request went out before the check: its grant is left to expire.
            let sent = LockOptions::new(Duration::from_secs(10)).manual_renewal();
            if let Some(l) = self.inner.try_acquire(key, &sent).await? {
                l.abandon();
            }
        }
        checked.map(|_| ())
    }

    pub(super) fn timeout(name: &LockName, started: Instant) -> Error {
        Error::Timeout {
            name: name.clone(),
            waited: started.elapsed(),
        }
    }
}

#[async_trait]
impl DistributedLock for FlawedLock {
    fn backend(&self) -> &'static str {
        "flawed-memory"
    }
    fn capabilities(&self) -> Capabilities {
        self.capabilities_declared()
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        let key = self.key(name)?;
        self.cross().await?;
        let info = self.inner.inspect(&key).await?;
        match (self.flaw, info) {
            (Flaw::InspectBlind, _) => Ok(None),
            (Flaw::InspectShowsNewestToken, Some(i)) => Ok(Some(lock_core::HolderInfo::new(
                *self.shared.newest_token.lock(),
                i.remaining,
            ))),
            (Flaw::InspectShowsExpiredHolder, None) => Ok(self
                .expired_grant(&key)
                .map(|g| lock_core::HolderInfo::new(g.token, Some(Duration::ZERO)))),
            (Flaw::InspectRemainingIsTheTtl, Some(i)) => {
                let ttl = self.shared.grants.lock().get(&key).map(|g| g.ttl);
                Ok(Some(lock_core::HolderInfo::new(
                    i.fencing_token,
                    ttl.or(i.remaining),
                )))
            }
            (_, Some(i)) => {
                // Tokens as the wrapper handed them out.
                let token = self.shared.grants.lock().get(&key).and_then(|g| g.token);
                Ok(Some(lock_core::HolderInfo::new(
                    token.or(i.fencing_token),
                    i.remaining,
                )))
            }
            (_, None) => Ok(None),
        }
    }
    async fn holders(&self, name: &LockName) -> Result<Vec<lock_core::HolderInfo>> {
        self.holders_flawed(name).await
    }
    async fn leader(&self, name: &LockName) -> Result<Option<lock_core::Leader>> {
        self.leader_flawed(name).await
    }
    async fn watch(&self, name: &LockName) -> Result<Box<dyn lock_core::ChangeFeed>> {
        self.watch_flawed(name).await
    }
    /// The flawed paths live in `try_acquire` and `acquire` (overridden, so a flaw can skip the
    /// TTL validation the provided ones do); this maps a deadline onto them.
    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        let (name, opts) = (req.name(), req.opts());
        let opts = match req.deadline() {
            Deadline::Now => return self.try_acquire(name, opts).await,
            Deadline::At(t) => opts
                .clone()
                .wait_for(t.saturating_duration_since(Instant::now())),
            Deadline::Never => opts.clone().wait_forever(),
        };
        match self.acquire(name, &opts).await {
            Ok(lease) => Ok(Some(lease)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
    async fn try_acquire(
        &self,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        let report = AcquireReport::start(self.backend(), name, opts, false);
        let r = self
            .try_acquire_flawed(name, opts)
            .instrument(report.span())
            .await;
        report.finish(match &r {
            Ok(Some(l)) => Acquired::Granted(l.fencing_token()),
            Ok(None) if self.flaw == Flaw::BusyReportedAsGranted => Acquired::Granted(None),
            Ok(None) => Acquired::Busy,
            Err(e) => Acquired::Failed(e),
        });
        r
    }
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Box<dyn Lease>> {
        if self.flaw == Flaw::AcquireTimedFromItsEnd {
            let r = self.acquire_flawed(name, opts).await;
            let report = AcquireReport::start(self.backend(), name, opts, true);
            report.finish(match &r {
                Ok(l) => Acquired::Granted(l.fencing_token()),
                Err(Error::Timeout { .. }) => Acquired::Timeout,
                Err(e) => Acquired::Failed(e),
            });
            return r;
        }
        let report = AcquireReport::start(self.backend(), name, opts, true);
        // Whether it will wait: decided from the store's holders as it arrives (a driver
        // knows it from its first attempt).
        if self.flaw != Flaw::HandoffNotReported && self.must_wait(name, opts).await {
            report.queued();
        }
        let r = self
            .acquire_flawed(name, opts)
            .instrument(report.span())
            .await;
        report.finish(match &r {
            Ok(l) => Acquired::Granted(l.fencing_token()),
            Err(Error::Timeout { .. }) => Acquired::Timeout,
            Err(e) => Acquired::Failed(e),
        });
        r
    }
}
