//! `RedlockLock`: quorum acquire, renew and release over independent masters.

use std::fmt;
use std::sync::Arc;

use crate::client::Masters;
use crate::config::BACKEND;
use crate::quorum::{contend, read_holders};
use crate::RedlockConfig;
use async_trait::async_trait;
use lock_core::driver::Acquisition;
use lock_core::{Capabilities, DistributedLock, Fencing, Lease, LockName, Result};

/// What every Redlock client can promise; its minimum TTL follows its configuration
/// ([`RedlockConfig::min_ttl`]).
pub(crate) const CAPS: Capabilities = Capabilities::new()
    .with_fencing(Fencing::None)
    .with_inspect(true)
    // Readers by majority (each master's group of readers): see the crate's docs.
    .with_shared(true);

/// A Redlock client over N independent Redis masters.
///
/// A lock is held when a majority (N/2 + 1) of masters granted it within a validity of
/// TTL − elapsed − drift, measured on the monotonic clock from before the first request. Every
/// request goes to all masters in parallel, each with its own timeout, and is decided as soon
/// as a majority agrees (slower masters still get it); a failed acquisition is released on
/// every master that may hold it, including those that did not answer.
///
/// **No fencing tokens**: independent masters cannot agree on a monotonic counter without
/// consensus, so [`Capabilities::fencing`] is `Fencing::None` and
/// [`Lease::fencing_token`](lock_core::Lease::fencing_token) is `None`. When correctness needs
/// a token, use the etcd or ZooKeeper driver.
///
/// **Operational rule**: a master that restarts must either have persisted its keys
/// (`appendonly yes` + `appendfsync always`) or stay down longer than the longest TTL in use;
/// otherwise it forgets grants and a second client can assemble a majority while the first
/// still holds the lock.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::{DistributedLock, LockName, LockOptions};
/// use lock_redlock::RedlockLock;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// let locks = RedlockLock::from_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?;
/// let lease = locks.acquire(&LockName::new("report")?, &LockOptions::new(Duration::from_secs(10))).await?;
/// assert!(lease.fencing_token().is_none());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) masters: Masters,
    /// [`CAPS`] with the minimum TTL of the configuration, worked out once at connect.
    pub(crate) caps: Capabilities,
}

impl RedlockLock {
    /// Connects to every master in parallel. Succeeds when a majority answers; masters that are
    /// down are retried in the background. Rejected credentials on any master are a
    /// [`Error::Config`](lock_core::Error::Config); fewer than a majority reachable is
    /// [`Error::Unavailable`](lock_core::Error::Unavailable).
    pub async fn connect(config: RedlockConfig) -> Result<Self> {
        let caps = CAPS.with_min_ttl(config.min_ttl());
        Ok(RedlockLock {
            inner: Arc::new(Inner {
                masters: Masters::connect(config).await?,
                caps,
            }),
        })
    }

    /// [`connect`](Self::connect) from a `redlock://` URL.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(RedlockConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.masters.config
    }
}

#[async_trait]
impl DistributedLock for RedlockLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// A quorum read of every master's lock key and group of readers: held when a majority
    /// store the same writer, or a reader is a member on a majority; the remaining time is how
    /// long until fewer than a majority still do. No fencing token (Redlock has none). Free
    /// when nobody has a majority (split leftovers of failed attempts hold nothing); too few
    /// answers is `QuorumNotReached`.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        Ok(read_holders(&self.inner.masters, name).await?.pop())
    }

    /// The writer, or every reader held on a majority of masters, as [`inspect`] reads them.
    ///
    /// [`inspect`]: DistributedLock::inspect
    async fn holders(&self, name: &LockName) -> Result<Vec<lock_core::HolderInfo>> {
        read_holders(&self.inner.masters, name).await
    }

    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        contend(&self.inner.masters, req).await
    }
}

impl fmt::Debug for RedlockLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLock")
            .field("config", self.config())
            .finish()
    }
}
