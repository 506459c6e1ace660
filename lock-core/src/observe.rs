//! Observing an election: a driver's feed of changes ([`ChangeFeed`]) turned into a stream of
//! leaders ([`Observer`]) in which a term never goes back and a gap is never silent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::Backoff;
use crate::{Change, ChangeFeed, DistributedLock, FencingToken, Leader, LockName, Result};

/// One step of an [`Observer`]: who leads now.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Observation {
    /// The leader, or `None` when nobody leads.
    pub leader: Option<Leader>,
    /// The observer lost its feed (a reconnect) and re-read: leaders may have come and gone
    /// in between unseen. Said even when the leader read is the one seen before.
    pub resynced: bool,
}

impl Observation {
    /// An observation (for code that reports a [`Leader`] read alone as one).
    pub const fn new(leader: Option<Leader>, resynced: bool) -> Self {
        Observation { leader, resynced }
    }
}

/// A stream of a name's leaders ([`Election::observe`](crate::Election::observe)). The first
/// [`next`](Self::next) is the leader at the time; each later one a change: another leader
/// (a higher term), a proclaimed value (same term), or nobody. A term never goes back (a read
/// that shows one, from a lagging replica, is read again, never passed on), and a term that
/// ended never comes back. Wakes on the backend's notifications only.
pub struct Observer {
    lock: Arc<dyn DistributedLock>,
    name: LockName,
    feed: Option<Box<dyn ChangeFeed>>,
    /// What `next` last returned (`None` before the first).
    last: Option<Option<Leader>>,
    /// The highest term returned; with `ended`: that term's leadership was seen to end.
    top: Option<FencingToken>,
    ended: bool,
    /// A read is due (at first, after a notification, a lapse, a gap).
    dirty: bool,
    resync: bool,
    /// When the leader's lease runs out if it is not renewed, and when a stale read is to be
    /// read again.
    lapse: Option<Instant>,
    retry: Option<Instant>,
    pauses: Backoff,
}

impl Observer {
    pub(crate) async fn new(lock: Arc<dyn DistributedLock>, name: LockName) -> Result<Self> {
        // The feed first: a change between the first read and the feed would be missed.
        let feed = lock.watch(&name).await?;
        Ok(Observer {
            lock,
            name,
            feed: Some(feed),
            last: None,
            top: None,
            ended: false,
            dirty: true,
            resync: false,
            lapse: None,
            retry: None,
            pauses: Backoff::transient(),
        })
    }

    /// The name observed.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The next leader change (the first call: the leader now). Waits as long as it takes;
    /// while the backend does not answer it retries with back-off and then says
    /// [`resynced`](Observation::resynced). Cancel-safe: a dropped call loses nothing.
    /// A non-retryable error (a refused credential) is returned.
    pub async fn next(&mut self) -> Result<Observation> {
        loop {
            if self.feed.is_none() {
                match self.lock.watch(&self.name).await {
                    Ok(feed) => self.feed = Some(feed),
                    Err(e) => {
                        self.failed(e).await?;
                        continue;
                    }
                }
            }
            if self.dirty {
                let read = match self.lock.leader(&self.name).await {
                    Ok(read) => read,
                    Err(e) => {
                        self.failed(e).await?;
                        continue;
                    }
                };
                self.pauses.reset();
                self.dirty = false;
                if let Some(seen) = self.accept(read) {
                    return Ok(seen);
                }
            }
            self.wait().await?;
        }
    }

    /// Takes a read: the observation to return, if it is one.
    fn accept(&mut self, read: Option<Leader>) -> Option<Observation> {
        let now = Instant::now();
        self.lapse = (read.as_ref())
            .and_then(|l| l.remaining)
            .map(|r| now + r + Duration::from_millis(1));
        self.retry = None;
        if let (Some(l), Some(top)) = (&read, self.top) {
            // A lower term, or one seen to end, shown again: a stale read. Read again soon.
            if l.term < top || (l.term == top && self.ended) {
                self.retry = Some(now + self.pauses.pause());
                return None;
            }
        }
        // `remaining` changes with every renewal: not a change of leader.
        let same = match (self.last.as_ref(), &read) {
            (Some(Some(a)), Some(b)) => a.term == b.term && a.value == b.value,
            (Some(None), None) => true,
            _ => false,
        };
        if same && !self.resync {
            return None;
        }
        match &read {
            Some(l) => {
                self.top = Some(l.term);
                self.ended = false;
            }
            None => self.ended = self.top.is_some(),
        }
        self.last = Some(read.clone());
        Some(Observation {
            leader: read,
            resynced: std::mem::take(&mut self.resync),
        })
    }

    /// Until the next notification, the leader's lapse where the feed does not report one, or
    /// a stale read's retry.
    async fn wait(&mut self) -> Result<()> {
        let Some(feed) = self.feed.as_mut() else {
            return Ok(());
        };
        let lapse = self.lapse.filter(|_| !feed.reports_expiry());
        let at = match (lapse, self.retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timer = async {
            match at {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            change = feed.changed() => match change {
                Ok(Change::Notified) => self.dirty = true,
                Ok(Change::Resumed) => {
                    self.dirty = true;
                    self.resync = true;
                }
                Err(e) => self.failed(e).await?,
            },
            () = timer => self.dirty = true,
        }
        Ok(())
    }

    /// A retryable failure: drop the feed, pause, and read again, saying so. Any other is the
    /// caller's.
    async fn failed(&mut self, e: crate::Error) -> Result<()> {
        if !e.is_retryable() {
            return Err(e);
        }
        tracing::debug!(lock = %self.name, error = %e, "observer lost its feed; re-reading");
        self.feed = None;
        self.dirty = true;
        // Only after a first observation is there something to have missed.
        self.resync = self.last.is_some();
        tokio::time::sleep(self.pauses.pause()).await;
        Ok(())
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("name", &self.name)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
#[path = "observe_tests.rs"]
mod tests;
