//! Negative controls: deliberately broken drivers that the suite must catch.
//!
//! Each [`Flaw`] breaks one promise of the contract on top of the (correct) in-memory driver.
//! The suite's own tests run the cases each flaw names in [`Flaw::caught_by`] and assert that at
//! least one fails — and that [`Flaw::None`], the same wrapper with nothing broken, passes every
//! case, so the failures come from the flaw alone. A suite that passes a broken driver is the
//! worst bug this project can have.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::LeaseTracker;
use lock_core::memory::MemoryLock;
use lock_core::{
    Capabilities, Deadline, DistributedLock, Error, FencingToken, Lease, LeaseState, LockName,
    LockOptions, LostSignal, Renewal, Result, Wait, MAX_NAME_LEN, MAX_TTL,
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
    /// Taking over an expired lock is check-then-set: racers that all saw it expired are all
    /// granted it, each overwriting the last.
    ExpiredTakeoverNotAtomic,
    /// `inspect` still shows a holder that expired (a lazily expired record).
    InspectShowsExpiredHolder,
    /// `inspect` reports the lease's TTL as the time remaining, however much has passed.
    InspectRemainingIsTheTtl,
    /// The TTL sent to the store is rounded down to whole 100 ms; `valid_until` uses the
    /// requested one.
    TtlRoundedDown,
    /// Through a slow wire, `valid_until` is measured from the reply instead of from before the
    /// request.
    ValidUntilFromReply,
    /// A bounded `acquire` (`wait_for`) checks the lock once a second instead of waking on a
    /// release.
    BoundedWaitPolls,
    /// `try_acquire` on a held lock waits up to a TTL for it before saying no.
    TryAcquireWaits,
    /// A waiter that timed out stays queued for many TTLs: later *waiting* acquires queue
    /// behind it (`try_acquire` does not look at the queue).
    TimedOutWaiterStaysQueued,
    /// When the holder expires rather than releases, waiters race for the lock, the latest
    /// arrival first.
    NoFifoAfterExpiry,
    /// A renewal of an expired lease succeeds when the same client holds the lock again, and
    /// extends the lock by another TTL.
    StaleRenewExtendsSameClient,
    /// Releasing an expired lease that nobody took over returns `Ok`.
    ReleaseOfExpiredIsOk,
    /// Dropping a lease leaves the lock held for many TTLs instead of freeing it.
    DropKeepsLock,
    /// `abandon` leaves the lost signal pending forever.
    AbandonKeepsLostPending,
    /// The driver declares a `max_ttl` of 12 h but accepts anything up to the global one.
    MaxTtlNotEnforced,
    /// The backend key is the name cut to 127 bytes.
    NameTruncated,
    /// Name escaping that is not one-to-one: `.` becomes `__`, so `a.` and `a__` are one key.
    EscapingNotInjective,
    /// The fencing counter is forgotten once a name sits idle for two TTLs (a counter key with
    /// a TTL): tokens start again at 1.
    CounterForgetsIdleNames,
    /// Declares `Strict` fencing, but a backend restart loses the counter (Redis without
    /// `appendfsync always`): tokens start again at 1.
    CounterLostOnRestart,
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
        Flaw::ExpiredTakeoverNotAtomic,
        Flaw::InspectShowsExpiredHolder,
        Flaw::InspectRemainingIsTheTtl,
        Flaw::TtlRoundedDown,
        Flaw::ValidUntilFromReply,
        Flaw::BoundedWaitPolls,
        Flaw::TryAcquireWaits,
        Flaw::TimedOutWaiterStaysQueued,
        Flaw::NoFifoAfterExpiry,
        Flaw::StaleRenewExtendsSameClient,
        Flaw::ReleaseOfExpiredIsOk,
        Flaw::DropKeepsLock,
        Flaw::AbandonKeepsLostPending,
        Flaw::MaxTtlNotEnforced,
        Flaw::NameTruncated,
        Flaw::EscapingNotInjective,
        Flaw::CounterForgetsIdleNames,
        Flaw::CounterLostOnRestart,
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
            Flaw::ExpiredTakeoverNotAtomic => &["expiry::expired_lock_goes_to_exactly_one_racer"],
            Flaw::InspectShowsExpiredHolder | Flaw::InspectRemainingIsTheTtl => {
                &["inspect::inspect_follows_expiry_and_takeover"]
            }
            Flaw::TtlRoundedDown => &["expiry::odd_ttl_holds_until_valid_until"],
            Flaw::ValidUntilFromReply => &["expiry::valid_until_counts_from_before_the_request"],
            Flaw::BoundedWaitPolls => &["waiting::bounded_waiter_wakes_promptly_after_release"],
            Flaw::TryAcquireWaits => &["waiting::try_acquire_does_not_wait"],
            Flaw::TimedOutWaiterStaysQueued => {
                &["waiting::timed_out_waiter_does_not_block_waiters"]
            }
            Flaw::NoFifoAfterExpiry => &["waiting::waiters_served_fifo_after_expiry"],
            Flaw::StaleRenewExtendsSameClient => {
                &["ownership::stale_renew_does_not_extend_new_lease"]
            }
            Flaw::ReleaseOfExpiredIsOk => &["ownership::release_after_expiry_is_not_held"],
            Flaw::DropKeepsLock => &["lost::dropped_lease_frees_promptly"],
            Flaw::AbandonKeepsLostPending => &["lost::lost_signal_resolves_on_abandon"],
            Flaw::MaxTtlNotEnforced => &["input::declared_max_ttl_is_enforced"],
            Flaw::NameTruncated => {
                &["input::max_length_names_differing_at_the_end_are_independent"]
            }
            Flaw::EscapingNotInjective => {
                &["input::names_differing_in_punctuation_are_independent"]
            }
            Flaw::CounterForgetsIdleNames => &["fencing::token_survives_idle_name"],
            Flaw::CounterLostOnRestart => &["fencing::strict_tokens_survive_backend_restart"],
        }
    }
}

/// A [`Harness`] over a [`FlawedLock`] with one [`Flaw`].
#[derive(Debug)]
pub struct FlawedHarness {
    flaw: Flaw,
    store: MemoryLock,
    shared: Arc<Shared>,
    timing: Timing,
}

/// What the wrapper remembers across its clients, to act out the flaws.
#[derive(Debug, Default)]
struct Shared {
    /// Names held by ghosts (of cancelled acquires, dropped leases), until when: every
    /// acquisition is refused.
    ghosts: Mutex<HashMap<LockName, Instant>>,
    /// Names with a timed-out waiter still queued, until when: waiting acquires queue behind.
    queued_ghosts: Mutex<HashMap<LockName, Instant>>,
    /// The current grant of each name, as the wrapper handed it out.
    grants: Mutex<HashMap<LockName, Grant>>,
    /// Per name: when it was last released and the token offset in force.
    idle: Mutex<HashMap<LockName, (Instant, u64)>>,
    /// Waiting acquires per name so far (arrival numbers).
    arrivals: Mutex<HashMap<LockName, u32>>,
    /// Lost-signal senders kept alive on purpose ([`Flaw::AbandonKeepsLostPending`]).
    kept: Mutex<Vec<LeaseTracker>>,
    next_client: AtomicU64,
    /// When [`Harness::restart_backend`] last ran.
    restarted: Mutex<Option<Instant>>,
}

#[derive(Debug, Clone, Copy)]
struct Grant {
    expires: Instant,
    ttl: Duration,
    token: Option<FencingToken>,
    client: u64,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FlawedHarness {
    /// A harness whose clients all share one store (except under
    /// [`Flaw::NoMutualExclusion`]).
    pub fn new(flaw: Flaw) -> Self {
        FlawedHarness {
            flaw,
            store: MemoryLock::new(),
            shared: Arc::default(),
            timing: Timing::for_ttl(Duration::from_millis(200)),
        }
    }

    fn lock(&self, inner: MemoryLock, delay: Option<Duration>) -> FlawedLock {
        FlawedLock {
            inner,
            flaw: self.flaw,
            shared: self.shared.clone(),
            delay,
            id: self.shared.next_client.fetch_add(1, Ordering::Relaxed),
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
        Ok(Arc::new(self.lock(inner, None)))
    }
    /// The same store, with every `try_acquire` landing `delay` after it was made, whether or
    /// not its caller still waits, and its reply taking as long again — like a request on the
    /// wire.
    async fn delayed_client(
        &self,
        delay: Duration,
    ) -> Option<std::result::Result<Delayed, BoxError>> {
        Some(Ok(Delayed {
            lock: Arc::new(self.lock(self.store.clone(), Some(delay))),
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
    fn can_restart_backend(&self) -> bool {
        true
    }
    /// The store keeps its state (a durable backend); under
    /// [`Flaw::CounterLostOnRestart`] its counters start again.
    async fn restart_backend(&self) -> std::result::Result<(), BoxError> {
        *locked(&self.shared.restarted) = Some(Instant::now());
        Ok(())
    }
}

/// The in-memory driver with one flaw.
#[derive(Debug, Clone)]
pub struct FlawedLock {
    inner: MemoryLock,
    flaw: Flaw,
    shared: Arc<Shared>,
    /// For delayed clients: how long a `try_acquire` takes to reach the store.
    delay: Option<Duration>,
    /// This client's number (clients of one harness share a store).
    id: u64,
}

/// Until when an entry of `map` holds `name`, if it still does.
fn held_until(map: &Mutex<HashMap<LockName, Instant>>, name: &LockName) -> Option<Instant> {
    locked(map)
        .get(name)
        .copied()
        .filter(|t| *t > Instant::now())
}

impl FlawedLock {
    /// The backend key of `name` under this flaw.
    fn key(&self, name: &LockName) -> Result<LockName> {
        let raw = name.as_str();
        match self.flaw {
            Flaw::NameTruncated if raw.len() >= MAX_NAME_LEN => {
                LockName::new(&raw[..MAX_NAME_LEN - 1])
            }
            Flaw::EscapingNotInjective if raw.contains('.') => {
                let escaped = raw.replace('.', "__");
                LockName::new(&escaped[..escaped.len().min(MAX_NAME_LEN)])
            }
            _ => Ok(name.clone()),
        }
    }

    fn capabilities_declared(&self) -> Capabilities {
        self.inner
            .capabilities()
            .with_max_ttl(Duration::from_secs(12 * 60 * 60))
    }

    fn inner_opts(&self, opts: &LockOptions) -> LockOptions {
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
            _ => opts.clone(),
        }
    }

    /// A `try_acquire` sent over a slow wire: it lands after `delay` even if the caller has
    /// gone, and its reply takes `delay` again. A correct client then releases the grant
    /// nobody waits for; the flawed one leaves it.
    async fn in_flight(
        &self,
        delay: Duration,
        key: &LockName,
        opts: &LockOptions,
    ) -> Result<(Option<Box<dyn Lease>>, Instant)> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (inner, key, opts, flaw) = (
            self.inner.clone(),
            key.clone(),
            self.inner_opts(opts),
            self.flaw,
        );
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let r = inner.try_acquire(&key, &opts).await;
            // Taken after the store's own clock reading: an upper bound for it.
            let landed = Instant::now();
            tokio::time::sleep(delay).await;
            if let Err((Ok(Some(orphan)), _)) = tx.send((r, landed)) {
                if flaw == Flaw::CancelInFlightLeavesGhost {
                    orphan.abandon();
                } else {
                    let _ = orphan.release().await;
                }
            }
        });
        let (r, landed) = rx
            .await
            .map_err(|_| Error::unavailable("flawed-memory", "the in-flight request vanished"))?;
        Ok((r?, landed))
    }

    /// A grant of the store, wrapped: recorded, and given the flaw's behaviour.
    /// `landed`: when the request reached the store (later than `started` for a delayed
    /// client).
    fn wrap(
        &self,
        lease: Box<dyn Lease>,
        opts: &LockOptions,
        started: Instant,
        landed: Instant,
    ) -> Box<dyn Lease> {
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
            let mut idle = locked(&self.shared.idle);
            let entry = idle.entry(name.clone()).or_insert((Instant::now(), 0));
            if self.flaw == Flaw::CounterForgetsIdleNames && entry.0 + opts.ttl * 2 < Instant::now()
            {
                entry.1 = t.get().saturating_sub(1);
            }
            offset = entry.1;
        }
        let token = lease
            .fencing_token()
            .map(|t| FencingToken::new(t.get().saturating_sub(offset).max(1)));
        locked(&self.shared.grants).insert(
            name,
            Grant {
                expires: started + opts.ttl,
                ttl: opts.ttl,
                token,
                client: self.id,
            },
        );
        // The store's validity starts when the request landed; the wire took `delay` each way.
        let shift = match (self.delay, self.flaw) {
            (Some(_), Flaw::ValidUntilFromReply) => Shift::Later(landed.elapsed()),
            _ => Shift::Earlier(landed.saturating_duration_since(started)),
        };
        Box::new(FlawedLease {
            never_lost: matches!(
                self.flaw,
                Flaw::LostSignalNeverFires | Flaw::AbandonKeepsLostPending
            )
            .then(|| LeaseTracker::new(Instant::now() + MAX_TTL)),
            inner: lease,
            resurrected: Mutex::new(None),
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
        })
    }

    /// Forgets `name`'s grant after a release.
    fn released(&self, name: &LockName) {
        locked(&self.shared.grants).remove(name);
        if let Some(e) = locked(&self.shared.idle).get_mut(name) {
            e.0 = Instant::now();
        }
    }

    /// An expired grant of `name` that nobody released or replaced, if any.
    fn expired_grant(&self, name: &LockName) -> Option<Grant> {
        locked(&self.shared.grants)
            .get(name)
            .copied()
            .filter(|g| g.expires <= Instant::now())
    }

    /// Waits while a ghost (or, for waiting acquires, a queued ghost) holds `name`; `false`
    /// if one still does at the deadline.
    async fn wait_out_ghosts(&self, name: &LockName, deadline: Option<Instant>) -> bool {
        loop {
            let until = held_until(&self.shared.ghosts, name)
                .into_iter()
                .chain(held_until(&self.shared.queued_ghosts, name))
                .max();
            let Some(until) = until else {
                return true;
            };
            let stop = deadline.map_or(until, |d| d.min(until));
            tokio::time::sleep_until(stop.into()).await;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return held_until(&self.shared.ghosts, name).is_none()
                    && held_until(&self.shared.queued_ghosts, name).is_none();
            }
        }
    }

    fn timeout(name: &LockName, started: Instant) -> Error {
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
        let info = self.inner.inspect(&key).await?;
        match (self.flaw, info) {
            (Flaw::InspectBlind, _) => Ok(None),
            (Flaw::InspectShowsExpiredHolder, None) => Ok(self
                .expired_grant(&key)
                .map(|g| lock_core::HolderInfo::new(g.token, Some(Duration::ZERO)))),
            (Flaw::InspectRemainingIsTheTtl, Some(i)) => {
                let ttl = locked(&self.shared.grants).get(&key).map(|g| g.ttl);
                Ok(Some(lock_core::HolderInfo::new(
                    i.fencing_token,
                    ttl.or(i.remaining),
                )))
            }
            (_, Some(i)) => {
                // Tokens as the wrapper handed them out.
                let token = locked(&self.shared.grants).get(&key).and_then(|g| g.token);
                Ok(Some(lock_core::HolderInfo::new(
                    token.or(i.fencing_token),
                    i.remaining,
                )))
            }
            (_, None) => Ok(None),
        }
    }
    /// The flawed paths live in `try_acquire` and `acquire` (overridden, so a flaw can skip the
    /// TTL validation the provided ones do); this maps a deadline onto them.
    async fn acquire_until(
        &self,
        name: &LockName,
        _ttl: Duration,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        let opts = match deadline {
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
        let caps = match self.flaw {
            Flaw::MaxTtlNotEnforced => self.inner.capabilities(),
            _ => self.capabilities_declared(),
        };
        opts.validate(&caps)?;
        let key = self.key(name)?;
        if held_until(&self.shared.ghosts, &key).is_some() {
            return Ok(None);
        }
        let started = Instant::now();
        if self.flaw == Flaw::ExpiredTakeoverNotAtomic && self.expired_grant(&key).is_some() {
            // Saw it expired; the write lands a moment later, over whatever happened since.
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.inner.break_lock(&key);
        }
        let lease = match (self.delay, self.flaw) {
            (None, Flaw::TryAcquireWaits) => {
                let o = self.inner_opts(opts).wait_for(opts.ttl);
                match self.inner.acquire(&key, &o).await {
                    Ok(l) => Some(l),
                    Err(Error::Timeout { .. }) => None,
                    Err(e) => return Err(e),
                }
            }
            (None, _) => self.inner.try_acquire(&key, &self.inner_opts(opts)).await?,
            (Some(delay), _) => {
                let (lease, landed) = self.in_flight(delay, &key, opts).await?;
                return Ok(lease.map(|l| self.wrap(l, opts, started, landed)));
            }
        };
        Ok(lease.map(|l| self.wrap(l, opts, started, started)))
    }
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Box<dyn Lease>> {
        let caps = match self.flaw {
            Flaw::MaxTtlNotEnforced => self.inner.capabilities(),
            _ => self.capabilities_declared(),
        };
        opts.validate(&caps)?;
        let key = self.key(name)?;
        let started = Instant::now();
        let deadline = opts.wait.deadline(started);
        if self.flaw != Flaw::CancelLeavesGhost && !self.wait_out_ghosts(&key, deadline).await {
            return Err(Self::timeout(&key, started));
        }
        let arrival = {
            let mut a = locked(&self.shared.arrivals);
            let n = a.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let bounded = !matches!(opts.wait, Wait::Forever | Wait::No);
        match self.flaw {
            Flaw::SpinningWaiter | Flaw::BoundedWaitPolls
                if self.flaw == Flaw::SpinningWaiter || bounded =>
            {
                let pause = match self.flaw {
                    Flaw::SpinningWaiter => Duration::from_millis(2),
                    _ => Duration::from_secs(1),
                };
                loop {
                    if let Some(l) = self.try_acquire(name, opts).await? {
                        return Ok(l);
                    }
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(Self::timeout(&key, started));
                    }
                    let next = deadline.map_or(now + pause, |d| d.min(now + pause));
                    tokio::time::sleep_until(next.into()).await;
                }
            }
            Flaw::IgnoresWaitTimeout => {
                let l = self
                    .inner
                    .acquire(&key, &self.inner_opts(opts).wait_forever())
                    .await?;
                Ok(self.wrap(l, opts, started, started))
            }
            Flaw::CancelLeavesGhost => {
                // The ghost of an earlier cancelled acquire holds the lock first.
                if let Some(until) = held_until(&self.shared.ghosts, &key) {
                    let stop = deadline.map_or(until, |d| d.min(until));
                    tokio::time::sleep_until(stop.into()).await;
                    if held_until(&self.shared.ghosts, &key).is_some() {
                        return Err(Self::timeout(&key, started));
                    }
                }
                let mut ghost = Ghost {
                    shared: self.shared.clone(),
                    name: key.clone(),
                    ttl: opts.ttl * 50,
                    armed: true,
                };
                let l = self.inner.acquire(&key, &self.inner_opts(opts)).await;
                ghost.armed = false;
                Ok(self.wrap(l?, opts, started, started))
            }
            Flaw::TimedOutWaiterStaysQueued => {
                match self.inner.acquire(&key, &self.inner_opts(opts)).await {
                    Ok(l) => Ok(self.wrap(l, opts, started, started)),
                    Err(e @ Error::Timeout { .. }) => {
                        locked(&self.shared.queued_ghosts)
                            .insert(key.clone(), Instant::now() + opts.ttl * 50);
                        Err(e)
                    }
                    Err(e) => Err(e),
                }
            }
            Flaw::NoFifoAfterExpiry => {
                // Waits out an unreleased holder by the clock, then races: the latest arrival
                // wakes first.
                let expires = locked(&self.shared.grants).get(&key).map(|g| g.expires);
                if let Some(at) = expires.filter(|at| *at > Instant::now()) {
                    let head_start = Duration::from_millis(60) / arrival.max(1);
                    tokio::time::sleep_until((at + head_start).into()).await;
                }
                let l = self.inner.acquire(&key, &self.inner_opts(opts)).await?;
                Ok(self.wrap(l, opts, started, started))
            }
            _ => {
                let l = self.inner.acquire(&key, &self.inner_opts(opts)).await?;
                Ok(self.wrap(l, opts, started, started))
            }
        }
    }
}

/// On drop while armed (the acquire future was cancelled), leaves a ghost holder behind for
/// a long TTL, recorded at once so no later waiter can get ahead of it.
struct Ghost {
    shared: Arc<Shared>,
    name: LockName,
    ttl: Duration,
    armed: bool,
}

impl Drop for Ghost {
    fn drop(&mut self) {
        if self.armed {
            locked(&self.shared.ghosts).insert(self.name.clone(), Instant::now() + self.ttl);
        }
    }
}

/// [`Flaw::DropKeepsLock`]: a lease dropped without release leaves a ghost holder.
#[derive(Debug)]
struct DropGhost {
    armed: bool,
    shared: Arc<Shared>,
    ttl: Duration,
}

/// Which way the wire moved `valid_until` from the store's view.
#[derive(Debug, Clone, Copy)]
enum Shift {
    Earlier(Duration),
    Later(Duration),
}

#[derive(Debug)]
struct FlawedLease {
    inner: Box<dyn Lease>,
    resurrected: Mutex<Option<Box<dyn Lease>>>,
    never_lost: Option<LeaseTracker>,
    lock: FlawedLock,
    opts: LockOptions,
    claimed_valid_until: Instant,
    shift: Shift,
    /// Subtracted from the store's token ([`Flaw::CounterForgetsIdleNames`]).
    offset: u64,
    drop_ghost: DropGhost,
    /// Ended by `abandon`.
    abandoned: bool,
}

impl Drop for FlawedLease {
    fn drop(&mut self) {
        if self.drop_ghost.armed {
            let s = &self.drop_ghost.shared;
            locked(&s.ghosts).insert(
                self.inner.name().clone(),
                Instant::now() + self.drop_ghost.ttl,
            );
        }
        if let Some(t) = self.never_lost.take() {
            let keep = match self.lock.flaw {
                Flaw::LostSignalNeverFires => true,
                Flaw::AbandonKeepsLostPending => self.abandoned,
                _ => false,
            };
            if keep {
                // Kept alive, so the signal never resolves.
                locked(&self.lock.shared.kept).push(t);
            } else {
                t.mark_released();
            }
        }
    }
}

#[async_trait]
impl Lease for FlawedLease {
    fn name(&self) -> &LockName {
        self.inner.name()
    }
    fn fencing_token(&self) -> Option<FencingToken> {
        let t = self.inner.fencing_token()?;
        let t = FencingToken::new(t.get().saturating_sub(self.offset).max(1));
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
            Flaw::NoExpiry | Flaw::EarlyExpiry | Flaw::TtlRoundedDown => self.claimed_valid_until,
            Flaw::LostSignalNeverFires => Instant::now() + self.opts.ttl,
            _ => match self.shift {
                Shift::Earlier(d) => self.inner.valid_until() - d,
                Shift::Later(d) => self.inner.valid_until() + d,
            },
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
        let resurrect = match self.lock.flaw {
            Flaw::RenewResurrects => true,
            Flaw::StaleRenewExtendsSameClient => locked(&self.lock.shared.grants)
                .get(self.inner.name())
                .is_some_and(|g| g.client == self.lock.id),
            _ => false,
        };
        if r.is_err() && resurrect {
            let opts = self.lock.inner_opts(&self.opts).manual_renewal();
            if self.lock.flaw == Flaw::StaleRenewExtendsSameClient {
                self.lock.inner.break_lock(self.inner.name());
            }
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
    async fn release(mut self: Box<Self>) -> Result<()> {
        self.drop_ghost.armed = false;
        let lock = self.lock.clone();
        let opts = self.opts.clone();
        let name = self.inner.name().clone();
        let inner = std::mem::replace(&mut self.inner, Box::new(Released(name.clone())));
        let r = inner.release().await;
        if r.is_ok() {
            lock.released(&name);
        }
        match lock.flaw {
            Flaw::ReleaseWithoutOwnerCheck if r.is_err() => {
                lock.inner.break_lock(&name);
                Ok(())
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
    fn abandon(mut self: Box<Self>) {
        self.drop_ghost.armed = false;
        self.abandoned = true;
        let name = self.inner.name().clone();
        std::mem::replace(&mut self.inner, Box::new(Released(name))).abandon();
    }
}

/// What is left in a [`FlawedLease`] once its store lease was released or abandoned.
#[derive(Debug)]
struct Released(LockName);

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
        Err(Error::NotHeld {
            name: self.0.clone(),
        })
    }
    async fn release(self: Box<Self>) -> Result<()> {
        Ok(())
    }
    fn abandon(self: Box<Self>) {}
}
