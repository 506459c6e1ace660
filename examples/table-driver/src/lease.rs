//! `TableOps`: the two backend operations of a held lock; `ManagedLease` does the rest (state,
//! lost signal, watchdog, drop).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{lease_end, LeaseOps};
use lock_core::{Error, LockName, Result};

use crate::client::Shared;

pub(crate) struct TableOps {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: LockName,
    pub(crate) owner: u64,
    pub(crate) ttl: Duration,
}

#[async_trait]
impl LeaseOps for TableOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    /// Compare owner and extend; never recreate a lock that is gone.
    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        if !self.shared.extend(&self.name, self.owner, self.ttl) {
            return Err(Error::not_held(&self.name));
        }
        Ok(lease_end(start, self.ttl))
    }

    /// Compare owner and delete; a stale lease never touches its successor.
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        if !self.shared.delete(&self.name, self.owner) {
            return Err(Error::not_held(&self.name));
        }
        Ok(())
    }
}
