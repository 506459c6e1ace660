//! The fencing counter in the lock file survives every crash point: an emptied or unreadable
//! counter is an error, never a restart at token 1, and the file stays as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use lock_core::{DistributedLock, Error, LockName, LockOptions};
use lock_file::FileLock;

async fn setup(tag: &str) -> (FileLock, LockName, LockOptions, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("lock-file-counter-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let locks = FileLock::open(&dir).await.unwrap();
    let name = LockName::new("counted").unwrap();
    (locks, name, LockOptions::new(Duration::from_secs(5)), dir)
}

/// What a crash between the old driver's truncate and its write left behind: an empty file.
#[tokio::test]
async fn an_emptied_counter_is_an_error_not_token_one() {
    let (locks, name, opts, dir) = setup("empty").await;
    for _ in 0..3 {
        let l = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
        l.release().await.unwrap();
    }
    let path = locks.path_of(&name);
    std::fs::write(&path, "").unwrap();
    match locks.try_acquire(&name, &opts).await {
        Err(Error::Backend { .. }) => {}
        Ok(Some(l)) => panic!(
            "an emptied counter granted token {:?} (tokens 1..=3 were already granted)",
            l.fencing_token()
        ),
        other => panic!("expected a backend error for an emptied counter, got {other:?}"),
    }
    let err = locks.inspect(&name).await;
    assert!(err.is_err(), "inspect read an emptied counter: {err:?}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"",
        "the damaged file was changed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_garbage_counter_is_an_error() {
    let (locks, name, opts, dir) = setup("garbage").await;
    std::fs::write(locks.path_of(&name), "not a number\n").unwrap();
    let r = locks.try_acquire(&name, &opts).await;
    assert!(matches!(r, Err(Error::Backend { .. })), "{r:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh name starts at 1, and tokens go on across driver instances (a restart).
#[tokio::test]
async fn tokens_continue_across_instances() {
    let (locks, name, opts, dir) = setup("restart").await;
    let a = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    assert_eq!(a.fencing_token().map(|t| t.get()), Some(1));
    a.release().await.unwrap();
    let again = FileLock::open(&dir).await.unwrap();
    let b = again.try_acquire(&name, &opts).await.unwrap().unwrap();
    assert_eq!(b.fencing_token().map(|t| t.get()), Some(2));
    let seen = again
        .inspect(&name)
        .await
        .unwrap()
        .and_then(|h| h.fencing_token);
    assert_eq!(
        seen.map(|t| t.get()),
        Some(2),
        "inspect shows the holder's token"
    );
    b.release().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
