//! `shared_lease=true` (`src/shared.rs`) against the single member of `scripts/services.sh`
//! (`ETCD_URL`, default: its `etcd` server): what sharing promises beyond the conformance
//! suite (which runs whole as `shared_lease::` in `tests/conformance.rs`) — many locks on one
//! lease and one keep-alive, one client's two acquisitions of a name never share a key, a lock
//! lost or abandoned beside live ones still frees, and an acquisition cut short leaves no key.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, LeaseState, LockName, LockOptions, Mode};
use lock_etcd::etcd_client::{Client, GetOptions};
use lock_etcd::{EtcdConfig, EtcdLock};
use test_support::{
    etcd_calls_started, etcd_grpc_messages_received, etcd_messages_received, serial, servers,
};

mod common;
use common::{all_held, lease_of, renewals};

fn endpoint() -> String {
    servers::url("{etcd}")
}

/// A client whose locks share a lease, through `endpoint`.
async fn sharing(endpoint: String) -> EtcdLock {
    EtcdLock::connect(EtcdConfig::new([endpoint]).with_shared_lease(true))
        .await
        .unwrap_or_else(|e| panic!("etcd (scripts/services.sh up etcd): {e}"))
}

/// The keys under `name`'s range, read directly.
async fn keys_of(admin: &mut Client, name: &LockName) -> Vec<String> {
    let dir = format!("/distlock/{name}/");
    let opts = GetOptions::new().with_prefix().with_keys_only();
    let got = admin.get(dir, Some(opts)).await.expect("read the keys");
    got.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Twenty locks of one client and TTL, renewed by their watchdogs for 4 s: their keys are all on
/// one lease, granted once, and that lease gets about one keep-alive per renewal period, not
/// one per lock; their renewals' reads go in one transaction per period, not one each.
/// (Serial: the member counts every client's requests.)
#[test]
fn many_locks_share_one_lease_and_its_keep_alives() {
    serial(async {
        let eps = [endpoint()];
        let locks = sharing(endpoint()).await;
        let mut admin = locks.client();
        let ttl = Duration::from_secs(2);
        let opts = LockOptions::new(ttl).auto_renew(None);
        let grants = etcd_calls_started(&eps, "LeaseGrant").await.unwrap();
        let mut held = Vec::new();
        for i in 0..20 {
            let name = fresh_name(&format!("shared-lease-{i}"));
            held.push(
                locks
                    .try_acquire(&name, &opts)
                    .await
                    .unwrap()
                    .expect("free"),
            );
        }
        let granted = etcd_calls_started(&eps, "LeaseGrant").await.unwrap() - grants;
        assert!(
            granted <= 1,
            "{granted} leases granted for 20 locks on one shared lease"
        );
        let mut leases = Vec::new();
        for l in &held {
            leases.push(lease_of(&mut admin, &l.backend_key().unwrap()).await);
        }
        leases.dedup();
        assert_eq!(
            leases.len(),
            1,
            "20 locks on leases {leases:x?}: one expected"
        );
        assert_ne!(leases[0], 0, "the keys are on a lease");

        let sent = etcd_messages_received(&eps, "LeaseKeepAlive")
            .await
            .unwrap();
        let all = etcd_grpc_messages_received(&eps).await.unwrap();
        let renewed = renewals(&held);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let sent = etcd_messages_received(&eps, "LeaseKeepAlive")
            .await
            .unwrap()
            - sent;
        let all = etcd_grpc_messages_received(&eps).await.unwrap() - all;
        let renewed = renewals(&held) - renewed;
        all_held(&held, "every lock renewed");
        assert!(
            renewed >= 80,
            "{renewed} renewals of 20 locks in 4 s at a 2 s TTL (every 2/3 s: about 120)"
        );
        // One keep-alive answers every renewal within a quarter of the TTL: about 8 in 4 s.
        assert!(
            sent <= 20,
            "{sent} keep-alives for {renewed} renewals of 20 locks on one lease: not coalesced"
        );
        // A keep-alive and a transaction of 20 reads per period: about 16 in 4 s.
        assert!(
            all <= 40,
            "{all} requests for {renewed} renewals of 20 locks on one lease: a read each, not \
             one transaction of them all"
        );
        for l in held {
            l.release().await.unwrap();
        }
    });
}

/// One client acquiring one name twice gets two keys: the exclusive second waits (Go's
/// `concurrency.Mutex` puts both on one key in one session, and both "hold"), and two shared
/// holds are two holders that release separately.
#[test]
fn one_clients_two_acquisitions_of_a_name_are_two_keys() {
    serial(async {
        let locks = sharing(endpoint()).await;
        let mut admin = locks.client();
        let ttl = Duration::from_secs(2);
        let name = fresh_name("shared-lease-twice");
        let first = locks
            .try_acquire(&name, &LockOptions::new(ttl))
            .await
            .unwrap()
            .expect("free");
        let second = locks
            .try_acquire(&name, &LockOptions::new(ttl))
            .await
            .unwrap();
        assert!(
            second.is_none(),
            "the same client's second exclusive acquisition was granted beside the first"
        );
        first.release().await.unwrap();
        assert!(
            keys_of(&mut admin, &name).await.is_empty(),
            "released: no key left"
        );

        let shared = LockOptions::new(ttl).mode(Mode::Shared);
        let a = locks
            .try_acquire(&name, &shared)
            .await
            .unwrap()
            .expect("free");
        let b = locks
            .try_acquire(&name, &shared)
            .await
            .unwrap()
            .expect("shared");
        assert_ne!(a.backend_key(), b.backend_key(), "two holders on one key");
        assert_eq!(locks.holders(&name).await.unwrap().len(), 2);
        a.release().await.unwrap();
        assert_eq!(keys_of(&mut admin, &name).await, [b.backend_key().unwrap()]);
        b.renew().await.expect("the other holder is untouched");
        b.release().await.unwrap();
    });
}

/// A lock abandoned (as by a crash of its holder alone) while the same client's other locks
/// keep the shared lease alive frees within its TTL and the slack, as a lease of its own
/// would have expired: the key does not live on with the lease.
#[test]
fn an_abandoned_lock_frees_though_its_lease_lives_on() {
    serial(async {
        let locks = sharing(endpoint()).await;
        let other = sharing(endpoint()).await;
        let ttl = Duration::from_secs(2);
        let auto = LockOptions::new(ttl).auto_renew(None);
        let kept = locks
            .try_acquire(&fresh_name("shared-lease-kept"), &auto)
            .await
            .unwrap()
            .expect("free");
        let name = fresh_name("shared-lease-abandoned");
        let abandoned = locks
            .try_acquire(&name, &auto)
            .await
            .unwrap()
            .expect("free");
        abandoned.abandon();
        let started = Instant::now();
        let wait = LockOptions::new(ttl).wait_for(ttl + Duration::from_secs(3));
        let next = other.acquire(&name, &wait).await.unwrap_or_else(|e| {
            panic!(
                "the abandoned lock was still held {:?} later, its shared lease kept alive by \
                 another lock ({:?}): {e}",
                started.elapsed(),
                kept.state()
            )
        });
        assert_eq!(kept.state(), LeaseState::Held, "the other lock lives on");
        next.release().await.unwrap();
        kept.release().await.unwrap();
    });
}

/// A put that finds its tombstone (left by an undo that ran first) does not land: the
/// acquisition goes to another lease and key. Found by numbering: the client's next key on
/// its lease is the one after its last.
#[test]
fn a_put_never_lands_after_its_tombstone() {
    serial(async {
        let locks = sharing(endpoint()).await;
        let mut admin = locks.client();
        let ttl = Duration::from_secs(2);
        let first = fresh_name("shared-lease-tomb-a");
        let held = locks
            .try_acquire(&first, &LockOptions::new(ttl))
            .await
            .unwrap()
            .expect("free");
        let key = held.backend_key().unwrap();
        let leaf = key.rsplit('/').next().unwrap();
        let (lease, seq) = leaf.split_once('_').expect("<lease>_<seq>");
        let seq = u64::from_str_radix(seq, 16).unwrap();
        let name = fresh_name("shared-lease-tomb-b");
        let tomb = format!("/distlock/{name}#{lease}_{:x}", seq + 1);
        let id = i64::from_str_radix(lease, 16).unwrap();
        let on_lease = lock_etcd::etcd_client::PutOptions::new().with_lease(id);
        admin.put(tomb.as_str(), "", Some(on_lease)).await.unwrap();
        let next = locks
            .try_acquire(&name, &LockOptions::new(ttl))
            .await
            .unwrap()
            .expect("free");
        let got = next.backend_key().unwrap();
        assert_ne!(
            got,
            format!("/distlock/{name}/{lease}_{:x}", seq + 1),
            "the put landed although its tombstone was there"
        );
        next.release().await.unwrap();
        held.release().await.unwrap();
    });
}

/// Acquisitions cut short at every point of their put's round trip (a 100 ms link each way)
/// leave no key behind, whichever of the put and its undo the member applies first: another
/// client gets the lock at once.
#[test]
fn an_acquisition_cut_short_leaves_no_key() {
    serial(async {
        let single = servers::port("etcd");
        let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], single))).unwrap();
        let locks = sharing(proxy.addr().to_string()).await;
        let direct = sharing(endpoint()).await;
        let mut admin = direct.client();
        let ttl = Duration::from_secs(4);
        // A fresh shared lease first, so that an acquisition is a put alone.
        let warm = locks
            .try_acquire(
                &fresh_name("shared-lease-warm"),
                &LockOptions::new(ttl).auto_renew(None),
            )
            .await
            .unwrap()
            .expect("free");
        proxy.delay(Duration::from_millis(100));
        for cut in [0, 50, 100, 150, 200, 250, 300] {
            let name = fresh_name(&format!("shared-lease-cut-{cut}"));
            let opts = LockOptions::new(ttl);
            let acquiring = locks.try_acquire(&name, &opts);
            let r = tokio::time::timeout(Duration::from_millis(cut), acquiring).await;
            if let Ok(Ok(Some(lease))) = r {
                lease.release().await.unwrap(); // it finished in time: nothing cut
            }
            // A put and its undo still on their way (100 ms each) land within this: a key
            // seen gone before may be the put not landed yet, which the undo then deletes.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let by = Instant::now() + Duration::from_secs(3);
            loop {
                let left = keys_of(&mut admin, &name).await;
                if left.is_empty() {
                    break;
                }
                assert!(
                    Instant::now() < by,
                    "an acquisition cut after {cut} ms left {left:?} 3 s later"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let taken = direct.try_acquire(&name, &opts).await.unwrap();
            let taken = taken.unwrap_or_else(|| panic!("cut after {cut} ms: the lock is busy"));
            // Past the time a put could still be in flight: it must not land now.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(
                keys_of(&mut admin, &name).await.len(),
                1,
                "cut after {cut} ms"
            );
            taken.release().await.unwrap();
        }
        proxy.heal();
        warm.release().await.unwrap();
    });
}
