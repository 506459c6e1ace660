//! Partitions between the members of a cluster, which a proxy between clients and servers
//! cannot make. A test starts a cluster of its own ([`Members`], on
//! [`free_ports`](crate::ports::free_ports), data in
//! [`shm_dir`]) whose members reach each other only through `FaultProxy`s ([`Link`]s): each
//! member names the proxies as its peers' addresses, so every connection another member dials
//! to member *i* passes through a link to *i*, and blackholing those makes *i* a member that
//! nobody can dial ([`Fault::Mute`]). Where each member has links of its own to each peer (its
//! configuration names its peers separately from the others', or a
//! [`ByDialer`](crate::by_dialer::ByDialer) at the one address they all name sends each
//! member's connections through its own link), blackholing also the links *i* dials through
//! cuts it off both ways ([`Fault::Isolate`]). Each client talks to one member
//! only, so a client of a struck member has no way around the fault.
//!
//! [`scenario`] checks the promise under such a fault: the lock is never held twice. When the
//! other client is granted the lock, the holder's lease is already Lost or past its
//! `valid_until`. What it saw ([`Seen`]) is printed for RELIABILITY.md (`--nocapture`).

use parking_lot::Mutex;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conformance_tests::{fresh_name, FaultProxy};
use lock_core::{DistributedLock, Lease, LeaseState, LockOptions};

/// What every cluster a test starts itself has: its processes, the address each serves
/// clients on, the proxies in front of each one's peer ports, and its data directory.
#[derive(Debug)]
pub struct Parts {
    /// The servers' processes.
    pub members: Members,
    /// `host:port` where member `i` serves clients.
    pub clients: Vec<String>,
    /// The proxies between members.
    pub links: Vec<Link>,
    /// Data and logs.
    pub dir: crate::Scratch,
    /// Whether a client of member *i* lists every member (*i* first), not *i* alone.
    pub every: bool,
    /// Member *i*'s time of day, where the members run under the clock shim (empty: they do
    /// not, and the nemesis steps no clock).
    pub clocks: Vec<crate::shim::StepFile>,
}

impl Parts {
    /// A cluster's parts, whose clients list their own member alone.
    pub fn new(
        members: Members,
        clients: Vec<String>,
        links: Vec<Link>,
        dir: crate::Scratch,
    ) -> Self {
        Parts {
            members,
            clients,
            links,
            dir,
            every: false,
            clocks: Vec::new(),
        }
    }

    /// The same, whose members read their time of day through `clocks` (one per member, in
    /// order; see [`StepFile::apply`](crate::clock::StepFile::apply)).
    pub fn with_clocks(self, clocks: Vec<crate::shim::StepFile>) -> Self {
        Parts { clocks, ..self }
    }

    /// The same, whose clients list every member, their own first (so they can move to a
    /// member that still answers).
    pub fn listing_every_member(self) -> Self {
        Parts {
            every: true,
            ..self
        }
    }

    /// The client addresses a client of member `i` lists: `i`'s, then, with
    /// [`every`](Self::every), the others'.
    pub fn client_hosts(&self, i: usize) -> Vec<String> {
        let others = (self.clients.iter().enumerate()).filter(|(j, _)| self.every && *j != i);
        let others = others.map(|(_, c)| c.clone());
        (self.clients.get(i).cloned().into_iter())
            .chain(others)
            .collect()
    }
}

/// A proxy between members: every connection member `from` dials to member `to` (to one of
/// its peer ports) passes through it.
#[derive(Debug)]
pub struct Link {
    /// The member that dials through it; `None` when every other member does (members that
    /// all name a peer at one address, with no [`ByDialer`](crate::by_dialer::ByDialer) there).
    pub from: Option<usize>,
    /// The member it leads to.
    pub to: usize,
    /// The proxy.
    pub proxy: FaultProxy,
}

/// A cluster a test started itself, with proxies in front of its members' peer ports.
#[async_trait]
pub trait Cluster: Send + Sync {
    /// Its processes, addresses and proxies.
    fn parts(&self) -> &Parts;
    /// The member every member names as leader, if they agree now.
    async fn agreed_leader(&self) -> Option<usize>;
    /// A client that talks to member `i` only.
    async fn client(&self, i: usize) -> lock_core::Result<Arc<dyn DistributedLock>>;

    /// The member every member names as leader, once they agree (within a minute).
    ///
    /// # Panics
    /// If they do not agree within a minute (the failure names the logs' directory).
    async fn leader(&self) -> usize {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(i) = self.agreed_leader().await {
                return i;
            }
            let dir = &self.parts().dir;
            let gone = self.parts().members.exited();
            assert!(
                gone.is_empty(),
                "members {gone:?} of the test's cluster exited before it agreed on a leader \
                 (logs in {}):\n{}",
                dir.display(),
                log_tails(dir, 15)
            );
            assert!(
                Instant::now() < until,
                "the test's cluster agreed on no leader within 60 s (logs in {}):\n{}",
                dir.display(),
                log_tails(dir, 15)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The processes of a test's own cluster, killed (SIGCONT first, in case one is frozen) when
/// dropped, however the test ends.
#[derive(Debug, Default)]
pub struct Members(pub Vec<Child>);

impl Members {
    /// The members whose process has exited (a zombie, or gone): `/proc` says, since a
    /// shared borrow cannot `try_wait`.
    pub fn exited(&self) -> Vec<usize> {
        let exited = |c: &Child| {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", c.id()));
            // The state follows the command's closing parenthesis.
            stat.map_or(true, |s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
            })
        };
        (self.0.iter().enumerate())
            .filter(|(_, c)| exited(c))
            .map(|(i, _)| i)
            .collect()
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A fresh [`Scratch`](crate::Scratch) directory on `/dev/shm` where there is one (servers
/// that fsync every write take seconds per write on a disk here), else in the temporary
/// directory.
///
/// # Panics
/// If it cannot be created.
#[allow(clippy::expect_used)]
pub fn shm_dir(prefix: &str) -> crate::Scratch {
    let shm = std::path::Path::new("/dev/shm");
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    crate::Scratch(Some(
        if shm.is_dir() {
            builder.tempdir_in(shm)
        } else {
            builder.tempdir()
        }
        .expect("a data directory"),
    ))
}

/// The last `lines` lines of every `*.log` file in `dir` and its subdirectories, each headed by
/// its path: what the servers said, for a failure's report. Files that cannot be read are
/// named with the reason.
pub fn log_tails(dir: &std::path::Path, lines: usize) -> String {
    let mut logs = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "log") {
                logs.push(path);
            }
        }
    }
    logs.sort();
    let mut out = String::new();
    for log in logs {
        let text = match std::fs::read(&log) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(e) => format!("(unreadable: {e})"),
        };
        out.push_str(&format!(
            "--- the last {lines} lines of {}\n{text}\n",
            log.display()
        ));
    }
    out
}

/// What happens to one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing another member dials to it gets through (the links to it blackholed); what it
    /// dials itself does, and on such a connection both sides still hear each other.
    Mute,
    /// Cut off from every other member both ways: the links to it and the links it dials
    /// through blackholed. Its clients still reach it.
    ///
    /// # Panics
    /// On a cluster with a link that every member dials through ([`Link::from`] `None`):
    /// blackholing it would cut off the others too.
    Isolate,
    /// SIGSTOP: it answers nobody, peers and clients alike.
    Freeze,
    /// Cut off from member `j` both ways (the links between the two blackholed), while both
    /// still reach the others.
    ///
    /// # Panics
    /// As [`Isolate`](Fault::Isolate), on a cluster with a link that every member dials
    /// through.
    Between(usize),
}

impl Fault {
    /// Whether this fault on member `i` blackholes `link`.
    fn strikes(self, i: usize, link: &Link) -> bool {
        match self {
            Fault::Mute => link.to == i,
            Fault::Isolate => link.to == i || link.from == Some(i),
            Fault::Freeze => false,
            Fault::Between(j) => {
                (link.from == Some(i) && link.to == j) || (link.from == Some(j) && link.to == i)
            }
        }
    }

    /// The links this fault blackholes on member `i`.
    fn links(self, cluster: &dyn Cluster, i: usize) -> Vec<&FaultProxy> {
        let links = &cluster.parts().links;
        if matches!(self, Fault::Isolate | Fault::Between(_)) {
            assert!(
                links.iter().all(|l| l.from.is_some()),
                "this cluster's members dial each other through shared links: it cannot cut \
                 a member off both ways"
            );
        }
        let struck = links.iter().filter(|l| self.strikes(i, l));
        struck.map(|l| &l.proxy).collect()
    }

    /// Strikes member `i` (`on`) or heals it.
    pub fn set(self, cluster: &dyn Cluster, i: usize, on: bool) {
        match self {
            Fault::Freeze => {
                let signal = if on { "STOP" } else { "CONT" };
                crate::kill(signal, cluster.parts().members.0[i].id());
            }
            _ => {
                let act = if on {
                    FaultProxy::blackhole
                } else {
                    FaultProxy::heal
                };
                self.links(cluster, i).into_iter().for_each(act);
            }
        }
    }
}

/// The faults in force on a cluster's members, for faults that overlap: a link stays
/// blackholed while any fault in force strikes it, so that healing one fault (member 0 cut
/// off) cannot heal a link that another (member 1 muted) still cuts. [`Fault::set`] alone
/// knows only its own fault.
#[derive(Debug, Default)]
pub struct Faults(Mutex<Vec<(Fault, usize)>>);

impl Faults {
    /// Strikes member `i` with `fault` (`on`) or heals that fault, leaving the others in force.
    pub fn set(&self, cluster: &dyn Cluster, fault: Fault, i: usize, on: bool) {
        if let Fault::Freeze = fault {
            return fault.set(cluster, i, on); // no link: nothing to share
        }
        fault.links(cluster, i); // its own checks
        let mut active = self.0.lock();
        let struck =
            |active: &[(Fault, usize)], l: &Link| active.iter().any(|(f, i)| f.strikes(*i, l));
        let before: Vec<bool> = cluster
            .parts()
            .links
            .iter()
            .map(|l| struck(&active, l))
            .collect();
        if on {
            active.push((fault, i));
        } else if let Some(k) = active.iter().position(|a| *a == (fault, i)) {
            active.remove(k);
        }
        for (l, was) in cluster.parts().links.iter().zip(before) {
            match (was, struck(&active, l)) {
                (false, true) => l.proxy.blackhole(),
                (true, false) => l.proxy.heal(),
                _ => {}
            }
        }
    }
}

/// Who is where, by the index of the leader: `(holder's member, waiter's member, struck member)`.
pub type Roles = fn(leader: usize) -> (usize, usize, usize);

/// What one scenario saw, for the failure message and for RELIABILITY.md.
#[derive(Debug)]
pub struct Seen {
    /// The lock's TTL (the backend's minimum, at least 2 s).
    pub ttl: Duration,
    /// From the fault to the holder's lease turning Lost or released (`None`: neither).
    pub holder_lost: Option<Duration>,
    /// From the fault to the waiter's grant (`None`: not granted).
    pub other_granted: Option<Duration>,
    /// The waiter's error, if it was not granted.
    pub other_error: Option<String>,
    /// Every state the holder's lease passed through.
    pub holder_states: Vec<LeaseState>,
}

/// The holder's lease, shared by the scenario, the sampler and the release: `None` once taken
/// out to be released.
type Held = Arc<Mutex<Option<Box<dyn Lease>>>>;

/// When the lease's lost signal resolved (a release counts too), and every state it passed
/// through, sampled every 5 ms until it is released or Lost.
fn watch(
    held: &Held,
) -> (
    Arc<Mutex<Option<Instant>>>,
    tokio::task::JoinHandle<Vec<LeaseState>>,
) {
    let at = Arc::new(Mutex::new(None));
    let signal = held.lock().as_ref().map(|l| l.lost());
    let slot = at.clone();
    tokio::spawn(async move {
        if let Some(signal) = signal {
            signal.await;
        }
        *slot.lock() = Some(Instant::now());
    });
    let held = held.clone();
    let states = tokio::spawn(async move {
        let mut seen: Vec<LeaseState> = Vec::new();
        loop {
            let Some(state) = held.lock().as_ref().map(|l| l.state()) else {
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
    let lease = held.lock().take();
    if let Some(lease) = lease {
        if let Err(e) = lease.release().await {
            eprintln!("the holder's release failed: {e}");
        }
    }
}

/// A client of one member holds a lock (auto-renewed, at the backend's minimum TTL), a client
/// of another waits for it, then `fault` strikes a third (the members by `roles`). The waiter
/// may be granted the lock only once the holder's lease is Lost or past its `valid_until`.
/// With `release_after`, the holder releases that long after the fault, if it still can.
///
/// # Panics
/// If the lock is held twice (the failure names both sides' evidence), or the cluster does not
/// answer before the fault.
#[allow(clippy::expect_used, clippy::unwrap_used)]
pub async fn scenario(
    cluster: &dyn Cluster,
    tag: &str,
    roles: Roles,
    fault: Fault,
    release_after: Option<Duration>,
) -> Seen {
    let (holder_at, other_at, struck) = roles(cluster.leader().await);
    let client = |i| async move {
        match cluster.client(i).await {
            Ok(c) => c,
            Err(e) => panic!("{tag}: a client of member {i}: {e}"),
        }
    };
    let (a, b) = (client(holder_at).await, client(other_at).await);
    let ttl = a.capabilities().min_ttl.max(Duration::from_secs(2));
    let name = fresh_name(tag);
    let auto = LockOptions::new(ttl).auto_renew(None);
    let held: Held = Arc::new(Mutex::new(Some(
        a.acquire(&name, &auto).await.expect("the holder's grant"),
    )));
    let (holder_lost, states) = watch(&held);
    let (n, o) = (
        name.clone(),
        auto.wait_for(ttl * 6 + Duration::from_secs(10)),
    );
    let waiting = tokio::spawn(async move {
        let r = b.acquire(&n, &o).await;
        (Instant::now(), r)
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // queued
    let struck_at = Instant::now();
    fault.set(cluster, struck, true);
    if let Some(after) = release_after {
        let held = held.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            release(&held).await;
        });
    }
    let (granted_at, granted) = waiting.await.expect("the waiter's task");
    let since = |t: Instant| t.saturating_duration_since(struck_at);
    let (other_granted, other_error) = match granted {
        Ok(other) => {
            // Read after the grant: a renewal confirmed since then only makes it worse.
            let belief = held.lock().as_ref().map(|l| (l.state(), l.valid_until()));
            let lost = *holder_lost.lock();
            let ended = lost.is_some_and(|l| l <= granted_at);
            if let Some((state, until)) = belief.filter(|(_, until)| *until > granted_at) {
                assert!(
                    ended,
                    "{tag}: the lock was held twice: the waiter was granted it {:?} after the \
                     fault, while the holder's lease was {state:?}, valid {:?} longer, and not \
                     yet Lost (lost signal {:?} after the fault)",
                    since(granted_at),
                    until - granted_at,
                    lost.map(since),
                );
            }
            assert!(
                belief.is_some() || ended,
                "{tag}: the waiter was granted the lock {:?} after the fault, before the \
                 holder's release had finished",
                since(granted_at)
            );
            fault.set(cluster, struck, false);
            let _ = other.release().await;
            (Some(since(granted_at)), None)
        }
        Err(e) => (None, Some(e.to_string())),
    };
    fault.set(cluster, struck, false);
    release(&held).await;
    let holder_lost = holder_lost.lock().map(since);
    let seen = Seen {
        ttl,
        holder_lost,
        other_granted,
        other_error,
        holder_states: states.await.unwrap_or_default(),
    };
    eprintln!("{tag}: {seen:?}");
    seen
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;
