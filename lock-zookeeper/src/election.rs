//! An election over the lock's nodes: the leader is the oldest contender under the name's
//! node, its data the leader's value, its `czxid` the term — where Curator's `LeaderSelector`
//! (its mutex's node data: the participant id) and kazoo's `Election` (its lock's identifier)
//! keep theirs, so the three elect among one queue.

use async_trait::async_trait;
use lock_core::driver::{queue_turn, Turn};
use lock_core::{
    Change, ChangeFeed, Error, FencingToken, Leader, LeaderValue, LockName, Mode, Result,
};
use zookeeper_client::{AddWatchMode, EventType, PersistentWatcher};

use crate::client::Session;
use crate::config::BACKEND;
use crate::modes::mode_of;
use crate::queue::parent;
use crate::sequence::contenders;

/// The oldest contender, if it holds exclusively: its data and `czxid`. A lock lives as long
/// as its holder's session: no remaining time to report. Sees every change committed before
/// it was asked, on any member.
pub(crate) async fn leader(s: &Session, name: &LockName) -> Result<Option<Leader>> {
    let client = s.live().await?;
    let parent = parent(s, name)?;
    let pace = s.pace(&client);
    // The head may go between the listing and the read: list again then.
    for _ in 0..3 {
        // After a `sync` in an ensemble: a follower answers from its own state, which may
        // lag a change its leader committed before this read was asked.
        let listed = pace.children(&client, &parent);
        let children = match listed.await {
            Ok((c, _)) => contenders(c),
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            // A session that ended is no lease lost here: a read on the next one is fine.
            Err(e) => return Err(s.error(e, None)),
        };
        let modes: Vec<Mode> = children.iter().map(|(_, c)| mode_of(c)).collect();
        let Some((_, head)) = children.first() else {
            return Ok(None);
        };
        if modes[0] != Mode::Exclusive || queue_turn(&modes, 0) != Turn::Granted {
            return Ok(None);
        }
        match client.get_data(&format!("{parent}/{head}")).await {
            Ok((data, stat)) => {
                let term = u64::try_from(stat.czxid)
                    .map(FencingToken::new)
                    .map_err(|_| Error::backend(BACKEND, "a node with a negative czxid"))?;
                return Ok(Some(Leader::new(LeaderValue::read(&data), term, None)));
            }
            Err(zookeeper_client::Error::NoNode) => continue,
            Err(e) => return Err(s.error(e, None)),
        }
    }
    Err(Error::unavailable(
        BACKEND,
        format!("{name}'s head changed under three reads in a row"),
    ))
}

/// A persistent recursive watch on the name's node: a contender created or deleted (a grant,
/// a release, a session's end), a value changed.
pub(crate) async fn watch(s: &Session, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
    let client = s.live().await?;
    let parent = parent(s, name)?;
    let watcher = client
        .watch(&parent, AddWatchMode::PersistentRecursive)
        .await
        .map_err(|e| s.error(e, None))?;
    Ok(Box::new(Feed {
        state: client.state_watcher(),
        client,
        watcher: Some(watcher),
    }))
}

struct Feed {
    /// The watch's session, kept open while the feed lives: the driver may move on to a new
    /// session, and a session whose every handle is dropped ends without telling its watchers
    /// (the client library's watcher then panics when asked for its next event).
    client: zookeeper_client::Client,
    /// Gone after a terminal session event, which the watcher must not be asked past.
    watcher: Option<PersistentWatcher>,
    /// The session's connection state: a reconnection loses the events in between and, in an
    /// ensemble, left the persistent watch silent after it (seen under the history checker's
    /// server restarts and partitions), so any change of it ends this feed: the observer makes
    /// a new watch and reads again.
    state: zookeeper_client::StateWatcher,
}

#[async_trait]
impl ChangeFeed for Feed {
    async fn changed(&mut self) -> Result<Change> {
        if self.client.state().is_terminated() {
            self.watcher = None;
        }
        let Some(watcher) = self.watcher.as_mut() else {
            return Err(Error::unavailable(BACKEND, "the watch's session ended"));
        };
        let event = tokio::select! {
            event = watcher.changed() => event,
            state = self.state.changed() => {
                if state.is_terminated() {
                    self.watcher = None;
                }
                return Err(Error::unavailable(
                    BACKEND,
                    format!("the watch's session is {state:?}: watching anew"),
                ));
            }
        };
        match (event.event_type, event.session_state) {
            (EventType::Session, state) => {
                if state.is_terminated() {
                    self.watcher = None;
                }
                // Events while disconnected may be lost (ZOOKEEPER-4698): a new watch, and a
                // read, follow.
                Err(Error::unavailable(
                    BACKEND,
                    "the watch's connection changed",
                ))
            }
            _ => Ok(Change::Notified),
        }
    }

    /// A session's end deletes its ephemeral node: an event like any.
    fn reports_expiry(&self) -> bool {
        true
    }
}
