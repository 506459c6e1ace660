//! [`FlawedLock::in_flight`]: a request on a slow wire, which lands and replies after the
//! caller may have left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Error, Lease, LockName, LockOptions, Result};

use super::harness::FlawedLock;
use super::Flaw;

impl FlawedLock {
    /// A `try_acquire` sent over a slow wire: it lands after `delay` even if the caller has
    /// gone, and its reply takes `delay` again; a cut of the link meanwhile loses the reply,
    /// and the caller gets an error. A correct client then releases the grant nobody waits
    /// for; the flawed one leaves it.
    pub(super) async fn in_flight(
        &self,
        delay: Duration,
        key: &LockName,
        opts: &LockOptions,
    ) -> Result<(Option<Box<dyn Lease>>, Instant)> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (inner, key, opts, flaw) = (
            self.inner.clone(),
            key.clone(),
            self.inner_opts(opts),
            self.flaw,
        );
        let reply_lost = Arc::new(AtomicBool::new(false));
        let lost = reply_lost.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let r = inner.try_acquire(&key, &opts).await;
            // Taken after the store's own clock reading: an upper bound for it.
            let landed = Instant::now();
            tokio::time::sleep(delay).await;
            if let Err((Ok(Some(orphan)), _)) = tx.send((r, landed)) {
                let leave = match flaw {
                    Flaw::CancelInFlightLeavesGhost => true,
                    Flaw::LostReplyLeavesGrant => lost.load(Ordering::SeqCst),
                    _ => false,
                };
                if leave {
                    orphan.abandon();
                } else {
                    let _ = orphan.release().await;
                }
            }
        });
        let cut: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match &self.link
        {
            Some(wire) => Box::pin(wire.next_cut()),
            None => Box::pin(std::future::pending()),
        };
        tokio::select! {
            reply = rx => {
                let (r, landed) = reply.map_err(|_| {
                    Error::unavailable("flawed-memory", "the in-flight request vanished")
                })?;
                Ok((r?, landed))
            }
            () = cut => {
                reply_lost.store(true, Ordering::SeqCst);
                Err(Error::unavailable(
                    "flawed-memory",
                    "the connection dropped with the request in flight",
                ))
            }
        }
    }
}
