//! [`ServicesSh`]: the servers of `scripts/services.sh` as the conformance suite's
//! [`Servers`], for the safety nemesis (freeze, crash and restart by pid).

use std::process::Command;

use conformance_tests::{async_trait, BoxError, Servers};

/// Seconds after which a frozen server is resumed whatever happens to the test.
const FREEZE_AT_MOST: u32 = 30;

/// How to tell which member leads.
#[derive(Clone, Debug)]
enum Leader {
    None,
    /// ZooKeeper members' client addresses, in member order (`srvr` says `Mode: leader`).
    Zk(Vec<String>),
    /// etcd members' client addresses, in member order (the leader's own member id is the
    /// `leader` its status names).
    Etcd(Vec<String>),
    /// A Sentinel deployment's Redis servers' addresses, in member order: the master is the
    /// one the sentinels name (`sentinel1` to `3`).
    Sentinel(Vec<String>),
    /// A Redis Cluster's nodes' addresses, in member order: the first master among them
    /// leads (an aimed fault strikes a shard's master).
    Cluster(Vec<String>),
}

/// Servers started by `scripts/services.sh`, by their names there.
#[derive(Clone, Debug)]
pub struct ServicesSh {
    names: Vec<&'static str>,
    keeps_locks: bool,
    leader: Leader,
    /// Signal the recorded process's children too (PostgreSQL: one process per session).
    children: bool,
}

impl ServicesSh {
    /// The servers `names`; `keeps_locks`: whether a crash and restart keeps every lock and
    /// counter (see [`Servers::restart_keeps_locks`]).
    pub fn new(names: &[&'static str], keeps_locks: bool) -> Self {
        ServicesSh {
            names: names.to_vec(),
            keeps_locks,
            leader: Leader::None,
            children: false,
        }
    }

    /// Freezes and thaws the recorded process's children with it: a PostgreSQL server is a
    /// postmaster and one backend per session, and freezing the postmaster alone leaves every
    /// open session answering.
    pub fn with_children(mut self) -> Self {
        self.children = true;
        self
    }

    /// A ZooKeeper ensemble whose members answer on `hosts` (`h:p`, in member order).
    pub fn zk_leader(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.leader = Leader::Zk(hosts.into_iter().map(Into::into).collect());
        self
    }

    /// An etcd cluster whose members answer on `endpoints` (`h:p` or `http://h:p`, in member
    /// order).
    pub fn etcd_leader(mut self, endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.leader = Leader::Etcd(endpoints.into_iter().map(Into::into).collect());
        self
    }

    /// A Sentinel deployment whose Redis servers answer on `hosts` (`h:p`, in member order):
    /// the sentinels name the master, the one that leads.
    pub fn sentinel_master(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.leader = Leader::Sentinel(hosts.into_iter().map(Into::into).collect());
        self
    }

    /// A Redis Cluster whose nodes answer on `hosts` (`h:p`, in member order): each shard a
    /// master and one replica.
    pub fn cluster_masters(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.leader = Leader::Cluster(hosts.into_iter().map(Into::into).collect());
        self
    }

    fn name(&self, i: usize) -> Result<&'static str, BoxError> {
        self.names
            .get(i)
            .copied()
            .ok_or_else(|| format!("no member {i} among {:?}", self.names).into())
    }

    /// `kill -SIG` the pid services.sh recorded for member `i`, off the runtime's threads.
    async fn signal(&self, i: usize, sig: &'static str) -> Result<(), BoxError> {
        let name = self.name(i)?;
        let children = self.children;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
        tokio::task::spawn_blocking(move || -> Result<(), BoxError> {
            let out = Command::new(script).args(["pid", name]).output()?;
            let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !out.status.success() || pid.is_empty() {
                return Err(format!("services.sh pid {name}: no pid").into());
            }
            if children {
                // Exits 1 when there is no child: not an error.
                Command::new("pkill")
                    .args([format!("-{sig}"), "-P".into(), pid.clone()])
                    .status()?;
            }
            let ok = Command::new("kill")
                .args([format!("-{sig}"), pid.clone()])
                .status()?
                .success();
            if ok && sig == "STOP" {
                // A safety net that outlives this process: a test that dies (or a future
                // dropped) between freeze and thaw must not leave a shared server stopped.
                // SIGCONT to a running process does nothing.
                Command::new("sh")
                    .args([
                        "-c",
                        &format!(
                            "sleep {FREEZE_AT_MOST}; kill -CONT {pid} 2>/dev/null; \
                             pkill -CONT -P {pid} 2>/dev/null"
                        ),
                    ])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()?;
                Ok(())
            } else if ok {
                Ok(())
            } else {
                Err(format!("kill -{sig} {pid} ({name}) failed").into())
            }
        })
        .await?
    }
}

#[async_trait]
impl Servers for ServicesSh {
    fn members(&self) -> Vec<String> {
        self.names.iter().map(|n| n.to_string()).collect()
    }
    /// Also resumed after 30 s by a detached `sh`, should the test die before [`thaw`](Servers::thaw).
    async fn freeze(&self, i: usize) -> Result<(), BoxError> {
        self.signal(i, "STOP").await
    }
    async fn thaw(&self, i: usize) -> Result<(), BoxError> {
        self.signal(i, "CONT").await
    }
    async fn restart(&self, members: &[usize]) -> Result<(), BoxError> {
        let names = members
            .iter()
            .map(|i| self.name(*i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(crate::restart_servers(&names).await?)
    }
    fn restart_keeps_locks(&self) -> bool {
        self.keeps_locks
    }
    async fn leader(&self) -> Option<usize> {
        match &self.leader {
            Leader::None => None,
            Leader::Zk(hosts) => {
                for (i, h) in hosts.iter().enumerate() {
                    if crate::zk_mode(h).await.as_deref() == Some("leader") {
                        return Some(i);
                    }
                }
                None
            }
            Leader::Etcd(endpoints) => {
                for (i, ep) in endpoints.iter().enumerate() {
                    let (me, leader) = crate::etcd_status(ep).await?;
                    if me == leader {
                        return Some(i);
                    }
                }
                None
            }
            Leader::Sentinel(hosts) => {
                let master = crate::sentinel_master().await?;
                hosts.iter().position(|h| *h == master)
            }
            Leader::Cluster(hosts) => {
                for (i, h) in hosts.iter().enumerate() {
                    if crate::redis_role(h).await.as_deref() == Some("master") {
                        return Some(i);
                    }
                }
                None
            }
        }
    }
    /// A ZooKeeper ensemble: one member says leader and every other follower. An etcd
    /// cluster: every member names the same leader. A Sentinel deployment: the sentinels name
    /// a master that answers as one, with every other member replicating from it. A Redis
    /// Cluster: every node says the cluster is ok, and half of them are masters with their
    /// replica attached. Servers without a leader: always.
    async fn serving(&self) -> bool {
        match &self.leader {
            Leader::None => true,
            Leader::Zk(hosts) => {
                let mut leaders = 0;
                for h in hosts {
                    match crate::zk_mode(h).await.as_deref() {
                        Some("leader") => leaders += 1,
                        Some("follower") => {}
                        _ => return false,
                    }
                }
                leaders == 1
            }
            Leader::Etcd(endpoints) => {
                let mut ids = Vec::new();
                for ep in endpoints {
                    match crate::etcd_status(ep).await {
                        Some(id) => ids.push(id),
                        None => return false,
                    }
                }
                // The leader all name is one of them (not "0", none).
                let leader = ids.first().map(|(_, l)| l.clone());
                ids.iter().all(|(_, l)| Some(l) == leader.as_ref())
                    && ids.iter().any(|(me, _)| Some(me) == leader.as_ref())
            }
            // Healed: the master the sentinels name says so, and every other member
            // replicates from it again (the sentinels convert a thawed old master some 10 s
            // after it answers; until then a client waiting for every replica, as
            // `wait_replicas=2` does here, cannot be granted).
            Leader::Sentinel(hosts) => match crate::sentinel_master().await {
                Some(master) if hosts.contains(&master) => {
                    crate::redis_role(&master).await.as_deref() == Some("master")
                        && crate::redis_replicas(&master).await == Some(hosts.len() - 1)
                }
                _ => false,
            },
            // Healed: a thawed old master rejoins as a replica of the one promoted in its
            // place; until then its shard has no replica (`wait_replicas=1` cannot grant).
            Leader::Cluster(hosts) => {
                let mut masters = 0;
                for h in hosts {
                    if crate::redis_cluster_state(h).await.as_deref() != Some("ok") {
                        return false;
                    }
                    match crate::redis_role(h).await.as_deref() {
                        Some("master") if crate::redis_replicas(h).await == Some(1) => masters += 1,
                        Some("slave") => {}
                        _ => return false,
                    }
                }
                masters * 2 == hosts.len()
            }
        }
    }
}
