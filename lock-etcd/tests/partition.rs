//! Partitions between etcd members, and a frozen leader, on a 3-member cluster of the test's
//! own (`etcd` from `scripts/services.sh install`, data on `/dev/shm`, default heartbeat and
//! election timeout). Each member advertises a `FaultProxy` as its peer URL, so every
//! connection another member dials to it passes there (`test_support::partition`).
//!
//! Every scenario checks that the lock is never held twice; the figures (`--nocapture`) are in
//! RELIABILITY.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::{async_trait, FaultProxy};
use lock_core::{DistributedLock, LeaseState};
use lock_etcd::{EtcdConfig, EtcdLock};
use test_support::partition::{
    free_ports, scenario, shm_dir, Cluster, Fault, Link, Members, Parts,
};
use test_support::{loopback, serial};

/// Three etcd members; `links[i]` is the proxy in front of member `i`'s peer port, which every
/// other member dials (etcd members know each other by one advertised peer URL each, so the
/// links are shared: no `Fault::Isolate` here).
struct Etcd(Parts);

impl Etcd {
    fn start() -> Etcd {
        let dir = shm_dir("distlock-etcd-partition-");
        let held = free_ports(6);
        let ports = held.numbers();
        let (peer_ports, client_ports) = ports.split_at(3);
        let links: Vec<Link> = (peer_ports.iter().enumerate())
            .map(|(to, p)| Link {
                from: None,
                to,
                proxy: FaultProxy::start(loopback(*p)).expect("a peer proxy"),
            })
            .collect();
        let initial: Vec<String> = (links.iter())
            .map(|l| format!("m{}=http://{}", l.to, l.proxy.addr()))
            .collect();
        held.release();
        let (mut members, mut clients) = (Members::default(), Vec::new());
        for (i, peer) in peer_ports.iter().enumerate() {
            let client = format!("127.0.0.1:{}", client_ports[i]);
            let log = std::fs::File::create(dir.join(format!("m{i}.log"))).unwrap();
            let advertised = format!("http://{}", links[i].proxy.addr());
            let child = Command::new("etcd")
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.join(format!("m{i}")))
                .args(["--listen-client-urls", &format!("http://{client}")])
                .args(["--advertise-client-urls", &format!("http://{client}")])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args(["--initial-advertise-peer-urls", &advertised])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "distlock-partition"])
                .args(["--logger", "zap", "--log-level", "warn"])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("etcd (scripts/services.sh install puts it on the PATH)");
            members.0.push(child);
            clients.push(client);
        }
        Etcd(Parts {
            members,
            clients,
            links,
            dir,
        })
    }
}

#[async_trait]
impl Cluster for Etcd {
    fn parts(&self) -> &Parts {
        &self.0
    }

    async fn agreed_leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        for client in &self.0.clients {
            ids.push(test_support::etcd_status(client).await?);
        }
        // Every member's (own id, leader's id): the leader is the member whose id all name.
        let leader = &ids[0].1;
        ids.iter().all(|(_, l)| l == leader).then_some(())?;
        ids.iter().position(|(me, _)| me == leader)
    }

    async fn client(&self, i: usize) -> lock_core::Result<Arc<dyn DistributedLock>> {
        let config = EtcdConfig::new([self.0.clients[i].clone()]);
        Ok(Arc::new(EtcdLock::connect(config).await?))
    }
}

/// The leader is frozen while a client of one follower holds the lock and a client of the
/// other waits, both at the server's minimum TTL: the followers elect a new leader, which
/// extends every lease. The holder cannot confirm its lease through the election and must
/// count it Lost, but the waiter's lease lives on: the waiter must come through the election
/// and be granted the lock (it used to fail with "its lease could not be kept alive while
/// waiting" whenever the election outlasted its TTL).
#[test]
fn a_waiter_comes_through_a_leader_election() {
    serial(async {
        let roles = |l| ((l + 1) % 3, (l + 2) % 3, l);
        let seen = scenario(&Etcd::start(), "etcd-election", roles, Fault::Freeze, None).await;
        let Some(granted) = seen.other_granted else {
            panic!("the waiter did not come through the election: {seen:?}");
        };
        // The holder could not confirm its lease through the election: it must have been told
        // (Lost) before the lock moved on, never left believing it still held it.
        assert!(
            seen.holder_lost.is_some_and(|l| l <= granted)
                && seen.holder_states.last() == Some(&LeaseState::Lost),
            "the holder was not told it had lost the lock before the waiter got it: {seen:?}"
        );
    });
}

/// The leader goes mute with the lock's holder on it, the waiter on a follower.
#[test]
fn a_mute_leader_never_lets_the_lock_be_held_twice() {
    serial(async {
        let roles = |l| (l, (l + 1) % 3, l);
        scenario(&Etcd::start(), "etcd-mute-leader", roles, Fault::Mute, None).await;
    });
}

/// A follower goes mute with the lock's holder on it, the waiter on the leader.
#[test]
fn a_mute_follower_never_lets_the_lock_be_held_twice() {
    serial(async {
        let roles = |l| ((l + 1) % 3, l, (l + 1) % 3);
        scenario(
            &Etcd::start(),
            "etcd-mute-follower",
            roles,
            Fault::Mute,
            None,
        )
        .await;
    });
}

/// A follower goes mute with the waiter on it, the holder on the leader, which releases the
/// lock 3 s after the fault.
#[test]
fn a_mute_waiters_member_never_lets_the_lock_be_held_twice() {
    serial(async {
        let (roles, release) = (
            |l| (l, (l + 1) % 3, (l + 1) % 3),
            Some(Duration::from_secs(3)),
        );
        scenario(
            &Etcd::start(),
            "etcd-mute-waiter",
            roles,
            Fault::Mute,
            release,
        )
        .await;
    });
}
