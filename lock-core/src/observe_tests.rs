//! The observer's own rules, against drivers that misbehave the ways backends may: a read
//! from a lagging replica, a feed that breaks.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::driver::Acquisition;
use crate::memory::MemoryLock;
use crate::{
    Capabilities, Change, ChangeFeed, DistributedLock, Election, Error, Leader, LeaderValue, Lease,
    LockName, LockOptions, Result,
};

/// The memory store, but every other leader read returns the read before it (a replica one
/// step behind), and the first feed it makes breaks after its first notification.
#[derive(Debug)]
struct Lagging {
    store: MemoryLock,
    reads: AtomicU32,
    previous: parking_lot::Mutex<Option<Leader>>,
    feeds: AtomicU32,
}

#[async_trait]
impl DistributedLock for Lagging {
    fn backend(&self) -> &'static str {
        "lagging"
    }
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        self.store.acquire_until(req).await
    }
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let now = self.store.leader(name).await?;
        let before = std::mem::replace(&mut *self.previous.lock(), now.clone());
        if self.reads.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
            return Ok(before);
        }
        Ok(now)
    }
    async fn watch(&self, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
        let feed = self.store.watch(name).await?;
        let breaks = self.feeds.fetch_add(1, Ordering::SeqCst) == 0;
        Ok(Box::new(Breaking {
            feed,
            breaks,
            told: 0,
        }))
    }
}

struct Breaking {
    feed: Box<dyn ChangeFeed>,
    breaks: bool,
    told: u32,
}

#[async_trait]
impl ChangeFeed for Breaking {
    async fn changed(&mut self) -> Result<Change> {
        if self.breaks && self.told == 1 {
            return Err(Error::unavailable(
                "lagging",
                "the watch's connection dropped",
            ));
        }
        let c = self.feed.changed().await?;
        self.told += 1;
        Ok(c)
    }
}

fn lagging() -> Arc<Lagging> {
    Arc::new(Lagging {
        store: MemoryLock::new(),
        reads: AtomicU32::new(0),
        previous: parking_lot::Mutex::new(None),
        feeds: AtomicU32::new(0),
    })
}

/// Through reads that lag every other time, a feed that breaks, and leaders that come and go,
/// the observer makes its feed again, says it re-read after the gap, ends on the last leader,
/// and shows no term going back on the way (`stale_reads_are_never_shown` tests that rule
/// alone: here few reads happen to lag across a change).
#[tokio::test]
async fn a_broken_feed_is_made_again_and_told() {
    let lock = lagging();
    let election = Election::new(lock.clone()).unwrap();
    let name = LockName::new("lagging").unwrap();
    let mut observer = election.observe(&name).await.unwrap();
    let mut seen = vec![observer.next().await.unwrap()];
    let opts = LockOptions::new(Duration::from_secs(30));
    let mut last_term = None;
    for i in 0..6 {
        let v = LeaderValue::new(format!("leader-{i}")).unwrap();
        let l = election.campaign(&name, v, &opts).await.unwrap();
        last_term = Some(l.term());
        l.resign().await.unwrap();
    }
    let v = LeaderValue::new("last").unwrap();
    let last = election.campaign(&name, v, &opts).await.unwrap();
    loop {
        let o = tokio::time::timeout(Duration::from_secs(5), observer.next())
            .await
            .expect("the observer did not reach the last leader")
            .unwrap();
        seen.push(o.clone());
        if o.leader.as_ref().is_some_and(|l| l.term == last.term()) {
            break;
        }
    }
    assert!(last.term() > last_term.unwrap());
    let mut top = None;
    let mut ended = false;
    for o in &seen {
        match &o.leader {
            Some(l) => {
                assert!(
                    top.map_or(true, |t| l.term > t || (l.term == t && !ended)),
                    "term {:?} shown after {top:?} (ended: {ended}): {seen:#?}",
                    l.term
                );
                top = Some(l.term);
                ended = false;
            }
            None => ended = top.is_some(),
        }
    }
    assert!(
        seen.iter().any(|o| o.resynced),
        "the feed broke, yet no observation says the observer re-read: {seen:#?}"
    );
    assert!(
        lock.feeds.load(Ordering::SeqCst) >= 2,
        "the broken feed was not made again"
    );
    last.resign().await.unwrap();
}

/// A value beyond the bound is refused before anything is asked of the backend, and a value
/// goes with an exclusive grant only.
#[tokio::test]
async fn bad_values_are_typed_errors() {
    assert!(matches!(
        LeaderValue::new(vec![0u8; crate::MAX_VALUE_LEN + 1]),
        Err(Error::InvalidOptions(_))
    ));
    let lock = MemoryLock::new();
    let name = LockName::new("v").unwrap();
    let v = LeaderValue::new("x").unwrap();
    let shared = LockOptions::new(Duration::from_secs(5)).shared().value(v);
    let r = lock.try_acquire(&name, &shared).await;
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{r:?}");
    assert!(lock.holders(&name).await.unwrap().is_empty());
}

/// The observer's rule on its own, over a scripted series of reads: a lower term, or a term
/// that was seen to end, is a stale read and is never passed on; a proclaim (same term, new
/// value) is; a renewal (same term and value, less `remaining`) is not.
#[tokio::test]
async fn stale_reads_are_never_shown() {
    let name = LockName::new("scripted").unwrap();
    let mut o = super::Observer::new(Arc::new(MemoryLock::new()), name)
        .await
        .unwrap();
    let at = |v: &str, t: u64, left: u64| {
        Some(Leader::new(
            LeaderValue::new(v).unwrap(),
            crate::FencingToken::new(t),
            Some(Duration::from_secs(left)),
        ))
    };
    let script = [
        (None, true),
        (at("a", 5, 9), true),
        (at("a", 5, 8), false),   // renewed: no change
        (at("a2", 5, 8), true),   // proclaimed
        (at("old", 4, 3), false), // a lower term: stale
        (None, true),             // a ended
        (at("a2", 5, 2), false),  // an ended term again: stale
        (at("b", 7, 9), true),
        (None, true),
        (None, false),
    ];
    for (i, (read, shown)) in script.into_iter().enumerate() {
        let got = o.accept(read.clone());
        assert_eq!(
            got.as_ref().map(|g| g.leader.clone()),
            shown.then_some(read.clone()),
            "read {i} ({read:?})"
        );
    }
}
