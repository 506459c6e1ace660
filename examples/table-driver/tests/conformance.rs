//! The whole shared suite against the example driver: this file is all a driver needs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{async_trait, BoxError, Harness, Timing};
use lock_core::{DistributedLock, LockName};
use table_driver::Table;

struct Tables(Table);

#[async_trait]
impl Harness for Tables {
    /// A new, independent client (another process, as far as the cases are concerned).
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        Ok(Arc::new(self.0.client()))
    }
    /// The TTL the cases use, and (default) how late a wake-up may be.
    fn timing(&self) -> Timing {
        Timing::for_ttl(Duration::from_millis(300))
    }
    /// The backend's request count: proves waiters sleep instead of polling.
    async fn backend_requests(&self) -> Option<u64> {
        Some(self.0.requests())
    }
    /// Deleting a lock behind its holder's back: proves refused renewals are noticed.
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        self.0.break_lock(name);
        Some(Ok(()))
    }
}

fn main() -> ExitCode {
    conformance_tests::run(Tables(Table::default()))
}
