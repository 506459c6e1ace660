//! An example distlock driver, written the way an out-of-tree driver would be: it depends only
//! on `lock-core`, implements `DistributedLock`, lets `ManagedLease` build the `Lease` from two
//! backend operations (`LeaseOps::renew` / `release`), and proves itself with the shared
//! conformance suite (`tests/conformance.rs`). Guide: `docs/writing-a-driver.md`.
//!
//! Its "server" is a table shared by the clients of one [`Table`]: each entry holds the owner's
//! random token, the expiry, and a fencing counter per name. Replace the table operations with
//! requests to your backend and the rest of the file stays as it is.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{DistributedLock, LockName, LockOptions};
//! let table = table_driver::Table::default();
//! let (a, b) = (table.client(), table.client());
//! let name = LockName::new("demo")?;
//! let lease = a.acquire(&name, &LockOptions::new(Duration::from_secs(5))).await?;
//! assert!(b.try_acquire(&name, &LockOptions::new(Duration::from_secs(5))).await?.is_none());
//! lease.release().await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{connecting, drift, Acquisition, Driver, Grant, LeaseOps, ManagedLease};
use lock_core::{
    Capabilities, DistributedLock, Error, Fencing, FencingToken, Lease, LockName, Result,
};
use tokio::sync::Notify;

/// The "server": lock entries and fencing counters, shared by all clients made from it.
#[derive(Clone, Default)]
pub struct Table {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    entries: Mutex<HashMap<LockName, Entry>>,
    fences: Mutex<HashMap<LockName, u64>>,
    /// Wakes waiters when a lock is released (a real backend would use pub/sub or a watch).
    released: Notify,
    /// Operations served: the suite checks with it that waiters do not poll.
    requests: AtomicU64,
    next_owner: AtomicU64,
}

struct Entry {
    owner: u64,
    expires: Instant,
}

impl Table {
    /// A new client of this table (the suite's "another process").
    pub fn client(&self) -> TableLock {
        TableLock {
            shared: self.shared.clone(),
        }
    }

    /// How many operations the table has served.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Deletes a lock behind its holder's back (what an operator might do).
    pub fn break_lock(&self, name: &LockName) {
        self.shared.lock_entries().remove(name);
        self.shared.released.notify_waiters();
    }
}

impl Shared {
    fn lock_entries(&self) -> std::sync::MutexGuard<'_, HashMap<LockName, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The backend's atomic "acquire": grant if free (or expired), else say how long the
    /// holder has left. One request.
    fn try_grant(
        &self,
        name: &LockName,
        owner: u64,
        ttl: Duration,
    ) -> std::result::Result<u64, Duration> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut entries = self.lock_entries();
        if let Some(e) = entries.get(name) {
            if e.expires > now {
                return Err(e.expires - now);
            }
        }
        entries.insert(
            name.clone(),
            Entry {
                owner,
                expires: now + ttl,
            },
        );
        let mut fences = self.fences.lock().unwrap_or_else(|p| p.into_inner());
        let fence = fences.entry(name.clone()).or_insert(0);
        *fence += 1;
        Ok(*fence)
    }
}

/// A client of a [`Table`].
#[derive(Clone)]
pub struct TableLock {
    shared: Arc<Shared>,
}

impl TableLock {
    /// A client of the table named by `table://NAME` (one table per name in this process, so
    /// two clients of one URL see each other's locks): how `distlock::connect` reaches this
    /// driver, through [`DRIVER`].
    pub fn from_url(url: &str) -> Result<Self> {
        static TABLES: std::sync::OnceLock<Mutex<HashMap<String, Table>>> =
            std::sync::OnceLock::new();
        let name = url
            .strip_prefix("table://")
            .filter(|n| !n.contains(['/', '?', '@', '#']))
            .ok_or_else(|| Error::config("a table URL is table://[NAME]"))?;
        let mut tables = TABLES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Ok(tables.entry(name.to_string()).or_default().client())
    }
}

/// This driver for `distlock::connect`: the schemes it serves and how it connects from a URL.
/// An application registers it once with `distlock::register_driver(table_driver::DRIVER)`.
pub const DRIVER: Driver = Driver {
    backend: "table",
    schemes: &["table"],
    connect: |url| connecting(async move { TableLock::from_url(&url) }),
};

impl std::fmt::Debug for TableLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableLock").finish_non_exhaustive()
    }
}

#[async_trait]
impl DistributedLock for TableLock {
    fn backend(&self) -> &'static str {
        "table"
    }

    /// Declared honestly: the suite picks (and skips, with a reason) cases from these.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new().with_fencing(Fencing::Strict)
    }

    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        let (name, ttl, opts, deadline) = (req.name(), req.ttl(), req.opts(), req.deadline());
        let owner = self.shared.next_owner.fetch_add(1, Ordering::Relaxed);
        loop {
            // Register for wake-ups *before* trying, so a release in between is not missed.
            let released = self.shared.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            // Validity is measured from before the request, minus clock drift.
            let start = Instant::now();
            let holder_left = match self.shared.try_grant(name, owner, ttl) {
                Ok(fence) => {
                    let ops = TableOps {
                        shared: self.shared.clone(),
                        name: name.clone(),
                        owner,
                        ttl,
                    };
                    return Ok(Some(Box::new(ManagedLease::new(
                        name.clone(),
                        Grant {
                            token: Some(FencingToken::new(fence)),
                            ttl,
                            valid_until: start + ttl.saturating_sub(drift(ttl)),
                        },
                        opts.renewal,
                        ops,
                    ))));
                }
                Err(left) => left,
            };
            let now = Instant::now();
            if deadline.passed() {
                return Ok(None);
            }
            // Sleep until a release, the holder's expiry, or our deadline: never a spin.
            let mut until = now + holder_left;
            if let Some(d) = deadline.at() {
                until = until.min(d);
            }
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

/// The two backend operations of a lease; `ManagedLease` does the rest (state, lost signal,
/// watchdog, drop).
struct TableOps {
    shared: Arc<Shared>,
    name: LockName,
    owner: u64,
    ttl: Duration,
}

#[async_trait]
impl LeaseOps for TableOps {
    /// Compare owner and extend; never recreate a lock that is gone.
    async fn renew(&self) -> Result<Instant> {
        self.shared.requests.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let mut entries = self.shared.lock_entries();
        match entries.get_mut(&self.name) {
            Some(e) if e.owner == self.owner && e.expires > start => {
                e.expires = start + self.ttl;
                Ok(start + self.ttl.saturating_sub(drift(self.ttl)))
            }
            _ => Err(Error::NotHeld {
                name: self.name.clone(),
            }),
        }
    }

    /// Compare owner and delete; a stale lease never touches its successor.
    async fn release(&self) -> Result<()> {
        self.shared.requests.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.shared.lock_entries();
        match entries.get(&self.name) {
            Some(e) if e.owner == self.owner && e.expires > Instant::now() => {
                entries.remove(&self.name);
                drop(entries);
                self.shared.released.notify_waiters();
                Ok(())
            }
            _ => Err(Error::NotHeld {
                name: self.name.clone(),
            }),
        }
    }
}
