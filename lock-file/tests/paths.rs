//! What sits at a lock's path is used only if it is a regular file. A symbolic link there (in
//! a directory others can write to, the classic attack on a program run by root) is refused,
//! and nothing is written through it; a FIFO is refused at once instead of blocking the
//! opener forever; a directory is refused. Each is a Config error (the directory's content is
//! wrong; retrying cannot help), and `inspect` refuses it too.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::path::Path;
use std::time::Duration;

use lock_core::{DistributedLock, Error, LockName, LockOptions};
use lock_file::FileLock;

/// `try_acquire` and `inspect` of a lock whose path holds `what`, each within 5 s, must be
/// Config errors.
async fn refused(dir: &Path, what: &str, make: impl FnOnce(&Path)) {
    let locks = FileLock::open(dir).await.unwrap();
    let name = LockName::new(format!("at-{what}")).unwrap();
    let path = locks.path_of(&name);
    make(&path);
    let opts = LockOptions::new(Duration::from_secs(5));
    let limit = Duration::from_secs(5);
    let blocked = |op: &str| {
        // An open of a FIFO blocks until the other end opens: open it, so that the blocked
        // thread ends and the test can report instead of hanging.
        let _ = std::fs::OpenOptions::new().write(true).open(&path);
        format!("{op} on a {what} still blocked after {limit:?}")
    };
    let got = tokio::time::timeout(limit, locks.try_acquire(&name, &opts))
        .await
        .unwrap_or_else(|_| panic!("{}", blocked("try_acquire")));
    match got {
        Err(Error::Config { message, .. }) => {
            assert!(message.contains("regular file"), "{what}: {message}");
        }
        Ok(Some(_)) => panic!("a lock was granted on a {what}"),
        other => panic!("a {what} at the lock's path: expected a Config error, got {other:?}"),
    }
    let seen = tokio::time::timeout(limit, locks.inspect(&name))
        .await
        .unwrap_or_else(|_| panic!("{}", blocked("inspect")));
    assert!(
        matches!(seen, Err(Error::Config { .. })),
        "inspect of a {what}: {seen:?}"
    );
}

#[tokio::test]
async fn a_symlink_at_the_lock_path_is_refused_and_not_written_through() {
    let dir = tempfile::tempdir().unwrap();
    // Content the counter would accept (a legacy counter: digits), outside the lock directory.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "7\n").unwrap();
    let locks = dir.path().join("locks");
    refused(&locks, "symlink", |p| {
        std::os::unix::fs::symlink(&victim, p).unwrap();
    })
    .await;
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"7\n",
        "written through the link"
    );
}

#[tokio::test]
async fn a_fifo_at_the_lock_path_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    refused(dir.path(), "fifo", |p| {
        let ok = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(ok.success(), "mkfifo {}", p.display());
    })
    .await;
}

#[tokio::test]
async fn a_directory_at_the_lock_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    refused(dir.path(), "directory", |p| std::fs::create_dir(p).unwrap()).await;
}
