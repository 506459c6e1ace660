//! Locks for programs without an async runtime: the same drivers and promises, behind calls
//! that block the calling thread.
//!
//! A [`BlockingLocks`] owns a small Tokio runtime (one worker thread) on which its driver's
//! connections and every lease's watchdog run, so an automatically renewed lease stays renewed
//! while the calling thread is busy in its own (blocking) work. Leases keep the runtime alive:
//! it stops when the service and the last of its leases are gone.
//!
//! ```
//! use std::time::Duration;
//! use distlock::blocking::BlockingLocks;
//! use distlock::{LockName, LockOptions, StopOn};
//!
//! fn main() -> distlock::Result<()> {
//!     let locks = BlockingLocks::connect("memory://blocking-docs")?;
//!     let name = LockName::new("nightly-report")?;
//!     let opts = LockOptions::new(Duration::from_secs(30)).auto_renew(None);
//!
//!     // By hand: acquire, check the state before each step, release.
//!     let lease = locks.acquire(&name, &opts)?;
//!     let token = lease.fencing_token(); // to storage, which refuses lower tokens
//!     assert!(token.is_some() && lease.state() == distlock::LeaseState::Held);
//!     lease.release()?;
//!
//!     // Scoped: released at the end; Err(Lost) if the lease was lost before the work ended.
//!     let rows = locks.with_lock(&name, &opts, StopOn::Lost, |scope| {
//!         // a long job checks scope.state() between its steps
//!         scope.fencing_token().map_or(0, |t| t.get())
//!     })?;
//!     assert!(rows > 0);
//!     Ok(())
//! }
//! ```
//!
//! Calling these methods on a thread inside an async runtime's context (one of its workers, or
//! one of its `spawn_blocking` threads) is an [`Error::Config`], never a panic or a blocked
//! runtime thread: there, use the async API (from `spawn_blocking`, `Handle::block_on` on
//! it).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{
    DistributedLock, Error, FencingToken, HolderInfo, Lease, LeaseState, LockName, LockOptions,
    LostSignal, Result, StopOn,
};
use tokio::runtime::{Handle, Runtime};

/// How long dropping the last handle waits for the runtime's tasks (a lease's release on its
/// way) before it stops them.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// The runtime shared by a service and its leases; stopped when the last of them is dropped.
#[derive(Debug)]
struct Engine(Option<Runtime>);

impl Engine {
    fn new() -> Result<Arc<Self>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("distlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| Error::config_with("could not start the blocking API's runtime", e))?;
        Ok(Arc::new(Engine(Some(rt))))
    }

    /// Runs `f` to its end on the calling thread, which must not be a runtime's.
    fn block_on<F: Future>(&self, f: F) -> Result<F::Output> {
        if Handle::try_current().is_ok() {
            return Err(Error::config(
                "distlock::blocking was called inside an async runtime, where blocking would \
                 stall its thread: use the async API (distlock::connect) there",
            ));
        }
        match &self.0 {
            Some(rt) => Ok(rt.block_on(f)),
            None => Err(Error::config("the blocking API's runtime has stopped")),
        }
    }

    fn handle(&self) -> Option<&Handle> {
        self.0.as_ref().map(Runtime::handle)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            // Waiting is not allowed inside another runtime; elsewhere a release on its way
            // gets a moment to arrive.
            if Handle::try_current().is_ok() {
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(SHUTDOWN_WAIT);
            }
        }
    }
}

/// A lock service whose calls block: [`DistributedLock`]'s methods, for threads without a
/// runtime. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct BlockingLocks {
    locks: Arc<dyn DistributedLock>,
    // Dropped after `locks`: the driver's connections close on their runtime.
    engine: Arc<Engine>,
}

impl BlockingLocks {
    /// Connects the driver for `url`, as [`crate::connect`] does (the same schemes, features and
    /// errors).
    pub fn connect(url: &str) -> Result<Self> {
        let engine = Engine::new()?;
        let locks = engine.block_on(crate::connect(url))??;
        Ok(BlockingLocks { locks, engine })
    }

    /// The service behind it, for what this facade does not wrap (an
    /// [`Election`](crate::Election)); its futures must run on an async runtime.
    pub fn as_async(&self) -> &Arc<dyn DistributedLock> {
        &self.locks
    }

    /// [`DistributedLock::acquire`]: waits as `opts` allows.
    pub fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<BlockingLease> {
        let lease = self.engine.block_on(self.locks.acquire(name, opts))??;
        Ok(self.lease(lease))
    }

    /// [`DistributedLock::try_acquire`]: one attempt; `Ok(None)` while someone else holds it.
    pub fn try_acquire(
        &self,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<BlockingLease>> {
        let lease = self.engine.block_on(self.locks.try_acquire(name, opts))??;
        Ok(lease.map(|l| self.lease(l)))
    }

    /// [`DistributedLock::inspect`].
    pub fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.engine.block_on(self.locks.inspect(name))?
    }

    /// [`DistributedLock::holders`].
    pub fn holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        self.engine.block_on(self.locks.holders(name))?
    }

    /// Acquires `name`, runs `work` on this thread, and releases. Blocking work cannot be
    /// stopped part-way: it checks [`BlockingScope::state`] between its steps, and when the
    /// lease was in a state `stop` names by the time it returned, its output is not returned
    /// but [`Error::Lost`] is — the work ran, at least in part, without the lock.
    pub fn with_lock<T>(
        &self,
        name: &LockName,
        opts: &LockOptions,
        stop: StopOn,
        work: impl FnOnce(&BlockingScope) -> T,
    ) -> Result<T> {
        let lease = self.acquire(name, opts)?;
        let scope = BlockingScope {
            name: name.clone(),
            token: lease.fencing_token(),
            signal: lease.lost(),
        };
        let out = work(&scope);
        let state = lease.state();
        if stop.stops(state) {
            // Frees the lock where it is still held (StopOn::AtRisk); NotHeld where it is gone.
            let _ = lease.release();
            return Err(Error::Lost {
                name: name.clone(),
                reason: format!(
                    "the lease was {state:?} when its blocking work returned; its output was \
                     dropped"
                ),
            });
        }
        if let Err(e) = lease.release() {
            tracing::warn!(lock = %name, error = %e, "the work finished while its lease held; its release failed and is sent again in the background");
        }
        Ok(out)
    }

    fn lease(&self, lease: Box<dyn Lease>) -> BlockingLease {
        BlockingLease {
            lease: Some(lease),
            engine: self.engine.clone(),
        }
    }
}

/// What [`BlockingLocks::with_lock`]'s work knows of its lease.
#[derive(Debug)]
pub struct BlockingScope {
    name: LockName,
    token: Option<FencingToken>,
    signal: LostSignal,
}

impl BlockingScope {
    /// The lock held.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The grant's fencing token.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.token
    }

    /// The lease's state now: check it before each protected step.
    pub fn state(&self) -> LeaseState {
        self.signal.state()
    }
}

/// A held lock, for blocking code: [`Lease`]'s methods. Dropping it releases the lock before
/// `drop` returns (waiting at most the driver's request timeout), or in the background where
/// dropped inside an async runtime.
#[derive(Debug)]
pub struct BlockingLease {
    // `None` only once released or abandoned.
    lease: Option<Box<dyn Lease>>,
    engine: Arc<Engine>,
}

impl BlockingLease {
    fn get(&self) -> &dyn Lease {
        match &self.lease {
            Some(l) => &**l,
            None => unreachable!("a BlockingLease is consumed by release and abandon"),
        }
    }

    /// [`Lease::name`].
    pub fn name(&self) -> &LockName {
        self.get().name()
    }

    /// [`Lease::fencing_token`].
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.get().fencing_token()
    }

    /// [`Lease::ttl`].
    pub fn ttl(&self) -> Duration {
        self.get().ttl()
    }

    /// [`Lease::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.get().valid_until()
    }

    /// [`Lease::state`].
    pub fn state(&self) -> LeaseState {
        self.get().state()
    }

    /// [`Lease::lost`]: `is_lost()` polls it; [`LostSignal::state`] reads the state.
    pub fn lost(&self) -> LostSignal {
        self.get().lost()
    }

    /// [`Lease::backend_key`].
    pub fn backend_key(&self) -> Option<String> {
        self.get().backend_key()
    }

    /// [`Lease::renew`].
    pub fn renew(&self) -> Result<()> {
        self.engine.block_on(self.get().renew())?
    }

    /// [`Lease::release`].
    pub fn release(mut self) -> Result<()> {
        match self.lease.take() {
            Some(l) => self.engine.block_on(l.release())?,
            None => Ok(()),
        }
    }

    /// [`Lease::abandon`]: stops renewing and leaves the lock to expire.
    pub fn abandon(mut self) {
        if let Some(l) = self.lease.take() {
            l.abandon();
        }
    }
}

impl Drop for BlockingLease {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        if Handle::try_current().is_ok() {
            // Inside a runtime: the lease's own drop sends the release on its runtime.
            if let Some(h) = self.engine.handle() {
                let _in = h.enter();
                drop(lease);
            }
            return;
        }
        if let Err(e) = self.engine.block_on(lease.release()).and_then(|r| r) {
            tracing::debug!(error = %e, "a dropped blocking lease's release failed; the driver sends it again or it expires");
        }
    }
}
