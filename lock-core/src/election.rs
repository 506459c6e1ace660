//! Leader election, read as the lock it is: a name's exclusive holder is its leader, the value
//! the holder was granted with (or proclaimed since) says who it is, and the fencing token of
//! its grant is its term. A campaign is an exclusive acquisition; a leadership is a lease
//! (renewal, expiry, lost signal, release) — no second lease machinery. What an election adds
//! to a driver is three hooks: the value stored with a grant ([`LockOptions::value`]), the
//! leader read back with it ([`DistributedLock::leader`]) or changed by its holder
//! ([`Lease::proclaim`]), and a feed of changes ([`DistributedLock::watch`]) that
//! [`Observer`](crate::Observer) turns into a stream of leaders.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::{
    DistributedLock, Error, Fencing, FencingToken, Leader, LeaderValue, Lease, LockName,
    LockOptions, Observer, Result,
};

/// Elected: the lease of the name's exclusive lock, with its term. Everything a lease does —
/// renewal, [`lost`](Lease::lost), [`valid_until`](Lease::valid_until) — it does through
/// `Deref`; [`resign`](Self::resign) releases it, and the next candidate is elected as a waiter
/// is granted a released lock.
pub struct Leadership {
    lease: Box<dyn Lease>,
    term: FencingToken,
}

impl Leadership {
    /// The term: this leadership's fencing token. Pass it to the storage the leader writes to,
    /// as a lock holder passes its token.
    pub fn term(&self) -> FencingToken {
        self.term
    }
    /// Changes the value observers and [`Election::leader`] see, without giving up leadership;
    /// refused ([`Error::NotHeld`], [`Error::Lost`]) once the leadership has ended.
    pub async fn proclaim(&self, value: LeaderValue) -> Result<()> {
        self.lease.proclaim(&value).await
    }
    /// Gives up leadership: releases the lock, so the next candidate is elected at once.
    pub async fn resign(self) -> Result<()> {
        self.lease.release().await
    }
    /// Stops renewing without telling the backend, as a crashed leader would
    /// ([`Lease::abandon`]): the next candidate is elected when the lease lapses.
    pub fn abandon(self) {
        self.lease.abandon()
    }
    /// The lease itself (for code written against [`Lease`]).
    pub fn into_lease(self) -> Box<dyn Lease> {
        self.lease
    }
}

impl Deref for Leadership {
    type Target = dyn Lease;
    fn deref(&self) -> &Self::Target {
        &*self.lease
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("term", &self.term)
            .field("lease", &self.lease)
            .finish()
    }
}

/// Elections on one lock service: campaign, read the leader, observe its changes. Works on any
/// driver whose [`Capabilities::election`](crate::Capabilities::election) is true and which
/// fences (the term is the fencing token).
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use lock_core::{memory::MemoryLock, Election, LeaderValue, LockName, LockOptions};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// let election = Election::new(Arc::new(MemoryLock::new()))?;
/// let name = LockName::new("scheduler")?;
/// let mut observer = election.observe(&name).await?;
/// assert_eq!(observer.next().await?.leader, None);
/// let opts = LockOptions::new(Duration::from_secs(10)).auto_renew(None);
/// let me = election.campaign(&name, LeaderValue::new("node-1:8080")?, &opts).await?;
/// let seen = observer.next().await?.leader.expect("elected");
/// assert_eq!((seen.value.as_str(), seen.term), (Some("node-1:8080"), me.term()));
/// me.proclaim(LeaderValue::new("node-1:9090")?).await?;
/// assert_eq!(observer.next().await?.leader.map(|l| l.value.to_string()).as_deref(), Some("node-1:9090"));
/// me.resign().await?;
/// assert_eq!(observer.next().await?.leader, None);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    lock: Arc<dyn DistributedLock>,
}

impl Election {
    /// Elections on `lock`; [`Error::Unsupported`] where its driver cannot hold one (no
    /// stored value or change feed, or no fencing token to be the term).
    pub fn new(lock: Arc<dyn DistributedLock>) -> Result<Self> {
        let caps = lock.capabilities();
        if !caps.election || caps.fencing == Fencing::None {
            return Err(Error::Unsupported {
                backend: lock.backend(),
                operation: "leader election",
            });
        }
        Ok(Election { lock })
    }

    /// The lock service underneath.
    pub fn lock(&self) -> &Arc<dyn DistributedLock> {
        &self.lock
    }

    /// Campaigns for `name` with `value`, waiting as long as `opts.wait` allows (then
    /// [`Error::Timeout`]): an exclusive acquisition, cancel-safe like any, that leaves no
    /// candidate behind when dropped. `opts.mode` is ignored: a leader is the exclusive holder.
    pub async fn campaign(
        &self,
        name: &LockName,
        value: LeaderValue,
        opts: &LockOptions,
    ) -> Result<Leadership> {
        let opts = opts.clone().exclusive().value(value);
        leadership(self.lock.backend(), self.lock.acquire(name, &opts).await?)
    }

    /// One campaign attempt: `Ok(None)` when someone else leads (or, on FIFO backends,
    /// candidates are queued ahead).
    pub async fn try_campaign(
        &self,
        name: &LockName,
        value: LeaderValue,
        opts: &LockOptions,
    ) -> Result<Option<Leadership>> {
        let opts = opts.clone().exclusive().value(value);
        self.lock
            .try_acquire(name, &opts)
            .await?
            .map(|lease| leadership(self.lock.backend(), lease))
            .transpose()
    }

    /// Who leads `name` now, or `None`; possibly stale by the time it arrives.
    pub async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.lock.leader(name).await
    }

    /// A stream of `name`'s leaders: its first [`Observer::next`] is the leader now, each next
    /// one a change.
    pub async fn observe(&self, name: &LockName) -> Result<Observer> {
        Observer::new(self.lock.clone(), name.clone()).await
    }
}

fn leadership(backend: &'static str, lease: Box<dyn Lease>) -> Result<Leadership> {
    match lease.fencing_token() {
        Some(term) => Ok(Leadership { lease, term }),
        // `new` refused drivers without fencing; one that declares it and then grants without
        // a token has no term to give. Dropped, the lease is released in the background.
        None => Err(Error::Unsupported {
            backend,
            operation: "a term (this grant has no fencing token)",
        }),
    }
}
