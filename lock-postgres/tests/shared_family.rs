//! Readers and permit holders on shared sessions (`shared_sessions=N`): they are held there as
//! exclusive locks are, a refused try gives back exactly what it took (the session holds other
//! leases' locks), a release or an abandon lets go of exactly its keys, and a client's second
//! reader or permit of a name it holds on every shared session gets a session of its own;
//! `wait_sessions` bounds their waits as a writer's, and announces their releases to pollers.
//! Against the `pg` server of `scripts/services.sh`; the evidence is the server's `pg_locks`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::collections::HashSet;
use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, Error, Lease, LeaseState, LockName, LockOptions};
use lock_postgres::{advisory_key, PgLock};

mod common;
use common::{
    all_granted, bounded, connections, granted, opts, waiting, woken_hand_offs, SESSION_MS,
};

/// A client with `shared_sessions=shared`, named `app` on the server.
async fn client(shared: usize, app: &str) -> PgLock {
    bounded(shared, None, app).await
}

/// A client with a session per lock.
async fn own() -> PgLock {
    client(0, "distlock-family-other").await
}

/// A writer of `other` gets `name` at once (nothing of anybody's is left on it) and lets go.
async fn free_to_a_writer(other: &PgLock, name: &LockName) {
    granted(other, name, opts()).await.release().await.unwrap();
}

/// A name and an application name no other test run uses.
fn app(what: &str) -> String {
    fresh_name(what).as_str().to_string()
}

/// Every advisory lock the connections named `app` hold, as `(pid, key, mode)` (a two-integer
/// key as `classid << 32 | objid`, with `objsubid` 2).
async fn locks_of(c: &tokio_postgres::Client, app: &str) -> Vec<(i32, i64, i16, String)> {
    let rows = c
        .query(
            "SELECT l.pid, (l.classid::int8 << 32) | l.objid::int8, l.objsubid, l.mode \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1",
            &[&app],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// Only `held`'s key, exclusive, once: what a client that holds one exclusive lease shows.
async fn only_holds(c: &tokio_postgres::Client, app: &str, held: &LockName, after: &str) {
    let locks = locks_of(c, app).await;
    let want = advisory_key(held);
    assert!(
        locks.len() == 1 && locks[0].1 == want && locks[0].3 == "ExclusiveLock",
        "after {after}: the client's sessions hold {locks:?}, not only {held}'s key {want} \
         (a refused try gives back what it took, a lease lets go of its own keys, and only \
         those)"
    );
}

/// 300 readers and 300 permit holders of 600 names, on 3 shared sessions: the server holds
/// every name's key shared, in at most 3 backends, which are all the client's connections;
/// a writer of another client is refused, a permit's count is kept, and releasing them all
/// leaves the client's sessions holding nothing.
#[tokio::test]
async fn readers_and_permit_holders_are_held_on_few_sessions() {
    let name_of_app = app("family-many");
    let lock = client(3, &name_of_app).await;
    let other = own().await;
    let readers: Vec<LockName> = (0..300).map(|_| fresh_name("family-r")).collect();
    let permits: Vec<LockName> = (0..300).map(|_| fresh_name("family-p")).collect();
    let mut leases: Vec<Box<dyn Lease>> = Vec::new();
    for n in &readers {
        leases.push(granted(&lock, n, opts().shared()).await);
    }
    for n in &permits {
        leases.push(granted(&lock, n, opts().permits(2)).await);
    }
    let admin = test_support::pg_locker().await;
    let locks = locks_of(&admin, &name_of_app).await;
    let pids: HashSet<i32> = locks.iter().map(|l| l.0).collect();
    assert!(
        pids.len() <= 3,
        "600 family leases on {} sessions",
        pids.len()
    );
    assert!(connections(&admin, &name_of_app).await <= 3);
    for n in readers.iter().chain(&permits) {
        let key = advisory_key(n);
        let on: Vec<_> = locks.iter().filter(|l| l.1 == key && l.2 == 1).collect();
        assert!(
            on.len() == 1 && on[0].3 == "ShareLock",
            "{n}: its key is held {on:?}"
        );
    }
    for n in readers.iter().take(3).chain(permits.iter().take(3)) {
        assert!(other.try_acquire(n, &opts()).await.unwrap().is_none());
    }
    // The second of 2 permits is another client's to take; a third is nobody's.
    let second = granted(&other, &permits[0], opts().permits(2)).await;
    let third = other.try_acquire(&permits[0], &opts().permits(2)).await;
    assert!(third.unwrap().is_none(), "a third of 2 permits was granted");
    second.release().await.unwrap();
    // Held past a confirmation round (a third of the session timeout), all of them.
    tokio::time::sleep(Duration::from_millis(SESSION_MS / 2)).await;
    assert!(leases.iter().all(|l| l.state() == LeaseState::Held));
    for l in leases {
        l.release().await.unwrap();
    }
    let left = locks_of(&admin, &name_of_app).await;
    assert!(left.is_empty(), "released, the client still holds {left:?}");
    for n in [&readers[0], &permits[0]] {
        free_to_a_writer(&other, n).await;
    }
}

/// A client of one shared session that holds an exclusive lease, and the evidence that its
/// refused tries leave nothing behind.
struct Refusals {
    lock: PgLock,
    app: String,
    admin: tokio_postgres::Client,
    kept_name: LockName,
}

impl Refusals {
    /// `opts`' try of `x` is refused, and the session holds the kept lease's key only.
    async fn refused(&self, x: &LockName, opts: LockOptions, what: &str) {
        let r = self.lock.try_acquire(x, &opts).await;
        assert!(
            matches!(r, Ok(None)),
            "{what}: not refused: {:?}",
            r.map(|l| l.is_some())
        );
        only_holds(&self.admin, &self.app, &self.kept_name, what).await;
    }
}

/// Each way a reader's or permit's try is refused, on a client whose one shared session
/// holds an exclusive lease too: after each, that session holds that lease's key and nothing
/// else (a key kept would block the name, or be granted again to the client, re-entrant; an
/// unlock of everything would drop the other lease's lock).
#[tokio::test]
async fn a_refused_try_gives_back_exactly_what_it_took() {
    let app = app("family-refused");
    let c = Refusals {
        lock: client(1, &app).await,
        app,
        admin: test_support::pg_locker().await,
        kept_name: fresh_name("family-kept"),
    };
    let (o1, o2) = (own().await, own().await);
    let kept = granted(&c.lock, &c.kept_name, opts()).await;
    let x = fresh_name("family-x");

    // A writer holds the name: refused at its key.
    let w = granted(&o1, &x, opts()).await;
    c.refused(&x, opts().shared(), "a reader refused by a writer")
        .await;
    c.refused(&x, opts().permits(1), "a permit refused by a writer")
        .await;
    w.release().await.unwrap();

    // A permit holder of 1: a reader is refused at the permits' key, a permit at the slots,
    // another count by its mark.
    let p = granted(&o1, &x, opts().permits(1)).await;
    c.refused(&x, opts().shared(), "a reader refused by a permit")
        .await;
    c.refused(&x, opts().permits(1), "a permit refused, every slot taken")
        .await;
    let other_count = c.lock.try_acquire(&x, &opts().permits(2)).await;
    assert!(
        matches!(other_count, Err(Error::PermitsMismatch { .. })),
        "permits(2) beside permits(1): {:?}",
        other_count.map(|l| l.is_some())
    );
    only_holds(&c.admin, &c.app, &c.kept_name, "a permit of another count").await;

    // Another client's permit request waits inside the gate for the slot: the gate is taken.
    let waiter = {
        let (o2, x) = (o2.clone(), x.clone());
        tokio::spawn(async move {
            o2.acquire(&x, &opts().permits(1).wait_for(Duration::from_secs(20)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.refused(&x, opts().shared(), "a reader refused at the gate")
        .await;
    c.refused(&x, opts().permits(1), "a permit refused at the gate")
        .await;
    p.release().await.unwrap();
    let next = waiter.await.unwrap();
    next.expect("the waiting permit, once the slot is free")
        .release()
        .await
        .unwrap();

    // A reader holds: a permit is refused at the readers' key.
    let r = granted(&o1, &x, opts().shared()).await;
    c.refused(&x, opts().permits(1), "a permit refused by a reader")
        .await;
    r.release().await.unwrap();

    // Free now, and granted to the client whose refusals left nothing behind.
    let p = granted(&c.lock, &x, opts().permits(1)).await;
    p.release().await.unwrap();
    assert_eq!(kept.state(), LeaseState::Held);
    kept.release().await.unwrap();
}

/// A reader, a permit holder and a writer of three names on one shared session: each
/// release lets go of exactly its lease's keys (two for a reader, four for a permit holder),
/// and the other leases' stay.
#[tokio::test]
async fn a_release_lets_go_of_exactly_its_keys() {
    let name_of_app = app("family-release");
    let lock = client(1, &name_of_app).await;
    let other = own().await;
    let admin = test_support::pg_locker().await;
    let [r, p, w] = ["family-rel-r", "family-rel-p", "family-rel-w"].map(fresh_name);
    let reader = granted(&lock, &r, opts().shared()).await;
    let permit = granted(&lock, &p, opts().permits(2)).await;
    let writer = granted(&lock, &w, opts()).await;
    let locks = locks_of(&admin, &name_of_app).await;
    let pids: HashSet<i32> = locks.iter().map(|l| l.0).collect();
    assert_eq!(pids.len(), 1, "one shared session: {locks:?}");
    assert_eq!(
        locks.len(),
        2 + 4 + 1,
        "a reader's 2 keys, a permit's 4, a writer's 1: {locks:?}"
    );
    reader.release().await.unwrap();
    let left = locks_of(&admin, &name_of_app).await;
    assert_eq!(left.len(), 4 + 1, "after the reader's release: {left:?}");
    permit.release().await.unwrap();
    only_holds(
        &admin,
        &name_of_app,
        &w,
        "the reader's and the permit's releases",
    )
    .await;
    for n in [&r, &p] {
        free_to_a_writer(&other, n).await;
    }
    assert_eq!(writer.state(), LeaseState::Held);
    writer.release().await.unwrap();
}

/// A client holds a name as a reader (or a permit) on its only shared session: a second
/// reader (more permits) of the name is asked on a session of its own, and granted; the
/// permits' count still holds across both.
#[tokio::test]
async fn a_second_reader_of_a_name_gets_a_session_of_its_own() {
    let name_of_app = app("family-second");
    let lock = client(1, &name_of_app).await;
    let other = own().await;
    let x = fresh_name("family-2r");
    let first = granted(&lock, &x, opts().shared()).await;
    // A second reader of a name its client reads.
    let second = granted(&lock, &x, opts().shared()).await;
    assert!(other.try_acquire(&x, &opts()).await.unwrap().is_none());
    first.release().await.unwrap();
    assert!(other.try_acquire(&x, &opts()).await.unwrap().is_none());
    second.release().await.unwrap();
    free_to_a_writer(&other, &x).await;

    let y = fresh_name("family-3p");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(granted(&lock, &y, opts().permits(3)).await);
    }
    let fourth = lock.try_acquire(&y, &opts().permits(3)).await.unwrap();
    assert!(fourth.is_none(), "a fourth of 3 permits was granted");
    for l in held {
        l.release().await.unwrap();
    }
}

/// Abandoned on a shared session, a reader and a permit holder free their keys at once (the
/// session lives on for a writer's lease, which stays Held), and nothing of them is left.
#[tokio::test]
async fn abandoned_readers_and_permits_free_their_keys_and_spare_the_session() {
    let name_of_app = app("family-abandon");
    let lock = client(1, &name_of_app).await;
    let other = own().await;
    let admin = test_support::pg_locker().await;
    let [r, p, w] = ["family-ab-r", "family-ab-p", "family-ab-w"].map(fresh_name);
    let writer = granted(&lock, &w, opts()).await;
    let reader = granted(&lock, &r, opts().shared()).await;
    let permit = granted(&lock, &p, opts().permits(2)).await;
    reader.abandon();
    permit.abandon();
    for n in [&r, &p] {
        let got = other
            .acquire(n, &opts().wait_for(Duration::from_secs(1)))
            .await;
        assert!(
            got.is_ok(),
            "{n}: the abandoned lease's lock stayed: {got:?}"
        );
        got.unwrap().release().await.unwrap();
    }
    only_holds(&admin, &name_of_app, &w, "abandoning a reader and a permit").await;
    tokio::time::sleep(Duration::from_millis(SESSION_MS / 2)).await;
    assert_eq!(writer.state(), LeaseState::Held);
    writer.release().await.unwrap();
}

/// `wait_sessions=1` bounds readers' and permits' waits as it does writers': six of them for
/// six names another client holds take at most 2 shared + 1 waiting + 1 listening
/// connections, one waits on the server, and every one is granted once the names are free.
#[tokio::test]
async fn bounded_waits_hold_for_readers_and_permits() {
    let name_of_app = app("family-bounded");
    let lock = bounded(2, Some(1), &name_of_app).await;
    let other = own().await;
    let names: Vec<LockName> = (0..6).map(|_| fresh_name("family-wait")).collect();
    let mut held = Vec::new();
    for n in &names {
        held.push(granted(&other, n, opts()).await);
    }
    let waiters: Vec<_> = (names.iter().cloned().enumerate())
        .map(|(i, n)| {
            let lock = lock.clone();
            let o = opts().wait_for(Duration::from_secs(20));
            let o = if i % 2 == 0 { o.shared() } else { o.permits(2) };
            tokio::spawn(async move { lock.acquire(&n, &o).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let admin = test_support::pg_locker().await;
    let mut on_server = 0;
    for n in &names {
        on_server += waiting(&admin, n).await;
    }
    assert_eq!(
        on_server, 1,
        "readers' and permits' waits on the server, of 6"
    );
    let open = connections(&admin, &name_of_app).await;
    assert!(
        open <= 4,
        "6 waiters took {open} connections, not at most 2 + 1 + 1"
    );
    for l in held {
        l.release().await.unwrap();
    }
    all_granted(waiters).await;
}

/// A reader's and a permit holder's releases are announced (`wait_sessions`): another
/// client's poller is woken by them, as by a writer's.
#[tokio::test]
async fn pollers_are_woken_by_announced_family_releases() {
    let name_of_app = app("family-announced");
    let holder = bounded(2, Some(0), &name_of_app).await;
    let waiter = bounded(2, Some(0), &name_of_app).await;
    woken_hand_offs(
        &holder,
        &waiter,
        opts().shared(),
        opts(),
        "a reader's release",
    )
    .await;
    woken_hand_offs(
        &holder,
        &waiter,
        opts().permits(1),
        opts().permits(1),
        "a permit's release",
    )
    .await;
}

/// A polling reader of a name its own client reads on its only shared session is granted
/// (on a session of its own), not left to poll until the other reader goes.
#[tokio::test]
async fn a_polling_reader_beside_its_own_clients_reader_is_granted() {
    let name_of_app = app("family-poll-own");
    let lock = bounded(1, Some(0), &name_of_app).await;
    let x = fresh_name("family-poll-own");
    let first = granted(&lock, &x, opts().shared()).await;
    let wait = opts().shared().wait_for(Duration::from_secs(2));
    let second = lock.acquire(&x, &wait).await;
    let second = second.expect("a reader beside its own client's reader");
    first.release().await.unwrap();
    second.release().await.unwrap();
}
