//! Shared mode is `flock(LOCK_SH)` on the lock file: util-linux's `flock -s` and `flock -x` and
//! distlock's shared and exclusive modes are one lock, both ways, and a reader that dies frees
//! its share at once.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, LockName, LockOptions, Mode};
use lock_file::FileLock;

/// `flock MODE -n FILE true`: whether the util-linux tool got the lock at once.
fn flock_now(mode: &str, file: &Path) -> bool {
    let status = Command::new("flock")
        .args([mode, "-n"])
        .arg(file)
        .arg("true")
        .status()
        .expect("util-linux flock (apt-get install util-linux)");
    status.success()
}

/// `flock -o MODE FILE CMD` in the background, once it holds the lock. `-o`: the lock is the
/// tool's own (its command, which waits for its stdin to close, does not inherit it), so
/// killing the tool is a holder dying.
fn flock_holding(mode: &str, file: &Path) -> Child {
    let ready = file.with_extension(format!("ready{}", mode.trim_start_matches('-')));
    let _ = std::fs::remove_file(&ready);
    let child = Command::new("flock")
        .args(["-o", mode])
        .arg(file)
        .args([
            "sh",
            "-c",
            &format!("touch {} && exec cat >/dev/null", ready.display()),
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        assert!(
            Instant::now() < until,
            "flock {mode} never held {}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// Kills the tool (its lock goes with it) and ends its command by closing its stdin.
fn stop(mut child: Child) {
    let _ = child.kill();
    drop(child.stdin.take());
    let _ = child.wait();
}

#[tokio::test]
async fn flock_s_and_x_and_distlocks_modes_are_one_lock() {
    let dir = std::env::temp_dir().join(format!("lock-file-flock-{}", std::process::id()));
    let locks = FileLock::open(&dir).await.unwrap();
    let name = LockName::new("interop").unwrap();
    let file = locks.path_of(&name);
    let opts = LockOptions::new(Duration::from_secs(5));
    let shared = opts.clone().shared();

    // distlock reads: flock -s joins, flock -x is refused.
    let reader = locks.try_acquire(&name, &shared).await.unwrap().unwrap();
    assert!(
        flock_now("-s", &file),
        "flock -s refused beside a distlock reader"
    );
    assert!(
        !flock_now("-x", &file),
        "flock -x granted beside a distlock reader"
    );
    reader.release().await.unwrap();
    // distlock writes: both are refused.
    let writer = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    assert!(
        !flock_now("-s", &file),
        "flock -s granted beside a distlock writer"
    );
    writer.release().await.unwrap();

    // flock -s holds: distlock reads beside it, and lists both readers; a writer is refused.
    let tool = flock_holding("-s", &file);
    let reader = locks.try_acquire(&name, &shared).await.unwrap();
    let reader = reader.expect("a distlock reader refused beside flock -s");
    let holders = locks.holders(&name).await.unwrap();
    assert!(
        holders.len() == 2 && holders.iter().all(|h| h.mode == Mode::Shared),
        "{holders:?}"
    );
    assert!(locks.try_acquire(&name, &opts).await.unwrap().is_none());
    reader.release().await.unwrap();
    assert!(locks.try_acquire(&name, &opts).await.unwrap().is_none());
    // The tool dies: its share goes with it, and a writer gets the lock at once.
    stop(tool);
    let writer = locks.try_acquire(&name, &opts).await.unwrap();
    let writer = writer.expect("the lock stayed held after flock -s died");
    writer.release().await.unwrap();

    // flock -x holds: distlock's reader is refused; its waiting reader gets the lock once the
    // tool is gone.
    let tool = flock_holding("-x", &file);
    assert!(locks.try_acquire(&name, &shared).await.unwrap().is_none());
    assert_eq!(locks.holders(&name).await.unwrap().len(), 1);
    let waiting = {
        let (locks, name, shared) = (locks.clone(), name.clone(), shared.clone());
        tokio::spawn(async move {
            locks
                .acquire(&name, &shared.wait_for(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a reader was granted beside flock -x"
    );
    stop(tool);
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    assert!(
        matches!(granted, Ok(Ok(Ok(_)))),
        "the waiting reader was not granted after flock -x died: {granted:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Permits on the same file: a permit holder takes `flock(LOCK_SH)`, so `flock -x` and
/// distlock's permits exclude each other both ways; `holders` lists each permit with its
/// count. A `flock -s` of another program is a reader that does not know the permits' marks
/// (`family.rs`): it is granted beside permit holders, as the README says.
#[tokio::test]
async fn flock_x_and_permits_exclude_each_other() {
    let dir = std::env::temp_dir().join(format!("lock-file-flock-p-{}", std::process::id()));
    let (locks, others) = (
        FileLock::open(&dir).await.unwrap(),
        FileLock::open(&dir).await.unwrap(),
    );
    let name = LockName::new("interop-permits").unwrap();
    let file = locks.path_of(&name);
    let two = LockOptions::new(Duration::from_secs(5)).permits(2);

    let a = locks.try_acquire(&name, &two).await.unwrap().unwrap();
    let b = others.try_acquire(&name, &two).await.unwrap().unwrap();
    assert!(locks.try_acquire(&name, &two).await.unwrap().is_none());
    let holders = locks.holders(&name).await.unwrap();
    assert!(
        holders.len() == 2 && holders.iter().all(|h| h.mode == Mode::Permits(2)),
        "{holders:?}"
    );
    assert!(!flock_now("-x", &file), "flock -x granted beside permits");
    assert!(
        flock_now("-s", &file),
        "a foreign flock -s is a plain reader"
    );
    // A waiter of another FileLock is woken by a release here (inotify, not its own wake-up).
    let waiting = {
        let (others, name, two) = (others.clone(), name.clone(), two.clone());
        tokio::spawn(async move {
            others
                .acquire(&name, &two.wait_for(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "a third permit of two was granted");
    a.release().await.unwrap();
    let c = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting permit was not granted within 5 s of a release")
        .unwrap()
        .unwrap();
    b.release().await.unwrap();
    c.release().await.unwrap();

    // flock -x holds: a permit waits, and is granted once the tool dies.
    let tool = flock_holding("-x", &file);
    assert!(locks.try_acquire(&name, &two).await.unwrap().is_none());
    let waiting = {
        let (locks, name, two) = (locks.clone(), name.clone(), two.clone());
        tokio::spawn(async move {
            locks
                .acquire(&name, &two.wait_for(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a permit was granted beside flock -x"
    );
    stop(tool);
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    assert!(
        matches!(granted, Ok(Ok(Ok(_)))),
        "the waiting permit was not granted after flock -x died: {granted:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A released lock is free at once, in every mode, though another descriptor of its files is
/// still open: a child that another thread forks holds one until it execs (here, the lease's
/// own duplicates stand for it). Closing alone freed the lock only with the last of them, so
/// `flock -x` and another client were refused after the release. (An abandoned lease leaves
/// the lock to such duplicates: `tests/inherit.rs`.)
#[tokio::test]
async fn a_release_frees_the_lock_whoever_else_has_its_descriptors() {
    let dir = std::env::temp_dir().join(format!("lock-file-flock-dup-{}", std::process::id()));
    let (locks, others) = (
        FileLock::open(&dir).await.unwrap(),
        FileLock::open(&dir).await.unwrap(),
    );
    let name = LockName::new("interop-dup").unwrap();
    let file = locks.path_of(&name);
    let opts = LockOptions::new(Duration::from_secs(5));
    for mode in [opts.clone(), opts.clone().shared(), opts.clone().permits(1)] {
        let lease = locks.try_acquire(&name, &mode).await.unwrap().unwrap();
        let copies = lease.inheritable_fds();
        assert!(!copies.is_empty(), "no descriptors to copy");
        lease.release().await.unwrap();
        assert!(
            flock_now("-x", &file),
            "flock -x refused after a release in {:?} while a copy of its descriptors is open",
            mode.mode
        );
        // A permit's slot and a reader's mark go too: one permit of one is free again.
        let again = others.try_acquire(&name, &mode).await.unwrap();
        let again = again.unwrap_or_else(|| {
            panic!(
                "another client refused after a release in {:?} while a copy of its \
                 descriptors is open",
                mode.mode
            )
        });
        again.release().await.unwrap();
        // A reader's mark would keep a permit out (`family.rs`): gone too.
        let permit = others.try_acquire(&name, &opts.clone().permits(1)).await;
        let permit = permit.unwrap().unwrap_or_else(|| {
            panic!(
                "a permit refused after a release in {:?} while a copy of its descriptors is \
                 open",
                mode.mode
            )
        });
        permit.release().await.unwrap();
        drop(copies);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
