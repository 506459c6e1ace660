//! Compile-time proof that the traits are usable as trait objects across tasks.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report
use std::sync::Arc;

use lock_core::{memory::MemoryLock, DistributedLock, Lease};

fn assert_send_sync<T: Send + Sync + ?Sized>() {}

#[test]
fn traits_are_dyn_compatible_and_thread_safe() {
    assert_send_sync::<dyn DistributedLock>();
    assert_send_sync::<dyn Lease>();
    let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
    let boxed: Box<dyn DistributedLock> = Box::new(locks.clone());
    assert_eq!(boxed.backend(), "memory");
    let _maybe: Option<Box<dyn Lease>> = None;
}
