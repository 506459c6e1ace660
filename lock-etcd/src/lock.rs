//! `EtcdLock`: a lease per lock, a revision-ordered queue, a watch on the predecessor.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, TxnOp};
use lock_core::driver::{queue_turn, Acquisition, Turn};
use lock_core::{
    Capabilities, ChangeFeed, DistributedLock, ExpiryClock, Fencing, FencingToken, HolderInfo,
    Leader, Lease, LockName, Mode, Result,
};

use crate::client::Cluster;
use crate::config::BACKEND;
use crate::guarded::guarded_txn;
use crate::layout;
use crate::queue::contend;
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
///
/// **A shared lease** ([`EtcdConfig::with_shared_lease`]): the locks of one TTL put their keys
/// on one lease of the client instead of a lease each (keys `<lease-hex>_<n>`), so that their
/// renewals share its keep-alives and no lease is granted, pooled or revoked per lock; what
/// changes is in the crate's docs.
#[derive(Clone)]
pub struct EtcdLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) caps: Capabilities,
}

impl EtcdLock {
    /// Connects, authenticates if configured, and checks that the cluster answers a
    /// linearizable read (etcd-client's own `connect` does no I/O without credentials).
    /// Credentials given to a cluster with authentication off are not used (a warning is
    /// logged), as etcd's own clients do.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        let (cluster, min_ttl) = Cluster::connect(config).await?;
        let caps = Capabilities::new()
            .with_fencing(Fencing::Strict)
            .with_inspect(true)
            .with_fifo(true)
            // A contender's key says its mode; one queue serves them all (`layout.rs`).
            .with_shared(true)
            .with_permits(true)
            // The key's value is the holder's, as `etcdctl elect` writes its proposal.
            .with_election(true)
            // Leases are kept by the quorum and counted on the leader's monotonic clock (a
            // restart or a new leader grants each its whole TTL again).
            .with_survives_restart(true)
            .with_expires_by(ExpiryClock::Elapsed)
            .with_ttl_granularity(Duration::from_secs(1))
            .with_min_ttl(min_ttl);
        Ok(EtcdLock {
            inner: Arc::new(Inner {
                cluster: Arc::new(cluster),
                caps,
            }),
        })
    }

    /// [`connect`](Self::connect) from an `etcd://` URL.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(EtcdConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.cluster.config
    }

    /// The underlying client (a clone: clients share one channel).
    pub fn client(&self) -> Client {
        self.inner.cluster.client.clone()
    }

    /// Runs `ops` in one etcd transaction **only while `lease` still holds its lock**: the
    /// transaction compares the lock key's `create_revision` with the lease's fencing token, so
    /// it is applied atomically with the ownership check — a holder that lost its lock (lease
    /// expired, key deleted, a successor granted) cannot write. Returns the transaction's
    /// response; [`Error::NotHeld`](lock_core::Error::NotHeld) (nothing applied) when the lock
    /// is no longer this lease's.
    ///
    /// One request: the transaction itself, on the key the lease reports
    /// ([`Lease::backend_key`]). `lease` must come from an `EtcdLock` with the same prefix: a
    /// lease without a fencing token, or whose key is not one of this driver's under its
    /// name (another backend's, another prefix's), is an
    /// [`Error::Unsupported`](lock_core::Error::Unsupported) and nothing is sent.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_core::{DistributedLock, LockName, LockOptions};
    /// use lock_etcd::{etcd_client::TxnOp, EtcdLock};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// let locks = EtcdLock::from_url("etcd://127.0.0.1:2379").await?;
    /// let lease = locks.acquire(&LockName::new("ledger")?, &LockOptions::new(Duration::from_secs(10))).await?;
    /// // Written only if `lease` still holds "ledger" at the moment etcd applies it.
    /// locks.guarded_txn(&*lease, [TxnOp::put("ledger/balance", "42", None)]).await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn guarded_txn(
        &self,
        lease: &dyn Lease,
        ops: impl IntoIterator<Item = TxnOp>,
    ) -> Result<etcd_client::TxnResponse> {
        guarded_txn(&self.inner.cluster, lease, ops).await
    }
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
        contend(&self.inner.cluster, req).await
    }

    /// The oldest contender, when it holds exclusively (`election.rs`).
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        crate::election::leader(&self.inner.cluster, name).await
    }

    async fn watch(&self, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
        crate::election::watch(&self.inner.cluster, name).await
    }

    /// The newest of [`holders`](DistributedLock::holders).
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        Ok(self.holders(name).await?.pop())
    }

    /// The keys under the name whose turn has come ([`queue_turn`]): each one's
    /// `create_revision`, mode and lease's remaining TTL, oldest first.
    async fn holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let c = &self.inner.cluster;
        let dir = layout::dir(&c.config, name);
        let range = c
            .call(|mut cl| {
                let dir = dir.clone();
                async move { cl.get(dir, Some(layout::range_up_to(0))).await }
            })
            .await?;
        let queue = layout::contenders(&dir, range.kvs());
        let modes: Vec<Mode> = queue.iter().map(|(_, m)| *m).collect();
        let mut holders = Vec::new();
        for (i, (kv, mode)) in queue.iter().enumerate() {
            if queue_turn(&modes, i) != Turn::Granted {
                break;
            }
            let lease = kv.lease();
            let ttl = c
                .call(|mut cl| async move { cl.lease_time_to_live(lease, None).await })
                .await
                .ok()
                .and_then(|r| u64::try_from(r.ttl()).ok())
                .map(Duration::from_secs);
            let token = u64::try_from(kv.create_revision())
                .ok()
                .map(FencingToken::new);
            holders.push(HolderInfo::new(token, ttl).with_mode(*mode));
        }
        Ok(holders)
    }
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("config", self.config())
            .field("min_ttl", &self.inner.caps.min_ttl)
            .finish()
    }
}
