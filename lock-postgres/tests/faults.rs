//! PostgreSQL's own failure modes, against the servers of `scripts/services.sh` (`pg`,
//! `pgbouncer` in transaction-pooling mode, `pgbouncer-session`): what an
//! operator's `pg_terminate_backend`, a restart, a pooler, a cancelled waiter and a foreign
//! client do to a lease, observed on the server itself (`pg_locks`, `pg_stat_activity`, the
//! kernel's socket table). One test at a time: one of them restarts the server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Error, LeaseState, LockName, LockOptions};
use lock_postgres::{advisory_key, PgConfig, PgLock};
use test_support::serial;
use test_support::servers;

/// The `pg` server's URL.
fn pg() -> String {
    servers::url("postgres://locker@{pg}/postgres?sslmode=disable")
}

/// A libpq conninfo for the server called `name`, as user `locker`.
fn conninfo(name: &str) -> String {
    test_support::pg_conninfo(name)
}
const SESSION: Duration = Duration::from_secs(2);

fn config() -> PgConfig {
    PgConfig::from_url(&pg())
        .unwrap()
        .with_session_timeout(SESSION)
        .unwrap()
}

async fn lock() -> PgLock {
    PgLock::connect(config())
        .await
        .expect("pg of scripts/services.sh (scripts/services.sh up pg)")
}

fn name(tag: &str) -> LockName {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    LockName::new(format!("pgf-{tag}-{}-{nanos}", std::process::id())).unwrap()
}

fn opts() -> LockOptions {
    LockOptions::new(SESSION * 2)
}

/// A fault proxy in front of `pg`, and the configuration of a client through it (`query`:
/// more of the URL's query, each part starting with `&`).
fn proxied(query: &str) -> (conformance_tests::FaultProxy, PgConfig) {
    let proxy =
        conformance_tests::FaultProxy::start(servers::url("{pg}").parse().unwrap()).unwrap();
    let config = PgConfig::from_url(&format!(
        "postgres://locker@{}/postgres?sslmode=disable{query}",
        proxy.addr()
    ))
    .unwrap()
    .with_session_timeout(SESSION)
    .unwrap();
    (proxy, config)
}

async fn admin() -> tokio_postgres::Client {
    test_support::pg_client(&conninfo("pg")).await.unwrap()
}

const KEY_IS: &str = "locktype = 'advisory' AND objsubid = 1 \
                      AND ((classid::int8 << 32) | objid::int8) = $1";

/// (pid, granted) of every session holding or awaiting the advisory lock of `name`.
async fn lockers(admin: &tokio_postgres::Client, name: &LockName) -> Vec<(i32, bool)> {
    admin
        .query(
            &format!("SELECT pid, granted FROM pg_locks WHERE {KEY_IS} ORDER BY granted DESC"),
            &[&advisory_key(name)],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// `lock` waiting for `name` in a task of its own, returned once the server shows it queued.
async fn queued(
    lock: &PgLock,
    name: &LockName,
    admin: &tokio_postgres::Client,
) -> tokio::task::JoinHandle<lock_core::Result<Box<dyn lock_core::Lease>>> {
    let waiting = {
        let (lock, name) = (lock.clone(), name.clone());
        tokio::spawn(async move { lock.acquire(&name, &opts()).await })
    };
    until(
        Duration::from_secs(5),
        "the waiter queued on the server",
        || async { lockers(admin, name).await.iter().any(|(_, g)| !g) },
    )
    .await;
    waiting
}

/// Within `limit`, nobody waits for `name` in the server's lock queue any more: `what` names
/// the waiter that should be gone.
async fn no_waiter_within(
    limit: Duration,
    admin: &tokio_postgres::Client,
    name: &LockName,
    what: &str,
) {
    until(limit, what, || async {
        lockers(admin, name).await.iter().all(|(_, g)| *g)
    })
    .await;
}

async fn until<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < limit,
            "{what}: not so within {limit:?} (checked every 20 ms)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The documented SQL expression gives the driver's key, so an operator can find a lock in
/// `pg_locks` by name.
#[test]
fn the_documented_key_expression_matches() {
    serial(the_documented_key_expression_matches_case());
}

async fn the_documented_key_expression_matches_case() {
    let admin = admin().await;
    for n in ["reindex", "a", "nightly-job:2026-11-24", &"x".repeat(128)] {
        let n = LockName::new(n).unwrap();
        let row = admin
            .query_one(
                "SELECT ('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::bigint",
                &[&n.as_str()],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), advisory_key(&n), "key of {n}");
    }
}

/// PgBouncer in transaction-pooling mode is refused before any lock is granted, with a message
/// that says what to change, every time: on an idle pool and on one that other clients keep
/// busy (which hand the pool's connections round in an order the driver does not choose); a
/// proxy that keeps sessions (plain TCP) is accepted.
#[test]
fn a_transaction_pooler_is_refused() {
    serial(a_transaction_pooler_is_refused_case());
}

/// How many times each pool is probed: the refusal must not depend on which server
/// connection the pooler happens to hand out.
const POOLER_PROBES: usize = 15;

async fn a_transaction_pooler_is_refused_case() {
    let pooled = PgConfig::from_url(&servers::url(
        "postgres://locker@{pgbouncer}/postgres?sslmode=disable",
    ))
    .unwrap();
    let accepted = times_accepted(&pooled).await;
    assert_eq!(
        accepted, 0,
        "pgbouncer in transaction-pooling mode was accepted {accepted} times of {POOLER_PROBES} \
         (idle pool)"
    );
    // Two other clients keep the pool busy with short transactions, as an application
    // sharing the pooler would.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut busy = Vec::new();
    for _ in 0..2 {
        let stop = stop.clone();
        let other = test_support::pg_client(&conninfo("pgbouncer"))
            .await
            .expect("pgbouncer of scripts/services.sh (scripts/services.sh up pgbouncer)");
        busy.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                other.batch_execute("SELECT pg_sleep(0.002)").await.unwrap();
            }
        }));
    }
    let accepted = times_accepted(&pooled).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in busy {
        b.await.unwrap();
    }
    assert_eq!(
        accepted, 0,
        "pgbouncer in transaction-pooling mode was accepted {accepted} times of {POOLER_PROBES} \
         (pool kept busy by two other clients)"
    );
    let (_proxy, through) = proxied("");
    let lock = PgLock::connect(through)
        .await
        .expect("a session-keeping TCP proxy must be accepted");
    let n = name("proxied");
    let lease = lock.try_acquire(&n, &opts()).await.unwrap().unwrap();
    lease.release().await.unwrap();
}

/// PgBouncer in session-pooling mode keeps each client on one server connection, so session
/// advisory locks work through it: `connect` accepts it every time (the probe must not refuse
/// a pooler for being one), and a lock taken through it excludes a direct client until it is
/// released.
#[test]
fn a_session_pooler_is_accepted() {
    serial(a_session_pooler_is_accepted_case());
}

async fn a_session_pooler_is_accepted_case() {
    let pooled = PgConfig::from_url(&servers::url(
        "postgres://locker@{pgbouncer-session}/postgres?sslmode=disable",
    ))
    .unwrap()
    .with_session_timeout(SESSION)
    .unwrap();
    let accepted = times_accepted(&pooled).await;
    assert_eq!(
        accepted, POOLER_PROBES,
        "pgbouncer in session-pooling mode (scripts/services.sh up pgbouncer-session) was \
         accepted only {accepted} times of {POOLER_PROBES}"
    );
    let through = PgLock::connect(pooled).await.unwrap();
    let direct = lock().await;
    let n = name("session-pooled");
    let lease = through
        .try_acquire(&n, &opts())
        .await
        .unwrap()
        .expect("a free lock, through the session pooler");
    assert!(
        direct.try_acquire(&n, &opts()).await.unwrap().is_none(),
        "a direct client got the lock held through the session pooler"
    );
    lease.release().await.unwrap();
    let again = direct
        .try_acquire(&n, &opts())
        .await
        .unwrap()
        .expect("released through the session pooler, the lock is free for a direct client");
    again.release().await.unwrap();
}

/// Connects through `pooled` [`POOLER_PROBES`] times; how many connections were accepted.
/// A refusal must be the `Config` error that says what to change.
async fn times_accepted(pooled: &PgConfig) -> usize {
    let mut accepted = 0;
    for _ in 0..POOLER_PROBES {
        match PgLock::connect(pooled.clone()).await {
            Err(Error::Config { message, .. }) => assert!(
                message.contains("transaction-pooling") && message.contains("pool_mode = session"),
                "{message}"
            ),
            Err(e) => panic!("{pooled}: an error other than the pooler refusal: {e:?}"),
            Ok(_) => accepted += 1,
        }
    }
    accepted
}

/// An operator terminates the holder's backend: the lease turns Lost at once (its connection
/// closed), not at its next confirmation, and the lock is free on the server within a moment
/// of that (the backend's last reply precedes its exit); the late release fails and does not
/// free the next holder.
#[test]
fn a_terminated_backend_loses_the_lease_at_once() {
    serial(a_terminated_backend_loses_the_lease_at_once_case());
}

async fn a_terminated_backend_loses_the_lease_at_once_case() {
    let (a, b, admin) = (lock().await, lock().await, admin().await);
    let n = name("terminated");
    let lease = a.try_acquire(&n, &opts()).await.unwrap().unwrap();
    let holders = lockers(&admin, &n).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    let lost = lease.lost();
    let t0 = Instant::now();
    admin
        .query("SELECT pg_terminate_backend($1)", &[&holders[0].0])
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_millis(300), lost.wait())
        .await
        .unwrap_or_else(|_| {
            panic!("lease not Lost within 300 ms of pg_terminate_backend (confirmations are every ~667 ms)")
        });
    assert_eq!(lease.state(), LeaseState::Lost);
    // The backend's FATAL reply (which closes the holder's connection) leaves before the
    // backend has exited and let go of its locks: the holder may hear of the loss a moment
    // before the lock is free — the safe order. Free within a second of it, not at once.
    let next = b
        .acquire(&n, &opts().wait_for(Duration::from_secs(1)))
        .await
        .expect("lock free within a second after terminate");
    assert!(
        lease.release().await.is_err(),
        "release after terminate succeeded"
    );
    assert!(
        a.try_acquire(&n, &opts()).await.unwrap().is_none(),
        "the terminated lease's release freed the next holder"
    );
    let token_before = next.fencing_token();
    next.release().await.unwrap();
    eprintln!(
        "lost {:?} after terminate; next token {token_before:?}",
        t0.elapsed()
    );
}

/// The terminate's FATAL reply answers a confirmation in flight: it is the session's end, so
/// the lease is Lost, not at risk — an at-risk lease is believed held until `valid_until`, while
/// the server has already granted the lock to the next in line. (The reply can reach the query
/// before the client has seen the socket close: here the confirmation waits in a partition
/// while the operator terminates the backend, and the partition heals after it.)
#[test]
fn a_terminate_that_answers_a_confirmation_loses_the_lease() {
    serial(a_terminate_that_answers_a_confirmation_loses_the_lease_case());
}

async fn a_terminate_that_answers_a_confirmation_loses_the_lease_case() {
    let admin = admin().await;
    for round in 0..5 {
        let (proxy, config) = proxied("");
        let a = PgLock::connect(config).await.unwrap();
        let n = name(&format!("fatal-reply-{round}"));
        let lease = a
            .try_acquire(&n, &opts().manual_renewal())
            .await
            .unwrap()
            .unwrap();
        let holder = lockers(&admin, &n).await[0].0;
        proxy.blackhole();
        let renewing = tokio::spawn({
            let lease = std::sync::Arc::new(lease);
            let l = lease.clone();
            async move { (l.renew().await, lease) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        admin
            .query("SELECT pg_terminate_backend($1)", &[&holder])
            .await
            .unwrap();
        until(
            Duration::from_secs(2),
            "the lock free after terminate",
            || {
                let admin = &admin;
                let n = &n;
                async move { lockers(admin, n).await.is_empty() }
            },
        )
        .await;
        proxy.heal();
        let (renewed, lease) = renewing.await.unwrap();
        assert!(
            matches!(renewed, Err(Error::Lost { .. })),
            "round {round}: a confirmation answered by the terminate's FATAL: {renewed:?} \
             (the lock is free on the server: anything but Lost keeps the holder working)"
        );
        assert_eq!(lease.state(), LeaseState::Lost, "round {round}");
    }
}

/// A dropped connection, 40 times, with a waiter queued behind the holder: the server frees
/// the lock the moment it sees the close, and the holder's lease turns Lost as soon as its own
/// client sees the same close — not at its next confirmation. Measured against a baseline: a
/// plain socket cut at the same instant, read by a thread of this process. On a machine whose
/// cores are busy with other work (eight test lanes on two cores) the whole process learns of
/// the cut late (the socket's thread: up to 112 ms), and the lease's chain of task wake-ups
/// can each wait for a core (once 34 ms after the socket, at a load of 13). So: in the median
/// round the lease adds at most [`CUT_NOTICE`] to the socket's notice, and in no round as
/// much as a sixth of the session (where a lease that learns of the close by confirming would
/// land). Which of holder and waiter comes first is not ordered: the waiter's grant sometimes
/// returns a fraction of a millisecond before the holder's lost signal. The figures (how
/// often, by how much, how late the baseline) are printed, and quoted in RELIABILITY.md.
///
/// [`CUT_NOTICE`]: conformance_tests::safety::CUT_NOTICE
#[test]
fn a_cut_holder_is_lost_as_its_successor_is_granted() {
    serial(a_cut_holder_is_lost_as_its_successor_is_granted_case());
}

async fn a_cut_holder_is_lost_as_its_successor_is_granted_case() {
    let (proxy, through) = proxied("");
    let holder = PgLock::connect(through).await.unwrap();
    let (other, admin) = (lock().await, admin().await);
    let notice = conformance_tests::safety::CUT_NOTICE;
    let (mut ahead, mut longest, mut slowest) = (0, Duration::ZERO, Duration::ZERO);
    let (mut latest_baseline, mut beyonds) = (Duration::ZERO, Vec::new());
    const ROUNDS: u32 = 40;
    for round in 0..ROUNDS {
        let n = name(&format!("cut-race-{round}"));
        let lease = holder.try_acquire(&n, &opts()).await.unwrap().unwrap();
        let lost = lease.lost();
        let lost = tokio::spawn(async move {
            lost.wait().await;
            Instant::now()
        });
        let waiter = {
            let (other, n) = (other.clone(), n.clone());
            tokio::spawn(async move {
                let lease = other.acquire(&n, &opts()).await;
                (lease, Instant::now())
            })
        };
        until(Duration::from_secs(5), "the waiter queued", || async {
            lockers(&admin, &n).await.iter().any(|(_, g)| !g)
        })
        .await;
        let baseline = plain_socket_through(&proxy);
        let cut = Instant::now();
        proxy.cut();
        let lost_at = tokio::time::timeout(SESSION, lost)
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: lease not Lost within {SESSION:?} of its connection's cut")
            })
            .unwrap();
        let seen_at = baseline.join().unwrap();
        let beyond = lost_at.saturating_duration_since(seen_at);
        assert!(
            beyond <= SESSION / 6,
            "round {round}: the lease turned Lost {:?} after the cut, {beyond:?} after a plain \
             socket cut with it saw the close ({:?} after the cut): as late as a confirmation \
             would find it, not when its connection closed",
            lost_at - cut,
            seen_at.saturating_duration_since(cut)
        );
        latest_baseline = latest_baseline.max(seen_at.saturating_duration_since(cut));
        beyonds.push(beyond);
        let (next, granted_at) = tokio::time::timeout(SESSION, waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: waiter not granted within {SESSION:?}"))
            .unwrap();
        let next = next.unwrap();
        if let Some(by) = lost_at
            .checked_duration_since(granted_at)
            .filter(|d| !d.is_zero())
        {
            ahead += 1;
            longest = longest.max(by);
        }
        slowest = slowest.max(lost_at - cut);
        next.release().await.unwrap();
    }
    beyonds.sort();
    let (median, most) = (beyonds[beyonds.len() / 2], beyonds[beyonds.len() - 1]);
    eprintln!(
        "{ROUNDS} cuts: lost at most {slowest:?} after the cut; after the plain socket saw it: \
         median {median:?}, at most {most:?} (promise {notice:?}; that socket saw it at most \
         {latest_baseline:?} after the cut); the successor's grant returned first {ahead} \
         times, by at most {longest:?}"
    );
    assert!(
        median <= notice,
        "the lease turned Lost a median {median:?} after a plain socket cut with it saw the \
         close (at most {most:?}): more than the {notice:?} a session-bound lease may add to its \
         connection's close"
    );
}

/// A plain connection through `proxy` to the server (answered once, so the proxy holds it),
/// and a thread that reads it until the proxy closes it: when this process could first see
/// a cut, whatever its runtime's threads were doing.
fn plain_socket_through(proxy: &conformance_tests::FaultProxy) -> std::thread::JoinHandle<Instant> {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(proxy.addr()).unwrap();
    // PostgreSQL's SSLRequest: the server answers one byte ('N' or 'S') and then waits for
    // the startup message, long past this round.
    socket.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).unwrap();
    let mut answer = [0u8; 1];
    socket.read_exact(&mut answer).unwrap();
    std::thread::spawn(move || {
        let mut rest = [0u8; 64];
        while matches!(socket.read(&mut rest), Ok(n) if n > 0) {}
        Instant::now()
    })
}

/// A waiter whose `acquire` future is dropped, and one whose bounded wait runs out, leave no
/// waiter in the server's lock queue (cancel request, connection closed).
#[test]
fn a_cancelled_waiter_leaves_no_server_side_waiter() {
    serial(a_cancelled_waiter_leaves_no_server_side_waiter_case());
}

async fn a_cancelled_waiter_leaves_no_server_side_waiter_case() {
    let (a, b, admin) = (lock().await, lock().await, admin().await);
    let n = name("cancelled");
    let holder = a.try_acquire(&n, &opts()).await.unwrap().unwrap();
    let waiting = queued(&b, &n, &admin).await;
    waiting.abort();
    let aborted = Instant::now();
    no_waiter_within(
        Duration::from_secs(2),
        &admin,
        &n,
        "the aborted waiter gone from pg_locks",
    )
    .await;
    eprintln!("aborted waiter gone after {:?}", aborted.elapsed());
    let r = b
        .acquire(&n, &opts().wait_for(Duration::from_millis(300)))
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    no_waiter_within(
        Duration::from_secs(2),
        &admin,
        &n,
        "the timed-out waiter gone from pg_locks",
    )
    .await;
    holder.release().await.unwrap();
    assert!(
        lockers(&admin, &n).await.is_empty(),
        "a ghost was granted the lock after the release"
    );
}

/// A waiter waits in one statement, in the server's lock queue: its backend stays in the same
/// query, waiting on a lock, for as long as the holder holds (no polling).
#[test]
fn waiting_is_one_statement_in_the_servers_queue() {
    serial(waiting_is_one_statement_in_the_servers_queue_case());
}

async fn waiting_is_one_statement_in_the_servers_queue_case() {
    let (a, b, admin) = (lock().await, lock().await, admin().await);
    let n = name("idle-wait");
    let holder = a.try_acquire(&n, &opts()).await.unwrap().unwrap();
    let waiting = queued(&b, &n, &admin).await;
    let pid = lockers(&admin, &n)
        .await
        .iter()
        .find(|(_, g)| !g)
        .unwrap()
        .0;
    let look = || async {
        let r = admin
            .query_one(
                "SELECT query_start, wait_event_type, state FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap();
        let started: std::time::SystemTime = r.get(0);
        (
            started,
            r.get::<_, Option<String>>(1),
            r.get::<_, Option<String>>(2),
        )
    };
    let first = look().await;
    tokio::time::sleep(SESSION).await;
    let second = look().await;
    assert_eq!(
        first.1.as_deref(),
        Some("Lock"),
        "waiter's wait event: {first:?}"
    );
    assert_eq!(first.2.as_deref(), Some("active"), "{first:?}");
    assert_eq!(
        first, second,
        "the waiter's backend ran another statement while it waited (polling?)"
    );
    let released = Instant::now();
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("waiter not woken within 2 s of the release")
        .unwrap()
        .unwrap();
    eprintln!("waiter granted {:?} after the release", released.elapsed());
    next.release().await.unwrap();
}

/// The server's socket of a holder's session has TCP keepalive armed, with an idle time of at
/// most a third of the session timeout: the kernel, not only the setting, will probe a client
/// that went silent. (Making the kernel give up needs a real partition, which this machine's
/// loopback cannot make: no netem, no iptables. The proxy-based fault cases stand in for it.)
#[test]
fn the_servers_socket_probes_a_silent_holder() {
    serial(the_servers_socket_probes_a_silent_holder_case());
}

async fn the_servers_socket_probes_a_silent_holder_case() {
    let (a, admin) = (lock().await, admin().await);
    let n = name("keepalive");
    let lease = a.try_acquire(&n, &opts()).await.unwrap().unwrap();
    let pid = lockers(&admin, &n).await[0].0;
    let port: i32 = admin
        .query_one(
            "SELECT client_port FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap()
        .get(0);
    let filter = format!("( sport = :{} and dport = :{port} )", servers::port("pg"));
    // The socket shows its retransmission timer while a reply is unacknowledged; between
    // exchanges, the keepalive timer.
    let mut seen = Vec::new();
    for _ in 0..50 {
        let out = std::process::Command::new("ss")
            .args(["-tno", "state", "established", &filter])
            .output()
            .expect("run ss (iproute2)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if let Some(at) = text.find("timer:(keepalive,") {
            let secs: f64 = text[at + 17..]
                .split(|c: char| !c.is_ascii_digit() && c != '.')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::MAX);
            assert!(
                secs <= SESSION.as_secs_f64() / 3.0 + 0.5 || text[at..].contains("ms"),
                "keepalive fires in {secs} s on the server's socket: {text}"
            );
            lease.release().await.unwrap();
            return;
        }
        seen.push(text);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no keepalive timer on the server's socket of the holder (port {port}): {seen:?}");
}

/// Another program holding the same key (a plain `pg_advisory_lock`) holds the lock for
/// distlock: `try_acquire` says busy, `inspect` says foreign (no token of ours), and a waiter
/// is granted when that program unlocks.
#[test]
fn a_foreign_holder_of_the_key_holds_the_lock() {
    serial(a_foreign_holder_of_the_key_holds_the_lock_case());
}

async fn a_foreign_holder_of_the_key_holds_the_lock_case() {
    let (a, foreign) = (lock().await, admin().await);
    let n = name("foreign");
    let key = advisory_key(&n);
    foreign
        .query("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    assert!(a.try_acquire(&n, &opts()).await.unwrap().is_none());
    let seen = a.inspect(&n).await.unwrap().expect("a holder");
    assert!(seen.foreign && seen.fencing_token.is_none(), "{seen:?}");
    let waiting = queued(&a, &n, &foreign).await;
    foreign
        .query("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("waiter not woken within 2 s of the foreign unlock")
        .unwrap()
        .unwrap();
    let seen = a.inspect(&n).await.unwrap().expect("a holder");
    assert!(
        !seen.foreign && seen.fencing_token == lease.fencing_token(),
        "{seen:?}"
    );
    lease.release().await.unwrap();
}

/// A server restart ends every session: a holder turns Lost as soon as its connection closes,
/// and the fencing counter, committed before each grant, keeps increasing.
#[test]
fn a_restart_loses_leases_and_keeps_tokens() {
    serial(a_restart_loses_leases_and_keeps_tokens_case());
}

async fn a_restart_loses_leases_and_keeps_tokens_case() {
    let a = lock().await;
    let n = name("restart");
    let lease = a.try_acquire(&n, &opts()).await.unwrap().unwrap();
    let before = lease.fencing_token().unwrap();
    let lost = lease.lost();
    test_support::restart_servers(&["pg"]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), lost.wait())
        .await
        .expect("lease not Lost within 2 s of the restart");
    let b = lock().await;
    let after = b
        .try_acquire(&n, &opts())
        .await
        .unwrap()
        .expect("free after restart");
    assert!(
        after.fencing_token().unwrap() > before,
        "token {:?} after the restart, {before:?} before",
        after.fencing_token()
    );
    after.release().await.unwrap();
}

/// A frozen server (here a blackholed proxy: the bytes are taken, nothing comes back) is
/// `Unavailable` after a bounded time, never a hang: the connection's login within the connect
/// timeout plus the session timeout, and a holder query (`inspect`) of a client that connected
/// while the server answered within the session timeout. The try of `try_acquire` is the
/// conformance case `faults::unreachable_backend_is_an_error`.
#[test]
fn a_frozen_server_is_unavailable_not_a_hang() {
    serial(a_frozen_server_is_unavailable_not_a_hang_case());
}

async fn a_frozen_server_is_unavailable_not_a_hang_case() {
    let (proxy, through) = proxied("&connect_timeout=1");
    let margin = Duration::from_secs(2);
    let lock = PgLock::connect(through.clone()).await.unwrap();
    proxy.blackhole();
    let asked = Instant::now();
    let r = tokio::time::timeout(SESSION + margin, lock.inspect(&name("frozen")))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "inspect of a frozen server still unanswered after {:?}",
                SESSION + margin
            )
        });
    assert!(
        matches!(r, Err(Error::Unavailable { .. })),
        "inspect of a frozen server gave {r:?} after {:?}",
        asked.elapsed()
    );
    let bound = Duration::from_secs(1) + SESSION + margin;
    let asked = Instant::now();
    let r = tokio::time::timeout(bound, PgLock::connect(through))
        .await
        .unwrap_or_else(|_| panic!("connect to a frozen server still unanswered after {bound:?}"));
    assert!(
        matches!(r, Err(Error::Unavailable { .. })),
        "connect to a frozen server gave {:?} after {:?}",
        r.map(|_| ()),
        asked.elapsed()
    );
}

/// A database of the `pg` server whose sessions start with `setting = value`, as an
/// administrator's tuning would have them (`ALTER DATABASE … SET`), and a configuration of the
/// driver for it. Made once, kept: no other test connects to it.
async fn database_with(
    admin: &tokio_postgres::Client,
    db: &str,
    setting: &str,
    value: &str,
) -> PgConfig {
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
        .await
        .unwrap()
        .is_some();
    if !exists {
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .unwrap();
    }
    admin
        .batch_execute(&format!("ALTER DATABASE {db} SET {setting} = '{value}'"))
        .await
        .unwrap();
    PgConfig::from_url(&servers::url(&format!(
        "postgres://locker@{{pg}}/{db}?sslmode=disable"
    )))
    .unwrap()
    .with_session_timeout(SESSION)
    .unwrap()
}

/// Under a default isolation of `repeatable read` or `serializable` (set for a database or a
/// role), every waiter queued behind a holder is granted in turn, with increasing tokens.
/// Before the driver pinned its session's isolation, the grant statement took its snapshot
/// before it waited, and the second waiter failed with 40001 at its grant.
#[test]
fn queued_waiters_are_granted_under_any_default_isolation() {
    serial(queued_waiters_are_granted_under_any_default_isolation_case());
}

async fn queued_waiters_are_granted_under_any_default_isolation_case() {
    let admin = admin().await;
    for (db, level) in [
        ("distlock_repeatable_read", "repeatable read"),
        ("distlock_serializable", "serializable"),
    ] {
        let config = database_with(&admin, db, "default_transaction_isolation", level).await;
        let holder = PgLock::connect(config.clone()).await.unwrap();
        let n = name("isolation");
        let lease = holder.try_acquire(&n, &opts()).await.unwrap().unwrap();
        let mut waiting = Vec::new();
        for i in 1..=3 {
            let w = PgLock::connect(config.clone()).await.unwrap();
            let (w2, n2) = (w.clone(), n.clone());
            waiting.push((
                w,
                tokio::spawn(async move { w2.acquire(&n2, &opts()).await }),
            ));
            until(Duration::from_secs(5), "the waiters queued", || async {
                lockers(&admin, &n).await.iter().filter(|(_, g)| !g).count() == i
            })
            .await;
        }
        let mut last = lease.fencing_token().unwrap();
        lease.release().await.unwrap();
        // Each waiter is granted as the one before it releases.
        let mut handles: Vec<_> = waiting.into_iter().map(|(_, h)| h).collect();
        for turn in 1..=3 {
            let done = loop {
                if let Some(i) = handles.iter().position(|h| h.is_finished()) {
                    break handles.remove(i);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            let next = tokio::time::timeout(SESSION, done)
                .await
                .unwrap()
                .unwrap()
                .unwrap_or_else(|e| panic!("{level}: waiter {turn} failed at its grant: {e}"));
            let token = next.fencing_token().unwrap();
            assert!(token > last, "{level}: token {token:?} after {last:?}");
            last = token;
            next.release().await.unwrap();
        }
    }
}

/// The fencing counter's commit is durable whatever the server's tuning: under
/// `synchronous_commit = off` for the database (a common setting), a server crash right after
/// some grants used to lose their commits, and the tokens they had were issued again. Tokens
/// are declared `Strict`, so the driver asks for a synchronous commit in its own sessions.
#[test]
fn a_crash_under_asynchronous_commit_repeats_no_token() {
    serial(a_crash_under_asynchronous_commit_repeats_no_token_case());
}

async fn a_crash_under_asynchronous_commit_repeats_no_token_case() {
    let config = database_with(
        &admin().await,
        "distlock_async_commit",
        "synchronous_commit",
        "off",
    )
    .await;
    for round in 0..3 {
        let lock = PgLock::connect(config.clone()).await.unwrap();
        let n = name(&format!("async-commit-{round}"));
        let mut last = None;
        for _ in 0..3 {
            let lease = lock.try_acquire(&n, &opts()).await.unwrap().unwrap();
            last = lease.fencing_token();
            lease.release().await.unwrap();
        }
        // At once, before the server's WAL writer flushes on its own (every 200 ms).
        test_support::restart_servers(&["pg"]).await.unwrap();
        let lock = PgLock::connect(config.clone()).await.unwrap();
        let after = lock
            .try_acquire(&n, &opts())
            .await
            .unwrap()
            .expect("free after the crash");
        assert!(
            after.fencing_token() > last,
            "round {round}: token {:?} after the crash, {last:?} granted before it: a token \
             declared Strict was issued twice",
            after.fencing_token()
        );
        after.release().await.unwrap();
    }
}

/// A distlock grant in progress (its advisory lock taken, its counter row not yet committed:
/// here another transaction holds the row, as a holder's stuck release or proclaim does until
/// its session ends) has no term to show yet: `leader` says so with a retryable error, so an
/// observer reads again, never `Unsupported` (which ended the observer for good: the safety
/// soak's rule (e) caught it, 2 violations in 100,014 grants), and once the row commits it
/// names the new leader.
#[test]
fn a_grant_in_progress_is_not_a_foreign_leader() {
    serial(a_grant_in_progress_is_not_a_foreign_leader_case());
}

async fn a_grant_in_progress_is_not_a_foreign_leader_case() {
    let (first, second) = (lock().await, lock().await);
    let n = name("in-progress");
    let value = |v: &str| opts().value(lock_core::LeaderValue::new(v.as_bytes().to_vec()).unwrap());
    first
        .acquire(&n, &value("one"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let admin = admin().await;
    admin.batch_execute("BEGIN").await.unwrap();
    admin
        .query(
            "SELECT 1 FROM distlock_fencing WHERE name = $1 FOR UPDATE",
            &[&n.as_str()],
        )
        .await
        .unwrap();
    let granting = {
        let n = n.clone();
        let opts = value("two");
        tokio::spawn(async move { second.acquire(&n, &opts).await.map(|l| (second, l)) })
    };
    until(
        Duration::from_secs(5),
        "the second grant's advisory lock",
        || async {
            lockers(&admin, &n)
                .await
                .iter()
                .any(|(_, granted)| *granted)
        },
    )
    .await;
    match first.leader(&n).await {
        Err(e) if e.is_retryable() => {}
        other => panic!("a grant in progress read as {other:?}, not a retryable error"),
    }
    admin.batch_execute("COMMIT").await.unwrap();
    let (_second, lease) = tokio::time::timeout(Duration::from_secs(5), granting)
        .await
        .expect("granted once the row is free")
        .unwrap()
        .unwrap();
    let leader = first.leader(&n).await.unwrap().expect("a leader");
    assert_eq!(leader.value.as_bytes(), b"two");
    assert_eq!(Some(leader.term), lease.fencing_token());
    lease.release().await.unwrap();
}
