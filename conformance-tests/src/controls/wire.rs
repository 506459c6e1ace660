//! The in-process link of a faulty control client: what a fault proxy does to a networked
//! driver's traffic, acted out on its calls; and the leases whose renewals cross it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{drift, LeaseOps};
use lock_core::{Error, Lease, LockName, Result};
use tokio::sync::watch;

use super::Flaw;
use crate::{Fault, Link};

/// One client's link: the fault in force, and what happened to it so far.
#[derive(Debug)]
pub(super) struct Wire {
    fault: watch::Sender<Fault>,
    cuts: AtomicU64,
    /// Ever blackholed ([`Flaw::NeverReconnects`] stays down after that).
    partitioned: AtomicBool,
}

impl Wire {
    pub(super) fn new(fault: Fault) -> Arc<Self> {
        Arc::new(Wire {
            fault: watch::channel(fault).0,
            cuts: AtomicU64::new(0),
            partitioned: AtomicBool::new(false),
        })
    }

    /// The delay in force, if any.
    pub(super) fn delay(&self) -> Option<Duration> {
        match *self.fault.borrow() {
            Fault::Delay(d) => Some(d),
            _ => None,
        }
    }

    fn down(&self) -> bool {
        *self.fault.borrow() == Fault::Blackhole
    }

    /// A request crossing the link: held while it is blackholed (it flows once healed, as a
    /// TCP retransmission would); under [`Flaw::NeverReconnects`], refused for good once the
    /// link has been down.
    pub(super) async fn cross(&self, flaw: Flaw) -> Result<()> {
        if flaw == Flaw::NeverReconnects && self.partitioned.load(Ordering::Relaxed) {
            return Err(Error::unavailable(
                "flawed-memory",
                "the connection broke and this client never reconnects",
            ));
        }
        let mut rx = self.fault.subscribe();
        let _ = rx.wait_for(|f| *f != Fault::Blackhole).await;
        Ok(())
    }
}

/// The [`Link`] a faulty control client hands to the suite.
#[derive(Debug)]
pub(super) struct WireLink(pub(super) Arc<Wire>);

impl Link for WireLink {
    fn set(&self, fault: Fault) {
        match fault {
            Fault::Cut => {
                self.0.cuts.fetch_add(1, Ordering::Relaxed);
            }
            f => {
                if f == Fault::Blackhole {
                    self.0.partitioned.store(true, Ordering::Relaxed);
                }
                self.0.fault.send_replace(f);
            }
        }
    }
}

/// A store lease whose renewals and release cross a [`Wire`], tracked by a
/// [`ManagedLease`](lock_core::driver::ManagedLease) as a networked driver's would be.
#[derive(Debug)]
pub(super) struct WiredOps {
    pub(super) store: tokio::sync::Mutex<Option<Box<dyn Lease>>>,
    pub(super) wire: Arc<Wire>,
    pub(super) flaw: Flaw,
    pub(super) name: LockName,
    pub(super) ttl: Duration,
    /// The wire's cuts when the lock was granted.
    pub(super) cuts: u64,
}

impl WiredOps {
    /// `ttl`: the TTL the client asked for (what it believes it renews by).
    pub(super) fn new(lease: Box<dyn Lease>, ttl: Duration, wire: Arc<Wire>, flaw: Flaw) -> Self {
        WiredOps {
            name: lease.name().clone(),
            ttl,
            store: tokio::sync::Mutex::new(Some(lease)),
            cuts: wire.cuts.load(Ordering::Relaxed),
            wire,
            flaw,
        }
    }

    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.clone(),
        }
    }
}

#[async_trait]
impl LeaseOps for WiredOps {
    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        if self.flaw == Flaw::RenewsBlindWhilePartitioned && self.wire.down() {
            return Ok(start + self.ttl);
        }
        if self.flaw == Flaw::CutLosesLease && self.wire.cuts.load(Ordering::Relaxed) != self.cuts {
            // Like a driver whose leases die with their connection: the lock is let go.
            if let Some(l) = self.store.lock().await.take() {
                let _ = l.release().await;
            }
            return Err(self.not_held());
        }
        self.wire.cross(self.flaw).await?;
        let store = self.store.lock().await;
        let lease = store.as_ref().ok_or_else(|| self.not_held())?;
        lease.renew().await?;
        Ok(start + self.ttl - drift(self.ttl))
    }

    async fn release(&self) -> Result<()> {
        self.wire.cross(self.flaw).await?;
        let lease = self.store.lock().await.take();
        lease.ok_or_else(|| self.not_held())?.release().await
    }

    fn abandon(&self) {
        if let Ok(mut store) = self.store.try_lock() {
            if let Some(l) = store.take() {
                l.abandon();
            }
        }
    }
}
