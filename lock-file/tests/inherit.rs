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

/// The per-name wake-up entries go once nobody waits on or holds the name: memory does not
/// grow with the number of distinct names ever used.
#[tokio::test]
async fn wake_up_entries_go_when_nobody_waits() {
    let dir = std::env::temp_dir().join(format!("lock-file-wakers-{}", std::process::id()));
    let locks = FileLock::open(&dir).await.unwrap();
    let opts = LockOptions::new(Duration::from_secs(5));
    for i in 0..200 {
        let name = LockName::new(format!("n{i}")).unwrap();
        let lease = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
        if i % 2 == 0 {
            lease.release().await.unwrap();
        } else {
            drop(lease);
        }
    }
    // A waiter that timed out, and one that was granted.
    let name = LockName::new("contended").unwrap();
    let held = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    let timed_out = locks
        .acquire(&name, &opts.clone().wait_for(Duration::from_millis(50)))
        .await;
    assert!(timed_out.is_err());
    assert_eq!(locks.tracked_names(), 1, "only the held name is tracked");
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await; // background drops settle
    assert_eq!(
        locks.tracked_names(),
        0,
        "wake-up entries left for names nobody waits on or holds"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
