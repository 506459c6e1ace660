//! The in-memory reference driver.
//!
//! [`MemoryLock`] keeps every rule of the contract inside one process, for every [`Mode`]
//! (exclusive, shared, permits): TTL expiry, strictly increasing fencing tokens per name, FIFO
//! waiters across modes (a reader that comes after a waiting writer waits behind it) woken by
//! notification (a waiter sleeps until
//! it is notified, until the holder's expiry, or until its own deadline — it never polls),
//! cancel-safe `acquire`, and a lost signal at expiry. Use it in examples and in your own unit
//! tests; clones share one store and behave like independent clients of one server.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::driver::{Acquisition, LeaseOps, ManagedLease};
use crate::traits::{acquire_by, try_acquire_by};

#[path = "memory_store.rs"]
mod store;
use crate::{
    Capabilities, Change, ChangeFeed, Deadline, DistributedLock, Error, ExpiryClock, Fencing,
    FencingToken, HolderInfo, Leader, LeaderValue, Lease, LockName, LockOptions, Mode, Result,
};
use store::{Attempt, Granted, QueueGuard, Queued, Store};

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
