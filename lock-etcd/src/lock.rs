//! `EtcdLock`: a lease per lock, a revision-ordered queue, a watch on the predecessor.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::Client;
use lock_core::driver::Acquisition;
use lock_core::{Capabilities, DistributedLock, FencingToken, Lease, LockName, Result};

use crate::config::BACKEND;
use crate::spares::Spares;
use crate::EtcdConfig;

/// An etcd lock client. Cheap to clone (one gRPC channel, shared).
///
/// Each acquisition grants its own lease (TTL rounded *up* to whole seconds, and at least the
/// server's minimum, which `connect` measures) and puts `<prefix>/<name>/<lease-hex>` with it,
/// only if that key does not exist. The key with the lowest `create_revision` under the name
/// holds the lock; every other contender watches the deletion of the key just before its own,
/// so a release wakes exactly one waiter and waiters are served in revision order (FIFO).
///
/// **Waiting keeps the lease alive**: a waiter sends one keep-alive every third of its TTL and
/// nothing else; if its lease cannot be kept alive (or its key vanished), `acquire` fails with
/// `Lost` — it is never granted a lock on an expired lease. A cancelled or timed-out `acquire`
/// revokes its lease, so no key of it stays in the queue.
///
/// **Renew** sends a keep-alive, then reads the lock key: a lock key deleted behind the holder's
/// back (an operator, a `break`) is `NotHeld`, not a silent renewal of a lease that guards
/// nothing. The read also tells the term of the leader that answered: after a leader change the
/// key moves onto a lease granted in the new term before the lock counts as renewed (see the
/// crate doc, Failure modes). **Release** deletes the key only if it is still this
/// grant's (compare on `create_revision`); a bare `LeaseRevoke` could not say `NotHeld`, as it
/// succeeds even when the key is gone.
///
/// **Lease reuse**: a released lease guards nothing; instead of revoking it, the client keeps
/// it (up to 64) for its next acquisition with the same TTL. That saves a grant and a revoke
/// — two consensus writes — per lock; a lease still serves one lock at a time, and a spare
/// that expired is replaced by a new grant. A spare with ≥ 90 % of its TTL still ahead is used
/// as it is (the new lock's `valid_until` is what is left of it, never more); an older one is
/// kept alive, then the key is put (the put's term vouches for the keep-alive, as a renewal's
/// read does). Leases of failed releases and of cancelled acquisitions are revoked.
///
/// **Fencing**: the key's `create_revision`, strictly increasing across the whole cluster.
#[derive(Clone)]
pub struct EtcdLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) spares: Arc<Spares>,
    pub(crate) config: EtcdConfig,
    pub(crate) caps: Capabilities,
    /// The highest leader term any response reported (`term.rs`).
    pub(crate) term: AtomicU64,
}

#[async_trait]
impl DistributedLock for EtcdLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        self.contend(req).await
    }

    /// The oldest key under the name (the holder): its `create_revision`, and its lease's
    /// remaining TTL.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        let Some(kv) = self.head_of(name).await? else {
            return Ok(None);
        };
        let (rev, lease) = (kv.create_revision(), kv.lease());
        let ttl = self
            .call(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await
            .ok()
            .and_then(|r| u64::try_from(r.ttl()).ok())
            .map(Duration::from_secs);
        Ok(Some(lock_core::HolderInfo::new(
            u64::try_from(rev).ok().map(FencingToken::new),
            ttl,
        )))
    }
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("config", &self.inner.config)
            .field("min_ttl", &self.inner.caps.min_ttl)
            .finish()
    }
}
