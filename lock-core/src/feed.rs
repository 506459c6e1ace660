//! The hook a driver gives elections' observers: a feed of changes to one name.

use async_trait::async_trait;

use crate::Result;

/// What a [`ChangeFeed`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// The name's holders or its leader's value may have changed.
    Notified,
    /// The feed was cut and has been made again (a reconnect, a watch that fell behind):
    /// changes in between may have been missed.
    Resumed,
}

/// A driver's notifications of changes to one name, the hook [`DistributedLock::watch`](crate::DistributedLock::watch)
/// returns: etcd's watch, a ZooKeeper watch, Redis pub/sub, PostgreSQL `LISTEN`, inotify.
/// It says *that* something changed; the observer reads *what* with
/// [`DistributedLock::leader`](crate::DistributedLock::leader). Spurious notifications are harmless; a missed one is a bug,
/// unless the feed says [`Change::Resumed`].
#[async_trait]
pub trait ChangeFeed: Send {
    /// Waits for the next change. Cancel-safe: a notification that arrives while nobody waits
    /// is kept for the next call. A retryable error ends this feed: the observer makes a new
    /// one and re-reads.
    async fn changed(&mut self) -> Result<Change>;

    /// Whether the feed also reports a leader whose lease ran out (etcd deletes the key,
    /// ZooKeeper the node). Where it does not (a Redis key's expiry, which no client
    /// hears of by default), the observer re-reads when the leader's `remaining` has passed:
    /// one read per lapse, never a faster poll.
    fn reports_expiry(&self) -> bool {
        false
    }
}
