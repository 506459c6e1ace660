//! Scoped use: work that runs only while its lease holds, stopped when the lease is lost, and
//! the lock released at its end — the habit every lock user needs, written once.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::{
    DistributedLock, Error, FencingToken, Lease, LeaseState, LockName, LockOptions, LostSignal,
    Result, StopOn,
};

/// What work run by [`LockExt::with_lock`] knows of its lease: the name, the fencing token to
/// pass to storage, the state to check before each protected step, and the signal or token to
/// hand to tasks it spawns. It does not own the lease: the scope releases it when the work ends.
#[derive(Clone, Debug)]
pub struct Scope {
    name: LockName,
    token: Option<FencingToken>,
    backend_key: Option<String>,
    signal: LostSignal,
}

impl Scope {
    fn of(lease: &dyn Lease) -> Self {
        Scope {
            name: lease.name().clone(),
            token: lease.fencing_token(),
            backend_key: lease.backend_key(),
            signal: lease.lost(),
        }
    }

    /// The lock held.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The grant's fencing token ([`Lease::fencing_token`]).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.token
    }

    /// Where the grant lives on the backend ([`Lease::backend_key`]).
    pub fn backend_key(&self) -> Option<&str> {
        self.backend_key.as_deref()
    }

    /// The lease's state now ([`Lease::state`]).
    pub fn state(&self) -> LeaseState {
        self.signal.state()
    }

    /// The lease's lost signal ([`Lease::lost`]).
    pub fn lost(&self) -> LostSignal {
        self.signal.clone()
    }

    /// A token cancelled when the scope's work is stopped or ends
    /// ([`LostSignal::cancellation_token`]), for tasks the work spawns.
    pub fn cancellation_token(&self, stop: StopOn) -> Result<CancellationToken> {
        self.signal.cancellation_token(stop)
    }
}

/// Runs `work` while `lease` holds and releases the lease at its end.
///
/// Returns the work's output if the lease was not in a state `stop` names when the work
/// finished. Once it is (with [`StopOn::Lost`]: another client may hold the lock now), the
/// work is dropped at once — at its next `.await`, so it takes no further step under a lease
/// it no longer has — and the call returns [`Error::Lost`] naming the lock and the state.
/// The lease is released either way: awaited after finished work (a release that fails is
/// logged and sent again in the background, as for a dropped lease: the work's output is not
/// thrown away for it), in the background after stopped work. Cancel-safe: dropping the call
/// drops the work and the lease, which frees the lock in the background.
///
/// ```
/// # use std::time::Duration;
/// use lock_core::{memory::MemoryLock, while_held, DistributedLock, LockName, LockOptions, StopOn};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// let locks = MemoryLock::new();
/// let name = LockName::new("invoices")?;
/// let lease = locks.acquire(&name, &LockOptions::new(Duration::from_secs(10)).auto_renew(None)).await?;
/// let token = lease.fencing_token();
/// let sent = while_held(lease, StopOn::Lost, async move {
///     // write with `token`; storage refuses lower tokens
///     token.map(|t| t.get())
/// })
/// .await?;
/// assert!(sent.is_some());
/// assert!(locks.inspect(&name).await?.is_none()); // released
/// # Ok(()) }
/// ```
pub async fn while_held<F>(lease: Box<dyn Lease>, stop: StopOn, work: F) -> Result<F::Output>
where
    F: Future,
{
    let signal = lease.lost();
    let clock = lease.lost();
    let finished = {
        let mut work = std::pin::pin!(work);
        let mut stopped = std::pin::pin!(signal.until(stop));
        std::future::poll_fn(|cx| {
            // The signal first: work that would finish in the same poll as the loss is judged
            // by the state below, not by the order of the branches.
            if stopped.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(None);
            }
            // Then the clock: the timer that ends a lease at `valid_until` fires at the next
            // tick of the runtime's millisecond wheel, and a step of the work woken by an
            // earlier timer in that tick would run after `valid_until` (seen 2 times in 12).
            if stop.stops(clock.state()) {
                return std::task::Poll::Ready(None);
            }
            work.as_mut().poll(cx).map(Some)
        })
        .await
    };
    let state = lease.state();
    let name = lease.name().clone();
    match finished {
        Some(out) if !stop.stops(state) => {
            if let Err(e) = lease.release().await {
                tracing::warn!(
                    lock = %name,
                    error = %e,
                    "the work finished while its lease held; its release failed and is sent again in the background"
                );
            }
            Ok(out)
        }
        _ => {
            drop(lease); // frees in the background; the caller hears of the loss at once
            Err(Error::Lost {
                name,
                reason: match state {
                    LeaseState::Lost => "the lease was lost while its work ran; the work was stopped",
                    _ => "the lease turned AtRisk while its work ran (StopOn::AtRisk); the work was stopped and the lock released",
                }
                .into(),
            })
        }
    }
}

/// Scoped use on every lock service: `locks.with_lock(&name, &opts, stop, |scope| async { … })`
/// acquires (waiting as `opts` says), runs the work while the lease holds, and releases — the
/// work stopped, and [`Error::Lost`] returned, once the lease is in a state `stop` names
/// ([`while_held`]). Implemented for every [`DistributedLock`], `dyn` and `Arc` included.
///
/// ```
/// # use std::sync::Arc;
/// # use std::time::Duration;
/// use lock_core::{memory::MemoryLock, DistributedLock, LockExt, LockName, LockOptions, StopOn};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
/// let name = LockName::new("nightly-export")?;
/// let opts = LockOptions::new(Duration::from_secs(30)).auto_renew(None);
/// let rows = locks
///     .with_lock(&name, &opts, StopOn::Lost, |scope| async move {
///         // before each protected step: scope.state(), and scope.fencing_token() to storage
///         assert!(scope.fencing_token().is_some());
///         42
///     })
///     .await?;
/// assert_eq!(rows, 42);
/// # Ok(()) }
/// ```
pub trait LockExt: DistributedLock {
    /// Acquires `name` with `opts` ([`DistributedLock::acquire`]: its errors, `Timeout`
    /// included, are returned before any work runs), then runs `work` as [`while_held`] does.
    fn with_lock<'a, W, F>(
        &'a self,
        name: &'a LockName,
        opts: &'a LockOptions,
        stop: StopOn,
        work: W,
    ) -> impl Future<Output = Result<F::Output>> + Send + 'a
    where
        W: FnOnce(Scope) -> F + Send + 'a,
        F: Future + Send + 'a,
        F::Output: Send,
    {
        async move {
            let lease = self.acquire(name, opts).await?;
            let scope = Scope::of(&*lease);
            while_held(lease, stop, work(scope)).await
        }
    }
}

impl<T: DistributedLock + ?Sized> LockExt for T {}

#[cfg(test)]
#[path = "scope_tests.rs"]
mod tests;
