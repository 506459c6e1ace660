//! [`FlawedLock`]'s two acquisitions, where most flaws act: the trait's `try_acquire` and
//! `acquire` (in `lock.rs`) report around them, as a driver that overrides them must.

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Error, Lease, LockName, LockOptions, Result, Wait};

use super::harness::*;
use super::lease::*;
use super::waiting::Arrived;
use super::*;

impl FlawedLock {
    /// `try_acquire` under the flaw (the trait's reports around it).
    pub(super) async fn try_acquire_flawed(
        &self,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        let key = self.key_in(name, opts)?;
        self.validate(&key, opts).await?;
        self.note_candidate(&key, opts);
        if self.flaw == Flaw::BlocksTheRuntime {
            std::thread::sleep(BLOCKING_CALL);
        }
        if held_until(&self.shared.ghosts, &key).is_some() {
            return Ok(None);
        }
        let started = Instant::now();
        if self.flaw == Flaw::ExpiredTakeoverNotAtomic && self.expired_grant(&key).is_some() {
            // Saw it expired; the write lands a moment later, over whatever happened since.
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.inner.break_lock(&key);
        }
        match self.cross().await {
            // The failed request taken for a refusal, as if someone held the lock.
            Err(e) if self.flaw == Flaw::UnreachableIsRefusal && e.is_retryable() => {
                return Ok(None)
            }
            r => r?,
        }
        if self.flaw == Flaw::SplitVoteGivesUp && self.overlapped(&key).await {
            return Ok(None);
        }
        let lease = match (self.delay(), self.flaw) {
            (None, Flaw::TryAcquireWaits) => {
                let o = self.inner_opts(opts).wait_for(opts.ttl);
                match self.inner.acquire(&key, &o).await {
                    Ok(l) => Some(l),
                    Err(Error::Timeout { .. }) => None,
                    Err(e) => return Err(e),
                }
            }
            (None, Flaw::CancelledGrantStays) => {
                match self.inner.try_acquire(&key, &self.inner_opts(opts)).await? {
                    // A step after the grant (reading a counter, say) with the grant held by
                    // something that, dropped, does not release it.
                    Some(l) => {
                        let mut parked = AbandonOnDrop(Some(l));
                        tokio::task::yield_now().await;
                        parked.0.take()
                    }
                    None => None,
                }
            }
            (None, Flaw::UnreadGrantStays) => self.try_on_a_task(&key, opts).await?,
            (None, Flaw::TryAcquireJumpsQueue) => self.jump_queue(&key, opts).await?,
            (None, Flaw::ReadersJumpWriters) => self.jump_writers(&key, opts).await?,
            (None, Flaw::MismatchOnlyWithHolders) => self.mismatch_with_holders(&key, opts).await?,
            (None, _) => self.inner.try_acquire(&key, &self.inner_opts(opts)).await?,
            (Some(delay), _) => {
                let (lease, landed) = self.in_flight(delay, &key, opts).await?;
                if self.flaw == Flaw::SlowIsBusy && started.elapsed() > opts.ttl / 3 {
                    if let Some(l) = lease {
                        let _ = l.release().await;
                    }
                    return Ok(None);
                }
                return match lease {
                    Some(l) => Ok(Some(
                        self.in_time(self.wrap(l, opts, started, landed)).await?,
                    )),
                    None => Ok(None),
                };
            }
        };
        Ok(lease.map(|l| self.wrap(l, opts, started, started)))
    }
    /// [`Flaw::UnreadGrantStays`]: the try on a task of its own, its grant sent back over a
    /// channel; released if the send fails, abandoned if it lies in the channel unread.
    async fn try_on_a_task(
        &self,
        key: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (inner, key, o) = (self.inner.clone(), key.clone(), self.inner_opts(opts));
        tokio::spawn(async move {
            // A request's round trip: the caller's first poll finds the channel empty (on a
            // multi-thread runtime an instant grant could be in it already).
            tokio::time::sleep(Duration::from_millis(1)).await;
            let got = inner.try_acquire(&key, &o).await;
            if let Err(Ok(Some(mut parked))) =
                tx.send(got.map(|l| l.map(|l| AbandonOnDrop(Some(l)))))
            {
                if let Some(l) = parked.0.take() {
                    let _ = l.release().await;
                }
            }
        });
        match rx.await {
            Ok(got) => Ok(got?.and_then(|mut parked| parked.0.take())),
            Err(_) => Err(Error::unavailable(
                "flawed-memory",
                "the request's task ended",
            )),
        }
    }

    /// Whether an acquisition of `name` in `opts.mode` arriving now finds it held in a way
    /// that makes it wait (its holders and it may not hold together).
    pub(super) async fn must_wait(&self, name: &LockName, opts: &LockOptions) -> bool {
        let Ok(key) = self.key_in(name, opts) else {
            return false;
        };
        let Ok(holders) = self.inner.holders(&key).await else {
            return false;
        };
        let mut modes: Vec<lock_core::Mode> = holders.iter().map(|h| h.mode).collect();
        modes.push(opts.mode);
        lock_core::driver::queue_turn(&modes, modes.len() - 1) != lock_core::driver::Turn::Granted
    }

    /// `acquire` under the flaw (the trait's reports around it).
    pub(super) async fn acquire_flawed(
        &self,
        name: &LockName,
        opts: &LockOptions,
    ) -> Result<Box<dyn Lease>> {
        let waits;
        let opts = match (self.flaw, opts.wait) {
            (Flaw::NoWaitWaits, Wait::No) => {
                waits = opts.clone().wait_for(opts.ttl);
                &waits
            }
            _ => opts,
        };
        let key = self.key_in(name, opts)?;
        self.validate(&key, opts).await?;
        self.note_candidate(&key, opts);
        let started = Instant::now();
        self.cross().await?;
        let deadline = opts.wait.deadline(started);
        if self.flaw == Flaw::SpentDeadlineGivesUp
            && matches!(opts.wait, Wait::For(_))
            && deadline.is_some_and(|d| Instant::now() >= d)
        {
            return Err(Self::timeout(&key, started));
        }
        if self.flaw != Flaw::CancelLeavesGhost && !self.wait_out_ghosts(&key, deadline).await {
            return Err(Self::timeout(&key, started));
        }
        self.miss_wakeup(&key, deadline).await;
        let arrival = {
            let mut a = self.shared.arrivals.lock();
            let n = a.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        self.wait(Arrived {
            name,
            key,
            opts,
            started,
            deadline,
            arrival,
        })
        .await
    }
}
