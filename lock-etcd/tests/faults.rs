//! etcd under failures: a waiter whose lease expires while it waits (through the suite's
//! `FaultProxy` in front of the single member, `etcd`), the cluster's leader killed while a lock
//! is held and waited for, the lock key moving to a lease of the new term when the leader
//! freezes (a holder's, a waiter's, one on a spare lease), and a cancelled waiter in a queue
//! of five. Run one at a time. (A
//! partitioned holder is the conformance suite's `faults` case.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, Error, Lease, LeaseState, LockOptions};
use lock_etcd::etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use lock_etcd::{EtcdConfig, EtcdLock};
use test_support::{kill, serial, servers, services};

mod common;
use common::revoked;

/// The single member (`etcd` of `scripts/servers.tsv`).
fn single() -> u16 {
    servers::port("etcd")
}

/// The cluster's members: `services.sh` name and client port.
fn cluster() -> [(&'static str, u16); 3] {
    ["etcd-c1", "etcd-c2", "etcd-c3"].map(|s| (s, servers::port(s)))
}

async fn etcd(endpoints: &[String]) -> EtcdLock {
    EtcdLock::connect(EtcdConfig::new(endpoints.to_vec()))
        .await
        .unwrap_or_else(|e| panic!("etcd at {endpoints:?} (scripts/services.sh up): {e}"))
}

fn local(port: u16) -> Vec<String> {
    vec![format!("127.0.0.1:{port}")]
}

#[test]
fn a_waiter_whose_lease_expires_while_waiting_is_never_granted() {
    serial(async {
        let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], single()))).unwrap();
        let holder = etcd(&local(single())).await;
        let waiter = etcd(&[proxy.addr().to_string()]).await;
        let third = etcd(&local(single())).await;
        let ttl = holder.capabilities().min_ttl;
        let name = fresh_name("etcd-waiter-expires");
        let hold = LockOptions::new(ttl).auto_renew(None);
        let lease = holder.acquire(&name, &hold).await.unwrap();
        let (n, o) = (name.clone(), LockOptions::new(ttl).wait_for(ttl * 10));
        let waiting = tokio::spawn(async move { waiter.acquire(&n, &o).await });
        tokio::time::sleep(Duration::from_millis(300)).await; // queued
                                                              // A third contender queues behind the waiter.
        let (n, o) = (name.clone(), LockOptions::new(ttl).wait_for(ttl * 10));
        let behind = tokio::spawn(async move { third.acquire(&n, &o).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Cut the waiter off for longer than its lease lives (the server revokes expired
        // leases on a 500 ms tick), then let it talk again and free the lock.
        proxy.blackhole();
        tokio::time::sleep(ttl * 2 + Duration::from_secs(1)).await;
        proxy.heal();
        lease.release().await.unwrap();
        match tokio::time::timeout(ttl * 4, waiting)
            .await
            .unwrap()
            .unwrap()
        {
            Ok(l) => panic!(
                "a waiter whose lease expired was granted (state {:?})",
                l.state()
            ),
            Err(Error::Lost { .. } | Error::Unavailable { .. }) => {}
            Err(e) => panic!("expected Lost (or Unavailable), got {e:?}"),
        }
        // The queue moved on past the expired waiter.
        let l = tokio::time::timeout(ttl * 4, behind)
            .await
            .expect("the contender behind the expired waiter was never granted")
            .unwrap()
            .unwrap();
        l.release().await.unwrap();
        drop(proxy);
    });
}

/// A waiter whose cluster goes silent for good (its link blackholed, never healed) is not left
/// waiting without end, though it may wait forever: once its lease has gone unconfirmed for a
/// request timeout past its validity, `acquire` fails with the backend's retryable error.
#[test]
fn a_waiter_cut_off_for_good_gets_an_error_not_an_endless_wait() {
    serial(async {
        let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], single()))).unwrap();
        let holder = etcd(&local(single())).await;
        let timeout = Duration::from_secs(2);
        let config = EtcdConfig::new([proxy.addr().to_string()]).with_request_timeout(timeout);
        let waiter = EtcdLock::connect(config).await.unwrap();
        let ttl = holder.capabilities().min_ttl;
        let name = fresh_name("etcd-waiter-silent");
        let lease = holder
            .acquire(&name, &LockOptions::new(ttl * 30))
            .await
            .unwrap();
        let (n, o) = (name.clone(), LockOptions::new(ttl));
        let waiting = tokio::spawn(async move { waiter.acquire(&n, &o).await });
        tokio::time::sleep(Duration::from_millis(300)).await; // queued
        proxy.blackhole();
        let cut = Instant::now();
        // The lease's validity (at most a TTL), the request timeout, one more try and slack.
        let bound = ttl + timeout + ttl / 2 + Duration::from_secs(2);
        let r = tokio::time::timeout(bound, waiting)
            .await
            .unwrap_or_else(|_| panic!("a cut-off waiter still waited {bound:?} after the cut"))
            .unwrap();
        match r {
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("a cut-off waiter failed with {e:?}, which is not retryable"),
            Ok(_) => panic!("a cut-off waiter was granted the lock its holder holds"),
        }
        eprintln!(
            "the cut-off waiter's error came {:?} after the cut",
            cut.elapsed()
        );
        proxy.heal();
        lease.release().await.unwrap();
    });
}

/// Which member of the cluster leads now, by its `services.sh` name.
async fn leader() -> Option<&'static str> {
    leader_but("").await // no member is named ""
}

#[test]
fn lock_and_queue_survive_the_cluster_leader_being_killed() {
    serial(async {
        let eps: Vec<String> = cluster()
            .iter()
            .map(|(_, p)| format!("127.0.0.1:{p}"))
            .collect();
        let (holder, w1, w2) = (etcd(&eps).await, etcd(&eps).await, etcd(&eps).await);
        // Comfortably above an election (~2 s here): the holder must be able to confirm its
        // lease once the new leader is up, before its own validity runs out.
        let ttl = (holder.capabilities().min_ttl * 4).max(Duration::from_secs(8));
        let name = fresh_name("etcd-leader-kill");
        let auto = LockOptions::new(ttl).auto_renew(None);
        let lease = holder.acquire(&name, &auto).await.unwrap();
        let token = lease.fencing_token().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for (i, w) in [(1, w1), (2, w2)] {
            let (n, o, order) = (name.clone(), auto.clone().wait_for(ttl * 15), order.clone());
            waiters.push(tokio::spawn(async move {
                let l = w.acquire(&n, &o).await?;
                order.lock().unwrap().push(i);
                let t = l.fencing_token();
                tokio::time::sleep(Duration::from_millis(200)).await;
                l.release().await?;
                Ok::<_, Error>(t)
            }));
            tokio::time::sleep(Duration::from_millis(300)).await; // queue in order
        }

        let victim = leader().await.expect("the cluster has a leader");
        let _restart = Restart(victim); // even if an assertion below fails
        let pid = services(&["pid", victim]);
        kill("KILL", pid);
        // A new leader is elected in ~2 s; the holder keeps renewing through it. A renewal
        // that straddles the election may be slow (AtRisk) but the lease must never be Lost,
        // and must be confirmed Held again once the new leader serves.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let confirm_by = Instant::now() + ttl / 2;
        loop {
            let state = lease.state();
            assert_ne!(
                state,
                LeaseState::Lost,
                "the holder lost its lock to a leader election"
            );
            if state == LeaseState::Held {
                break;
            }
            assert!(
                Instant::now() < confirm_by,
                "the holder's lease stayed {state:?} for {:?} after the election",
                ttl / 2
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "a waiter finished while the lock was held"
        );
        lease.release().await.unwrap();
        let mut tokens = vec![token];
        for w in waiters {
            let t = tokio::time::timeout(ttl * 10, w)
                .await
                .expect("a waiter was stranded by the election")
                .unwrap()
                .unwrap();
            tokens.push(t.unwrap());
        }
        assert_eq!(*order.lock().unwrap(), [1, 2], "FIFO order broken");
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "tokens not increasing: {tokens:?}"
        );
    });
}

/// The leases the keys under `name` are on, in queue order, read through `client`.
async fn key_leases(client: &mut Client, name: &lock_core::LockName) -> Vec<i64> {
    let dir = format!("/distlock/{name}/");
    let opts = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let got = client
        .get(dir, Some(opts))
        .await
        .expect("read the lock keys");
    got.kvs().iter().map(|kv| kv.lease()).collect()
}

/// The lease the lock key of `name` is on (the name's only key).
async fn key_lease(client: &mut Client, name: &lock_core::LockName) -> i64 {
    let leases = key_leases(client, name).await;
    assert_eq!(leases.len(), 1, "one key under {name}: {leases:x?}");
    leases[0]
}

/// Freezes `victim` (the leader) and waits for the next leader: (its thaw guard, the next).
async fn freeze(victim: &'static str, within: Duration) -> (Thaw, &'static str) {
    let pid = services(&["pid", victim]);
    let thaw = Thaw(pid.clone());
    kill("STOP", &pid);
    let frozen = Instant::now();
    loop {
        if let Some(new) = leader_but(victim).await {
            return (thaw, new);
        }
        assert!(
            frozen.elapsed() < within,
            "no new leader within {within:?} of freezing {victim}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Renews by hand until a renewal is answered (through the new leader).
async fn renew_through(lease: &dyn lock_core::Lease, leader: &str) {
    loop {
        match lease.renew().await {
            Ok(()) => return,
            Err(e) if e.is_retryable() => {
                assert_ne!(
                    lease.state(),
                    LeaseState::Lost,
                    "lost before {leader} answered: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("renewal after {leader} was elected: {e}"),
        }
    }
}

/// The client endpoints of every member but `not`.
fn endpoints_but(not: &str) -> Vec<String> {
    let others = cluster().into_iter().filter(|(s, _)| *s != not);
    others.map(|(_, p)| format!("127.0.0.1:{p}")).collect()
}

/// A client of every member but `not` (the leader, to be frozen): its requests reach the
/// leader through the followers, never wait on a frozen member's socket, and reach the next
/// leader once one is elected.
async fn client_but(not: &str) -> EtcdLock {
    EtcdLock::connect(EtcdConfig::new(endpoints_but(not)))
        .await
        .expect("the cluster (services.sh up)")
}

/// The leader now (to be frozen), a client of the other members, and a TTL comfortably above
/// an election (~2 s here), so that the holder gets through to the next leader in time.
async fn beside_the_leader() -> (&'static str, EtcdLock, Duration) {
    let victim = leader().await.expect("the cluster has a leader");
    let holder = client_but(victim).await;
    let ttl = (holder.capabilities().min_ttl * 4).max(Duration::from_secs(8));
    (victim, holder, ttl)
}

/// An admin client of every member but `not`.
async fn admin_but(not: &str) -> Client {
    Client::connect(endpoints_but(not), None)
        .await
        .expect("admin client")
}

/// `locks`' lock on the fresh `name`, for `ttl`.
async fn hold(locks: &EtcdLock, name: &lock_core::LockName, ttl: Duration) -> Box<dyn Lease> {
    locks
        .try_acquire(name, &LockOptions::new(ttl))
        .await
        .unwrap()
        .expect("a fresh name is free")
}

/// The member that leads, asked of every member but `not` (frozen), each for 1 s at most (a
/// frozen member never answers), by its `services.sh` name.
async fn leader_but(not: &str) -> Option<&'static str> {
    for (svc, port) in cluster().into_iter().filter(|(s, _)| *s != not) {
        let ask = async {
            let mut c = Client::connect([format!("127.0.0.1:{port}")], None)
                .await
                .ok()?;
            let s = c.status().await.ok()?;
            Some((s.header().map(|h| h.member_id()), s.leader()))
        };
        if let Ok(Some((me, lead))) = tokio::time::timeout(Duration::from_secs(1), ask).await {
            if me == Some(lead) {
                return Some(svc);
            }
        }
    }
    None
}

/// etcd keeps a lease's end in its leader's memory only, and a leader that stalls and resumes
/// can revoke, by its old view, a lease the next leader has renewed (etcd-io/etcd#15247, fixed
/// in 3.4.31 and 3.5.13; Debian's 3.4.23 has it). So after a leader change the holder moves
/// its key onto a lease granted in the new term and revokes the old one: when the frozen leader
/// resumes, there is nothing of the lock on a lease it knows of. The fencing token is the
/// key's `create_revision` and does not change; renewals without a leader change keep the key
/// where it is (a move costs two consensus writes).
#[test]
fn after_a_leader_change_the_lock_key_moves_to_a_lease_of_the_new_term() {
    serial(async {
        let (victim, holder, ttl) = beside_the_leader().await;
        let name = fresh_name("etcd-new-term");
        let lease = hold(&holder, &name, ttl).await;
        let token = lease.fencing_token();
        let mut admin = admin_but(victim).await;
        let first = key_lease(&mut admin, &name).await;
        for _ in 0..3 {
            lease.renew().await.unwrap();
        }
        assert_eq!(
            key_lease(&mut admin, &name).await,
            first,
            "the lock key moved to another lease although no leader changed"
        );

        let (thaw, elected) = freeze(victim, ttl / 2).await;
        renew_through(&*lease, elected).await;
        let moved = key_lease(&mut admin, &name).await;
        assert_ne!(
            moved, first,
            "after {victim} (leader) froze and {elected} was elected, a renewal left the lock \
             key on lease {first:x}, which {victim} may revoke by its old view when it resumes"
        );
        assert_eq!(
            lease.fencing_token(),
            token,
            "the move changed the fencing token"
        );
        assert_eq!(lease.state(), LeaseState::Held);
        revoked(&mut admin, first, "the key left it").await;
        // Thawed, the old leader finds nothing to revoke: the lock stays held and renewable.
        drop(thaw);
        tokio::time::sleep(Duration::from_secs(2)).await;
        lease.renew().await.unwrap();
        assert_eq!(key_lease(&mut admin, &name).await, moved);
        lease.release().await.unwrap();
    });
}

/// With `shared_lease=true`, three locks on one lease: after a leader change each key moves at
/// its next renewal, all onto one lease of the new term (granted once for them), tokens
/// unchanged, every lock still held.
#[test]
fn after_a_leader_change_shared_lease_keys_move_to_one_lease_of_the_new_term() {
    serial(async {
        let (victim, _, ttl) = beside_the_leader().await;
        let holder =
            EtcdLock::connect(EtcdConfig::new(endpoints_but(victim)).with_shared_lease(true))
                .await
                .expect("the cluster (services.sh up)");
        let mut admin = admin_but(victim).await;
        let mut held = Vec::new();
        for i in 0..3 {
            let name = fresh_name(&format!("etcd-shared-term-{i}"));
            let lease = hold(&holder, &name, ttl).await;
            held.push((name, lease));
        }
        let mut first = Vec::new();
        for (name, _) in &held {
            first.push(key_lease(&mut admin, name).await);
        }
        first.dedup();
        assert_eq!(
            first.len(),
            1,
            "three locks on one shared lease: {first:x?}"
        );

        let (_thaw, elected) = freeze(victim, ttl / 2).await;
        let mut moved = Vec::new();
        for (name, lease) in &held {
            let token = lease.fencing_token();
            renew_through(&**lease, elected).await;
            assert_eq!(
                lease.fencing_token(),
                token,
                "the move changed the fencing token"
            );
            assert_eq!(lease.state(), LeaseState::Held);
            moved.push(key_lease(&mut admin, name).await);
        }
        moved.dedup();
        assert_eq!(
            moved.len(),
            1,
            "after {elected} was elected the keys are on leases {moved:x?}: one lease of the \
             new term expected"
        );
        assert_ne!(
            moved[0], first[0],
            "the keys stayed on the lease of the old term"
        );
        for (_, lease) in held {
            lease.release().await.unwrap();
        }
    });
}

/// A waiter whose lease was last confirmed before a leader change, and whose turn comes after
/// it, is granted on a lease of the new term: its key moves before the grant (same token).
#[test]
fn a_waiter_whose_turn_comes_after_a_leader_change_is_granted_on_a_lease_of_the_new_term() {
    serial(async {
        let (victim, holder, ttl) = beside_the_leader().await;
        let waiter = client_but(victim).await;
        let min = holder.capabilities().min_ttl;
        let name = fresh_name("etcd-new-term-waiter");
        let lease = hold(&holder, &name, ttl).await;
        // The waiter's TTL is the minimum: by its turn, its grant's validity has passed, and
        // only keep-alives answered in its own term could vouch for its lease.
        let (n, o) = (name.clone(), LockOptions::new(min).wait_for(ttl * 4));
        let waiting = tokio::spawn(async move { waiter.acquire(&n, &o).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut admin = admin_but(victim).await;
        let queued = key_leases(&mut admin, &name).await;
        assert_eq!(
            queued.len(),
            2,
            "the holder's key and the waiter's: {queued:x?}"
        );
        tokio::time::sleep(min + Duration::from_millis(500)).await;
        lease.renew().await.unwrap();

        let (_thaw, elected) = freeze(victim, ttl / 2).await;
        renew_through(&*lease, elected).await;
        lease.release().await.unwrap();
        let granted = tokio::time::timeout(ttl, waiting)
            .await
            .expect("the waiter was not granted within a TTL of the release")
            .unwrap()
            .unwrap_or_else(|e| panic!("the waiter, after {victim} froze: {e}"));
        let now = key_lease(&mut admin, &name).await;
        assert_ne!(
            now, queued[1],
            "the waiter was granted on lease {:x}, last confirmed before {victim} (leader) \
             froze, which {victim} may revoke by its old view when it resumes",
            queued[1]
        );
        revoked(&mut admin, queued[1], "the waiter's key left it").await;
        assert_eq!(granted.state(), LeaseState::Held);
        granted.release().await.unwrap();
    });
}

/// A released lease kept as a spare from before a leader change, and taken by the next lock
/// after it, vouches only for what its old term confirmed: the lock's first renewal moves the
/// key to a lease of the new term, and the spare is revoked.
#[test]
fn a_spare_lease_from_before_a_leader_change_is_left_at_the_first_renewal() {
    serial(async {
        let (victim, holder, ttl) = beside_the_leader().await;
        let opts = LockOptions::new(ttl);
        let mut admin = admin_but(victim).await;
        let first = fresh_name("etcd-spare-before");
        let lease = hold(&holder, &first, ttl).await;
        let spare = key_lease(&mut admin, &first).await;
        lease.release().await.unwrap();

        let (_thaw, elected) = freeze(victim, ttl / 2).await;
        let second = fresh_name("etcd-spare-after");
        let lease = loop {
            match holder.try_acquire(&second, &opts).await {
                Ok(l) => break l.expect("free"),
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("acquire after {elected} was elected: {e}"),
            }
        };
        let on = key_lease(&mut admin, &second).await;
        renew_through(&*lease, elected).await;
        let moved = key_lease(&mut admin, &second).await;
        if on == spare {
            assert_ne!(
                moved, spare,
                "the lock taken on spare lease {spare:x} (from before {victim} froze) stayed on \
                 it after a renewal answered through {elected}"
            );
            revoked(&mut admin, spare, "the key left the spare").await;
        }
        assert_eq!(lease.state(), LeaseState::Held);
        lease.release().await.unwrap();
        assert_eq!(
            on, spare,
            "the lock after the election did not take the spare lease (the case was not tested)"
        );
    });
}

/// Thaws a frozen member when dropped (even if an assertion failed).
struct Thaw(String);

impl Drop for Thaw {
    fn drop(&mut self) {
        kill("CONT", &self.0);
    }
}

/// Brings a killed member back (from its own data, so it rejoins) when dropped.
struct Restart(&'static str);

impl Drop for Restart {
    fn drop(&mut self) {
        services(&["up", self.0]);
    }
}

#[test]
fn a_cancelled_waiter_does_not_hold_up_the_queue() {
    serial(async {
        let long = Duration::from_secs(30); // far longer than the test may take
        let holder = etcd(&local(single())).await;
        let name = fresh_name("etcd-cancel");
        let lease = holder
            .acquire(&name, &LockOptions::new(long))
            .await
            .unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 1..=5 {
            let w = etcd(&local(single())).await;
            let (n, order) = (name.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let l = w
                    .acquire(&n, &LockOptions::new(long).wait_for(long))
                    .await?;
                order.lock().unwrap().push(i);
                l.release().await?;
                Ok::<_, Error>(())
            }));
            tokio::time::sleep(Duration::from_millis(200)).await; // queue in order
        }
        tasks[1].abort(); // the second waiter gives up
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start = Instant::now();
        lease.release().await.unwrap();
        for (i, t) in tasks.into_iter().enumerate() {
            if i == 1 {
                continue;
            }
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .unwrap_or_else(|_| panic!("waiter {} stuck behind the cancelled one", i + 1))
                .unwrap()
                .unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [1, 3, 4, 5]);
        // Bounded by the 30 s lease of the cancelled waiter, had its key stayed behind.
        assert!(start.elapsed() < Duration::from_secs(10));
    });
}
