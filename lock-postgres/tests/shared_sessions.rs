//! `shared_sessions=N`: what the conformance suite's `shared_sessions::` run cannot see from
//! outside a client. Many held locks on few connections; a client never granted a name twice
//! because advisory locks are re-entrant in a session; a grant whose caller is gone is undone;
//! a shared session's end loses exactly the leases on it; an abandoned lease frees its lock
//! while its session lives on. And `shared_waits=true`: a client's waiters of one name wait on
//! one session, in turns. Against the `pg` server of `scripts/services.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, LeaseState, LockName};
use lock_postgres::{advisory_key, PgLock};
use test_support::servers;

mod common;
use common::{all_granted, bounded, connections, opts, waiting, woken_hand_offs, SESSION_MS};

fn url(shared: usize) -> String {
    servers::url(&format!(
        "postgres://locker@{{pg}}/postgres?sslmode=disable&session_timeout_ms={SESSION_MS}\
         &shared_sessions={shared}&application_name=distlock-shared-test"
    ))
}

async fn sql() -> tokio_postgres::Client {
    test_support::pg_locker().await
}

/// The backend pids holding each of `names`' advisory keys.
async fn holding_pids(c: &tokio_postgres::Client, names: &[LockName]) -> Vec<i32> {
    let keys: Vec<i64> = names.iter().map(advisory_key).collect();
    let rows = c
        .query(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
             AND ((classid::int8 << 32) | objid::int8) = ANY($1)",
            &[&keys],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// 1,000 locks held by one client on at most 3 sessions: the server sees 1,000 advisory locks
/// in at most 3 backends, every lease is Held, and releasing them all leaves none.
#[tokio::test]
async fn a_thousand_held_locks_on_three_sessions() {
    let lock = PgLock::from_url(&url(3)).await.unwrap();
    let names: Vec<LockName> = (0..1000).map(|_| fresh_name("shared-many")).collect();
    let mut leases = Vec::new();
    for n in &names {
        leases.push(
            lock.try_acquire(n, &opts())
                .await
                .unwrap()
                .expect("a free name"),
        );
    }
    let admin = sql().await;
    let pids = holding_pids(&admin, &names).await;
    let sessions: HashSet<i32> = pids.iter().copied().collect();
    assert_eq!(pids.len(), 1000, "advisory locks held on the server");
    assert!(
        sessions.len() <= 3,
        "1,000 locks on {} sessions",
        sessions.len()
    );
    // Held past a confirmation round (a third of the session timeout), all of them.
    tokio::time::sleep(Duration::from_millis(SESSION_MS / 2)).await;
    assert!(leases.iter().all(|l| l.state() == LeaseState::Held));
    for l in leases {
        l.release().await.unwrap();
    }
    assert!(holding_pids(&admin, &names).await.is_empty());
}

/// Advisory locks are re-entrant in a session: a client that asked again for a name it holds
/// must be refused, on one shared session and on two.
#[tokio::test]
async fn a_held_name_is_not_granted_again_to_its_own_client() {
    for shared in [1, 2] {
        let lock = PgLock::from_url(&url(shared)).await.unwrap();
        let name = fresh_name("shared-twice");
        let first = lock.try_acquire(&name, &opts()).await.unwrap().unwrap();
        for _ in 0..3 {
            let again = lock.try_acquire(&name, &opts()).await.unwrap();
            assert!(
                again.is_none(),
                "shared_sessions={shared}: a held name was granted again to its own client"
            );
        }
        // Nor by a wait that ends before the holder does.
        let waited = lock
            .acquire(&name, &opts().wait_for(Duration::from_millis(300)))
            .await;
        assert!(
            matches!(waited, Err(lock_core::Error::Timeout { .. })),
            "{waited:?}"
        );
        first.release().await.unwrap();
        // The timed-out waiter's own session may hold it for a moment (the server grants a
        // cancelled wait until it sees the connection close): a wait, not a try.
        let next = lock
            .acquire(&name, &opts().wait_for(Duration::from_secs(5)))
            .await;
        assert!(next.is_ok(), "the released name was refused: {next:?}");
    }
}

/// A client of one shared session through a proxy (to slow its link later), and a lease it
/// holds there: the session is busy with something of its own, which must outlive what the
/// test does to its other leases.
async fn through_a_proxy() -> (FaultProxy, PgLock, Box<dyn lock_core::Lease>) {
    let proxies = FaultProxy::in_front_of([servers::addr("pg")], Duration::ZERO).unwrap();
    let proxy = proxies.into_iter().next().unwrap();
    let url = format!(
        "postgres://locker@{}/postgres?sslmode=disable&session_timeout_ms={SESSION_MS}\
         &shared_sessions=1",
        proxy.addr()
    );
    let lock = PgLock::from_url(&url).await.unwrap();
    let kept = lock.try_acquire(&fresh_name("shared-kept"), &opts()).await;
    (proxy, lock, kept.unwrap().expect("a free name"))
}

/// A `try_acquire` whose future is dropped after its request reached the server (the grant
/// made, its reply on the way through a slow link) leaves no lock behind in the shared
/// session, which lives on: another client gets it within a request's time, not never.
#[tokio::test]
async fn a_dropped_try_leaves_no_lock_in_the_shared_session() {
    let delay = Duration::from_millis(300);
    let (proxy, slow, kept) = through_a_proxy().await;
    proxy.delay(delay);
    let other = PgLock::from_url(&url(0)).await.unwrap();
    let admin = sql().await;
    let name = fresh_name("shared-dropped");
    let attempt = {
        let (slow, name) = (slow.clone(), name.clone());
        tokio::spawn(async move { slow.try_acquire(&name, &opts()).await })
    };
    // Dropped the moment the grant shows on the server, its reply still on its way.
    let sent = Instant::now();
    while holding_pids(&admin, std::slice::from_ref(&name))
        .await
        .is_empty()
    {
        assert!(
            sent.elapsed() < delay * 20,
            "the try never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    attempt.abort();
    let dropped_at = Instant::now();
    proxy.delay(Duration::ZERO);
    let next = other
        .acquire(&name, &opts().wait_for(Duration::from_secs(10)))
        .await;
    let took = dropped_at.elapsed();
    assert!(
        next.is_ok(),
        "the dropped grant stayed in the shared session: {next:?}"
    );
    assert!(
        took < delay * 4 + Duration::from_millis(500),
        "freed {took:?} after the try was dropped (a request takes {delay:?} each way)"
    );
    assert_eq!(kept.state(), LeaseState::Held, "the shared session's lease");
    next.unwrap().release().await.unwrap();
    kept.release().await.unwrap();
}

/// A `release` dropped while its unlock is on the way (a caller's timeout) still lets go of
/// the name in the client as well as on the server: the same client can take it again on its
/// one shared session, which lives on for its other lease. A claim left behind would refuse
/// that client the name for as long as the session lives (the conformance run's
/// `cancelled_release_still_frees` met it under load, where a 1 ms cancel lands mid-flight).
#[tokio::test]
async fn a_dropped_release_lets_its_own_client_take_the_name_again() {
    let delay = Duration::from_millis(200);
    let (proxy, slow, kept) = through_a_proxy().await;
    let name = fresh_name("shared-release-dropped");
    for round in 0..3 {
        let lease = slow.try_acquire(&name, &opts()).await.unwrap();
        let lease = lease.unwrap_or_else(|| {
            panic!("round {round}: the client was refused a name its dropped release let go of")
        });
        proxy.delay(delay);
        use std::future::Future;
        // Polled once (the unlock is sent), then dropped with its answer a delay away.
        let mut release = Box::pin(lease.release());
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(release.as_mut().poll(cx).is_ready()))
                .await;
        assert!(
            !polled,
            "round {round}: released through a {delay:?} link at once"
        );
        drop(release);
        proxy.delay(Duration::ZERO);
        // The unlock lands a delay on; give it time to (never the TTL: that is long).
        tokio::time::sleep(delay * 3).await;
    }
    let last = slow.try_acquire(&name, &opts()).await.unwrap();
    assert!(
        last.is_some(),
        "the client was refused a name its dropped release let go of"
    );
    assert_eq!(
        kept.state(),
        LeaseState::Held,
        "the shared session's other lease"
    );
    last.unwrap().release().await.unwrap();
    kept.release().await.unwrap();
}

/// When a shared session ends (its backend terminated), every lease on it is Lost, and only
/// those: the leases on the client's other session stay Held.
#[tokio::test]
async fn a_shared_sessions_end_loses_exactly_its_leases() {
    let lock = PgLock::from_url(&url(2)).await.unwrap();
    let names: Vec<LockName> = (0..40).map(|_| fresh_name("shared-end")).collect();
    let mut leases = Vec::new();
    for n in &names {
        leases.push(lock.try_acquire(n, &opts()).await.unwrap().unwrap());
    }
    let admin = sql().await;
    // Which session holds which: a grant's session is the backend pid holding its key.
    let mut on = Vec::new();
    for n in &names {
        on.push(holding_pids(&admin, std::slice::from_ref(n)).await[0]);
    }
    let victim = on[0];
    let spared: HashSet<i32> = on.iter().copied().filter(|p| *p != victim).collect();
    assert!(
        !spared.is_empty(),
        "40 locks all on one of two sessions: the test needs both in use"
    );
    admin
        .query("SELECT pg_terminate_backend($1)", &[&victim])
        .await
        .unwrap();
    for (lease, pid) in leases.iter().zip(&on).filter(|(_, p)| **p == victim) {
        let lost = tokio::time::timeout(Duration::from_millis(SESSION_MS), lease.lost()).await;
        assert!(
            lost.is_ok(),
            "a lease on the ended session {pid} was not told"
        );
    }
    tokio::time::sleep(Duration::from_millis(SESSION_MS / 2)).await;
    for (lease, pid) in leases.iter().zip(&on) {
        let expected = if *pid == victim {
            LeaseState::Lost
        } else {
            LeaseState::Held
        };
        assert_eq!(lease.state(), expected, "a lease on session {pid}");
    }
    // The lost names are free; the client grants them again, on a session that lives.
    for (n, _) in names.iter().zip(&on).filter(|(_, p)| **p == victim) {
        let again = lock.try_acquire(n, &opts()).await.unwrap();
        assert!(again.is_some(), "{n} still held after its session ended");
    }
}

/// An abandoned lease on a shared session frees its lock at once (the session lives on for
/// the others, so it is unlocked rather than closed), and the others stay Held.
#[tokio::test]
async fn an_abandoned_lease_frees_its_lock_and_spares_the_session() {
    let lock = PgLock::from_url(&url(1)).await.unwrap();
    let other = PgLock::from_url(&url(0)).await.unwrap();
    let (a, b) = (fresh_name("shared-abandon"), fresh_name("shared-stays"));
    let abandoned = lock.try_acquire(&a, &opts()).await.unwrap().unwrap();
    let stays = lock.try_acquire(&b, &opts()).await.unwrap().unwrap();
    abandoned.abandon();
    let next = other
        .acquire(&a, &opts().wait_for(Duration::from_secs(1)))
        .await;
    assert!(next.is_ok(), "the abandoned lock was not freed: {next:?}");
    assert!(other.try_acquire(&b, &opts()).await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(SESSION_MS / 2)).await;
    assert_eq!(stays.state(), LeaseState::Held);
    stays.release().await.unwrap();
}

/// Eight waiters of one name in one client, then the holder (another client) lets go: how many
/// wait on the server meanwhile, and the order they were granted in. The first waiter is
/// cancelled before the release when `cancel_first`.
async fn eight_waiters(shared_waits: bool, cancel_first: bool) -> (i64, Vec<usize>) {
    let holder = PgLock::from_url(&url(0)).await.unwrap();
    let waiters = Arc::new(
        PgLock::from_url(&format!("{}&shared_waits={shared_waits}", url(0)))
            .await
            .unwrap(),
    );
    let name = fresh_name("shared-waits");
    let held = holder.try_acquire(&name, &opts()).await.unwrap().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (w, n, order) = (waiters.clone(), name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let l = w.acquire(&n, &opts()).await.unwrap();
            order.lock().unwrap().push(i);
            l.release().await.unwrap();
        }));
        // Arrival order: each waiter on its way before the next comes.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every waiter that goes to the server at once is there within 3 s (a new session each).
    let admin = sql().await;
    let expected = if shared_waits { 1 } else { 8 };
    let settled = Instant::now() + Duration::from_secs(3);
    while waiting(&admin, &name).await < expected && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let on_server = waiting(&admin, &name).await;
    // A waiter behind the turn with a deadline gives up at it with `Timeout`, not later.
    let started = Instant::now();
    let late = waiters
        .acquire(&name, &opts().wait_for(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(late, Err(lock_core::Error::Timeout { .. }))
            && started.elapsed() < Duration::from_millis(1500),
        "a waiter with a 300 ms wait: {:?} after {:?}",
        late.map(|l| l.fencing_token()),
        started.elapsed()
    );
    if cancel_first {
        tasks.remove(0).abort();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("a waiter not granted within 10 s of the release")
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    (on_server, order)
}

/// With `shared_waits`, eight waiters of one name cost one waiting request on the server (eight
/// without: which shows the count is the server's), and are granted in the order they came
/// (the turns' order: each takes its place before it opens a session).
#[tokio::test]
async fn shared_waits_put_one_waiter_per_name_on_the_server_in_arrival_order() {
    // (Their order is the server's, by when each one's new session got there.)
    let (apart, _) = eight_waiters(false, false).await;
    assert_eq!(apart, 8, "waiting requests without shared_waits");
    let (shared, order) = eight_waiters(true, false).await;
    assert_eq!(shared, 1, "waiting requests with shared_waits");
    assert_eq!(
        order,
        (0..8).collect::<Vec<_>>(),
        "turns out of arrival order"
    );
}

/// A waiter cancelled while it waits on the server with the turn gives the turn to the next:
/// the others are all granted, in order.
#[tokio::test]
async fn a_cancelled_waiter_passes_its_turn_on() {
    let (shared, order) = eight_waiters(true, true).await;
    assert_eq!(shared, 1, "waiting requests with shared_waits");
    assert_eq!(order, (1..8).collect::<Vec<_>>(), "the rest, in order");
}

/// A granted waiter gives its turn up at the grant, not at its release: while it holds the
/// lock, the client's next waiter of that name already waits on the server (its place in the
/// server's queue kept), so the hand-off costs no extra round trip.
#[tokio::test]
async fn the_next_waiter_is_on_the_server_while_the_one_before_holds() {
    let holder = PgLock::from_url(&url(0)).await.unwrap();
    let waiters = Arc::new(
        PgLock::from_url(&format!("{}&shared_waits=true", url(0)))
            .await
            .unwrap(),
    );
    let name = fresh_name("shared-waits-turn");
    let held = holder.try_acquire(&name, &opts()).await.unwrap().unwrap();
    let (w1, w2) = (waiters.clone(), waiters.clone());
    let (n1, n2) = (name.clone(), name.clone());
    let first = tokio::spawn(async move { w1.acquire(&n1, &opts()).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = tokio::spawn(async move { w2.acquire(&n2, &opts()).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the first waiter not granted within 5 s of the release")
        .unwrap();
    let admin = sql().await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while waiting(&admin, &name).await < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        waiting(&admin, &name).await,
        1,
        "while the first waiter holds the lock, the second is not waiting on the server"
    );
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second waiter not granted within 5 s of the first's release")
        .unwrap();
    second.release().await.unwrap();
}

/// Each of `names` taken by `by` (another client): the waiters' locks are held.
async fn held_by(by: &PgLock, names: &[LockName]) -> Vec<Box<dyn lock_core::Lease>> {
    let mut held = Vec::new();
    for n in names {
        held.push(by.try_acquire(n, &opts()).await.unwrap().unwrap());
    }
    held
}

/// How many sessions wait on the server for `name` once that is `want`, or after 3 s.
async fn waiting_settled(c: &tokio_postgres::Client, name: &LockName, want: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(3);
    while waiting(c, name).await != want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    waiting(c, name).await
}

/// `wait_sessions=2` with `shared_sessions=2`: twelve waiters of twelve held names take at most
/// five connections (two shared, two waiting on the server, one listening for the pollers'
/// wake-ups; the others poll), and every one is granted once the names are released, the
/// pollers too.
#[tokio::test]
async fn bounded_waits_keep_a_client_to_its_sessions() {
    let app = format!("distlock-waits-{}", std::process::id());
    let lock = bounded(2, Some(2), &app).await;
    let other = PgLock::from_url(&url(0)).await.unwrap();
    let names: Vec<LockName> = (0..12).map(|_| fresh_name("waits-bounded")).collect();
    let held = held_by(&other, &names).await;
    let waiters: Vec<_> = (names.iter().cloned())
        .map(|n| {
            let lock = lock.clone();
            let wait = opts().wait_for(Duration::from_secs(20));
            tokio::spawn(async move { lock.acquire(&n, &wait).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let admin = sql().await;
    let waiting_on_server: i64 = {
        let mut sum = 0;
        for n in &names {
            sum += waiting(&admin, n).await;
        }
        sum
    };
    assert_eq!(waiting_on_server, 2, "waiters on the server, of 12");
    let open = connections(&admin, &app).await;
    assert!(
        open <= 5,
        "12 waiters took {open} connections, not at most 2 + 2 + 1"
    );
    for l in held {
        l.release().await.unwrap();
    }
    all_granted(waiters).await;
}

/// A polling waiter (`wait_sessions=0`) is woken by its own client's release of the name.
#[tokio::test]
async fn a_poller_is_woken_by_its_own_clients_release() {
    let app = format!("distlock-waits-woken-{}", std::process::id());
    let lock = bounded(2, Some(0), &app).await;
    woken_hand_offs(&lock, &lock, opts(), opts(), "its own client's release").await;
}

/// `wait_sessions=1`: a waiter granted on the server keeps the slot while it holds the lock,
/// so the next waiter polls instead of waiting on the server; once the holder releases, the
/// poller takes the slot that came free and waits on the server.
#[tokio::test]
async fn a_waiter_granted_on_the_server_keeps_its_slot() {
    let app = format!("distlock-waits-slot-{}", std::process::id());
    let lock = bounded(2, Some(1), &app).await;
    let other = PgLock::from_url(&url(0)).await.unwrap();
    let (x, y) = (fresh_name("waits-slot-x"), fresh_name("waits-slot-y"));
    let held_x = other.try_acquire(&x, &opts()).await.unwrap().unwrap();
    let held_y = other.try_acquire(&y, &opts()).await.unwrap().unwrap();
    let wait = opts().wait_for(Duration::from_secs(20));
    let first = {
        let (lock, x, wait) = (lock.clone(), x.clone(), wait.clone());
        tokio::spawn(async move { lock.acquire(&x, &wait).await })
    };
    let admin = sql().await;
    let settled = |what: &'static str, name: LockName, want: i64| {
        let admin = &admin;
        async move {
            assert_eq!(waiting_settled(admin, &name, want).await, want, "{what}");
        }
    };
    settled("the first waiter waits on the server", x.clone(), 1).await;
    held_x.release().await.unwrap();
    let first = first.await.unwrap().unwrap();
    let second = {
        let (lock, y) = (lock.clone(), y.clone());
        tokio::spawn(async move { lock.acquire(&y, &wait).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        waiting(&admin, &y).await,
        0,
        "the second waiter waits on the server while the first holds the lock it was granted \
         there (its slot)"
    );
    first.release().await.unwrap();
    settled("the poller took the freed slot", y.clone(), 1).await;
    held_y.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), second).await;
    second.unwrap().unwrap().unwrap().release().await.unwrap();
}

/// A polling waiter is woken by another client's release when that client announces it (it
/// has `wait_sessions` too).
#[tokio::test]
async fn a_poller_is_woken_by_another_clients_announced_release() {
    let app = format!("distlock-waits-announced-{}", std::process::id());
    let (holder, lock) = (
        bounded(2, Some(0), &app).await,
        bounded(2, Some(0), &app).await,
    );
    woken_hand_offs(
        &holder,
        &lock,
        opts(),
        opts(),
        "another client's announced release",
    )
    .await;
}

/// `wait_sessions=1`: a server wait that ends without a grant gives its slot back, whether it
/// timed out or its future was dropped: the next waiter waits on the server, not by polling.
#[tokio::test]
async fn a_server_wait_that_ends_without_a_grant_frees_its_slot() {
    let app = format!("distlock-waits-freed-{}", std::process::id());
    let lock = bounded(2, Some(1), &app).await;
    let other = PgLock::from_url(&url(0)).await.unwrap();
    let names: Vec<LockName> = (0..3).map(|_| fresh_name("waits-freed")).collect();
    let held = held_by(&other, &names).await;
    let admin = sql().await;
    let on_server = |name: LockName| {
        let admin = &admin;
        async move { waiting_settled(admin, &name, 1).await == 1 }
    };
    // The first waits on the server and times out there.
    let timed_out = {
        let (lock, n) = (lock.clone(), names[0].clone());
        let short = opts().wait_for(Duration::from_millis(1500));
        tokio::spawn(async move { lock.acquire(&n, &short).await })
    };
    assert!(
        on_server(names[0].clone()).await,
        "the first waiter, with a slot free, did not wait on the server"
    );
    let timed_out = timed_out.await.unwrap();
    assert!(
        matches!(timed_out, Err(lock_core::Error::Timeout { .. })),
        "a wait of 1.5 s for a held name: {timed_out:?}"
    );
    // The second takes the slot it left, waits on the server, and is dropped there.
    let long = opts().wait_for(Duration::from_secs(20));
    let dropped = {
        let (lock, n, long) = (lock.clone(), names[1].clone(), long.clone());
        tokio::spawn(async move { lock.acquire(&n, &long).await })
    };
    assert!(
        on_server(names[1].clone()).await,
        "after a server wait timed out, the next waiter did not wait on the server: the \
         timed-out wait kept its slot"
    );
    dropped.abort();
    let _ = dropped.await;
    // The third takes the slot the dropped one left.
    let third = {
        let (lock, n) = (lock.clone(), names[2].clone());
        tokio::spawn(async move { lock.acquire(&n, &long).await })
    };
    assert!(
        on_server(names[2].clone()).await,
        "after a server wait was dropped, the next waiter did not wait on the server: the \
         dropped wait kept its slot"
    );
    for l in held {
        l.release().await.unwrap();
    }
    let granted = tokio::time::timeout(Duration::from_secs(5), third).await;
    granted.unwrap().unwrap().unwrap().release().await.unwrap();
}
