//! The lock family's flaws ([`Flaw::SharedIsExclusive`] and the rest): shared mode and permits
//! broken on top of the store, one promise each, and the state they need.

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, HolderInfo, Lease, LockName, LockOptions, Mode, Result, MAX_TTL};

use super::harness::FlawedLock;
use super::Flaw;

/// A number per kind of mode, for [`Shared::family`](super::harness::Shared::family).
fn kind(mode: Mode) -> u8 {
    match mode {
        Mode::Shared => 1,
        Mode::Permits(_) => 2,
        _ => 0,
    }
}

impl FlawedLock {
    /// The store key of `name` for an acquisition with `opts`: [`FlawedLock::key`], moved aside
    /// by the flaws that keep a mode, or a permit count, on a key of its own.
    pub(super) fn key_in(&self, name: &LockName, opts: &LockOptions) -> Result<LockName> {
        let key = self.key(name)?;
        let suffix = match (self.flaw, opts.mode) {
            (Flaw::FamilyKeysSeparate, Mode::Shared) => "~r".to_string(),
            (Flaw::FamilyKeysSeparate, Mode::Permits(_)) => "~p".to_string(),
            (Flaw::PermitCountIgnored, Mode::Permits(k)) => format!("~k{k}"),
            _ => return Ok(key),
        };
        LockName::new(format!("{key}{suffix}"))
    }

    /// The store's options for `opts` under the family's flaws.
    pub(super) fn family_opts(&self, opts: &LockOptions) -> LockOptions {
        let o = opts.clone();
        match (self.flaw, opts.mode) {
            (Flaw::SharedIsExclusive, Mode::Shared) | (Flaw::ModeServedExclusive, _) => {
                o.exclusive()
            }
            (Flaw::PermitsOffByOne, Mode::Permits(k)) => o.permits(k.saturating_add(1)),
            (Flaw::FamilyNeverExpires, Mode::Shared | Mode::Permits(_)) => o.ttl(MAX_TTL),
            _ => o,
        }
    }

    /// How far below the store's token a lease of `mode` reports `token`.
    pub(super) fn family_offset(&self, key: &LockName, mode: Mode, token: Option<u64>) -> u64 {
        let Some(t) = token else { return 0 };
        match (self.flaw, mode) {
            (Flaw::TokensPerMode, _) => {
                let mut counts = self.shared.family.lock();
                let n = counts.entry((key.clone(), kind(mode))).or_insert(0);
                *n += 1;
                t.saturating_sub(*n)
            }
            // The permit's slot, 1 to k, as a semaphore of k keys would number it.
            (Flaw::PermitTokensWrap, Mode::Permits(k)) if k > 0 => {
                t.saturating_sub((t - 1) % u64::from(k) + 1)
            }
            _ => 0,
        }
    }

    /// [`Flaw::MismatchOnlyWithHolders`]: a permit request whose count differs only from a
    /// waiter's (no holder uses the other count) is refused as busy, not as a mismatch.
    pub(super) async fn mismatch_with_holders(
        &self,
        key: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        match self.inner.try_acquire(key, &self.inner_opts(opts)).await {
            Err(lock_core::Error::PermitsMismatch { held, .. }) => {
                let holders = self.inner.holders(key).await?;
                if holders.iter().any(|h| h.mode == Mode::Permits(held)) {
                    self.inner.try_acquire(key, &self.inner_opts(opts)).await
                } else {
                    Ok(None)
                }
            }
            r => r,
        }
    }

    /// [`DistributedLock::holders`] under the flaw.
    pub(super) async fn holders_flawed(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let key = self.key(name)?;
        self.cross().await?;
        let mut holders = self.inner.holders(&key).await?;
        if self.flaw == Flaw::HoldersShowsOne {
            holders.drain(..holders.len().saturating_sub(1));
        }
        Ok(holders)
    }

    /// [`Flaw::ReadersJumpWriters`]: a shared `try_acquire` beside shared holders is granted
    /// on a key of its own, whoever waits for the name.
    pub(super) async fn jump_writers(
        &self,
        key: &LockName,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        let holders = self.inner.holders(key).await?;
        let readers_only = !holders.is_empty() && holders.iter().all(|h| h.mode == Mode::Shared);
        if opts.mode == Mode::Shared && readers_only {
            let aside = LockName::new(format!("{key}~jump"))?;
            return self.inner.try_acquire(&aside, &self.inner_opts(opts)).await;
        }
        self.inner.try_acquire(key, &self.inner_opts(opts)).await
    }

    /// A waiting `acquire` in shared or permit mode under the family's waiting flaws; `None`
    /// where the flaw does not touch it.
    pub(super) async fn family_wait(
        &self,
        name: &LockName,
        key: &LockName,
        opts: &LockOptions,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Option<Result<Box<dyn Lease>>> {
        if opts.mode == Mode::Exclusive {
            return None;
        }
        // A poller every 5 ms, or one that misses every wake-up and looks again a TTL later.
        let pause = match self.flaw {
            Flaw::FamilyWaiterPolls => Duration::from_millis(5),
            Flaw::FamilyMissedWakeup => opts.ttl,
            Flaw::CancelledFamilyWaiterStays => return Some(self.wait_leaving(key, opts).await),
            Flaw::CutGrantsPermitBeyondK if matches!(opts.mode, Mode::Permits(_)) => {
                return Some(self.permit_on_cut(key, opts, started).await)
            }
            _ => return None,
        };
        Some(
            async {
                loop {
                    if let Some(l) = self.try_acquire(name, opts).await? {
                        return Ok(l);
                    }
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(Self::timeout(key, started));
                    }
                    let next = deadline.map_or(now + pause, |d| d.min(now + pause));
                    tokio::time::sleep_until(next.into()).await;
                }
            }
            .await,
        )
    }

    /// [`Flaw::CutGrantsPermitBeyondK`]: a permit waiter is granted at once when any client's
    /// connection is cut, however many permits are held.
    async fn permit_on_cut(
        &self,
        key: &LockName,
        opts: &LockOptions,
        started: Instant,
    ) -> Result<Box<dyn Lease>> {
        let (cut, inner_opts) = (self.shared.cut_anywhere.clone(), self.inner_opts(opts));
        tokio::select! {
            r = self.inner.acquire(key, &inner_opts) => Ok(self.wrap(r?, opts, started, started)),
            () = cut.notified() => {
                // From a store of its own: the holders of the name keep their permits.
                let phantom = lock_core::memory::MemoryLock::new()
                    .try_acquire(key, &inner_opts)
                    .await?
                    .ok_or_else(|| lock_core::Error::not_held(key))?;
                Ok(self.wrap(phantom, opts, started, started))
            }
        }
    }

    /// [`Flaw::CancelledFamilyWaiterStays`]: the request is queued as a server would keep it,
    /// whatever its caller does; a caller gone before the grant leaves the grant to nobody
    /// until its TTL (which the cases make 40 of theirs).
    async fn wait_leaving(&self, key: &LockName, opts: &LockOptions) -> Result<Box<dyn Lease>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (inner, queued, o) = (self.inner.clone(), key.clone(), self.inner_opts(opts));
        let started = Instant::now();
        tokio::spawn(async move {
            if let Err(Ok(orphan)) = tx.send(inner.acquire(&queued, &o).await) {
                orphan.abandon();
            }
        });
        let granted = rx
            .await
            .map_err(|_| lock_core::Error::unavailable("flawed-memory", "the request vanished"))?;
        Ok(self.wrap(granted?, opts, started, started))
    }
}
