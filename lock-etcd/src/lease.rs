//! The backend half of a held etcd lock: renew (keep-alive + key check), release (compare
//! on `create_revision`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use lock_core::driver::{lease_end, LeaseOps};
use lock_core::{Error, LockName, Result};

use crate::client::{call, txn_call, Resend};
use crate::spares::Spares;
use crate::waiting::keep_alive;
use crate::EtcdConfig;

pub(crate) struct EtcdLeaseOps {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    pub(crate) spares: Arc<Spares>,
    /// End of the lease's validity as last confirmed (for reuse as a spare after release).
    pub(crate) valid_until: std::sync::Mutex<Instant>,
    pub(crate) id: i64,
    pub(crate) ttl: Duration,
    pub(crate) key: String,
    pub(crate) rev: i64,
    pub(crate) name: LockName,
}

#[async_trait]
impl LeaseOps for EtcdLeaseOps {
    fn backend_key(&self) -> Option<String> {
        Some(self.key.clone())
    }

    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let limit = self.config.request_timeout();
        let key = self.key.as_str();
        let key_check = call(
            &self.config,
            &self.client,
            limit,
            Resend::Refused,
            |mut c| async move { c.get(key, Some(GetOptions::new().with_keys_only())).await },
        );
        let (alive, key) = tokio::join!(
            keep_alive(&self.client, &self.config, self.id, self.ttl, limit),
            key_check
        );
        let ttl = alive?.ok_or_else(|| Error::not_held(&self.name))?;
        if key?.kvs().first().map(|kv| kv.create_revision()) != Some(self.rev) {
            return Err(Error::not_held(&self.name));
        }
        let until = lease_end(start, ttl);
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
        Ok(until)
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
        let resp = txn_call(&self.config, &self.client, txn).await?;
        let valid_until = *self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        // The lease now guards nothing: keep it for the next lock, or drop it.
        if !(resp.succeeded() && self.spares.put(self.id, self.ttl, valid_until)) {
            let (mut c, id) = (self.client.clone(), self.id);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = c.lease_revoke(id).await;
                });
            }
        }
        if resp.succeeded() {
            Ok(())
        } else {
            Err(Error::not_held(&self.name))
        }
    }
}
