//! `ZkLock`: the ephemeral-sequential recipe with a predecessor watch.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{drift, scrub, Grant, LeaseOps, ManagedLease};
use lock_core::{
    Capabilities, Deadline, DistributedLock, Error, Fencing, FencingToken, Lease, LockName,
    LockOptions, Renewal, Result,
};
use zookeeper_client::{Acls, Client, CreateMode, Stat};

use crate::ZkConfig;

const BACKEND: &str = "zookeeper";
const MARK: &str = "-lock-";
/// ZooKeeper's sequential suffix: the parent's counter, `%010d`.
const SEQ_DIGITS: usize = 10;

/// A ZooKeeper lock client: one session, shared by all its locks.
///
/// Each contender creates `<base>/<name>/_c_<uuid>-lock-<seq>` (ephemeral, sequential) under a
/// container node per lock name. The lowest sequence holds the lock; every other contender
/// watches only the node just before its own, so a release wakes exactly one waiter and waiters
/// are served in arrival order.
///
/// **The session is the lease.** A lock lives as long as this client's session: a crashed
/// holder frees its locks when the server expires the session, after the (negotiated) session
/// timeout. Each lease is confirmed in the background every third of the session timeout (an
/// `exists` on its own node, which also proves the node is still this session's), whatever the
/// [`Renewal`] option says; `valid_until` is the start of the last confirmed request plus the
/// session timeout minus drift. A disconnected holder turns AtRisk at its next confirmation
/// — at most a third of the session timeout after the connection drops, plus a sixth when the
/// request hangs (a partition) — and Lost no later than the server can expire its session,
/// without waiting for the client library to report `Expired` (it does so only after 1.4× the
/// timeout). Once the session has ended, the next acquisition opens a new one, asking for the
/// configured timeout again; its leases are paced on the timeout that session was granted.
/// Leases of the old session stay Lost.
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
    inner: Arc<Inner>,
}

struct Inner {
    config: ZkConfig,
    /// The current session; replaced by a new one once it has ended (expired or closed).
    session: std::sync::Mutex<Client>,
    /// Serializes the re-creation of an ended session.
    reopen: tokio::sync::Mutex<()>,
    secured: bool,
    wakeups: AtomicU64,
    caps: Capabilities,
}

impl ZkLock {
    /// Opens a session (authenticating with digest credentials if configured) and makes sure
    /// the base path exists.
    pub async fn connect(config: ZkConfig) -> Result<Self> {
        let client = open_session(&config).await?;
        let session_timeout = client.session_timeout();
        let secured = config.digest().is_some();
        let lock = ZkLock {
            inner: Arc::new(Inner {
                caps: Capabilities::new()
                    .with_fencing(Fencing::Strict)
                    .with_inspect(true)
                    .with_fifo(true)
                    .with_per_lock_ttl(false)
                    .with_min_ttl(session_timeout),
                config,
                session: std::sync::Mutex::new(client.clone()),
                reopen: tokio::sync::Mutex::new(()),
                secured,
                wakeups: AtomicU64::new(0),
            }),
        };
        let config = &lock.inner.config;
        let opts = CreateMode::Persistent.with_acls(lock.acls());
        let mut made = client.mkdir(config.base_path(), &opts).await;
        if let (Err(zookeeper_client::Error::NoNode), Some(chroot)) = (&made, config.chroot()) {
            // The chroot itself is missing: create it from a session without one.
            let root = open_session(&config.without_chroot()).await?;
            match root.mkdir(chroot, &opts).await {
                Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                Err(e) => return Err(lock.error(e)),
            }
            made = client.mkdir(config.base_path(), &opts).await;
        }
        match made {
            Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => return Err(lock.error(e)),
        }
        Ok(lock)
    }

    /// [`connect`](Self::connect) from a `zk://` URL.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(ZkConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The session timeout the server granted the current session: the lease of every lock
    /// acquired on it.
    pub fn session_timeout(&self) -> Duration {
        self.current().session_timeout()
    }

    /// How many times a waiter of this client was woken by its predecessor's watch (for tests
    /// and diagnostics: one release should wake one waiter).
    pub fn watch_wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    /// The client of the current session (a handle: the next acquisition may use a new
    /// session if this one has ended).
    pub fn client(&self) -> Client {
        self.current()
    }

    fn current(&self) -> Client {
        self.inner
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A live session: the current one, or a new one if it has expired or been closed. Leases
    /// of the ended session stay Lost; only new acquisitions use the new session.
    async fn live_session(&self) -> Result<Client> {
        let client = self.current();
        if !client.state().is_terminated() {
            return Ok(client);
        }
        let _one_at_a_time = self.inner.reopen.lock().await;
        let client = self.current();
        if !client.state().is_terminated() {
            return Ok(client); // another task re-opened it meanwhile
        }
        let fresh = open_session(&self.inner.config).await?;
        tracing::info!(
            url = %self.inner.config.redacted_url(),
            "ZooKeeper session ended; opened a new one for new acquisitions"
        );
        *self.inner.session.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    fn acls(&self) -> Acls<'static> {
        // With credentials, only this user may delete (or create under) the nodes.
        if self.inner.secured {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    fn error(&self, e: zookeeper_client::Error) -> Error {
        map_error(e, &self.inner.config)
    }

    fn parent(&self, name: &LockName) -> String {
        format!("{}/{}", self.inner.config.base_path(), name)
    }

    /// Creates this contender's node; after a connection loss, finds it by its unique prefix
    /// instead of creating a second one.
    async fn enqueue(&self, client: &Client, parent: &str) -> Result<(String, Stat)> {
        let prefix = format!("_c_{}{MARK}", uuid::Uuid::new_v4().simple());
        // Dropped while a create is in flight, the server may still create the node — an
        // ephemeral that would head the queue for as long as this session lives. The guard then
        // finds it by its unique prefix (same session: the listing is served after the create)
        // and deletes it in the background.
        let mut pending = PendingNode {
            client: client.clone(),
            parent: parent.to_string(),
            prefix: prefix.clone(),
            armed: true,
        };
        let node_opts = CreateMode::EphemeralSequential.with_acls(self.acls());
        let parent_opts = CreateMode::Container.with_acls(self.acls());
        let mut last = None;
        for _ in 0..5 {
            match client
                .create(&format!("{parent}/{prefix}"), b"", &node_opts)
                .await
            {
                Ok((stat, seq)) => {
                    pending.armed = false; // the caller's NodeGuard takes over
                    return Ok((format!("{prefix}{seq}"), stat));
                }
                Err(zookeeper_client::Error::NoNode) => {
                    // The container is created on demand and removed by the server when empty.
                    match client.create(parent, b"", &parent_opts).await {
                        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
                        Err(zookeeper_client::Error::NoNode) => {
                            let base = self.inner.config.base_path();
                            match client
                                .mkdir(base, &CreateMode::Persistent.with_acls(self.acls()))
                                .await
                            {
                                Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                                Err(e) => return Err(self.error(e)),
                            }
                        }
                        Err(e) => return Err(self.error(e)),
                    }
                }
                Err(e) if transient(&e) => {
                    // The create may have been applied. Create again only once the lookup says
                    // for certain that it was not: a second node would queue behind the first,
                    // an orphan of this session that nobody deletes.
                    match self.find_own(client, parent, &prefix).await? {
                        Some(found) => {
                            pending.armed = false;
                            return Ok(found);
                        }
                        None => last = Some(e),
                    }
                }
                Err(e) => return Err(self.error(e)),
            }
        }
        Err(self.error(last.unwrap_or(zookeeper_client::Error::ConnectionLoss)))
    }

    /// This session's node under `parent` whose name starts with `prefix`, if one exists — a
    /// definite answer: a lookup that fails on a connection loss is repeated, while the
    /// session lives.
    async fn find_own(
        &self,
        client: &Client,
        parent: &str,
        prefix: &str,
    ) -> Result<Option<(String, Stat)>> {
        let children = match until_definite(client, || client.list_children(parent)).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.error(e)),
        };
        let Some(mine) = children.into_iter().find(|c| c.starts_with(prefix)) else {
            return Ok(None);
        };
        let path = format!("{parent}/{mine}");
        match until_definite(client, || client.check_stat(&path)).await {
            Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => {
                Ok(Some((mine, stat)))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Waits until `me` is the lowest node. `Ok(Some(t))`: granted, `t` = start of the request
    /// that confirmed it. `Ok(None)`: not granted by the deadline (at once, for `Deadline::Now`).
    async fn wait_turn(
        &self,
        client: &Client,
        parent: &str,
        me: &str,
        deadline: Deadline,
    ) -> Result<Option<Instant>> {
        loop {
            let asked = Instant::now();
            let children = contenders(
                client
                    .list_children(parent)
                    .await
                    .map_err(|e| self.error(e))?,
            );
            let Some(idx) = children.iter().position(|(_, c)| c == me) else {
                return Err(Error::Lost {
                    name: lock_name(parent),
                    reason: "the contender's node vanished (session expired?)".into(),
                });
            };
            if idx == 0 {
                return Ok(Some(asked));
            }
            if deadline.passed() {
                return Ok(None);
            }
            let pred = format!("{parent}/{}", children[idx - 1].1);
            let (stat, watcher) = client
                .check_and_watch_stat(&pred)
                .await
                .map_err(|e| self.error(e))?;
            if stat.is_none() {
                continue; // gone between the listing and the watch
            }
            let until = deadline.sleep();
            tokio::select! {
                _ = watcher.changed() => {
                    self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                }
                _ = until => return Ok(None),
            }
        }
    }

    async fn contend(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        // A session that ends before the grant loses nothing (no lease was handed out): try
        // once more on a new session.
        let mut retried = false;
        loop {
            let client = self.live_session().await?;
            match self.contend_on(&client, name, opts, ttl, deadline).await {
                Err(_) if !retried && client.state().is_terminated() => retried = true,
                r => return r,
            }
        }
    }

    async fn contend_on(
        &self,
        client: &Client,
        name: &LockName,
        opts: &LockOptions,
        ttl: Duration,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        let parent = self.parent(name);
        let (me, stat) = self.enqueue(client, &parent).await?;
        let path = format!("{parent}/{me}");
        // Until granted, a dropped (cancelled) future deletes the node in the background.
        let mut guard = NodeGuard {
            client: client.clone(),
            path: Some(path.clone()),
        };
        match self.wait_turn(client, &parent, &me, deadline).await {
            Ok(Some(confirmed)) => {
                guard.path = None;
                // This session's own timeout: a re-opened session may have been granted
                // another one than the first.
                let st = client.session_timeout();
                let renewal = match opts.renewal {
                    Renewal::Manual => Renewal::Auto { max_hold: None },
                    auto => auto,
                };
                let ops = ZkLeaseOps {
                    client: client.clone(),
                    path,
                    session: client.session_id().0,
                    session_timeout: st,
                    config: self.inner.config.clone(),
                };
                Ok(Some(Box::new(ManagedLease::new(
                    name.clone(),
                    Grant {
                        token: Some(FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0))),
                        ttl,
                        valid_until: confirmed + st.saturating_sub(drift(st)),
                    },
                    renewal,
                    ops,
                ))))
            }
            Ok(None) => {
                // Not ours: leave no node behind for later waiters to queue behind (retried
                // in the background if the connection drops under the delete).
                guard.path = None;
                if let Some(deleting) = delete_in_background(client, &path) {
                    if let Ok(Err(e)) = deleting.await {
                        return Err(self.error(e));
                    }
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Opens a session, authenticating with the digest credentials if configured.
async fn open_session(config: &ZkConfig) -> Result<Client> {
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout())
        .with_fail_eagerly();
    if let Some(d) = config.digest() {
        connector = connector.with_auth("digest", d.as_bytes());
    }
    let limit = config.session_timeout() + Duration::from_secs(2);
    let client = tokio::time::timeout(limit, connector.connect(&config.connect_string()))
        .await
        .map_err(|_| {
            Error::unavailable(
                BACKEND,
                format!("no session with {} within {limit:?}", config.redacted_url()),
            )
        })?
        .map_err(|e| match e {
            zookeeper_client::Error::AuthFailed | zookeeper_client::Error::NoAuth => {
                Error::unauthenticated(
                    BACKEND,
                    format!(
                        "ZooKeeper at {} rejected the digest credentials of user {:?}",
                        config.hosts(),
                        config.user().unwrap_or("")
                    ),
                )
            }
            e => Error::unavailable(
                BACKEND,
                format!(
                    "cannot connect to {}: {}",
                    config.redacted_url(),
                    scrub(&e, config.secret())
                ),
            ),
        })?;
    Ok(client)
}

/// Deletes the node created under `parent` with `prefix`, if any, when dropped while armed:
/// the acquisition was cancelled (or failed) with its create request possibly applied.
struct PendingNode {
    client: Client,
    parent: String,
    prefix: String,
    armed: bool,
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // the node goes with the session
        };
        let (client, parent, prefix) = (
            self.client.clone(),
            std::mem::take(&mut self.parent),
            std::mem::take(&mut self.prefix),
        );
        rt.spawn(async move {
            if let Ok(children) = until_definite(&client, || client.list_children(&parent)).await {
                for child in children.iter().filter(|c| c.starts_with(&prefix)) {
                    let path = format!("{parent}/{child}");
                    let _ = until_definite(&client, || client.delete(&path, None)).await;
                }
            }
        });
    }
}

/// Deletes a contender's node if the acquisition is dropped before it is granted.
struct NodeGuard {
    client: Client,
    path: Option<String>,
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            drop(delete_in_background(&self.client, &path));
        }
    }
}

/// Whether a failed request may succeed on the same session once the connection is back.
fn transient(e: &zookeeper_client::Error) -> bool {
    use zookeeper_client::Error as Z;
    matches!(
        e,
        Z::ConnectionLoss | Z::Timeout | Z::Throttled | Z::SessionMoved | Z::Custom(_)
    )
}

/// Repeats `request` while it fails transiently and `client`'s session lives, with a back-off
/// from 20 ms to 1 s: a request that must have a definite answer (a delete that frees a lock,
/// a lookup that decides whether to create) must not give up on a connection loss, because
/// the session — and whatever it created — survives the reconnect.
async fn until_definite<T, F, Fut>(
    client: &Client,
    mut request: F,
) -> std::result::Result<T, zookeeper_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, zookeeper_client::Error>>,
{
    let mut pause = Duration::from_millis(20);
    loop {
        match request().await {
            Err(e) if transient(&e) && !client.state().is_terminated() => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            r => return r,
        }
    }
}

/// Deletes this session's node at `path` in a task of its own, retrying until it is gone or
/// the session has ended (which removes it too): a delete lost with the connection would
/// otherwise leave the node — and the lock — held for the life of the session. The task
/// outlives a cancelled caller; `Ok(true)`: deleted now, `Ok(false)`: already gone.
fn delete_in_background(
    client: &Client,
    path: &str,
) -> Option<tokio::task::JoinHandle<std::result::Result<bool, zookeeper_client::Error>>> {
    let rt = tokio::runtime::Handle::try_current().ok()?; // none: the node goes with the session
    let (client, path) = (client.clone(), path.to_string());
    Some(rt.spawn(async move {
        let r = until_definite(&client, || client.delete(&path, None)).await;
        match r {
            Ok(()) => Ok(true),
            Err(zookeeper_client::Error::NoNode) => Ok(false),
            Err(_) if client.state().is_terminated() => Ok(false),
            Err(e) => {
                tracing::warn!(node = %path, error = %e, "could not delete a lock node");
                Err(e)
            }
        }
    }))
}

/// Every contender among a lock node's children, lowest sequence (the holder) first: any
/// child whose name ends in a ZooKeeper sequence suffix (ten digits), whoever made it —
/// distlock's `_c_<uuid>-lock-`, Curator's, kazoo's `<id>__lock__`, the WriteLock recipe's
/// `x-<session>-`. Ignoring a foreign node would let two clients hold the lock at once.
fn contenders(children: Vec<String>) -> Vec<(i64, String)> {
    let mut queue: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|c| {
            let suffix = c.get(c.len().checked_sub(SEQ_DIGITS)?..)?;
            if !suffix.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((suffix.parse().ok()?, c))
        })
        .collect();
    queue.sort();
    queue
}

fn lock_name(parent: &str) -> LockName {
    let n = parent.rsplit('/').next().unwrap_or("");
    LockName::new(n).unwrap_or_else(|_| LockName::new("unknown").unwrap_or_else(|_| unreachable!()))
}

#[async_trait]
impl DistributedLock for ZkLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    async fn acquire_until(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        self.contend(name, ttl, opts, deadline).await
    }

    /// The lowest sequence node (the holder) and its `czxid`; the lock lives as long as its
    /// holder's session, so there is no remaining time to report.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        let client = self.live_session().await?;
        let parent = self.parent(name);
        let children = match client.list_children(&parent).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.error(e)),
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
                Err(e) => return Err(self.error(e)),
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

struct ZkLeaseOps {
    client: Client,
    path: String,
    session: i64,
    session_timeout: Duration,
    config: ZkConfig,
}

impl fmt::Debug for ZkLeaseOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLease").field("node", &self.path).finish()
    }
}

impl ZkLeaseOps {
    fn name(&self) -> LockName {
        let parent = self.path.rsplit_once('/').map_or("", |(p, _)| p);
        lock_name(parent)
    }
}

#[async_trait]
impl LeaseOps for ZkLeaseOps {
    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        match self.client.check_stat(&self.path).await {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session => Ok(start
                + self
                    .session_timeout
                    .saturating_sub(drift(self.session_timeout))),
            Ok(_) => Err(Error::NotHeld { name: self.name() }),
            Err(e) => Err(map_error(e, &self.config)),
        }
    }

    /// Deletes the node; a delete lost with the connection is retried (in a task of its own,
    /// which a cancelled `release` does not stop) until it succeeds or the session ends. Waits
    /// for that at most one session timeout: then `Unavailable`, and the retries go on.
    async fn release(&self) -> Result<()> {
        let first = self.client.delete(&self.path, None).await;
        match first {
            Ok(()) => return Ok(()),
            Err(zookeeper_client::Error::NoNode) => {
                return Err(Error::NotHeld { name: self.name() })
            }
            Err(ref e) if !transient(e) => return Err(map_error(e.clone(), &self.config)),
            Err(_) => {}
        }
        let Some(deleting) = delete_in_background(&self.client, &self.path) else {
            return Err(Error::unavailable(
                BACKEND,
                "no runtime to retry the delete on",
            ));
        };
        match tokio::time::timeout(self.session_timeout, deleting).await {
            // After a lost request, "no node" is most likely that request having landed.
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(e))) => Err(map_error(e, &self.config)),
            Ok(Err(_)) => Err(Error::unavailable(BACKEND, "the delete task failed")),
            Err(_) => Err(Error::unavailable(
                BACKEND,
                format!(
                    "lock node {} not deleted within {:?} (connection lost); retrying until the \
                     session ends",
                    self.path, self.session_timeout
                ),
            )),
        }
    }

    fn lapses_without_renewal(&self) -> bool {
        false
    }

    /// The session is shared by every lock of the client, so it cannot be left to expire for
    /// one lock: abandoning deletes the node in the background, as dropping does.
    fn abandon(&self) {
        drop(delete_in_background(&self.client, &self.path));
    }
}

fn map_error(e: zookeeper_client::Error, config: &ZkConfig) -> Error {
    use zookeeper_client::Error as Z;
    let text = scrub(&e, config.secret());
    match e {
        Z::SessionExpired | Z::ClientClosed => Error::Lost {
            name: LockName::new("session").unwrap_or_else(|_| unreachable!()),
            reason: format!("ZooKeeper session ended: {text}"),
        },
        // `Custom` errors come from the connection layer ("no response from connection").
        Z::ConnectionLoss
        | Z::Timeout
        | Z::NoHosts
        | Z::Throttled
        | Z::SessionMoved
        | Z::Custom(_) => {
            Error::unavailable(BACKEND, format!("{text} ({})", config.redacted_url()))
        }
        Z::AuthFailed | Z::NoAuth | Z::InvalidAcl => Error::unauthenticated(
            BACKEND,
            format!(
                "ZooKeeper refused access for user {:?}: {text}",
                config.user().unwrap_or("")
            ),
        ),
        _ => Error::backend(BACKEND, format!("{text} ({})", config.redacted_url())),
    }
}
