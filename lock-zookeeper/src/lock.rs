//! `ZkLock`: the ephemeral-sequential recipe with a predecessor watch.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::driver::{queue_turn, Acquisition, Turn};
use lock_core::{
    Capabilities, ChangeFeed, DistributedLock, ExpiryClock, Fencing, FencingToken, HolderInfo,
    Leader, Lease, LockName, Mode, Result,
};
use zookeeper_client::Client;

use crate::client::Session;
use crate::config::BACKEND;
use crate::modes::mode_of;
use crate::queue::{contend_on, parent};
use crate::sequence::contenders;
use crate::ZkConfig;

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
    pub(crate) session: Session,
    pub(crate) caps: Capabilities,
}

impl ZkLock {
    /// Opens a session (authenticating with digest credentials if configured) and makes sure
    /// the base path exists.
    pub async fn connect(config: ZkConfig) -> Result<Self> {
        let session = Session::open(config).await?;
        let caps = Capabilities::new()
            .with_fencing(Fencing::Strict)
            .with_inspect(true)
            .with_fifo(true)
            // A node's name says its mode; one queue serves them all (`modes.rs`).
            .with_shared(true)
            .with_permits(true)
            // A node's data is its holder's value (`election.rs`).
            .with_election(true)
            .with_per_lock_ttl(false)
            // Sessions are on disk and counted in ticks of elapsed time: a restarted server
            // gives each its whole timeout again.
            .with_survives_restart(true)
            .with_expires_by(ExpiryClock::Elapsed)
            .with_min_ttl(session.current().session_timeout());
        Ok(ZkLock {
            inner: Arc::new(Inner { session, caps }),
        })
    }

    /// [`connect`](Self::connect) from a `zk://` URL.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(ZkConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.session.config
    }

    /// The session timeout the server granted the current session: the lease of every lock
    /// acquired on it.
    pub fn session_timeout(&self) -> Duration {
        self.inner.session.current().session_timeout()
    }

    /// How many times a waiter of this client was woken by its predecessor's watch (for tests
    /// and diagnostics: one release should wake one waiter).
    pub fn watch_wakeups(&self) -> u64 {
        self.inner.session.wakeups.load(Ordering::Relaxed)
    }

    /// The client of the current session (a handle: the next acquisition may use a new
    /// session if this one has ended).
    pub fn client(&self) -> Client {
        self.inner.session.current()
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
            let client = self.inner.session.live().await?;
            match contend_on(&self.inner.session, &client, req).await {
                Err(_) if !retried && client.state().is_terminated() => retried = true,
                r => return r,
            }
        }
    }

    /// The oldest contender, when it holds exclusively (`election.rs`).
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        crate::election::leader(&self.inner.session, name).await
    }

    async fn watch(&self, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
        crate::election::watch(&self.inner.session, name).await
    }

    /// The newest of [`holders`](DistributedLock::holders).
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        Ok(self.holders(name).await?.pop())
    }

    /// The nodes whose turn has come ([`queue_turn`]), oldest first: each one's `czxid` and
    /// mode. A lock lives as long as its holder's session, so there is no remaining time to
    /// report.
    async fn holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let session = &self.inner.session;
        let client = session.live().await?;
        let parent = parent(session, name)?;
        // After a `sync` in an ensemble, as `leader` (election.rs).
        let pace = session.pace(&client);
        let listed = pace.children(&client, &parent);
        let children = match listed.await {
            Ok((c, _)) => contenders(c),
            Err(zookeeper_client::Error::NoNode) => return Ok(vec![]),
            Err(e) => return Err(session.error(e, None)),
        };
        let modes: Vec<Mode> = children.iter().map(|(_, c)| mode_of(c)).collect();
        let mut holders = Vec::new();
        for (i, (_, child)) in children.iter().enumerate() {
            if queue_turn(&modes, i) != Turn::Granted {
                break;
            }
            match client.check_stat(&format!("{parent}/{child}")).await {
                Ok(Some(stat)) => holders.push(
                    HolderInfo::new(u64::try_from(stat.czxid).ok().map(FencingToken::new), None)
                        .with_mode(modes[i]),
                ),
                Ok(None) => continue, // released meanwhile
                Err(e) => return Err(session.error(e, None)),
            }
        }
        Ok(holders)
    }
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("config", self.config())
            .field("session_timeout", &self.session_timeout())
            .finish()
    }
}
