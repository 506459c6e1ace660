//! The blocking API (`distlock::blocking`): the same drivers and promises for threads without a
//! runtime — leases renewed while the caller blocks, released by `drop` before it returns,
//! scoped work refused its output once the lease was lost, and a typed error (not a panic)
//! when called inside a runtime.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use distlock::blocking::BlockingLocks;
use distlock::{Error, LeaseState, LockName, LockOptions, StopOn};

fn name(s: &str) -> LockName {
    LockName::new(format!("{s}-{}", std::process::id())).unwrap()
}

/// A lock directory of its own for each test.
fn file_url(test: &str) -> (String, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("distlock-blocking-{test}-{}", std::process::id()));
    (format!("file://{}", dir.display()), dir)
}

/// Two services on one lock directory (two programs, as far as the locks go): one holds, the
/// other is refused, inspects the holder's token, and gets the lock once it is released.
#[test]
fn two_services_exclude_each_other() {
    let (url, dir) = file_url("exclude");
    let (a, b) = (
        BlockingLocks::connect(&url).unwrap(),
        BlockingLocks::connect(&url).unwrap(),
    );
    let n = name("blocking-exclude");
    let opts = LockOptions::new(Duration::from_secs(5));
    let lease = a.acquire(&n, &opts).unwrap();
    assert_eq!(lease.state(), LeaseState::Held);
    assert!(b.try_acquire(&n, &opts).unwrap().is_none(), "granted twice");
    let holder = b
        .inspect(&n)
        .unwrap()
        .expect("held, so inspect names a holder");
    assert_eq!(holder.fencing_token, lease.fencing_token());
    lease.release().unwrap();
    let second = b
        .try_acquire(&n, &opts)
        .unwrap()
        .expect("released, so free");
    assert!(
        second.fencing_token() > holder.fencing_token,
        "tokens increase"
    );
    second.release().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// An automatically renewed lease stays held while the calling thread blocks for several
/// TTLs in its own work: the watchdog runs on the facade's runtime, not on the caller's thread.
#[test]
fn a_lease_is_renewed_while_the_caller_blocks() {
    let locks = BlockingLocks::connect("memory://blocking-renew").unwrap();
    let other = BlockingLocks::connect("memory://blocking-renew").unwrap();
    let n = name("blocking-renew");
    let ttl = Duration::from_millis(300);
    let lease = locks
        .acquire(&n, &LockOptions::new(ttl).auto_renew(None))
        .unwrap();
    let first_end = lease.valid_until();
    std::thread::sleep(ttl * 4); // blocking work, no await anywhere
    assert_eq!(
        lease.state(),
        LeaseState::Held,
        "not renewed while the caller blocked"
    );
    assert!(lease.valid_until() > first_end + ttl * 2);
    let no = other.try_acquire(&n, &LockOptions::new(ttl)).unwrap();
    assert!(
        no.is_none(),
        "a renewed lease's lock was granted to another"
    );
    lease.release().unwrap();
}

/// Dropping a lease frees the lock before `drop` returns: the next attempt, at once, gets it.
#[test]
fn a_dropped_lease_is_released_before_drop_returns() {
    let (url, dir) = file_url("drop");
    let (a, b) = (
        BlockingLocks::connect(&url).unwrap(),
        BlockingLocks::connect(&url).unwrap(),
    );
    let n = name("blocking-drop");
    let opts = LockOptions::new(Duration::from_secs(30)).auto_renew(None);
    drop(a.acquire(&n, &opts).unwrap());
    let next = b.try_acquire(&n, &opts).unwrap();
    assert!(
        next.is_some(),
        "dropped, and the lock still held right after drop returned"
    );
    // The memory driver, whose locks only its release (not a closed file) frees.
    let m = BlockingLocks::connect("memory://blocking-drop").unwrap();
    drop(m.acquire(&n, &opts).unwrap());
    assert!(m.inspect(&n).unwrap().is_none(), "dropped, and still held");
    let _ = std::fs::remove_dir_all(dir);
}

/// Scoped blocking work: its output and the lock released when the lease held throughout;
/// `Lost` (and the lock not left held) when the lease expired while the work blocked; the
/// acquisition's own error before any work runs.
#[test]
fn with_lock_returns_output_only_while_the_lease_held() {
    let locks = BlockingLocks::connect("memory://blocking-scope").unwrap();
    let n = name("blocking-scope");
    let opts = LockOptions::new(Duration::from_secs(5)).auto_renew(None);
    let token = locks
        .with_lock(&n, &opts, StopOn::Lost, |scope| {
            assert_eq!(scope.state(), LeaseState::Held);
            assert_eq!(scope.name(), &n);
            scope.fencing_token()
        })
        .unwrap();
    assert!(token.is_some());
    assert!(locks.inspect(&n).unwrap().is_none(), "released at the end");

    // Manual renewal, never renewed: the lease expires while the work blocks.
    let short = LockOptions::new(Duration::from_millis(100));
    let start = Instant::now();
    let r = locks.with_lock(&n, &short, StopOn::Lost, |scope| {
        std::thread::sleep(Duration::from_millis(300));
        scope.state()
    });
    assert!(start.elapsed() >= Duration::from_millis(300));
    match r {
        Err(Error::Lost { name, .. }) => assert_eq!(name, n),
        other => panic!("work that outlived its lease gave {other:?}, expected Lost"),
    }
    assert!(locks.inspect(&n).unwrap().is_none());

    let held = locks.acquire(&n, &opts).unwrap();
    let mut ran = false;
    let busy = LockOptions::new(Duration::from_secs(5)).wait_for(Duration::from_millis(20));
    let r = locks.with_lock(&n, &busy, StopOn::Lost, |_| ran = true);
    assert!(
        matches!(r, Err(Error::Timeout { .. })) && !ran,
        "{r:?}, ran: {ran}"
    );
    held.release().unwrap();
}

/// Inside an async runtime every blocking call is a Config error that points at the async API
/// — never a panic, never a stalled runtime thread — and dropping the facade there is fine.
#[tokio::test]
async fn inside_a_runtime_it_is_an_error_not_a_panic() {
    match BlockingLocks::connect("memory://blocking-async") {
        Err(Error::Config { message, .. }) => {
            assert!(message.contains("async API"), "{message}")
        }
        other => panic!("connect inside a runtime gave {other:?}"),
    }
}

/// A lease dropped inside a runtime (moved there by the program) is released in the background
/// on the facade's runtime, as an async lease's drop is.
#[test]
fn a_lease_dropped_inside_a_runtime_is_still_released() {
    let locks = BlockingLocks::connect("memory://blocking-moved").unwrap();
    let n = name("blocking-moved");
    let lease = locks
        .acquire(&n, &LockOptions::new(Duration::from_secs(30)))
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move { drop(lease) });
    let deadline = Instant::now() + Duration::from_secs(2);
    while locks.inspect(&n).unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "dropped inside a runtime and held 2 s later"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
