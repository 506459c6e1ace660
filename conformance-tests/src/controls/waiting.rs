//! The flawed ways of waiting: what [`FlawedLock::acquire`] does once a waiter has arrived.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Error, Lease, LockName, LockOptions, Result, Wait};

use super::harness::*;
use super::lease::Ghost;
use super::*;

/// How far a waiting request over a slow wire got ([`FlawedLock::wait_over_wire`]).
#[derive(Default)]
struct Stage {
    /// The store granted it.
    granted: AtomicBool,
    /// Its caller went away before that.
    cancelled_early: AtomicBool,
}

/// Dropped with the waiting caller: a request not yet granted is withdrawn from the queue
/// (unless the flaw keeps it there); a grant already made is left to the request's task,
/// whose reply then finds nobody and releases it.
struct UndoOnDrop {
    task: Option<tokio::task::AbortHandle>,
    stage: Arc<Stage>,
    keeps_place: bool,
}

impl Drop for UndoOnDrop {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        if !self.stage.granted.load(Ordering::SeqCst) {
            self.stage.cancelled_early.store(true, Ordering::SeqCst);
            if !self.keeps_place {
                task.abort();
            }
        }
    }
}

/// A waiting `acquire` that got past validation, its link and any ghost.
pub(super) struct Arrived<'a> {
    pub(super) name: &'a LockName,
    /// The backend key of `name`.
    pub(super) key: LockName,
    pub(super) opts: &'a LockOptions,
    pub(super) started: Instant,
    pub(super) deadline: Option<Instant>,
    /// Its arrival number among the waiting acquires of `key`.
    pub(super) arrival: u32,
}

impl FlawedLock {
    /// [`Flaw::TryAcquireJumpsQueue`]: a lock that is free with waiters queued for it is
    /// taken all the same, as by a `try_acquire` that looks for a holder and not for a queue
    /// (the grant comes from a private store, so the queued waiter gets the lock too).
    pub(super) async fn jump_queue(
        &self,
        key: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        let o = self.inner_opts(opts);
        if let Some(l) = self.inner.try_acquire(key, &o).await? {
            return Ok(Some(l));
        }
        if self.inner.inspect(key).await?.is_some() {
            return Ok(None);
        }
        lock_core::memory::MemoryLock::new()
            .try_acquire(key, &o)
            .await
    }

    /// Waits while a ghost (or, for waiting acquires, a queued ghost) holds `name`; `false`
    /// if one still does at the deadline.
    pub(super) async fn wait_out_ghosts(&self, name: &LockName, deadline: Option<Instant>) -> bool {
        loop {
            let until = held_until(&self.shared.ghosts, name)
                .into_iter()
                .chain(held_until(&self.shared.queued_ghosts, name))
                .max();
            let Some(until) = until else {
                return true;
            };
            let stop = deadline.map_or(until, |d| d.min(until));
            tokio::time::sleep_until(stop.into()).await;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return held_until(&self.shared.ghosts, name).is_none()
                    && held_until(&self.shared.queued_ghosts, name).is_none();
            }
        }
    }

    /// Waits for the lock as this flaw does.
    pub(super) async fn wait(&self, w: Arrived<'_>) -> Result<Box<dyn Lease>> {
        let (name, key, opts) = (w.name, w.key, w.opts);
        let (started, deadline, arrival) = (w.started, w.deadline, w.arrival);
        let bounded = !matches!(opts.wait, Wait::Forever | Wait::No);
        let polls = match self.flaw {
            Flaw::SpinningWaiter => Some(Duration::from_millis(2)),
            Flaw::BoundedWaitPolls if bounded => Some(Duration::from_secs(1)),
            Flaw::UnboundedWaitPolls if !bounded => Some(Duration::from_secs(1)),
            _ => None,
        };
        if let Some(pause) = polls {
            loop {
                if let Some(l) = self.try_acquire(name, opts).await? {
                    return Ok(l);
                }
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Err(Self::timeout(&key, started));
                }
                let next = deadline.map_or(now + pause, |d| d.min(now + pause));
                tokio::time::sleep_until(next.into()).await;
            }
        }
        if let Some(r) = self.family_wait(name, &key, opts, started, deadline).await {
            return r;
        }
        match self.flaw {
            Flaw::DeadlineHangsOnOneClient if self.odd_one => {
                match self.inner.acquire(&key, &self.inner_opts(opts)).await {
                    // The timeout fired, and nothing wakes this waiter again.
                    Err(Error::Timeout { .. }) => std::future::pending().await,
                    r => Ok(self.wrap(r?, opts, started, started)),
                }
            }
            Flaw::CutGrantsTwoWaiters => {
                let (cut, inner_opts) = (self.shared.cut_anywhere.clone(), self.inner_opts(opts));
                tokio::select! {
                    r = self.inner.acquire(&key, &inner_opts) => {
                        Ok(self.wrap(r?, opts, started, started))
                    }
                    () = cut.notified() => {
                        // A grant from a store of its own: whoever holds the name goes on
                        // holding it.
                        let phantom = lock_core::memory::MemoryLock::new()
                            .try_acquire(&key, &self.inner_opts(opts))
                            .await?
                            .ok_or_else(|| Error::not_held(&key))?;
                        Ok(self.wrap(phantom, opts, started, started))
                    }
                }
            }
            Flaw::IgnoresWaitTimeout => {
                let l = self
                    .inner
                    .acquire(&key, &self.inner_opts(opts).wait_forever())
                    .await?;
                Ok(self.wrap(l, opts, started, started))
            }
            Flaw::CancelLeavesGhost => {
                // The ghost of an earlier cancelled acquire holds the lock first.
                if let Some(until) = held_until(&self.shared.ghosts, &key) {
                    let stop = deadline.map_or(until, |d| d.min(until));
                    tokio::time::sleep_until(stop.into()).await;
                    if held_until(&self.shared.ghosts, &key).is_some() {
                        return Err(Self::timeout(&key, started));
                    }
                }
                let mut ghost = Ghost {
                    shared: self.shared.clone(),
                    name: key.clone(),
                    ttl: opts.ttl * 50,
                    armed: true,
                };
                let l = self.inner.acquire(&key, &self.inner_opts(opts)).await;
                ghost.armed = false;
                Ok(self.wrap(l?, opts, started, started))
            }
            Flaw::WaiterStarves if arrival == 2 => {
                if let Some(d) = deadline {
                    tokio::time::sleep_until(d.into()).await;
                } else {
                    std::future::pending::<()>().await;
                }
                Err(Self::timeout(&key, started))
            }
            Flaw::TimedOutWaiterGrantedLater | Flaw::TimedOutWaiterStaysQueued => {
                let r = self.inner.acquire(&key, &self.inner_opts(opts)).await;
                if let Err(Error::Timeout { .. }) = r {
                    self.leave_timed_out_waiter(&key, opts).await;
                }
                Ok(self.wrap(r?, opts, started, started))
            }
            Flaw::NoFifoAfterExpiry => {
                // Waits out an unreleased holder by the clock, then races: the latest arrival
                // wakes first.
                let expires = self.shared.grants.lock().get(&key).map(|g| g.expires);
                if let Some(at) = expires.filter(|at| *at > Instant::now()) {
                    let head_start = Duration::from_millis(60) / arrival.max(1);
                    tokio::time::sleep_until((at + head_start).into()).await;
                }
                let l = self.inner.acquire(&key, &self.inner_opts(opts)).await?;
                Ok(self.wrap(l, opts, started, started))
            }
            Flaw::WaitersLifo => loop {
                // Every waiter watches the lock; once it is free, the later a waiter arrived,
                // the sooner it tries.
                if self.inner.inspect(&key).await?.is_none() {
                    let pause = Duration::from_millis(200)
                        .saturating_sub(Duration::from_millis(10) * arrival);
                    tokio::time::sleep(pause).await;
                    if let Some(l) = self.inner.try_acquire(&key, &self.inner_opts(opts)).await? {
                        return Ok(self.wrap(l, opts, started, started));
                    }
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(Self::timeout(&key, started));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            },
            _ => {
                let Some(delay) = self.delay() else {
                    let l = self.inner.acquire(&key, &self.inner_opts(opts)).await?;
                    return Ok(self.wrap(l, opts, started, started));
                };
                let (l, landed, granted) = self.wait_over_wire(delay, &key, opts).await?;
                // Counted as from a request sent a delay before the store's grant, under
                // [`Flaw::WaiterValidityFromReply`] from the reply if it had to wait.
                let waited = granted.duration_since(landed) > Duration::from_millis(1);
                let sent = match self.flaw {
                    Flaw::WaiterValidityFromReply if waited => Instant::now(),
                    _ => granted.checked_sub(delay).unwrap_or(granted),
                };
                self.in_time(self.wrap(l, opts, sent, sent)).await
            }
        }
    }

    /// A waiting `acquire` over a slow wire: the request lands after `delay` and waits in the
    /// store's queue, and the grant's reply takes `delay` again. A caller that goes away
    /// before the grant takes its place in the queue with it (the undo is sent as a driver's
    /// would be); one that goes away while the grant is on its way has the grant released.
    /// Under [`Flaw::CancelledWaiterKeepsItsPlace`] and [`Flaw::CancelledWaiterKeepsItsGrant`]
    /// the one or the other is left to hold the lock. Returns the grant, when the request
    /// landed and when the store granted it.
    async fn wait_over_wire(
        &self,
        delay: Duration,
        key: &LockName,
        opts: &LockOptions,
    ) -> Result<(Box<dyn Lease>, Instant, Instant)> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stage = Arc::new(Stage::default());
        let (inner, k, o, flaw, s) = (
            self.inner.clone(),
            key.clone(),
            self.inner_opts(opts),
            self.flaw,
            stage.clone(),
        );
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let landed = Instant::now();
            let r = inner
                .acquire(&k, &o)
                .await
                .map(|l| (l, landed, Instant::now()));
            s.granted.store(true, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            if let Err(Ok((orphan, _, _))) = tx.send(r) {
                let early = s.cancelled_early.load(Ordering::SeqCst);
                let leave = match flaw {
                    Flaw::CancelledWaiterKeepsItsPlace => early,
                    Flaw::CancelledWaiterKeepsItsGrant => !early,
                    _ => false,
                };
                if leave {
                    orphan.abandon();
                } else {
                    let _ = orphan.release().await;
                }
            }
        });
        let mut undo = UndoOnDrop {
            task: Some(task.abort_handle()),
            stage,
            keeps_place: flaw == Flaw::CancelledWaiterKeepsItsPlace,
        };
        let r = rx.await;
        undo.task = None;
        r.map_err(|_| Error::unavailable("flawed-memory", "the waiting request vanished"))?
    }

    /// What a waiter that timed out leaves behind under this flaw.
    async fn leave_timed_out_waiter(&self, key: &LockName, opts: &LockOptions) {
        if self.flaw == Flaw::TimedOutWaiterStaysQueued {
            self.shared
                .queued_ghosts
                .lock()
                .insert(key.clone(), Instant::now() + opts.ttl * 50);
            return;
        }
        // The queued request lives on and is granted after the release.
        let (inner, key) = (self.inner.clone(), key.clone());
        let o = opts
            .clone()
            .ttl(opts.ttl * 50)
            .manual_renewal()
            .wait_forever();
        let mut left = Box::pin(async move {
            if let Ok(l) = inner.acquire(&key, &o).await {
                l.abandon();
            }
        });
        // Polled once here, so it is in the store's queue (the memory driver joins it on the
        // first poll) before the timeout returns: spawned unpolled, it could join only after
        // the holder's release, and then a newcomer would win the race and hide the flaw.
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(left.as_mut(), cx))
        })
        .await;
        if first.is_pending() {
            tokio::spawn(left);
        }
    }
}

impl FlawedLock {
    /// One voting round of 5 ms on `key`: whether another `try_acquire` was in flight on it
    /// during this one ([`Flaw::SplitVoteGivesUp`]).
    pub(super) async fn overlapped(&self, key: &LockName) -> bool {
        {
            let mut racing = self.shared.racing.lock();
            let (n, split) = racing.entry(key.clone()).or_insert((0, false));
            *n += 1;
            *split |= *n > 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut racing = self.shared.racing.lock();
        let Some((n, split)) = racing.get_mut(key) else {
            return false;
        };
        let overlapped = *split;
        *n -= 1;
        if *n == 0 {
            racing.remove(key);
        }
        overlapped
    }

    /// A grant whose reply crossed the wire after its own validity had passed is released
    /// and reported, as a driver must (under [`Flaw::BornLostHandedOut`], handed out Lost).
    pub(super) async fn in_time(&self, lease: Box<dyn Lease>) -> Result<Box<dyn Lease>> {
        if self.flaw == Flaw::BornLostHandedOut || lease.valid_until() > Instant::now() {
            return Ok(lease);
        }
        let _ = lease.release().await;
        Err(Error::unavailable(
            "flawed-memory",
            "the grant arrived after the lease's validity had passed",
        ))
    }
}
