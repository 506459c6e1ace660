//! `ZkLock`: the ephemeral-sequential recipe with a predecessor watch.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::driver::Acquisition;
use lock_core::{Capabilities, DistributedLock, FencingToken, Lease, LockName, Result};
use zookeeper_client::Client;

use crate::config::BACKEND;
use crate::confirm::Pace;
use crate::sequence::contenders;
use crate::ZkConfig;

pub(crate) const MARK: &str = "-lock-";

/// A ZooKeeper lock client: one session, shared by all its locks.
///
/// Each contender creates `<base>/<name>/_c_<uuid>-lock-<seq>` (ephemeral, sequential) under a
/// container node per lock name. The lowest sequence holds the lock; every other contender
/// watches only the node just before its own, so a release wakes exactly one waiter and waiters
/// are served in arrival order.
///
/// **The session is the lease.** A lock lives as long as this client's session: a crashed
/// holder frees its locks when the server expires the session, after the (negotiated) session
/// timeout. Each lease is confirmed in the background, whatever the
/// [`Renewal`](lock_core::Renewal) option says, by a request that also proves its node is still
/// this session's; `valid_until` is the start of the last confirmation plus what it vouches for,
/// minus drift. **On a standalone server** a confirmation is an `exists` and vouches for the
/// session timeout. **In an ensemble** (the servers' `/zookeeper/config` lists members) it is a
/// `sync` and an `exists` sent together, so that a follower behind its leader cannot vouch from
/// old state, and it vouches for half the session timeout: the leader expires sessions on what
/// followers relayed to it, which can be older than the confirmation. The listing that grants
/// a lock is sent with a `sync` in the same way, and vouches for as long. Confirmations come
/// every third of what they vouch for, and only an answer within a third of the session
/// timeout confirms: a slower one may come from a stalled member answering from its old state.
/// A disconnected holder turns AtRisk at its next confirmation — at most a third of the
/// vouched span after the connection drops, plus a sixth when the request hangs (a partition) —
/// and Lost at its `valid_until`, before the server can expire its session, without waiting
/// for the client library to report `Expired` (it does so only after 1.4× the timeout). In an
/// ensemble a leader that stalls for longer than half the session timeout makes its leases
/// Lost, though the session may survive: the lock stays held by the session until released.
/// Once the session has ended, the next acquisition opens a new one, asking for the configured
/// timeout again; its leases are paced on the timeout that session was granted. Leases of the
/// old session stay Lost.
///
/// **TTL option**: a lock cannot outlive or undercut the session, so the TTL must be at least
/// the session timeout (shorter is rejected as `InvalidOptions`, never silently ignored); the
/// lease reports the TTL asked for, but a vanished holder frees the lock after the session
/// timeout. `max_hold` is honoured by deleting the node (the lock would not lapse on its own).
///
/// **Fencing**: the lock node's `czxid`, a zxid: strictly increasing across the ensemble and
/// across re-creation of the parent node (the sequence suffix is not).
#[derive(Clone)]
pub struct ZkLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ZkConfig,
    /// The current session; replaced by a new one once it has ended (expired or closed).
    pub(crate) session: std::sync::Mutex<Client>,
    /// Serializes the re-creation of an ended session.
    pub(crate) reopen: tokio::sync::Mutex<()>,
    pub(crate) secured: bool,
    /// The servers form an ensemble: confirmations go through the leader and vouch for less
    /// (see [`Pace`]).
    pub(crate) ensemble: bool,
    pub(crate) wakeups: AtomicU64,
    pub(crate) caps: Capabilities,
}

impl ZkLock {
    /// How confirmations on `client`'s session vouch: on the timeout that session was granted
    /// (a re-opened session may have been granted another one than the first).
    pub(crate) fn pace(&self, client: &Client) -> Pace {
        Pace {
            session_timeout: client.session_timeout(),
            ensemble: self.inner.ensemble,
        }
    }
}

#[async_trait]
impl DistributedLock for ZkLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// Queues on the live session. A session that ends before the grant loses nothing (no
    /// lease was handed out): one more try on a new session.
    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        let mut retried = false;
        loop {
            let client = self.live_session().await?;
            match self.contend_on(&client, req).await {
                Err(_) if !retried && client.state().is_terminated() => retried = true,
                r => return r,
            }
        }
    }

    /// The lowest sequence node (the holder) and its `czxid`; the lock lives as long as its
    /// holder's session, so there is no remaining time to report.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        let client = self.live_session().await?;
        let parent = self.parent(name)?;
        let children = match client.list_children(&parent).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.error(e, None)),
        };
        for (_, head) in contenders(children) {
            match client.check_stat(&format!("{parent}/{head}")).await {
                Ok(Some(stat)) => {
                    return Ok(Some(lock_core::HolderInfo::new(
                        u64::try_from(stat.czxid).ok().map(FencingToken::new),
                        None,
                    )))
                }
                Ok(None) => continue, // released meanwhile: the next one holds
                Err(e) => return Err(self.error(e, None)),
            }
        }
        Ok(None)
    }
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("config", &self.inner.config)
            .field("session_timeout", &self.session_timeout())
            .finish()
    }
}
