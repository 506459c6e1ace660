//! The queue of contenders: one ephemeral sequential node each under the lock's parent; the
//! lowest holds the lock, every other watches the one just before its own.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lock_core::driver::{queue_turn, Acquisition, Backoff, Grant, ManagedLease, Turn};
use lock_core::{Deadline, Error, FencingToken, Lease, LockName, Mode, Renewal, Result};
use zookeeper_client::{Client, CreateMode, Stat};

use crate::client::{transient, until_definite, Session};
use crate::confirm::{on_turn, OnTurn, Pace, LATE_ASKS};
use crate::lease::{delete_in_background, ZkLeaseOps};
use crate::modes::{mark, mode_of};
use crate::sequence::contenders;

/// The node whose children queue for `name`; never in the tree the server reserves
/// (`/zookeeper`), which only lock `zookeeper` with `base=/` and no chroot could name
/// (a chroot or base inside it is refused at connect).
pub(crate) fn parent(s: &Session, name: &LockName) -> Result<String> {
    let path = s.config.lock_path(name);
    if let Some(root) = s.config.reserved(&path) {
        return Err(lock_core::Error::InvalidName {
            name: name.to_string(),
            reason: format!("its node would be {root}, in the tree ZooKeeper reserves"),
        });
    }
    Ok(path)
}

/// Creates this contender's node, its mode in its name and the holder's value as its data (as
/// Curator's `LeaderSelector` and kazoo's `Election` keep a participant's id); after a
/// connection loss, finds it by its unique prefix instead of creating a second one.
pub(crate) async fn enqueue(
    s: &Session,
    client: &Client,
    req: &Acquisition<'_>,
) -> Result<(String, Stat)> {
    let (name, mode) = (req.name(), req.mode());
    let value = req.value().map_or(&[][..], |v| v.as_bytes());
    let parent = &parent(s, name)?;
    let prefix = format!(
        "_c_{}{}",
        uuid::Uuid::new_v4().simple(),
        mark(mode, s.config.exclusive_mark())
    );
    // Dropped while a create is in flight, the server may still create the node — an
    // ephemeral that would head the queue for as long as this session lives. The guard then
    // finds it by its unique prefix (see `definite_children`) and deletes it in the
    // background.
    let mut pending = PendingNode {
        client: client.clone(),
        pace: s.pace(client),
        parent: parent.to_string(),
        prefix: prefix.clone(),
        armed: true,
    };
    let node_opts = CreateMode::EphemeralSequential.with_acls(s.acls());
    let parent_mode = if s.config.persistent_parents() {
        CreateMode::Persistent
    } else {
        CreateMode::Container
    };
    let parent_opts = parent_mode.with_acls(s.acls());
    let mut last = None;
    for _ in 0..5 {
        match client
            .create(&format!("{parent}/{prefix}"), value, &node_opts)
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
                        let base = s.config.base_path();
                        match client
                            .mkdir(base, &CreateMode::Persistent.with_acls(s.acls()))
                            .await
                        {
                            Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                            Err(e) => return Err(s.error(e, Some(name))),
                        }
                    }
                    Err(e) => return Err(s.error(e, Some(name))),
                }
            }
            Err(e) if transient(&e) => {
                // The create may have been applied. Create again only once the lookup says
                // for certain that it was not: a second node would queue behind the first,
                // an orphan of this session that nobody deletes.
                match find_own(s, client, name, &prefix).await? {
                    Some(found) => {
                        pending.armed = false;
                        return Ok(found);
                    }
                    None => last = Some(e),
                }
            }
            Err(e) => return Err(s.error(e, Some(name))),
        }
    }
    Err(s.error(
        last.unwrap_or(zookeeper_client::Error::ConnectionLoss),
        Some(name),
    ))
}

/// This session's node under `parent` whose name starts with `prefix`, if one exists — a
/// definite answer: a lookup that fails on a connection loss is repeated, while the
/// session lives, and it sees every create this session sent before (see
/// [`definite_children`]).
pub(crate) async fn find_own(
    s: &Session,
    client: &Client,
    name: &LockName,
    prefix: &str,
) -> Result<Option<(String, Stat)>> {
    let parent = &parent(s, name)?;
    let children = match definite_children(client, s.pace(client), parent).await {
        Ok(c) => c,
        Err(zookeeper_client::Error::NoNode) => return Ok(None),
        Err(e) => return Err(s.error(e, Some(name))),
    };
    let Some(mine) = children.into_iter().find(|c| c.starts_with(prefix)) else {
        return Ok(None);
    };
    let path = format!("{parent}/{mine}");
    match until_definite(client, || client.check_stat(&path)).await {
        Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => Ok(Some((mine, stat))),
        Ok(_) => Ok(None),
        Err(e) => Err(s.error(e, Some(name))),
    }
}

/// Waits until `me`'s turn has come: it and every node before it may hold together
/// ([`queue_turn`]; for the exclusive mode, `me` is the lowest node). `Ok(Some(t))`: granted,
/// valid until `t` (what the listing that found it first vouches for: see
/// [`Pace`](crate::confirm::Pace)). `Ok(None)`: not granted by the deadline (at once, for
/// `Deadline::Now`).
pub(crate) async fn wait_turn(
    s: &Session,
    client: &Client,
    req: &Acquisition<'_>,
    me: &str,
) -> Result<Option<Instant>> {
    let (name, deadline) = (req.name(), req.deadline());
    let parent = &parent(s, name)?;
    let pace = s.pace(client);
    let mut outage = Outage::new(pace.session_timeout);
    let mut late_asks = 0;
    loop {
        // In an ensemble the listing comes after a sync: a follower behind its leader could
        // still list this contender's node after the leader ended its session.
        let (children, asked) = match pace.children(client, parent).await {
            Ok(listed) => listed,
            Err(e) if outage.ride(&e, client, deadline).await => continue,
            Err(e) => return Err(s.error(e, Some(name))),
        };
        outage.over();
        let children = contenders(children);
        let Some(idx) = children.iter().position(|(_, c)| c == me) else {
            // Nothing was held: a retryable failure (a new attempt starts on a new session),
            // not `Lost`, which speaks of a lease the caller had.
            return Err(Error::unavailable(
                crate::config::BACKEND,
                format!("{name} not granted: the contender's node vanished (session expired?)"),
            ));
        };
        let modes: Vec<Mode> = children.iter().map(|(_, c)| mode_of(c)).collect();
        let turn = queue_turn(&modes, idx);
        if turn == Turn::Granted {
            // A slow answer may come from a member that was stalled (a frozen leader, a
            // GC pause) and answers from its old state after the ensemble expired this
            // session: ask again rather than vouch for a lease on it.
            match on_turn(pace.vouched(asked), deadline.passed(), &mut late_asks) {
                OnTurn::Granted(valid_until) => return Ok(Some(valid_until)),
                OnTurn::AskAgain => continue,
                OnTurn::TooSlow => {
                    return Err(Error::unavailable(
                        crate::config::BACKEND,
                        format!(
                            "{name}'s turn came, but {} answers in a row came later than a \
                             third of the session timeout ({:?}): too slow to vouch for a lease",
                            LATE_ASKS + 1,
                            pace.session_timeout
                        ),
                    ))
                }
            }
        }
        let blocker = match turn {
            Turn::Mismatch { held } => {
                return Err(Error::PermitsMismatch {
                    name: name.clone(),
                    held,
                    asked: modes[idx].limit().unwrap_or(0),
                })
            }
            Turn::After(j) => Some(j),
            _ => None,
        };
        if deadline.passed() {
            return Ok(None);
        }
        req.queued();
        let watcher = match blocker {
            // The node it waits for.
            Some(j) => {
                let pred = format!("{parent}/{}", children[j].1);
                let (stat, watcher) = match client.check_and_watch_stat(&pred).await {
                    Ok(watched) => watched,
                    Err(e) if outage.ride(&e, client, deadline).await => continue,
                    Err(e) => return Err(s.error(e, Some(name))),
                };
                if stat.is_none() {
                    continue; // gone between the listing and the watch
                }
                watcher
            }
            // A permit: any node before it may go first. The children's watch also fires
            // for newer waiters (a wake-up per change under the name, never a poll).
            None => {
                let (now, watcher) = match client.list_and_watch_children(parent).await {
                    Ok(watched) => watched,
                    Err(e) if outage.ride(&e, client, deadline).await => continue,
                    Err(e) => return Err(s.error(e, Some(name))),
                };
                if children[..idx].iter().any(|(_, c)| !now.contains(c)) {
                    continue; // one went between the listing and the watch
                }
                watcher
            }
        };
        let until = deadline.sleep();
        tokio::select! {
            _ = watcher.changed() => {
                s.wakeups.fetch_add(1, Ordering::Relaxed);
            }
            _ = until => return Ok(None),
        }
    }
}

/// A waiter's connection loss that its session may survive. The waiter's node lives as long as
/// its session, so its place in the queue does too: it asks again after a pause rather than
/// give the place up. Not past the deadline (a wait that cannot be answered in time ends with
/// the error), and not once the connection has been gone a whole session timeout — the
/// server has expired the session by then, and its node with it, though the client learns so
/// only when it reconnects.
struct Outage {
    since: Option<Instant>,
    pauses: Backoff,
    session: Duration,
}

impl Outage {
    fn new(session: Duration) -> Self {
        Outage {
            since: None,
            pauses: Backoff::transient(),
            session,
        }
    }

    /// Whether to ask again after `e`; if so, after the pause it waited.
    async fn ride(
        &mut self,
        e: &zookeeper_client::Error,
        client: &Client,
        deadline: Deadline,
    ) -> bool {
        if !transient(e) || client.state().is_terminated() {
            return false;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        let pause = self.pauses.pause();
        let next = Instant::now() + pause;
        let in_time = match deadline {
            Deadline::Now => false,
            Deadline::At(t) => next < t,
            Deadline::Never => true,
        };
        if !in_time || next >= since + self.session {
            return false;
        }
        tokio::time::sleep(pause).await;
        true
    }

    /// Answered again: the next loss starts a new outage.
    fn over(&mut self) {
        if self.since.take().is_some() {
            self.pauses.reset();
        }
    }
}

pub(crate) async fn contend_on(
    s: &Session,
    client: &Client,
    req: Acquisition<'_>,
) -> Result<Option<Box<dyn Lease>>> {
    let (name, ttl, opts) = (req.name(), req.ttl(), req.opts());
    let parent = parent(s, name)?;
    let (me, stat) = enqueue(s, client, &req).await?;
    let path = format!("{parent}/{me}");
    // Until granted, a dropped (cancelled) future deletes the node in the background.
    let mut guard = NodeGuard {
        client: client.clone(),
        path: Some(path.clone()),
    };
    match wait_turn(s, client, &req, &me).await {
        Ok(Some(valid_until)) => {
            guard.path = None;
            // The backend's detail of the grant, in the acquisition's span
            // (docs/observability.md): the session that owns the node, as the four-letter
            // commands and zkCli show it.
            tracing::debug!(
                lock.zookeeper.session = %format_args!("{:#x}", client.session_id().0),
                lock.zookeeper.node = %path,
                "granted to the session's node"
            );
            let renewal = match opts.renewal {
                Renewal::Manual => Renewal::Auto { max_hold: None },
                auto => auto,
            };
            let ops = ZkLeaseOps {
                name: name.clone(),
                client: client.clone(),
                path,
                session: client.session_id().0,
                pace: s.pace(client),
                config: s.config.clone(),
            };
            Ok(Some(Box::new(ManagedLease::new(
                name.clone(),
                Grant {
                    token: Some(FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0))),
                    ttl,
                    valid_until,
                },
                renewal,
                ops,
            ))))
        }
        Ok(None) => {
            // Not ours: leave no node behind for later waiters to queue behind (retried
            // in the background if the connection drops under the delete). The deadline has
            // passed, so the caller waits for that a third of a session at most: a link that
            // does not answer gets an error now, and the delete goes on until the session ends.
            guard.path = None;
            let grace = s.pace(client).session_timeout / 3;
            if let Some(deleting) = delete_in_background(client, &path) {
                match tokio::time::timeout(grace, deleting).await {
                    Ok(Ok(Err(e))) => return Err(s.error(e, Some(name))),
                    Err(_) => {
                        return Err(Error::unavailable(
                            crate::config::BACKEND,
                            format!(
                                "not granted by the deadline, and the waiter's node {path} was \
                                 not deleted within {grace:?} after it (connection lost); the \
                                 delete goes on until the session ends"
                            ),
                        ))
                    }
                    Ok(_) => {}
                }
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The children of `parent` as the leader has them, asked again after a connection loss while
/// the session lives. After a connection loss the session may have moved to another server,
/// which may not yet have applied a create the old one had passed on to the leader: a plain
/// listing there can miss this session's own node (and a second create would queue behind it,
/// an orphan for the life of the session). In an ensemble the listing is sent with a `sync`
/// ([`Pace::fresh`]), which the leader answers only after every proposal before it.
async fn definite_children(
    client: &Client,
    pace: Pace,
    parent: &str,
) -> std::result::Result<Vec<String>, zookeeper_client::Error> {
    until_definite(client, || async {
        let (children, _) = pace.children(client, parent).await?;
        Ok(children)
    })
    .await
}

/// Deletes the node created under `parent` with `prefix`, if any, when dropped while armed:
/// the acquisition was cancelled (or failed) with its create request possibly applied.
pub(crate) struct PendingNode {
    pub(crate) client: Client,
    pub(crate) pace: Pace,
    pub(crate) parent: String,
    pub(crate) prefix: String,
    pub(crate) armed: bool,
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // the node goes with the session
        };
        let (client, pace, parent, prefix) = (
            self.client.clone(),
            self.pace,
            std::mem::take(&mut self.parent),
            std::mem::take(&mut self.prefix),
        );
        rt.spawn(async move {
            if let Ok(children) = definite_children(&client, pace, &parent).await {
                for child in children.iter().filter(|c| c.starts_with(&prefix)) {
                    let path = format!("{parent}/{child}");
                    let _ = until_definite(&client, || client.delete(&path, None)).await;
                }
            }
        });
    }
}

/// Deletes a contender's node if the acquisition is dropped before it is granted.
pub(crate) struct NodeGuard {
    pub(crate) client: Client,
    pub(crate) path: Option<String>,
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            drop(delete_in_background(&self.client, &path));
        }
    }
}
