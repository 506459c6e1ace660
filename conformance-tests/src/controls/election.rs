//! The election hooks of [`FlawedLock`] and its leases: the leader read with the wrapper's
//! tokens, the change feed, proclaim, and the election flaws acted out on them.

use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Change, ChangeFeed, DistributedLock, Leader, LeaderValue, Lease, LockName, LockOptions, Result,
};

use super::harness::*;
use super::*;

impl FlawedLock {
    /// Remembers the value a campaign asked for, before it is granted: what the flaws that
    /// keep values apart from the lock read ([`Flaw::LeaderIsNewestCandidate`],
    /// [`Flaw::ProclaimUnchecked`]).
    pub(super) fn note_candidate(&self, key: &LockName, opts: &LockOptions) {
        if let (Flaw::LeaderIsNewestCandidate | Flaw::ProclaimUnchecked, Some(v)) =
            (self.flaw, &opts.value)
        {
            self.shared.values.lock().insert(key.clone(), v.clone());
        }
    }

    /// The store's options for `opts` under the election's flaws.
    pub(super) fn election_opts(&self, mut opts: LockOptions) -> LockOptions {
        if matches!(self.flaw, Flaw::ValueNotStored | Flaw::ElectionUndeclared) {
            opts.value = None;
        }
        opts
    }

    /// [`Flaw::ElectionUndeclared`] refuses the reads (and takes values all the same).
    fn undeclared(&self) -> Result<()> {
        if self.flaw == Flaw::ElectionUndeclared {
            return Err(lock_core::Error::Unsupported {
                backend: "flawed-memory",
                operation: "leader election",
            });
        }
        Ok(())
    }

    /// The store's leader, with the token the wrapper handed out, as `inspect` reports it.
    pub(super) async fn leader_flawed(&self, name: &LockName) -> Result<Option<Leader>> {
        self.undeclared()?;
        let key = self.key(name)?;
        self.cross().await?;
        let Some(l) = self.inner.leader(&key).await? else {
            if self.flaw == Flaw::LeaderNeverGone {
                let kept = self.shared.last_leader.lock().get(&(self.id, key)).cloned();
                return Ok(kept);
            }
            return Ok(None);
        };
        let token = (self.shared.grants.lock().get(&key)).and_then(|g| g.token);
        let value = match self.flaw {
            Flaw::LeaderIsNewestCandidate | Flaw::ProclaimUnchecked => {
                let kept = self.shared.values.lock().get(&key).cloned();
                kept.unwrap_or(l.value)
            }
            _ => l.value,
        };
        let read = Leader::new(value, token.unwrap_or(l.term), l.remaining);
        if self.flaw == Flaw::LeaderNeverGone {
            let mut kept = self.shared.last_leader.lock();
            kept.insert((self.id, key), read.clone());
        }
        Ok(Some(read))
    }

    pub(super) async fn watch_flawed(&self, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
        self.undeclared()?;
        let key = self.key(name)?;
        self.cross().await?;
        match self.flaw {
            Flaw::FeedSilent => Ok(Box::new(Silent)),
            Flaw::ObserverPolls => Ok(Box::new(Ticks(tokio::time::interval(
                Duration::from_millis(5),
            )))),
            _ => self.inner.watch(&key).await,
        }
    }

    /// [`Lease::proclaim`] of a lease of this client, under the flaw.
    pub(super) async fn proclaim_flawed(
        &self,
        lease: &dyn Lease,
        value: &LeaderValue,
    ) -> Result<()> {
        match self.flaw {
            Flaw::ProclaimIgnored => Ok(()),
            Flaw::ProclaimUnchecked => {
                // The value's own key, written whether or not the lock is still this lease's.
                let key = lease.name().clone();
                self.shared.values.lock().insert(key, value.clone());
                lease.proclaim(value).await
            }
            _ => {
                self.cross().await?;
                lease.proclaim(value).await
            }
        }
    }
}

/// [`Flaw::FeedSilent`]: a feed that never reports anything.
struct Silent;

#[async_trait]
impl ChangeFeed for Silent {
    async fn changed(&mut self) -> Result<Change> {
        std::future::pending().await
    }
}

/// [`Flaw::ObserverPolls`]: a feed that reports a change every few milliseconds, so the
/// observer reads the leader at that pace.
struct Ticks(tokio::time::Interval);

#[async_trait]
impl ChangeFeed for Ticks {
    async fn changed(&mut self) -> Result<Change> {
        self.0.tick().await;
        Ok(Change::Notified)
    }
}
