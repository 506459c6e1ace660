//! A driver's own watchdog at the wrong pace ([`Flaw::WatchdogRenewsLate`],
//! [`Flaw::WatchdogSpins`]) or blocking the runtime ([`Flaw::WatchdogBlocksTheRuntime`]): the
//! store's lease, renewed by hand from a task of the control's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::{FencingToken, Lease, LeaseState, LockName, LostSignal, Result};

use super::Flaw;

#[derive(Debug)]
pub(super) struct PacedLease {
    lease: Arc<Box<dyn Lease>>,
    pacer: Pacer,
}

/// The renewing task; stopped when the lease is released, abandoned or dropped.
#[derive(Debug)]
struct Pacer(tokio::task::JoinHandle<()>);

impl Pacer {
    /// Stops the task and waits until it has let go of the lease.
    async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl PacedLease {
    /// `lease` (manually renewed), renewed by a task at `flaw`'s pace — a tenth of the TTL
    /// before `valid_until`, every two-hundredth of the TTL, or every third of it after a
    /// blocking wait — until `max_hold` has passed.
    pub(super) fn new(lease: Box<dyn Lease>, flaw: Flaw, max_hold: Option<Duration>) -> Self {
        let stop_at = max_hold.and_then(|m| Instant::now().checked_add(m));
        let lease = Arc::new(lease);
        let weak = Arc::downgrade(&lease);
        let pacer = Pacer(tokio::spawn(async move {
            loop {
                let Some(at) = weak.upgrade().map(|l| match flaw {
                    Flaw::WatchdogRenewsLate => l.valid_until() - l.ttl() / 10,
                    Flaw::WatchdogBlocksTheRuntime => Instant::now() + l.ttl() / 3,
                    _ => Instant::now() + l.ttl() / 200,
                }) else {
                    return;
                };
                if stop_at.is_some_and(|s| at >= s) {
                    return;
                }
                tokio::time::sleep_until(at.into()).await;
                let Some(l) = weak.upgrade() else {
                    return;
                };
                if flaw == Flaw::WatchdogBlocksTheRuntime {
                    std::thread::sleep(super::BLOCKING_CALL);
                }
                if l.renew().await.is_err() {
                    return;
                }
            }
        }));
        PacedLease { lease, pacer }
    }

    /// The store's lease, once the pacer has let go of it.
    async fn alone(self) -> Option<Box<dyn Lease>> {
        self.pacer.stop().await;
        Arc::try_unwrap(self.lease).ok()
    }
}

#[async_trait]
impl Lease for PacedLease {
    fn name(&self) -> &LockName {
        self.lease.name()
    }
    fn fencing_token(&self) -> Option<FencingToken> {
        self.lease.fencing_token()
    }
    fn ttl(&self) -> Duration {
        self.lease.ttl()
    }
    fn valid_until(&self) -> Instant {
        self.lease.valid_until()
    }
    fn state(&self) -> LeaseState {
        self.lease.state()
    }
    fn lost(&self) -> LostSignal {
        self.lease.lost()
    }
    fn renewals(&self) -> Option<u64> {
        self.lease.renewals()
    }
    async fn renew(&self) -> Result<()> {
        self.lease.renew().await
    }
    async fn release(self: Box<Self>) -> Result<()> {
        let name = self.lease.name().clone();
        match self.alone().await {
            Some(lease) => lease.release().await,
            None => Err(lock_core::Error::NotHeld { name }),
        }
    }
    fn abandon(self: Box<Self>) {
        // The pacer is aborted on drop; the store's lease then drops too, which frees it
        // rather than leaving it to expire: good enough for a control of renewal pace.
        drop(self);
    }
    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        self.lease.proclaim(value).await
    }
    fn backend_key(&self) -> Option<String> {
        self.lease.backend_key()
    }
}
