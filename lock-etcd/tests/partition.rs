//! Partitions between etcd members, which a proxy between clients and servers cannot make. The
//! test starts a 3-member cluster of its own (`etcd` from `scripts/services.sh install`, data
//! on `/dev/shm`), whose members reach each other only through one `FaultProxy` per member:
//! each member advertises its proxy as its peer URL, so every connection another member dials
//! to it passes there.
//!
//! Blackholing one member's proxy makes that member **mute**: etcd sends a raft message from
//! X to Y over a stream that Y dialed to X, so no member hears X any more, while X still hears
//! them (and its forwarded lease keep-alives, which X dials to the leader, still pass). That is
//! the one-sided partition a firewall dropping a member's inbound peer port makes. Clients talk
//! to the members directly, each client to one member only, so the muted member's clients
//! have no way around the fault.
//!
//! The promise checked: the lock is never held twice. When the other side's client is granted
//! the lock, the first holder's lease must already be Lost or past its `valid_until`. The
//! figures (how long until the lock moves, if it does) are printed with `--nocapture` for
//! RELIABILITY.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, Lease, LeaseState, LockOptions};
use lock_etcd::{EtcdConfig, EtcdLock};
use test_support::{loopback, serial};

/// A cluster member: its process and its client endpoint.
struct Member {
    child: Child,
    client: String,
}

/// Three etcd members whose peer traffic passes through `peers[i]` on its way to member `i`.
struct Cluster {
    members: Vec<Member>,
    peers: Vec<FaultProxy>,
    dir: tempfile::TempDir,
}

/// A loopback port nobody listens on now (the kernel's choice; a race with another binder is
/// possible but would fail the start loudly, not silently).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Cluster {
    fn start() -> Cluster {
        // etcd fsyncs its WAL on every write: on a disk that is seconds (see services.sh).
        let shm = std::path::Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("distlock-etcd-partition-");
        let dir = if shm.is_dir() {
            builder.tempdir_in(shm)
        } else {
            builder.tempdir()
        }
        .expect("a data directory");
        let peer_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let peers: Vec<FaultProxy> = peer_ports
            .iter()
            .map(|p| FaultProxy::start(loopback(*p)).expect("a peer proxy"))
            .collect();
        let initial: Vec<String> = peers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}=http://{}", p.addr()))
            .collect();
        let mut members = Vec::new();
        for (i, peer) in peer_ports.iter().enumerate() {
            let client = format!("127.0.0.1:{}", free_port());
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).unwrap();
            let child = Command::new("etcd")
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.path().join(format!("m{i}")))
                .args(["--listen-client-urls", &format!("http://{client}")])
                .args(["--advertise-client-urls", &format!("http://{client}")])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://{}", peers[i].addr()),
                ])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "distlock-partition"])
                .args(["--logger", "zap", "--log-level", "warn"])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("etcd (scripts/services.sh install puts it on the PATH)");
            members.push(Member { child, client });
        }
        Cluster {
            members,
            peers,
            dir,
        }
    }

    /// The index of the member every member names as leader, once they agree.
    async fn leader(&self, within: Duration) -> usize {
        let until = Instant::now() + within;
        loop {
            let mut ids = Vec::new();
            for m in &self.members {
                ids.push(test_support::etcd_status(&m.client).await);
            }
            let leaders: Vec<&String> = ids.iter().flatten().map(|(_, l)| l).collect();
            if leaders.len() == ids.len() && leaders.iter().all(|l| *l == leaders[0]) {
                if let Some(i) = ids.iter().flatten().position(|(me, _)| me == leaders[0]) {
                    return i;
                }
            }
            assert!(
                Instant::now() < until,
                "the test's etcd cluster agreed on no leader within {within:?}: {ids:?} \
                 (logs in {})",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client that talks to member `i` only.
    async fn client(&self, i: usize) -> EtcdLock {
        let config = EtcdConfig::new([self.members[i].client.clone()]);
        EtcdLock::connect(config)
            .await
            .unwrap_or_else(|e| panic!("a client of member {i}: {e}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
    }
}

/// The holder's lease, shared by the scenario, the sampler and the release: `None` once taken
/// out to be released.
type Held = Arc<Mutex<Option<Box<dyn Lease>>>>;

/// When the lease's lost signal resolved (released counts too), and every state it passed
/// through, sampled every 5 ms until it is released or Lost.
fn watch(
    held: &Held,
) -> (
    Arc<Mutex<Option<Instant>>>,
    tokio::task::JoinHandle<Vec<LeaseState>>,
) {
    let at = Arc::new(Mutex::new(None));
    let signal = held.lock().unwrap().as_ref().map(|l| l.lost());
    let slot = at.clone();
    tokio::spawn(async move {
        if let Some(signal) = signal {
            signal.await;
        }
        *slot.lock().unwrap() = Some(Instant::now());
    });
    let held = held.clone();
    let states = tokio::spawn(async move {
        let mut seen: Vec<LeaseState> = Vec::new();
        loop {
            let Some(state) = held.lock().unwrap().as_ref().map(|l| l.state()) else {
                return seen;
            };
            if seen.last() != Some(&state) {
                seen.push(state);
            }
            if state == LeaseState::Lost {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    (at, states)
}

/// Releases the lease in `held`, if it is still there.
async fn release(held: &Held) {
    let lease = held.lock().unwrap().take();
    if let Some(lease) = lease {
        if let Err(e) = lease.release().await {
            eprintln!("the holder's release failed: {e}");
        }
    }
}

/// What one scenario saw, for the failure message and for RELIABILITY.md.
#[derive(Debug)]
struct Seen {
    /// From the fault to the holder's lease turning Lost (`None`: it never did).
    holder_lost: Option<Duration>,
    /// From the fault to the other side's grant (`None`: not within the wait).
    other_granted: Option<Duration>,
    /// Every state the holder's lease passed through.
    holder_states: Vec<LeaseState>,
}

/// What happens to one member.
#[derive(Clone, Copy)]
enum Fault {
    /// Nothing another member dials to it gets through (its peer proxy blackholed).
    Mute,
    /// SIGSTOP: it answers nobody, peers and clients alike.
    Freeze,
}

impl Fault {
    fn apply(self, cluster: &Cluster, i: usize) {
        match self {
            Fault::Mute => cluster.peers[i].blackhole(),
            Fault::Freeze => test_support::kill("STOP", cluster.members[i].child.id()),
        }
    }

    fn heal(self, cluster: &Cluster, i: usize) {
        match self {
            Fault::Mute => cluster.peers[i].heal(),
            Fault::Freeze => test_support::kill("CONT", cluster.members[i].child.id()),
        }
    }
}

/// `holder_at` holds a lock from a client of that member; a client of `other_at` waits for it;
/// `fault` strikes member `struck`. The other client may be granted the lock only once the
/// holder's lease is Lost or past its `valid_until`. With `release_after`, the holder releases
/// that long after the fault, if it still can.
async fn scenario(
    tag: &str,
    role: fn(leader: usize) -> (usize, usize, usize),
    fault: Fault,
    release_after: Option<Duration>,
) -> Seen {
    let cluster = Cluster::start();
    let (holder_at, other_at, struck) = role(cluster.leader(Duration::from_secs(20)).await);
    let (a, b) = (
        cluster.client(holder_at).await,
        cluster.client(other_at).await,
    );
    let ttl = a.capabilities().min_ttl.max(Duration::from_secs(2));
    let name = fresh_name(tag);
    let lease = a
        .acquire(&name, &LockOptions::new(ttl).auto_renew(None))
        .await
        .unwrap();
    let held: Held = Arc::new(Mutex::new(Some(lease)));
    let (holder_lost, states) = watch(&held);
    let wait = ttl * 6 + Duration::from_secs(10);
    let (n, o) = (name.clone(), LockOptions::new(ttl).wait_for(wait));
    let waiting = tokio::spawn(async move {
        let r = b.acquire(&n, &o).await;
        (Instant::now(), r)
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // queued
    let struck_at = Instant::now();
    fault.apply(&cluster, struck);
    if let Some(after) = release_after {
        let held = held.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            release(&held).await;
        });
    }
    let (granted_at, granted) = waiting.await.unwrap();
    let other_granted = match granted {
        Ok(other) => {
            // Read after the grant: a renewal confirmed since then only makes it worse.
            let belief = held
                .lock()
                .unwrap()
                .as_ref()
                .map(|l| (l.state(), l.valid_until()));
            let lost = *holder_lost.lock().unwrap();
            let ended = lost.is_some_and(|l| l <= granted_at);
            if let Some((state, until)) = belief.filter(|(_, until)| *until > granted_at) {
                assert!(
                    ended,
                    "{tag}: the lock was held twice: the other side was granted it {:?} after \
                     the fault, while the holder's lease was {state:?}, valid {:?} longer, and \
                     not yet Lost (lost signal {:?} after the fault)",
                    granted_at - struck_at,
                    until - granted_at,
                    lost.map(|l| l - struck_at),
                );
            }
            assert!(
                belief.is_some() || ended,
                "{tag}: the other side was granted the lock {:?} after the fault, before the \
                 holder's release had finished",
                granted_at - struck_at
            );
            fault.heal(&cluster, struck);
            other.release().await.unwrap();
            Some(granted_at - struck_at)
        }
        Err(e) => {
            eprintln!("{tag}: the other side was not granted the lock: {e}");
            None
        }
    };
    fault.heal(&cluster, struck);
    release(&held).await;
    let holder_lost = holder_lost.lock().unwrap().map(|l| l - struck_at);
    let seen = Seen {
        holder_lost,
        other_granted,
        holder_states: states.await.unwrap_or_default(),
    };
    eprintln!("{tag}: ttl {ttl:?}, {seen:?}");
    seen
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
        let role = |l| ((l + 1) % 3, (l + 2) % 3, l);
        let seen = scenario("etcd-election", role, Fault::Freeze, None).await;
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

/// The leader goes mute with the lock's holder on it, the waiter on a follower. The leader
/// stays leader (etcd falls back to the connections it dials itself), but a follower's client
/// cannot keep a lease alive (followers forward keep-alives to the leader's peer URL).
#[test]
fn a_mute_leader_never_lets_the_lock_be_held_twice() {
    serial(async {
        let role = |l| (l, (l + 1) % 3, l);
        scenario("etcd-mute-leader", role, Fault::Mute, None).await;
    });
}

/// A follower goes mute with the lock's holder on it, the waiter on the leader.
#[test]
fn a_mute_follower_never_lets_the_lock_be_held_twice() {
    serial(async {
        let role = |l| ((l + 1) % 3, l, (l + 1) % 3);
        scenario("etcd-mute-follower", role, Fault::Mute, None).await;
    });
}

/// A follower goes mute with the waiter on it, the holder on the leader, which releases the
/// lock 3 s after the fault.
#[test]
fn a_mute_waiters_member_never_lets_the_lock_be_held_twice() {
    serial(async {
        let release = Some(Duration::from_secs(3));
        let role = |l| (l, (l + 1) % 3, (l + 1) % 3);
        scenario("etcd-mute-waiter", role, Fault::Mute, release).await;
    });
}
