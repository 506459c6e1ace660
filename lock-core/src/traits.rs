//! The two traits every driver implements.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::Instrument;

use crate::driver::Acquisition;
use crate::telemetry::{AcquireReport, Acquired};
use crate::{
    Capabilities, ChangeFeed, Deadline, FencingToken, Leader, LeaderValue, LeaseState, LockName,
    LockOptions, LostSignal, Mode, Result,
};

/// A lock service: one backend, one client (connection, session) shared by all its leases.
/// A lease keeps what it needs of its client: dropping every handle of the client leaves its
/// leases held and renewed until they are released, dropped, abandoned or lost (conformance
/// case `renewal::lease_outlives_its_client_handle`).
///
/// Object safe: applications hold an `Arc<dyn DistributedLock>` and swap the backend from
/// configuration without code changes.
///
/// Works on any tokio runtime, a current-thread one included: no call, and no task a driver
/// spawns (a watchdog, a connection, a background release), keeps the runtime's thread
/// waiting, on healthy servers or while reconnecting and timing out; blocking work goes to
/// `spawn_blocking` (conformance cases `runtime::no_call_blocks_the_runtime` and
/// `runtime::no_call_blocks_the_runtime_under_faults`).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lock_core::{DistributedLock, LockName, LockOptions, memory::MemoryLock};
///
/// async fn nightly_job(locks: Arc<dyn DistributedLock>) -> lock_core::Result<()> {
///     let name = LockName::new("nightly-job")?;
///     let opts = LockOptions::new(Duration::from_secs(30)).auto_renew(None).no_wait();
///     let Some(lease) = locks.try_acquire(&name, &opts).await? else {
///         return Ok(()); // another instance runs it
///     };
///     // ... work, passing lease.fencing_token() to the storage ...
///     lease.release().await
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// nightly_job(Arc::new(MemoryLock::new())).await
/// # }
/// ```
#[async_trait]
pub trait DistributedLock: Send + Sync + Debug {
    /// Short backend name: `"memory"`, `"redis"`, `"redlock"`, `"zookeeper"`, `"etcd"`, `"file"`.
    fn backend(&self) -> &'static str;

    /// What this driver can promise.
    fn capabilities(&self) -> Capabilities;

    /// The one acquisition a driver implements; applications call
    /// [`try_acquire`](Self::try_acquire) or [`acquire`](Self::acquire), which validate the
    /// options against [`capabilities`](Self::capabilities) into the
    /// [`Acquisition`](crate::driver::Acquisition) passed here (its effective TTL, its
    /// deadline).
    ///
    /// Returns the lease, or `Ok(None)` when the lock was not granted by `deadline`
    /// ([`Deadline::Now`]: it is held, or on FIFO backends waiters are queued ahead). Nothing of
    /// a losing or timed-out attempt stays behind on the backend. A deadline that has passed
    /// before the first request (`wait_for(Duration::ZERO)`) still gets one attempt, like
    /// [`Deadline::Now`] (conformance case `waiting::spent_deadline_still_tries_once`).
    ///
    /// Waiting never polls: drivers wake on the backend's notification (or the holder's
    /// expiry). Cancel-safe: dropping the future leaves no waiter record behind and no held
    /// lock — also when a request already on its way still gets the lock after the caller
    /// left: the driver undoes that grant in the background (conformance case
    /// `waiting::cancelled_in_flight_leaves_no_holder`, and
    /// `waiting::cancelled_acquire_leaves_no_holder` for a cut anywhere, between the driver's
    /// own steps too). Only where no runtime is left to send the undo does such a grant stay
    /// until its TTL.
    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>>;

    /// One attempt. `Ok(None)` means someone else holds the lock (or, on FIFO backends, waiters
    /// are queued ahead). A losing attempt leaves nothing behind on the backend. A backend that
    /// does not answer is a retryable error within the driver's request timeout, never
    /// `Ok(None)` (conformance case `faults::unreachable_backend_is_an_error`).
    async fn try_acquire(
        &self,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        try_acquire_by(self, name, opts, async |req| self.acquire_until(req).await).await
    }

    /// Waits for the lock as long as `opts.wait` allows, then
    /// [`Error::Timeout`](crate::Error::Timeout). Cancel-safe, like
    /// [`acquire_until`](Self::acquire_until).
    async fn acquire(&self, name: &LockName, opts: &LockOptions) -> Result<Box<dyn Lease>> {
        acquire_by(self, name, opts, async |req| self.acquire_until(req).await).await
    }

    /// Who holds `name` now, read without acquiring it: `Ok(None)` if it is free. For
    /// operators and status commands. It shows every grant and release that completed before
    /// it was called, whichever client made them (a ZooKeeper client's follower is brought up
    /// to date first); by the time the answer arrives it may be stale.
    ///
    /// The default is [`Error::Unsupported`](crate::Error::Unsupported): drivers that can
    /// tell override it.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let _ = name;
        Err(crate::Error::Unsupported {
            backend: self.backend(),
            operation: "inspect",
        })
    }

    /// Every current holder of `name` (shared holders, permit holders), newest grant last;
    /// empty if it is free. Like [`inspect`](Self::inspect), which names one of them, read
    /// without acquiring and possibly stale by the time it arrives.
    ///
    /// The default answers from [`inspect`](Self::inspect): right for drivers that grant the
    /// exclusive mode only; drivers of the lock family override it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{memory::MemoryLock, DistributedLock, LockName, LockOptions, Mode};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// let locks = MemoryLock::new();
    /// let name = LockName::new("schema")?;
    /// let read = LockOptions::new(Duration::from_secs(10)).shared();
    /// let (a, b) = (locks.acquire(&name, &read).await?, locks.acquire(&name, &read).await?);
    /// let holders = locks.holders(&name).await?;
    /// assert_eq!(holders.len(), 2);
    /// assert!(holders.iter().all(|h| h.mode == Mode::Shared));
    /// # a.release().await?; b.release().await?; Ok(()) }
    /// ```
    async fn holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        Ok(self.inspect(name).await?.into_iter().collect())
    }

    /// The leader of `name` for [`Election`](crate::Election)s: its exclusive holder, with the
    /// value it was granted with ([`LockOptions::value`]) or has proclaimed since
    /// ([`Lease::proclaim`]), and its fencing token as the term; `Ok(None)` when no one holds
    /// it exclusively. Read without acquiring; like [`inspect`](Self::inspect), it shows every
    /// change that completed before it was called, and may be stale by the time it arrives.
    ///
    /// The default is [`Error::Unsupported`](crate::Error::Unsupported); drivers that declare
    /// [`Capabilities::election`](crate::Capabilities::election) override it.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let _ = name;
        Err(crate::Error::Unsupported {
            backend: self.backend(),
            operation: "leader election",
        })
    }

    /// A feed of changes to `name` (a grant, a release, a lapse where the backend reports one,
    /// a proclaimed value), for an election's [`Observer`](crate::Observer); made before the
    /// observer's first read, so nothing after that read is missed.
    ///
    /// The default is [`Error::Unsupported`](crate::Error::Unsupported); drivers that declare
    /// [`Capabilities::election`](crate::Capabilities::election) override it.
    async fn watch(&self, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
        let _ = name;
        Err(crate::Error::Unsupported {
            backend: self.backend(),
            operation: "leader election",
        })
    }
}

/// The body of [`DistributedLock::try_acquire`] around `until`, a driver's acquisition: the
/// default's (through the boxed [`DistributedLock::acquire_until`]) and, unboxed, this crate's
/// memory driver's (an allocation and a move of its future less per call).
pub(crate) async fn try_acquire_by<L, F>(
    lock: &L,
    name: &LockName,
    opts: &LockOptions,
    until: F,
) -> Result<Option<Box<dyn Lease>>>
where
    L: DistributedLock + ?Sized,
    F: AsyncFnOnce(Acquisition<'_>) -> Result<Option<Box<dyn Lease>>>,
{
    let probe = AcquireReport::start(lock.backend(), name, opts, false);
    let result = async {
        let caps = lock.capabilities();
        supports(lock.backend(), &caps, opts)?;
        let req = Acquisition::new(name, opts, &caps, Deadline::Now)?.reported_by(&probe);
        until(req).await
    }
    .instrument(probe.span())
    .await;
    probe.finish(match &result {
        Ok(Some(lease)) => Acquired::Granted(lease.fencing_token()),
        Ok(None) => Acquired::Busy,
        Err(e) => Acquired::Failed(e),
    });
    result
}

/// The body of [`DistributedLock::acquire`] around `until`, as [`try_acquire_by`].
pub(crate) async fn acquire_by<L, F>(
    lock: &L,
    name: &LockName,
    opts: &LockOptions,
    until: F,
) -> Result<Box<dyn Lease>>
where
    L: DistributedLock + ?Sized,
    F: AsyncFnOnce(Acquisition<'_>) -> Result<Option<Box<dyn Lease>>>,
{
    let probe = AcquireReport::start(lock.backend(), name, opts, true);
    let start = probe.started(); // one clock reading for the deadline and the report
    let result = async {
        let deadline = Deadline::from_wait(opts.wait, start);
        let caps = lock.capabilities();
        supports(lock.backend(), &caps, opts)?;
        let req = Acquisition::new(name, opts, &caps, deadline)?.reported_by(&probe);
        until(req).await
    }
    .instrument(probe.span())
    .await;
    match result {
        Ok(Some(lease)) => {
            probe.finish(Acquired::Granted(lease.fencing_token()));
            Ok(lease)
        }
        Ok(None) => {
            probe.finish(Acquired::Timeout);
            Err(crate::Error::Timeout {
                name: name.clone(),
                waited: start.elapsed(),
            })
        }
        Err(e) => {
            probe.finish(Acquired::Failed(&e));
            Err(e)
        }
    }
}

/// [`Error::Unsupported`](crate::Error::Unsupported) for a mode the driver does not declare
/// in `caps`: a shared or permit request is never served as an exclusive lock instead.
fn supports(backend: &'static str, caps: &Capabilities, opts: &LockOptions) -> Result<()> {
    let operation = match opts.mode {
        Mode::Shared if !caps.shared => "shared mode",
        Mode::Permits(_) if !caps.permits => "permits (semaphores)",
        // A value the driver would not store is refused, never dropped.
        _ if opts.value.is_some() && !caps.election => "a holder's value (leader election)",
        _ => return Ok(()),
    };
    Err(crate::Error::Unsupported { backend, operation })
}

/// What [`DistributedLock::inspect`] can tell about a lock's current holder.
///
/// ```
/// use std::time::Duration;
/// use lock_core::{FencingToken, HolderInfo};
/// let h = HolderInfo::new(Some(FencingToken::new(7)), Some(Duration::from_secs(3)));
/// assert_eq!(h.fencing_token.map(|t| t.get()), Some(7));
/// assert!(!h.foreign);
/// // Held through the same key by a client that is not distlock: no token of ours to show.
/// let other = HolderInfo::foreign(Some(Duration::from_secs(9)));
/// assert!(other.foreign && other.fencing_token.is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's fencing token, where the backend records it.
    pub fencing_token: Option<FencingToken>,
    /// How long the lock lasts if its holder stops renewing, where the backend can tell
    /// (`None` for session- or process-scoped locks).
    pub remaining: Option<Duration>,
    /// Held by another client than distlock on the same key (redis-py, redsync, ...), where
    /// the backend can tell; then there is no fencing token to report.
    pub foreign: bool,
    /// How it holds the name: exclusive (the default), shared, or one of K permits.
    pub mode: Mode,
}

impl HolderInfo {
    /// A holder description.
    pub const fn new(fencing_token: Option<FencingToken>, remaining: Option<Duration>) -> Self {
        HolderInfo {
            fencing_token,
            remaining,
            foreign: false,
            mode: Mode::Exclusive,
        }
    }
    /// A holder that is another client than distlock.
    pub const fn foreign(remaining: Option<Duration>) -> Self {
        HolderInfo {
            fencing_token: None,
            remaining,
            foreign: true,
            mode: Mode::Exclusive,
        }
    }
    /// The same holder, holding in `mode`.
    pub const fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}

/// A held lock. A lease is a value (name + owner token), not a thread: any task may renew or
/// release it, and release takes it by value so it cannot be released twice.
///
/// Dropping a lease without [`release`](Lease::release) inside a Tokio runtime frees the lock
/// promptly, in the background (conformance case `lost::dropped_lease_frees_promptly`), and a
/// background release that fails for a reason that may pass is sent again until it gets
/// through or the lease has expired anyway (`faults::dropped_lease_still_frees_after_a_lost_release`);
/// where no runtime is left to send the release, it frees by expiry.
/// [`abandon`](Lease::abandon) deliberately leaves it to expire.
#[async_trait]
pub trait Lease: Send + Sync + Debug {
    /// The lock this lease holds.
    fn name(&self) -> &LockName;

    /// This grant's fencing token; `None` only where
    /// [`Capabilities::fencing`](crate::Capabilities::fencing) is `Fencing::None`. The same for
    /// the lease's whole life: renewals do not change it (conformance case
    /// `fencing::token_is_the_grants_for_its_life`).
    fn fencing_token(&self) -> Option<FencingToken>;

    /// The TTL the backend actually granted (rounded up to its granularity, never shortened).
    fn ttl(&self) -> Duration;

    /// Conservative end of validity on the local monotonic clock: acquisition start plus TTL
    /// minus clock drift, moved forward by each confirmed renewal. The backend cannot give the
    /// lock to anyone else before this instant.
    fn valid_until(&self) -> Instant;

    /// Held, AtRisk or Lost, right now.
    fn state(&self) -> LeaseState;

    /// A signal that resolves when the lease is lost, released, dropped or abandoned, so no task
    /// waits on it forever.
    fn lost(&self) -> LostSignal;

    /// Extends the lease by its TTL. Owner-checked on the backend; never recreates a lock that
    /// expired: then [`Error::NotHeld`](crate::Error::NotHeld) or
    /// [`Error::Lost`](crate::Error::Lost), and the lease is Lost for good. A backend that does
    /// not answer is an error within the driver's request timeout, never `Ok` (conformance
    /// case `faults::cut_off_holder_gets_answers_not_hangs`); a
    /// [`ManagedLease`](crate::driver::ManagedLease) ends an unanswered renewal at
    /// `valid_until` at the latest, with `Lost`. Cancel-safe: a renewal dropped part-way
    /// leaves the lease as it was, or renewed (conformance case
    /// `renewal::cancelled_renew_leaves_the_lease_held`).
    async fn renew(&self) -> Result<()>;

    /// Releases the lock if this lease still holds it; `Err(NotHeld)` if it had expired. Never
    /// touches a successor. A release dropped part-way still frees the lock promptly, as a
    /// dropped lease does (conformance case `exclusion::cancelled_release_still_frees`). One
    /// that fails for a reason that may pass (its connection dropped) reports the error, and
    /// the driver sends it again in the background until it gets through or the lease has
    /// expired anyway ([`ManagedLease`](crate::driver::ManagedLease) does; conformance case
    /// `faults::failed_release_still_frees`).
    async fn release(self: Box<Self>) -> Result<()>;

    /// Stops renewing and forgets the lease without telling the backend, as if this holder had
    /// crashed: the lock frees however the backend frees a dead holder's lock (TTL or session
    /// expiry; at once for file locks, which the kernel drops with the file handle).
    fn abandon(self: Box<Self>);

    /// Where this grant lives on the backend, in the backend's own terms: the etcd key, the
    /// ZooKeeper node's path (below the chroot), the Redis key, the lock file's path. For
    /// operators and foreign clients that look at the backend directly (`distlock run` exports
    /// it as `DISTLOCK_KEY`). `None` (the default) where the driver does not say. Each lock
    /// has its own, and a lease's does not change while it lives (conformance case
    /// `inspect::backend_key_is_the_locks_own`).
    fn backend_key(&self) -> Option<String> {
        None
    }

    /// How many renewals of this lease the backend has confirmed so far, by the watchdog or by
    /// [`renew`](Self::renew); `None` (the default) where the driver does not count them.
    /// Every [`ManagedLease`](crate::driver::ManagedLease) counts (conformance cases
    /// `telemetry::acquisitions_renewals_and_releases_are_reported` and
    /// `renewal::watchdog_renews_at_about_a_third_of_the_ttl`).
    ///
    /// ```
    /// # async fn demo() -> lock_core::Result<()> {
    /// use lock_core::{memory::MemoryLock, DistributedLock, LockName, LockOptions};
    /// let locks = MemoryLock::new();
    /// let lease = locks
    ///     .acquire(&LockName::new("jobs")?, &LockOptions::new(std::time::Duration::from_secs(5)))
    ///     .await?;
    /// lease.renew().await?;
    /// assert_eq!(lease.renewals(), Some(1));
    /// # lease.release().await }
    /// ```
    fn renewals(&self) -> Option<u64> {
        None
    }

    /// Duplicates of the descriptors whose open files hold this lock, for a supervisor that
    /// starts processes (`distlock run`): a child that inherits them keeps the lock held until
    /// it exits, even if this process dies first — `flock(1)`'s way. Empty (the default) where
    /// the lock lives on a server, whose TTL or session already outlasts a dead holder. The
    /// duplicates are close-on-exec; dropping them does not release the lock.
    #[cfg(unix)]
    fn inheritable_fds(&self) -> Vec<std::os::fd::OwnedFd> {
        Vec::new()
    }

    /// Changes the value this holder was granted with ([`LockOptions::value`]): what
    /// [`DistributedLock::leader`] reads and observers are notified of, for an
    /// [`Election`](crate::Election)'s leader that changes what it says without giving up
    /// leadership. Owner-checked on the backend like a renewal: once the lease has ended it
    /// is refused ([`Error::NotHeld`](crate::Error::NotHeld), [`Error::Lost`](crate::Error::Lost))
    /// and changes nothing. The default is [`Error::Unsupported`](crate::Error::Unsupported).
    async fn proclaim(&self, value: &LeaderValue) -> Result<()> {
        let _ = value;
        Err(crate::Error::Unsupported {
            backend: "this driver",
            operation: "proclaim",
        })
    }
}

/// `Arc<T>` and `Box<T>` are locks too, forwarding every method (provided ones included, so a
/// driver's own override is kept); clippy's `missing_trait_methods` catches a method added to
/// the trait and not forwarded here.
/// The future an `#[async_trait]` method returns.
type Boxed<'f, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'f>>;

macro_rules! forward {
    ($ptr:ident) => {
        #[async_trait]
        #[warn(clippy::missing_trait_methods)]
        impl<T: DistributedLock + ?Sized> DistributedLock for $ptr<T> {
            fn backend(&self) -> &'static str {
                (**self).backend()
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            // The hot three hand on the inner lock's boxed future as it is: an `async fn`
            // here would box it again (an allocation per call).
            fn acquire_until<'s, 'r, 'f>(
                &'s self,
                req: Acquisition<'r>,
            ) -> Boxed<'f, Result<Option<Box<dyn Lease>>>>
            where
                's: 'f,
                'r: 'f,
                Self: 'f,
            {
                (**self).acquire_until(req)
            }
            fn try_acquire<'s, 'n, 'o, 'f>(
                &'s self,
                name: &'n LockName,
                opts: &'o LockOptions,
            ) -> Boxed<'f, Result<Option<Box<dyn Lease>>>>
            where
                's: 'f,
                'n: 'f,
                'o: 'f,
                Self: 'f,
            {
                (**self).try_acquire(name, opts)
            }
            fn acquire<'s, 'n, 'o, 'f>(
                &'s self,
                name: &'n LockName,
                opts: &'o LockOptions,
            ) -> Boxed<'f, Result<Box<dyn Lease>>>
            where
                's: 'f,
                'n: 'f,
                'o: 'f,
                Self: 'f,
            {
                (**self).acquire(name, opts)
            }
            async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
                (**self).inspect(name).await
            }
            async fn holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
                (**self).holders(name).await
            }
            async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
                (**self).leader(name).await
            }
            async fn watch(&self, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
                (**self).watch(name).await
            }
        }
    };
}

forward!(Arc);
forward!(Box);
