//! The backend half of a held etcd lock: renew (keep-alive, then a key check; the key moves
//! to a new lease after a leader change), release (compare on `create_revision`).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use lock_core::driver::{lease_end, LeaseOps};
use lock_core::{Error, LockName, Result};

use crate::client::{call, txn_call, Cluster, Resend};
use crate::grant::rehome;
use crate::revoke::spawn_revoke;
use crate::term::Tenure;
use crate::waiting::keep_alive;

pub(crate) struct EtcdLeaseOps {
    pub(crate) cluster: std::sync::Arc<Cluster>,
    /// The lease the key is on now, the term its validity rests on, and that validity as last
    /// confirmed (for reuse as a spare after release).
    pub(crate) tenure: parking_lot::Mutex<Tenure>,
    /// Held while the key moves to a lease of a new term: renewals that land together move
    /// it once.
    pub(crate) moving: tokio::sync::Mutex<()>,
    pub(crate) ttl: Duration,
    pub(crate) key: String,
    pub(crate) rev: i64,
    pub(crate) name: LockName,
}

impl EtcdLeaseOps {
    fn tenure(&self) -> Tenure {
        *self.tenure.lock()
    }

    /// Moves the key onto a lease of the current term, unless a renewal beside this one did
    /// already (its lease is not `from` any more).
    async fn move_key(&self, from: i64) -> Result<Instant> {
        let _moving = self.moving.lock().await;
        let now = self.tenure();
        if now.id != from {
            return Ok(now.valid_until);
        }
        let moved = rehome(&self.cluster, &self.key, self.rev, from, self.ttl).await?;
        let tenure = moved.ok_or_else(|| Error::not_held(&self.name))?;
        *self.tenure.lock() = tenure;
        Ok(tenure.valid_until)
    }
}

#[async_trait]
impl LeaseOps for EtcdLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.key.clone())
    }

    /// A keep-alive, then a read of the key (after it, not beside it: the read's term says
    /// which leader answered the keep-alive, `term.rs`). In the lease's own term the validity
    /// moves on; after a leader change the key moves to a lease of the new term instead.
    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let held = self.tenure();
        let (config, client) = (&self.cluster.config, &self.cluster.client);
        let limit = config.request_timeout();
        let ttl = keep_alive(&self.cluster, held.id, self.ttl, limit)
            .await?
            .ok_or_else(|| Error::not_held(&self.name))?;
        let key = self.key.as_str();
        let read = call(config, client, limit, Resend::Refused, |mut c| async move {
            c.get(key, Some(GetOptions::new().with_keys_only())).await
        })
        .await?;
        let term = self.cluster.observe(read.header());
        let Some(kv) = read
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == self.rev)
        else {
            return Err(Error::not_held(&self.name));
        };
        if kv.lease() != held.id {
            // Moved by a renewal beside this one, or by someone else.
            let _moving = self.moving.lock().await;
            let now = self.tenure();
            return if now.id == kv.lease() {
                Ok(now.valid_until)
            } else {
                Err(Error::not_held(&self.name))
            };
        }
        if term == 0 || term != held.term {
            return self.move_key(held.id).await;
        }
        let until = lease_end(start, ttl);
        let mut tenure = self.tenure.lock();
        if tenure.id == held.id {
            tenure.valid_until = until;
        }
        Ok(until)
    }

    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        crate::election::proclaim(&self.cluster, &self.key, self.rev, &self.name, value).await
    }

    async fn release(&self) -> Result<()> {
        // Delete the key only if it is still this grant's; then drop the lease.
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::delete(self.key.as_str(), None)]);
        let inner = &self.cluster;
        let resp = txn_call(&inner.config, &inner.client, txn).await?;
        let tenure = self.tenure();
        // The lease now guards nothing: keep it for the next lock, or revoke it (sent again
        // after a failure, as every revoke of this driver, until it would have expired).
        if !(resp.succeeded() && inner.spares.put(self.ttl, tenure)) {
            spawn_revoke(self.cluster.clone(), tenure.id, tenure.valid_until);
        }
        if resp.succeeded() {
            Ok(())
        } else {
            Err(Error::not_held(&self.name))
        }
    }
}
