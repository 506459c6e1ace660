//! `TableLock`: a client of a [`Table`](crate::Table), and its one acquisition.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use lock_core::driver::{lease_end, Acquisition, Grant, ManagedLease};
use lock_core::{Capabilities, DistributedLock, Fencing, FencingToken, Lease, Result};

use crate::client::{Shared, Table};
use crate::config::{TableConfig, BACKEND};
use crate::lease::TableOps;

/// A client of a [`Table`](crate::Table).
#[derive(Clone)]
pub struct TableLock {
    pub(crate) shared: Arc<Shared>,
}

impl Table {
    /// A new client of this table (the suite's "another process").
    pub fn client(&self) -> TableLock {
        TableLock {
            shared: self.shared.clone(),
        }
    }
}

impl TableLock {
    /// A client of the table `config` names (one table per name in this process, so two
    /// clients of one name see each other's locks).
    pub fn connect(config: TableConfig) -> Self {
        static TABLES: std::sync::OnceLock<
            parking_lot::Mutex<std::collections::HashMap<String, Table>>,
        > = std::sync::OnceLock::new();
        let mut tables = TABLES.get_or_init(Default::default).lock();
        tables
            .entry(config.table().to_string())
            .or_default()
            .client()
    }

    /// A client of the table named by `table://NAME`: how `distlock::connect` reaches this
    /// driver, through [`DRIVER`](crate::DRIVER).
    pub fn from_url(url: &str) -> Result<Self> {
        Ok(Self::connect(TableConfig::from_url(url)?))
    }
}

impl std::fmt::Debug for TableLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableLock").finish_non_exhaustive()
    }
}

#[async_trait]
impl DistributedLock for TableLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Declared honestly: the suite picks (and skips, with a reason) cases from these.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new().with_fencing(Fencing::Strict)
    }

    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        let (name, ttl, opts, deadline) = (req.name(), req.ttl(), req.opts(), req.deadline());
        let owner = self.shared.next_owner.fetch_add(1, Ordering::Relaxed);
        loop {
            // Register for wake-ups *before* trying, so a release in between is not missed.
            let released = self.shared.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            // Validity is measured from before the request, minus clock drift.
            let start = Instant::now();
            let holder_left = match self.shared.try_grant(name, owner, ttl) {
                Ok(fence) => {
                    let ops = TableOps {
                        shared: self.shared.clone(),
                        name: name.clone(),
                        owner,
                        ttl,
                    };
                    return Ok(Some(Box::new(ManagedLease::new(
                        name.clone(),
                        Grant {
                            token: Some(FencingToken::new(fence)),
                            ttl,
                            valid_until: lease_end(start, ttl),
                        },
                        opts.renewal,
                        ops,
                    ))));
                }
                Err(left) => left,
            };
            let now = Instant::now();
            if deadline.passed() {
                return Ok(None);
            }
            // Held: this acquisition waits now (a grant after it is a hand-off).
            req.queued();
            // Sleep until a release, the holder's expiry, or our deadline: never a spin.
            let mut until = now + holder_left;
            if let Some(d) = deadline.at() {
                until = until.min(d);
            }
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}
