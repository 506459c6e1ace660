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
        }
    }
    /// A ZooKeeper ensemble: one member says leader and every other follower. An etcd
    /// cluster: every member names the same leader. Servers without a leader: always.
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
        }
    }
}
