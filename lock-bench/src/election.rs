//! The election scenarios: a leader goes, a waiting candidate takes over, an observer sees it.
//! - `resign`: the leader resigns; time from the resign call to the observer showing the next
//!   leader;
//! - `failover`: the leader crashes (its lease is left to lapse, as a killed process leaves
//!   it); time from the crash to the observer showing the next leader — the lease's TTL (or
//!   session) bounds it, so the figure says how close to that bound each subject comes.
//!
//! Subjects: distlock's `Election` on any backend that holds elections (leases of the
//! backend's minimum TTL, at least 2 s, renewed automatically), and on etcd the server's own
//! `Campaign`/`Resign`/`Observe` RPCs (etcd's `concurrency.Election`), with a lease of the same
//! TTL kept alive by a task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock::lock_etcd::etcd_client::{Client, LeaderKey, ObserveStream, ResignOptions};
use lock_core::{
    DistributedLock, Election, LeaderValue, Leadership, LockName, LockOptions, Observer,
};

use crate::scenarios::{fresh, micros, new_hist, ns, Sample};

/// Something that holds elections.
#[async_trait]
pub(crate) trait Elector: Send + Sync {
    fn label(&self) -> String;
    async fn campaign(&self, name: &str, value: &str) -> Result<Box<dyn Reign>, String>;
    async fn observe(&self, name: &str) -> Result<Box<dyn Sight>, String>;
}

/// A leadership of an [`Elector`].
#[async_trait]
pub(crate) trait Reign: Send {
    async fn resign(self: Box<Self>) -> Result<(), String>;
    /// Stops renewing and walks away, as a killed process does.
    fn crash(self: Box<Self>);
}

/// An observer of an [`Elector`]: the value of each leader it shows (`None`: nobody).
#[async_trait]
pub(crate) trait Sight: Send {
    async fn next_value(&mut self) -> Result<Option<String>, String>;
}

/// distlock's election over a connected lock.
pub(crate) struct Distlock {
    election: Election,
    opts: LockOptions,
}

impl Distlock {
    /// `None` where the driver holds no elections.
    pub(crate) fn new(lock: Arc<dyn DistributedLock>) -> Option<Self> {
        let ttl = lock.capabilities().min_ttl.max(Duration::from_secs(2));
        let opts = LockOptions::new(ttl).auto_renew(None);
        Election::new(lock)
            .ok()
            .map(|election| Distlock { election, opts })
    }
}

#[async_trait]
impl Elector for Distlock {
    fn label(&self) -> String {
        format!("distlock {} election", self.election.lock().backend())
    }
    async fn campaign(&self, name: &str, value: &str) -> Result<Box<dyn Reign>, String> {
        let name = LockName::new(name).map_err(|e| e.to_string())?;
        let value = LeaderValue::new(value).map_err(|e| e.to_string())?;
        let l = self.election.campaign(&name, value, &self.opts).await;
        Ok(Box::new(l.map_err(|e| e.to_string())?))
    }
    async fn observe(&self, name: &str) -> Result<Box<dyn Sight>, String> {
        let name = LockName::new(name).map_err(|e| e.to_string())?;
        let o = self.election.observe(&name).await;
        Ok(Box::new(o.map_err(|e| e.to_string())?))
    }
}

#[async_trait]
impl Reign for Leadership {
    async fn resign(self: Box<Self>) -> Result<(), String> {
        (*self).resign().await.map_err(|e| e.to_string())
    }
    fn crash(self: Box<Self>) {
        (*self).abandon()
    }
}

#[async_trait]
impl Sight for Observer {
    async fn next_value(&mut self) -> Result<Option<String>, String> {
        let o = self.next().await.map_err(|e| e.to_string())?;
        Ok(o.leader.map(|l| l.value.to_string()))
    }
}

/// etcd's own election RPCs, each candidate on a lease of its own kept alive by a task.
pub(crate) struct EtcdElection {
    pub(crate) client: Client,
    pub(crate) ttl: i64,
}

struct EtcdReign {
    client: Client,
    key: LeaderKey,
    keeper: tokio::task::JoinHandle<()>,
}

#[async_trait]
impl Elector for EtcdElection {
    fn label(&self) -> String {
        "etcd Campaign/Observe RPC".into()
    }
    async fn campaign(&self, name: &str, value: &str) -> Result<Box<dyn Reign>, String> {
        let mut c = self.client.clone();
        let lease = c
            .lease_grant(self.ttl, None)
            .await
            .map_err(|e| e.to_string())?;
        let id = lease.id();
        let (mut k, every) = (c.clone(), Duration::from_secs((self.ttl / 3).max(1) as u64));
        let keeper = tokio::spawn(async move {
            loop {
                let _ = k.lease_keep_alive(id).await;
                tokio::time::sleep(every).await;
            }
        });
        let resp = c
            .campaign(name, value, id)
            .await
            .map_err(|e| e.to_string())?;
        let key = resp
            .leader()
            .cloned()
            .ok_or("campaign answered without a leader key")?;
        Ok(Box::new(EtcdReign {
            client: c,
            key,
            keeper,
        }))
    }
    async fn observe(&self, name: &str) -> Result<Box<dyn Sight>, String> {
        let s = self.client.clone().observe(name).await;
        Ok(Box::new(s.map_err(|e| e.to_string())?))
    }
}

#[async_trait]
impl Reign for EtcdReign {
    async fn resign(self: Box<Self>) -> Result<(), String> {
        let mut c = self.client.clone();
        let r = c.resign(Some(ResignOptions::new().with_leader(self.key.clone())));
        let done = r.await.map(|_| ()).map_err(|e| e.to_string());
        self.keeper.abort();
        let _ = c.lease_revoke(self.key.lease()).await;
        done
    }
    fn crash(self: Box<Self>) {
        self.keeper.abort(); // the lease lapses after its TTL
    }
}

#[async_trait]
impl Sight for ObserveStream {
    /// etcd's observe shows leaders only (never "nobody").
    async fn next_value(&mut self) -> Result<Option<String>, String> {
        match self.message().await.map_err(|e| e.to_string())? {
            Some(r) => Ok(r
                .kv()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())),
            None => Err("the observe stream ended".into()),
        }
    }
}

/// Until `sight` shows the leader of value `v`.
async fn shows(v: &str, sight: &mut dyn Sight) -> Result<(), String> {
    loop {
        if sight.next_value().await?.as_deref() == Some(v) {
            return Ok(());
        }
    }
}

/// How the leader goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    Resign,
    Crash,
}

/// `n` times: a leader, a waiting candidate, an observer; the leader goes; the time until the
/// observer shows the candidate.
pub(crate) async fn failovers(
    e: Arc<dyn Elector>,
    n: u64,
    ending: Ending,
) -> Result<Sample, String> {
    let mut h = new_hist();
    let start = Instant::now();
    for i in 0..n {
        let name = fresh("elect");
        let (a, b) = (format!("a{i}"), format!("b{i}"));
        let leader = e.campaign(&name, &a).await?;
        let mut sight = e.observe(&name).await?;
        let limit = Duration::from_secs(60);
        tokio::time::timeout(limit, shows(&a, sight.as_mut()))
            .await
            .map_err(|_| "the observer never showed the first leader")??;
        let next = {
            let (e, name, b) = (e.clone(), name.clone(), b.clone());
            tokio::spawn(async move { e.campaign(&name, &b).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await; // the candidate queues
        let t0 = Instant::now();
        match ending {
            Ending::Resign => leader.resign().await?,
            Ending::Crash => leader.crash(),
        }
        tokio::time::timeout(limit, shows(&b, sight.as_mut()))
            .await
            .map_err(|_| "the observer never showed the next leader")??;
        h.saturating_record(ns(t0.elapsed()));
        let successor = next.await.map_err(|e| e.to_string())??;
        successor.resign().await?;
    }
    Ok(Sample {
        p50_us: Some(micros(&h, 0.5)),
        p99_us: Some(micros(&h, 0.99)),
        ops_per_sec: h.len() as f64 / start.elapsed().as_secs_f64(),
        ops: h.len(),
        requests_per_op: None,
        errors: 0,
    })
}
