//! The shared conformance suite against the in-memory reference driver.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report
//!
//! `cargo test -p lock-core --test conformance -- --list` names every case.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{async_trait, BoxError, Harness, Timing};
use lock_core::{memory::MemoryLock, DistributedLock, LockName};

struct Memory(MemoryLock);

#[async_trait]
impl Harness for Memory {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        Ok(Arc::new(self.0.clone()))
    }
    fn timing(&self) -> Timing {
        Timing::for_ttl(Duration::from_millis(200))
    }
    async fn backend_requests(&self) -> Option<u64> {
        Some(self.0.operations())
    }
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        self.0.break_lock(name);
        Some(Ok(()))
    }
}

fn main() -> ExitCode {
    conformance_tests::run(Memory(MemoryLock::new()))
}
