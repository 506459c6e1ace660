//! The backend half of a lease, which a driver writes, and the retried release that every
//! end of a lease uses.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use crate::backoff::Backoff;
use crate::Result;

/// The backend half of a lease: what a driver must do on the server. Everything else — state, lost
/// signal, watchdog, the release/renew ordering, drop — is
/// [`ManagedLease`](crate::driver::ManagedLease)'s job.
///
/// ```
/// use std::time::{Duration, Instant};
/// use lock_core::{async_trait, driver::LeaseOps, Result};
///
/// struct MyOps { ttl: Duration }
///
/// #[async_trait]
/// impl LeaseOps for MyOps {
///     fn backend(&self) -> &'static str {
///         "my"
///     }
///     async fn renew(&self) -> Result<Instant> {
///         let start = Instant::now();
///         // compare-owner-and-extend on the server, then:
///         Ok(start + self.ttl)
///     }
///     async fn release(&self, _valid_until: Instant) -> Result<()> {
///         // compare-owner-and-delete on the server
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait LeaseOps: Send + Sync + 'static {
    /// The backend's short name, as [`DistributedLock::backend`](crate::DistributedLock::backend)
    /// says it: the `lock.backend` of the lease's spans and metrics.
    fn backend(&self) -> &'static str;

    /// Extends the lease on the backend if this owner still holds it, and returns the new
    /// conservative `valid_until` (measured from before the request was sent, drift
    /// subtracted). Must never recreate a lock that is gone: `Err(NotHeld)` or `Err(Lost)`.
    async fn renew(&self) -> Result<Instant>;

    /// The watchdog's renewal ([`Renewal::Auto`](crate::Renewal::Auto)), asked when a third of
    /// the validity window has passed since the last confirmation it heard of; the default is
    /// [`renew`](Self::renew). A driver that renews many leases in one request may answer with
    /// a confirmation such a request got for this lease since then, as `renew` would have
    /// computed it, and send nothing: never one from before the lease's server changed
    /// ([`doubts`](Self::doubts)), and never for a renewal asked by hand, which always asks the
    /// backend.
    async fn renew_due(&self) -> Result<Instant> {
        self.renew().await
    }

    /// Deletes the lock on the backend if this owner still holds it; `Err(NotHeld)` otherwise.
    /// `valid_until` is the lease's validity by its last confirmation (the grant's, or the
    /// latest renewal's): what a driver whose answer can be indeterminate judges by (Redlock,
    /// when the token is off a majority but some masters stayed silent: a release while the
    /// lease was valid, `NotHeld` past it). Most drivers ignore it.
    async fn release(&self, valid_until: Instant) -> Result<()>;

    /// Called when the lease is dropped without `release` or `abandon`, with the lease's
    /// `valid_until`. The default releases in a background task on the current Tokio runtime,
    /// as [`release_with_retries`] does (sent again after a failure that may pass, until
    /// `until`); without a runtime the lock expires. Never block here.
    fn release_on_drop(self: Arc<Self>, until: Instant)
    where
        Self: Sized,
    {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = release_with_retries(self, until).await {
                    tracing::debug!(error = %e, "background release of a dropped lease failed");
                }
            });
        }
    }

    /// Called by [`Lease::abandon`](crate::Lease::abandon). The default does nothing: the lock
    /// expires.
    fn abandon(&self) {}

    /// For a lock that is its connection's session (PostgreSQL): a future that resolves once
    /// that connection has closed, which has freed the lock on the server. The lease then
    /// turns Lost at once instead of at its next renewal. The default: none.
    fn ended(&self) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        None
    }

    /// Changes the holder's value on the backend if this owner still holds it
    /// ([`Lease::proclaim`](crate::Lease::proclaim)), and notifies the name's watchers;
    /// `Err(NotHeld)` otherwise. The default: [`Error::Unsupported`](crate::Error::Unsupported).
    async fn proclaim(&self, value: &crate::LeaderValue) -> Result<()> {
        let _ = value;
        Err(crate::Error::Unsupported {
            backend: "this driver",
            operation: "proclaim",
        })
    }

    /// What [`Lease::backend_key`](crate::Lease::backend_key) returns; the default: none.
    fn backend_key(&self) -> Option<String> {
        None
    }

    /// What [`Lease::inheritable_fds`](crate::Lease::inheritable_fds) returns; the default: none.
    #[cfg(unix)]
    fn inheritable_fds(&self) -> Vec<std::os::fd::OwnedFd> {
        Vec::new()
    }

    /// For a backend whose server can change under a held lease (a Redis Sentinel failover,
    /// which may have lost the lease's key with the old master): a receiver whose value changes
    /// each time it did. At each change the lease turns AtRisk, and with
    /// [`Renewal::Auto`](crate::Renewal::Auto) is renewed at once: Held again if the new server
    /// confirms it, Lost if it refuses. The default: none.
    fn doubts(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Whether the lock ends by itself once renewals stop (a TTL). Backends where it lives as
    /// long as the client's session (ZooKeeper) return `false`; the watchdog then releases
    /// actively at `max_hold`, and once the lease has turned Lost, instead of just ceasing to
    /// renew.
    fn lapses_without_renewal(&self) -> bool {
        true
    }
}

/// Sends `ops`'s release (given `until`, the lease's `valid_until`) and returns its answer; after a failure that may pass (its connection
/// dropped), sends it again in the background ([`retry_in_background`]) until it gets through or
/// `until` (the lease's `valid_until`) has passed. The caller cannot retry: a released or dropped
/// lease is gone. Owner-checked like every release, so a retry after a first attempt that did land
/// touches nothing. What [`ManagedLease`](crate::driver::ManagedLease)'s `release` and the default
/// [`LeaseOps::release_on_drop`] do.
///
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
/// use lock_core::{async_trait, driver::LeaseOps, Result};
///
/// struct Ops;
/// #[async_trait]
/// impl LeaseOps for Ops {
///     fn backend(&self) -> &'static str { "my" }
///     async fn renew(&self) -> Result<Instant> { Ok(Instant::now()) }
///     async fn release(&self, _: Instant) -> Result<()> { Ok(()) } // an owner-checked delete
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<()> {
/// let until = Instant::now() + Duration::from_secs(5);
/// lock_core::driver::release_with_retries(Arc::new(Ops), until).await?;
/// # Ok(())
/// # }
/// ```
pub async fn release_with_retries<O: LeaseOps>(ops: Arc<O>, until: Instant) -> Result<()> {
    let result = ops.release(until).await;
    if matches!(&result, Err(e) if e.is_retryable()) {
        retry_in_background(until, move || {
            let ops = ops.clone();
            async move { ops.release(until).await }
        });
    }
    result
}

/// Runs `attempt` in the background, at once and then again after each failure that may pass
/// ([`Error::is_retryable`](crate::Error::is_retryable)), pausing by [`Backoff::transient`], until one
/// succeeds, one fails for good, or `until` has passed — so the task cannot outlive the lease it
/// cleans up after. For what a caller cannot retry itself: a release whose lease is gone, the undo
/// of an acquisition that failed. Without a Tokio runtime nothing runs (the lock then expires by
/// itself).
///
/// ```
/// use std::time::{Duration, Instant};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // An idempotent cleanup, retried for at most the lease's remaining validity.
/// lock_core::driver::retry_in_background(Instant::now() + Duration::from_secs(5), || async {
///     Ok(()) // say, an owner-checked delete of the lock key
/// });
/// # }
/// ```
pub fn retry_in_background<F, Fut>(until: Instant, mut attempt: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut pauses = Backoff::transient();
        loop {
            let result = tokio::time::timeout_at(until.into(), attempt()).await;
            let pause = pauses.pause();
            match result {
                Ok(Err(e)) if e.is_retryable() && Instant::now() + pause < until => {
                    tracing::debug!(error = %e, "background retry failed; trying again");
                    tokio::time::sleep(pause).await;
                }
                _ => return,
            }
        }
    });
}
