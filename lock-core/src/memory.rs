//! The in-memory reference driver.
//!
//! [`MemoryLock`] keeps every rule of the contract inside one process, for every [`Mode`]
//! (exclusive, shared, permits): TTL expiry, strictly increasing fencing tokens per name, FIFO
//! waiters across modes (a reader that comes after a waiting writer waits behind it) woken by
//! notification (a waiter sleeps until
//! it is notified, until the holder's expiry, or until its own deadline — it never polls),
//! cancel-safe `acquire`, and a lost signal at expiry. Use it in examples and in your own unit
//! tests; clones share one store and behave like independent clients of one server.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{watch, Notify};

use crate::driver::{Acquisition, Admission, LeaseOps, ManagedLease};
use crate::traits::{acquire_by, try_acquire_by};
use crate::{
    Capabilities, Change, ChangeFeed, Deadline, DistributedLock, Error, ExpiryClock, Fencing,
    FencingToken, HolderInfo, Leader, LeaderValue, Lease, LockName, LockOptions, Mode, Result,
};

/// An in-process lock service. Cheap to clone; clones share the same locks.
///
/// ```
/// use std::time::Duration;
/// use lock_core::{DistributedLock, LockName, LockOptions, memory::MemoryLock};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// let a = MemoryLock::new();
/// let b = a.clone(); // another "client" of the same store
/// let name = LockName::new("cache-refresh")?;
/// let opts = LockOptions::new(Duration::from_secs(10));
/// let lease = a.try_acquire(&name, &opts).await?.expect("free");
/// assert!(b.try_acquire(&name, &opts).await?.is_none());
/// lease.release().await?;
/// assert!(b.try_acquire(&name, &opts).await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryLock {
    store: Arc<Store>,
}

/// The names in use. foldhash, not SipHash: hashing a name twice per cycle was 4 % of the
/// driver's acquire+release (callgrind); names come from the application itself.
type Slots = HashMap<LockName, Slot, foldhash::fast::RandomState>;

#[derive(Default)]
struct Store {
    slots: Mutex<Slots>,
    next_id: AtomicU64,
    operations: AtomicU64,
}

#[derive(Default)]
struct Slot {
    /// In grant order.
    holders: Vec<Holder>,
    /// Last fencing token handed out; kept after release so tokens never repeat.
    fence: u64,
    queue: VecDeque<Waiter>,
    /// Bumped at every grant, release and proclaim: what observers' feeds wait on.
    changes: Changes,
}

struct Holder {
    owner: u64,
    expires_at: Instant,
    mode: Mode,
    fence: u64,
    value: Option<LeaderValue>,
}

struct Changes(watch::Sender<u64>);

impl Default for Changes {
    fn default() -> Self {
        Changes(watch::channel(0).0)
    }
}

impl Changes {
    /// Tells the name's observers; with none, nothing is sent: a watch channel's send wakes
    /// its eight notifiers whether anyone waits or not (two sends per cycle were a tenth of
    /// the driver's instructions: 10,027 to 9,114 per cycle, callgrind), and even a silent
    /// one takes its lock. Sound because feeds subscribe, and every bump is made, under the
    /// store's lock; and nobody reads the count, only its changes.
    fn bump(&self) {
        if self.0.receiver_count() > 0 {
            self.0.send_modify(|v| *v += 1);
        }
    }
}

struct Waiter {
    id: u64,
    notify: Arc<Notify>,
    mode: Mode,
}

/// A waiter's place in a name's queue, from [`Store::enter`].
struct Queued {
    id: u64,
    notify: Arc<Notify>,
    /// When the first holder's lease ends.
    first_expiry: Option<Instant>,
}

enum Attempt {
    Granted(Granted),
    /// Busy until `expires_at` (`None`: not this waiter's turn yet, or waiters queued ahead).
    Busy {
        expires_at: Option<Instant>,
    },
}

impl Slot {
    fn expire(&mut self, now: Instant) {
        // Looked for first: most calls find nothing to drop, and `retain` costs more.
        if self.holders.iter().any(|h| now >= h.expires_at) {
            self.holders.retain(|h| now < h.expires_at);
            self.changes.bump();
        }
    }
    /// Wakes the first waiter; a waiter granted wakes the next, so compatible waiters (readers,
    /// permits) are granted one after another.
    fn wake_head(&self) {
        if let Some(w) = self.queue.front() {
            w.notify.notify_one();
        }
    }
    /// When the first holder's lease ends: when a blocked waiter may have its turn.
    fn first_expiry(&self) -> Option<Instant> {
        self.holders.iter().map(|h| h.expires_at).min()
    }
    /// Whether `mode` may join the holders now; a mismatch of permits against holders and
    /// waiters is an error.
    fn admits(&self, name: &LockName, mode: Mode) -> Result<bool> {
        let holders = self.holders.iter().map(|h| h.mode);
        let users = holders.clone().chain(self.queue.iter().map(|w| w.mode));
        match mode.admits(holders, users) {
            Admission::Yes => Ok(true),
            Admission::No => Ok(false),
            Admission::Mismatch { held } => Err(permits_mismatch(name, held, mode)),
        }
    }
    fn grant(&mut self, owner: u64, req: &Acquisition<'_>, now: Instant) -> Granted {
        self.fence += 1;
        let expires_at = now + req.ttl();
        self.holders.push(Holder {
            owner,
            expires_at,
            mode: req.mode(),
            fence: self.fence,
            value: req.value().cloned(),
        });
        self.changes.bump();
        Granted {
            owner,
            fence: self.fence,
            expires_at,
            at: now,
        }
    }
}

fn permits_mismatch(name: &LockName, held: u32, mode: Mode) -> Error {
    Error::PermitsMismatch {
        name: name.clone(),
        held,
        asked: mode.limit().unwrap_or(0),
    }
}

impl Store {
    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.operations.fetch_add(1, Ordering::Relaxed);
        self.slots.lock()
    }

    /// One grant attempt. `waiter`: the caller's queue id, if it is queued.
    fn attempt(&self, req: &Acquisition<'_>, waiter: Option<u64>) -> Result<Attempt> {
        let (name, mode) = (req.name(), req.mode());
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(name.clone()).or_default();
        slot.expire(now);
        let admitted = slot.admits(name, mode)?;
        let my_turn = match (slot.queue.front(), waiter) {
            (None, _) => true,
            (Some(head), Some(me)) => head.id == me,
            (Some(_), None) => false,
        };
        if !my_turn {
            return Ok(Attempt::Busy { expires_at: None });
        }
        if !admitted {
            return Ok(Attempt::Busy {
                expires_at: slot.first_expiry(),
            });
        }
        if waiter.is_some() {
            slot.queue.pop_front();
            slot.wake_head();
        }
        let owner = self.next_id.fetch_add(1, Ordering::Relaxed);
        Ok(Attempt::Granted(slot.grant(owner, req, now)))
    }

    /// Takes the lock, or joins the queue, in one step: no release can slip in between.
    /// `Ok(Err(first_expiry))` once queued.
    fn enter(&self, req: &Acquisition<'_>) -> Result<std::result::Result<Granted, Queued>> {
        let (name, mode) = (req.name(), req.mode());
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(name.clone()).or_default();
        slot.expire(now);
        if slot.admits(name, mode)? && slot.queue.is_empty() {
            let owner = self.next_id.fetch_add(1, Ordering::Relaxed);
            return Ok(Ok(slot.grant(owner, req, now)));
        }
        // Made only here: an acquisition granted at once needs no wake-up of its own.
        let queued = Queued {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            notify: Arc::new(Notify::new()),
            first_expiry: slot.first_expiry(),
        };
        slot.queue.push_back(Waiter {
            id: queued.id,
            notify: queued.notify.clone(),
            mode,
        });
        Ok(Err(queued))
    }
}

/// Removes a waiter's queue record when its `acquire` returns or is dropped, and passes the
/// turn on if it was at the head of the queue.
struct QueueGuard<'a> {
    store: &'a Store,
    name: &'a LockName,
    id: u64,
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        let mut slots = self.store.slots();
        if let Some(slot) = slots.get_mut(self.name) {
            let was_head = slot.queue.front().is_some_and(|w| w.id == self.id);
            slot.queue.retain(|w| w.id != self.id);
            if was_head {
                slot.wake_head();
            }
        }
    }
}

impl MemoryLock {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many times the store's state was inspected or changed, by all clients. A waiter that
    /// polls shows up here; the conformance suite uses it to prove waiting is idle.
    pub fn operations(&self) -> u64 {
        self.store.operations.load(Ordering::Relaxed)
    }

    /// `memory://` or `memory://STORE`: one store per name in this process, so two
    /// `from_url`s (two "clients") of one name see each other's locks.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{memory::MemoryLock, DistributedLock, LockName, LockOptions};
    /// let (a, b) = (MemoryLock::from_url("memory://jobs")?, MemoryLock::from_url("memory://jobs")?);
    /// let name = LockName::new("x")?;
    /// let _held = a.try_acquire(&name, &LockOptions::new(Duration::from_secs(5))).await?;
    /// assert!(b.try_acquire(&name, &LockOptions::new(Duration::from_secs(5))).await?.is_none());
    /// assert!(MemoryLock::from_url("memory://a/b").is_err());
    /// # Ok(()) }
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        static STORES: std::sync::OnceLock<Mutex<HashMap<String, MemoryLock>>> =
            std::sync::OnceLock::new();
        let Some(name) = url.strip_prefix("memory://") else {
            return Err(Error::config("a memory URL starts with memory://"));
        };
        if name.contains(['/', '?', '@', '#']) {
            return Err(Error::config(
                "a memory URL is memory:// or memory://STORE-NAME",
            ));
        }
        let mut stores = STORES.get_or_init(Default::default).lock();
        Ok(stores.entry(name.to_string()).or_default().clone())
    }

    /// Administrative break: frees `name` whoever holds it (every holder, in any mode), like deleting the key by hand on a
    /// server. The holder's next renew or release returns `NotHeld`. Returns whether it was held.
    pub fn break_lock(&self, name: &LockName) -> bool {
        let mut slots = self.store.slots();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        slot.expire(Instant::now());
        let was_held = !slot.holders.is_empty();
        slot.holders.clear();
        slot.changes.bump();
        slot.wake_head();
        was_held
    }

    fn lease(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
        grant: Granted,
    ) -> Box<dyn Lease> {
        // Same clock as the store's expiry: valid_until is exactly the expiry, no drift; and
        // granted when the store read it (a clock reading less per grant).
        Box::new(ManagedLease::granted_at(
            name.clone(),
            crate::driver::Grant {
                token: Some(FencingToken::new(grant.fence)),
                ttl,
                valid_until: grant.expires_at,
            },
            opts.renewal,
            MemoryLeaseOps {
                store: self.store.clone(),
                name: name.clone(),
                owner: grant.owner,
                ttl,
            },
            grant.at,
        ))
    }
}

struct Granted {
    owner: u64,
    fence: u64,
    expires_at: Instant,
    /// When the store granted it (its clock reading for `expires_at`).
    at: Instant,
}

impl fmt::Debug for MemoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLock").finish_non_exhaustive()
    }
}

// Its store lives as long as the process, on `Instant`'s clock: nothing restarts it.
const CAPS: Capabilities = Capabilities::new()
    .with_fencing(Fencing::Strict)
    .with_fifo(true)
    .with_inspect(true)
    .with_survives_restart(true)
    .with_expires_by(ExpiryClock::Elapsed)
    .with_shared(true)
    .with_permits(true)
    .with_election(true);

#[async_trait]
impl DistributedLock for MemoryLock {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        CAPS
    }

    /// The newest holder (the last grant), in any mode.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        Ok(self.holders(name).await?.pop())
    }

    async fn holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let now = Instant::now();
        let mut slots = self.store.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Ok(Vec::new());
        };
        slot.expire(now);
        Ok(slot
            .holders
            .iter()
            .map(|h| {
                let token = Some(FencingToken::new(h.fence));
                HolderInfo::new(token, Some(h.expires_at - now)).with_mode(h.mode)
            })
            .collect())
    }

    /// The exclusive holder, with its value (empty if it was granted without one).
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let now = Instant::now();
        let mut slots = self.store.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Ok(None);
        };
        slot.expire(now);
        Ok((slot.holders.iter())
            .find(|h| h.mode == Mode::Exclusive)
            .map(|h| {
                let value = h.value.clone().unwrap_or_default();
                Leader::new(value, FencingToken::new(h.fence), Some(h.expires_at - now))
            }))
    }

    async fn watch(&self, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
        let mut slots = self.store.slots();
        let rx = slots.entry(name.clone()).or_default().changes.0.subscribe();
        Ok(Box::new(MemoryFeed(rx)))
    }

    // Without the default's detour through the boxed `acquire_until`: an allocation and a
    // move of the acquisition's future less per call (callgrind, BENCHMARKS.md).
    async fn try_acquire(
        &self,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        try_acquire_by(self, name, opts, async |req| self.grant_until(req).await).await
    }

    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Box<dyn Lease>> {
        acquire_by(self, name, opts, async |req| self.grant_until(req).await).await
    }

    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        self.grant_until(req).await
    }
}

impl MemoryLock {
    /// [`DistributedLock::acquire_until`]: granted now, or queued until granted at the head of
    /// the queue or the deadline.
    async fn grant_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        let (name, ttl, opts, deadline) = (req.name(), req.ttl(), req.opts(), req.deadline());
        if deadline == Deadline::Now {
            return Ok(match self.store.attempt(&req, None)? {
                Attempt::Granted(grant) => Some(self.lease(name, ttl, opts, grant)),
                Attempt::Busy { .. } => None,
            });
        }
        match self.store.enter(&req)? {
            Ok(grant) => Ok(Some(self.lease(name, ttl, opts, grant))),
            Err(queued) => {
                req.queued();
                // Boxed: its timers would make every acquisition's future (moved into its
                // box at each call) several times larger, queued or not.
                Box::pin(self.wait_in_queue(&req, queued)).await
            }
        }
    }

    /// A queued acquisition's wait, until it is granted at the head of the queue or its
    /// deadline passes.
    async fn wait_in_queue(
        &self,
        req: &Acquisition<'_>,
        me: Queued,
    ) -> Result<Option<Box<dyn Lease>>> {
        let (name, ttl, opts, deadline) = (req.name(), req.ttl(), req.opts(), req.deadline());
        let mut expires_at = me.first_expiry;
        let _guard = QueueGuard {
            store: &self.store,
            name,
            id: me.id,
        };
        loop {
            if deadline.passed() {
                return Ok(None);
            }
            let expiry = async {
                match expires_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = me.notify.notified() => {}
                _ = expiry => {}
                _ = deadline.sleep() => return Ok(None),
            }
            match self.store.attempt(req, Some(me.id))? {
                Attempt::Granted(grant) => return Ok(Some(self.lease(name, ttl, opts, grant))),
                Attempt::Busy { expires_at: e } => expires_at = e,
            }
        }
    }
}

struct MemoryLeaseOps {
    store: Arc<Store>,
    name: LockName,
    owner: u64,
    ttl: Duration,
}

impl MemoryLeaseOps {
    fn release_now(&self) -> Result<()> {
        let mut slots = self.store.slots();
        let slot = slots.get_mut(&self.name);
        match slot {
            Some(slot) => {
                slot.expire(Instant::now());
                // An owner holds once: the first match is the only one (and the order of
                // the others, the grants', is kept).
                let at = slot.holders.iter().position(|h| h.owner == self.owner);
                if let Some(at) = at {
                    slot.holders.remove(at);
                    slot.changes.bump();
                    slot.wake_head();
                    Ok(())
                } else {
                    Err(Error::not_held(&self.name))
                }
            }
            None => Err(Error::not_held(&self.name)),
        }
    }
}

#[async_trait]
impl LeaseOps for MemoryLeaseOps {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn renew(&self) -> Result<Instant> {
        let now = Instant::now();
        let mut slots = self.store.slots();
        let holder = slots
            .get_mut(&self.name)
            .and_then(|s| s.holders.iter_mut().find(|h| h.owner == self.owner))
            .filter(|h| now < h.expires_at);
        match holder {
            Some(h) => {
                h.expires_at = now + self.ttl;
                Ok(h.expires_at)
            }
            None => Err(Error::not_held(&self.name)),
        }
    }

    async fn release(&self, _valid_until: Instant) -> Result<()> {
        self.release_now()
    }

    async fn proclaim(&self, value: &LeaderValue) -> Result<()> {
        let now = Instant::now();
        let mut slots = self.store.slots();
        let Some(slot) = slots.get_mut(&self.name) else {
            return Err(Error::not_held(&self.name));
        };
        let holder = (slot.holders.iter_mut())
            .find(|h| h.owner == self.owner)
            .filter(|h| now < h.expires_at)
            .ok_or_else(|| Error::not_held(&self.name))?;
        holder.value = Some(value.clone());
        slot.changes.bump();
        Ok(())
    }

    fn release_on_drop(self: Arc<Self>, _until: Instant) {
        // Synchronous: no runtime needed, and the next waiter is woken at once.
        let _ = self.release_now();
    }
}

/// A memory store's notifications for one name. Lapses are not among them: the store expires
/// leases when it is next looked at.
struct MemoryFeed(watch::Receiver<u64>);

#[async_trait]
impl ChangeFeed for MemoryFeed {
    async fn changed(&mut self) -> Result<Change> {
        match self.0.changed().await {
            Ok(()) => Ok(Change::Notified),
            // The store lives as long as the process: its sender is never dropped while a
            // slot exists, and slots are never removed.
            Err(_) => std::future::pending().await,
        }
    }
}

/// The memory driver for `distlock::connect`: `memory://[STORE]` ([`MemoryLock::from_url`]).
pub const DRIVER: crate::driver::Driver = crate::driver::Driver {
    backend: "memory",
    schemes: &["memory"],
    connect: |url| crate::driver::connecting(async move { MemoryLock::from_url(&url) }),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_are_served_in_arrival_order() {
        let locks = MemoryLock::new();
        let name = LockName::new("fifo").unwrap();
        let opts = LockOptions::new(Duration::from_secs(10));
        let first = locks.acquire(&name, &opts).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let (locks, name, opts, order) =
                (locks.clone(), name.clone(), opts.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let l = locks.acquire(&name, &opts).await.unwrap();
                order.lock().push(i);
                l.release().await.unwrap();
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        first.release().await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock(), vec![0, 1, 2, 3]);
    }
}
