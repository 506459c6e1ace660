//! A lock directory that a reboot empties (a tmpfs) keeps its fencing counters only while the
//! machine runs: the driver declares `BestEffort` there, `Strict` on a disk.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report
#![cfg(target_os = "linux")]

use lock_core::{DistributedLock, Fencing};
use lock_file::FileLock;

#[tokio::test]
async fn fencing_is_best_effort_on_a_tmpfs_and_strict_on_a_disk() {
    // /dev/shm is a tmpfs on every Linux; the crate's own target directory is on a disk here.
    let shm =
        std::path::PathBuf::from(format!("/dev/shm/distlock-volatile-{}", std::process::id()));
    let on_tmpfs = FileLock::open(&shm).await.unwrap();
    assert_eq!(on_tmpfs.capabilities().fencing, Fencing::BestEffort);
    let _ = std::fs::remove_dir_all(&shm);
    let disk = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("volatile");
    let on_disk = FileLock::open(&disk).await.unwrap();
    assert_eq!(
        on_disk.capabilities().fencing,
        Fencing::Strict,
        "{} (not a tmpfs here?)",
        disk.display()
    );
}
