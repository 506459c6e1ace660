//! Baselines for the etcd driver, on the same members in the same run:
//! - etcd's own `Lock`/`Unlock` RPC (v3lock), each caller with its own lease that a background
//!   task keeps alive — the server-side recipe used as it is meant to be;
//! - the raw floor: a create-if-absent `Txn` with a kept-alive lease, then a `Delete` — the
//!   least a correct etcd lock can do (no queue, no waiting, no fencing check).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock::lock_etcd::etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::subject::{Guard, Subject};

const LEASE_TTL: i64 = 60;
/// Free leases kept for reuse; more are revoked, so that idle keep-alives stay few.
const SPARE: usize = 8;

/// Leases the baselines hold, kept alive every 20 s by one task that ends with the subject.
struct Leases {
    client: Client,
    all: Arc<Mutex<Vec<i64>>>,
    free: Mutex<Vec<i64>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Leases {
    fn new(client: Client) -> Self {
        let all: Arc<Mutex<Vec<i64>>> = Arc::default();
        let (c, ids) = (client.clone(), all.clone());
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(20)).await;
                let ids: Vec<i64> = ids.lock().map(|v| v.clone()).unwrap_or_default();
                for id in ids {
                    let _ = c.clone().lease_keep_alive(id).await;
                }
            }
        });
        Leases {
            client,
            all,
            free: Mutex::default(),
            keeper,
        }
    }

    /// A lease no other holder of this subject uses right now.
    async fn take(&self) -> Result<i64, String> {
        if let Some(id) = self.free.lock().map_err(|e| e.to_string())?.pop() {
            return Ok(id);
        }
        let id = self
            .client
            .clone()
            .lease_grant(LEASE_TTL, None)
            .await
            .map_err(|e| e.to_string())?
            .id();
        self.all.lock().map_err(|e| e.to_string())?.push(id);
        Ok(id)
    }

    async fn give_back(&self, id: i64) {
        if let Ok(mut free) = self.free.lock() {
            if free.len() < SPARE {
                free.push(id);
                return;
            }
        }
        if let Ok(mut all) = self.all.lock() {
            all.retain(|l| *l != id);
        }
        let _ = self.client.clone().lease_revoke(id).await;
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

async fn connect(endpoints: &[String]) -> Result<Client, String> {
    Client::connect(endpoints, None)
        .await
        .map_err(|e| e.to_string())
}

/// etcd's `Lock`/`Unlock` RPC.
pub(crate) struct LockRpc {
    leases: Arc<Leases>,
    label: String,
}

impl LockRpc {
    pub(crate) async fn connect(endpoints: &[String], label: &str) -> Result<Self, String> {
        Ok(LockRpc {
            leases: Arc::new(Leases::new(connect(endpoints).await?)),
            label: format!("baseline: etcd Lock/Unlock RPC, kept-alive lease ({label})"),
        })
    }
}

struct RpcGuard {
    leases: Arc<Leases>,
    key: Vec<u8>,
    lease: i64,
}

#[async_trait]
impl Guard for RpcGuard {
    async fn unlock(self: Box<Self>) -> Result<(), String> {
        let mut c = self.leases.client.clone();
        c.unlock(self.key.clone())
            .await
            .map_err(|e| e.to_string())?;
        self.leases.give_back(self.lease).await;
        Ok(())
    }
}

#[async_trait]
impl Subject for LockRpc {
    fn label(&self) -> String {
        self.label.clone()
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let lease = self.leases.take().await?;
        let mut c = self.leases.client.clone();
        let resp = c
            .lock(
                format!("/bench-rpc/{name}"),
                Some(distlock::lock_etcd::etcd_client::LockOptions::new().with_lease(lease)),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(Box::new(RpcGuard {
            leases: self.leases.clone(),
            key: resp.key().to_vec(),
            lease,
        }))
    }
}

/// Create-if-absent `Txn` + `Delete`: the raw floor (cannot wait).
pub(crate) struct TxnFloor {
    leases: Arc<Leases>,
    lease: i64,
    label: String,
}

impl TxnFloor {
    pub(crate) async fn connect(endpoints: &[String], label: &str) -> Result<Self, String> {
        let leases = Arc::new(Leases::new(connect(endpoints).await?));
        let lease = leases.take().await?;
        Ok(TxnFloor {
            leases,
            lease,
            label: format!("baseline: raw create-if-absent Txn + Delete ({label})"),
        })
    }
}

struct FloorGuard {
    client: Client,
    key: String,
}

#[async_trait]
impl Guard for FloorGuard {
    async fn unlock(self: Box<Self>) -> Result<(), String> {
        let mut c = self.client.clone();
        c.delete(self.key.as_str(), None)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[async_trait]
impl Subject for TxnFloor {
    fn label(&self) -> String {
        self.label.clone()
    }
    fn waits(&self) -> bool {
        false
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let key = format!("/bench-floor/{name}");
        let mut c = self.leases.client.clone();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        let resp = c.txn(txn).await.map_err(|e| e.to_string())?;
        if !resp.succeeded() {
            return Err(format!("{key} is held (the floor cannot wait)"));
        }
        Ok(Box::new(FloorGuard { client: c, key }))
    }
}
