//! `Lease::inheritable_fds`: a duplicate of the lock's descriptors keeps the lock after the
//! lease's own handles are gone (a supervisor that died), and only as long as it is open.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use lock_core::{DistributedLock, LockName, LockOptions};
use lock_file::FileLock;

#[tokio::test]
async fn an_inherited_descriptor_keeps_the_lock_until_it_closes() {
    let dir = std::env::temp_dir().join(format!("lock-file-inherit-{}", std::process::id()));
    let holder = FileLock::open(&dir).await.unwrap();
    let other = FileLock::open(&dir).await.unwrap();
    let name = LockName::new("inherited").unwrap();
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease = holder.try_acquire(&name, &opts).await.unwrap().unwrap();
    let fds = lease.inheritable_fds();
    assert_eq!(fds.len(), 2, "the locked handle and the writable one");
    // The holder's own handles go, as when its process dies; the duplicates remain.
    lease.abandon();
    assert!(
        other.try_acquire(&name, &opts).await.unwrap().is_none(),
        "the lock must stay held while a duplicate is open"
    );
    drop(fds);
    let next = other.try_acquire(&name, &opts).await.unwrap();
    assert!(
        next.is_some(),
        "the lock must free once the last duplicate closes"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
