//! The harness the suite runs the controls through: one store, the wrapper's memory of ghosts
//! and grants.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::LeaseTracker;
use lock_core::memory::MemoryLock;
use lock_core::{DistributedLock, FencingToken, LockName};

use crate::{BoxError, ClockStep, Fault, Faulty, Harness, Secured, Timing};

use super::secured::fake_secured;
use super::wire::{Wire, WireLink};

use super::*;

/// A [`Harness`] over a [`FlawedLock`] with one [`Flaw`].
#[derive(Debug, Clone)]
pub struct FlawedHarness {
    pub(super) flaw: Flaw,
    pub(super) store: MemoryLock,
    pub(super) shared: Arc<Shared>,
    pub(super) timing: Timing,
}

/// What the wrapper remembers across its clients, to act out the flaws.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Names held by ghosts (of cancelled acquires, dropped leases), until when: every
    /// acquisition is refused.
    pub(super) ghosts: Mutex<HashMap<LockName, Instant>>,
    /// Names with a timed-out waiter still queued, until when: waiting acquires queue behind.
    pub(super) queued_ghosts: Mutex<HashMap<LockName, Instant>>,
    /// The current grant of each name, as the wrapper handed it out.
    pub(super) grants: Mutex<HashMap<LockName, Grant>>,
    /// Per name: when it was last released and the token offset in force.
    pub(super) idle: Mutex<HashMap<LockName, (Instant, u64)>>,
    /// Per client: the TTL and the validity of the lease it released last
    /// ([`Flaw::RegrantOverstatesValidity`]).
    pub(super) last_released: Mutex<HashMap<u64, (Duration, Instant)>>,
    /// Waiting acquires per name so far (arrival numbers).
    pub(super) arrivals: Mutex<HashMap<LockName, u32>>,
    /// Per name: `try_acquire` calls in flight, and whether two of them overlapped since the
    /// name was last quiet ([`Flaw::SplitVoteGivesUp`]).
    pub(super) racing: Mutex<HashMap<LockName, (usize, bool)>>,
    /// Lost-signal senders kept alive on purpose ([`Flaw::AbandonKeepsLostPending`]).
    pub(super) kept: Mutex<Vec<LeaseTracker>>,
    pub(super) next_client: AtomicU64,
    /// The store's latest token per name (before any offset).
    pub(super) tokens: Mutex<HashMap<LockName, u64>>,
    /// A lock is its connection's session (`outlives_connection = false`): a cut frees it.
    pub(super) session_bound: bool,
    /// Woken at every cut of any client's link ([`Flaw::CutGrantsTwoWaiters`]).
    pub(super) cut_anywhere: Arc<tokio::sync::Notify>,
    /// Per name: the client that released it last, and the token that grant had
    /// ([`Flaw::RegrantKeepsToken`]).
    pub(super) released_by: Mutex<HashMap<LockName, (u64, Option<FencingToken>)>>,
    /// The token of the latest grant of any name ([`Flaw::InspectShowsNewestToken`]).
    pub(super) newest_token: Mutex<Option<FencingToken>>,
    /// Clients made behind a link so far ([`Flaw::DeadlineHangsOnOneClient`] strikes the first).
    pub(super) linked: AtomicU64,
    /// Per client: grants so far (the intermittent flaws strike one in twenty).
    pub(super) granted: Mutex<HashMap<u64, u64>>,
    /// The store's time of day, away from the real time ([`Harness::step_clock`]).
    pub(super) clock_step: Mutex<Option<ClockStep>>,
    /// Grants per name and kind of mode so far ([`Flaw::TokensPerMode`]).
    pub(super) family: Mutex<HashMap<(LockName, u8), u64>>,
    /// Per name: a value kept apart from the lock ([`Flaw::LeaderIsNewestCandidate`],
    /// [`Flaw::ProclaimUnchecked`]).
    pub(super) values: Mutex<HashMap<LockName, lock_core::LeaderValue>>,
    /// Per client and name: the last leader it read ([`Flaw::LeaderNeverGone`]).
    pub(super) last_leader: Mutex<HashMap<(u64, LockName), lock_core::Leader>>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Grant {
    pub(super) expires: Instant,
    pub(super) ttl: Duration,
    pub(super) token: Option<FencingToken>,
    pub(super) client: u64,
}

/// Until when an entry of `map` holds `name`, if it still does.
pub(super) fn held_until(
    map: &Mutex<HashMap<LockName, Instant>>,
    name: &LockName,
) -> Option<Instant> {
    map.lock()
        .get(name)
        .copied()
        .filter(|t| *t > Instant::now())
}

impl FlawedHarness {
    /// A harness whose clients all share one store (except under
    /// [`Flaw::NoMutualExclusion`]).
    pub fn new(flaw: Flaw) -> Self {
        FlawedHarness {
            flaw,
            store: MemoryLock::new(),
            shared: Arc::new(Shared {
                session_bound: matches!(
                    flaw,
                    Flaw::SessionLostLate
                        | Flaw::SessionLostByPolling
                        | Flaw::CutGrantsTwoWaiters
                        | Flaw::CutGrantsPermitBeyondK
                        | Flaw::LeaseReportsAsAnotherBackend
                ),
                ..Shared::default()
            }),
            timing: Timing::for_ttl(Duration::from_millis(200)),
        }
    }

    /// Like [`new`](Self::new), but each faulty client's locks are its connection's session,
    /// as with PostgreSQL (`outlives_connection = false`): a cut frees them on the store at
    /// once, and the leases learn of it at once (`LeaseOps::ended`) unless the flaw says
    /// otherwise.
    pub fn session_bound(flaw: Flaw) -> Self {
        let mut h = FlawedHarness::new(flaw);
        h.shared = Arc::new(Shared {
            session_bound: true,
            ..Shared::default()
        });
        h
    }

    pub(super) fn lock(&self, inner: MemoryLock, link: Option<Arc<Wire>>) -> FlawedLock {
        FlawedLock {
            inner,
            flaw: self.flaw,
            shared: self.shared.clone(),
            link,
            id: self.shared.next_client.fetch_add(1, Ordering::Relaxed),
            url: None,
            odd_one: false,
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
        let lock = self.lock(inner, None);
        Ok(match self.flaw {
            Flaw::ClientDropEndsLeases => Arc::new(EndsLeasesOnDrop(lock)),
            _ => Arc::new(lock),
        })
    }
    /// The same store behind an in-process link: a delayed `try_acquire` lands `delay` after
    /// it was made, whether or not its caller still waits, and its reply takes as long again
    /// — like a request on the wire; a blackholed call waits for the link to heal; renewals
    /// cross the link too.
    async fn faulty_client(
        &self,
        delay: Duration,
    ) -> Option<std::result::Result<Faulty, BoxError>> {
        let wire = Wire::new(Fault::Delay(delay), self.shared.cut_anywhere.clone());
        let lock = FlawedLock {
            odd_one: self.shared.linked.fetch_add(1, Ordering::Relaxed) == 0,
            ..self.lock(self.store.clone(), Some(wire.clone()))
        };
        Some(Ok(Faulty::new(Arc::new(lock), WireLink(wire))))
    }
    fn secured(&self) -> Option<Secured> {
        let h = self.clone();
        Some(fake_secured(self.flaw, move |shown| FlawedLock {
            url: Some(shown),
            ..h.lock(h.store.clone(), None)
        }))
    }
    fn timing(&self) -> Timing {
        self.timing
    }
    async fn backend_requests(&self) -> Option<u64> {
        Some(self.store.operations())
    }
    /// The control's keys are `flawed:locks/<name>`; one exists while its name is held.
    async fn key_exists(&self, key: &str) -> Option<std::result::Result<bool, BoxError>> {
        let held = match key.strip_prefix("flawed:locks/").map(LockName::new) {
            Some(Ok(name)) => self.store.inspect(&name).await.map(|h| h.is_some()),
            _ => Ok(false),
        };
        Some(held.map_err(Into::into))
    }
    async fn break_lock(&self, name: &LockName) -> Option<std::result::Result<(), BoxError>> {
        self.store.break_lock(name);
        Some(Ok(()))
    }
    fn can_restart_backend(&self) -> bool {
        true
    }
    /// The store keeps its state (a durable backend); under
    /// [`Flaw::CounterLostOnRestart`] its counters start again, under
    /// [`Flaw::RestartForgetsLocks`] its locks are gone.
    async fn restart_backend(&self) -> std::result::Result<(), BoxError> {
        if self.flaw == Flaw::RestartForgetsLocks {
            let held: Vec<LockName> = self.shared.grants.lock().keys().cloned().collect();
            for name in &held {
                self.store.break_lock(name);
            }
        }
        if self.flaw == Flaw::CounterLostOnRestart {
            // Every counter starts again: the next token of each name is 1.
            let tokens = self.shared.tokens.lock().clone();
            let mut idle = self.shared.idle.lock();
            for (name, last) in tokens {
                idle.entry(name).or_insert((Instant::now(), 0)).1 = last;
            }
        }
        Ok(())
    }
    fn can_step_clock(&self) -> bool {
        true
    }
    /// The store counts on `Instant`, which no step moves; [`Flaw::ExpiresByTimeOfDay`] and
    /// [`Flaw::TokensFollowTheClock`] act out a store that reads the time of day.
    async fn step_clock(&self, step: ClockStep) -> std::result::Result<(), BoxError> {
        step_clock_of_the_store(self, step);
        Ok(())
    }
}

/// The in-memory driver with one flaw.
#[derive(Debug, Clone)]
pub struct FlawedLock {
    pub(super) inner: MemoryLock,
    pub(super) flaw: Flaw,
    pub(super) shared: Arc<Shared>,
    /// For faulty clients: the link every call and renewal crosses.
    pub(super) link: Option<Arc<Wire>>,
    /// For clients made from a URL: the URL they show in `Debug` (only the derived `Debug`
    /// reads it, which the dead-code lint does not count).
    #[allow(dead_code)]
    pub(super) url: Option<String>,
    /// This client's number (clients of one harness share a store).
    pub(super) id: u64,
    /// The one client a one-client flaw strikes ([`Flaw::DeadlineHangsOnOneClient`]).
    pub(super) odd_one: bool,
}

/// [`Flaw::ClientDropEndsLeases`]: a client whose handle, dropped, takes its leases' locks
/// with it (like a driver that closes its connection on drop while leases still use it).
#[derive(Debug)]
struct EndsLeasesOnDrop(FlawedLock);

impl Drop for EndsLeasesOnDrop {
    fn drop(&mut self) {
        let mine: Vec<LockName> = self
            .0
            .shared
            .grants
            .lock()
            .iter()
            .filter(|(_, g)| g.client == self.0.id)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &mine {
            self.0.inner.break_lock(name);
        }
    }
}

#[async_trait]
impl DistributedLock for EndsLeasesOnDrop {
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn capabilities(&self) -> lock_core::Capabilities {
        self.0.capabilities()
    }
    async fn acquire_until(
        &self,
        req: lock_core::driver::Acquisition<'_>,
    ) -> lock_core::Result<Option<Box<dyn lock_core::Lease>>> {
        self.0.acquire_until(req).await
    }
    async fn try_acquire(
        &self,
        name: &LockName,
        opts: &lock_core::LockOptions,
    ) -> lock_core::Result<Option<Box<dyn lock_core::Lease>>> {
        self.0.try_acquire(name, opts).await
    }
    async fn acquire(
        &self,
        name: &LockName,
        opts: &lock_core::LockOptions,
    ) -> lock_core::Result<Box<dyn lock_core::Lease>> {
        self.0.acquire(name, opts).await
    }
    async fn inspect(&self, name: &LockName) -> lock_core::Result<Option<lock_core::HolderInfo>> {
        self.0.inspect(name).await
    }
    async fn holders(&self, name: &LockName) -> lock_core::Result<Vec<lock_core::HolderInfo>> {
        self.0.holders(name).await
    }
}

// The store's time of day, for the flaws that read it. The memory store counts on `Instant`,
// which no step of the time of day moves.

/// The store's clock is now `step` away from the real time (replacing the previous step).
fn step_clock_of_the_store(h: &FlawedHarness, step: ClockStep) {
    let previous = h.shared.clock_step.lock().replace(step);
    if !matches!(
        h.flaw,
        Flaw::ExpiresByTimeOfDay | Flaw::ClockBehindKeepsLocks
    ) {
        return;
    }
    // How far the time of day jumped, ahead positive.
    let jump = step
        .nanos()
        .saturating_sub(previous.map_or(0, ClockStep::nanos));
    let now = Instant::now();
    let grants = h.shared.grants.lock().clone();
    for (name, g) in grants.into_iter().filter(|(_, g)| g.expires > now) {
        let by = Duration::from_nanos(jump.unsigned_abs());
        if jump > 0 && g.expires - now <= by && h.flaw == Flaw::ExpiresByTimeOfDay {
            // Its end, as a time of day, has passed.
            h.store.break_lock(&name);
        } else if jump < 0 {
            // Its end, as a time of day, is that much later.
            h.shared.ghosts.lock().insert(name, g.expires + by);
        }
    }
}

/// [`Flaw::TokensFollowTheClock`]'s part of a token: the store's time of day in milliseconds,
/// counted from two hours before the real time so that a step behind stays above zero.
pub(super) fn time_of_day_ms(shared: &Shared) -> u64 {
    let base: i64 = 2 * 60 * 60 * 1000;
    let step_ms = shared
        .clock_step
        .lock()
        .map_or(0, |s| s.nanos() / 1_000_000);
    u64::try_from(base.saturating_add(step_ms)).unwrap_or(0)
}
