//! Baseline for the ZooKeeper driver: `zookeeper-client`'s own lock recipe on the same servers.

use async_trait::async_trait;
use zookeeper_client::{Acls, Client, CreateMode, LockOptions, LockPrefix, OwnedLockClient};

use crate::subject::{Guard, Subject};

/// `Client::lock` with a Curator-style prefix; its handle deletes the node in the background
/// when dropped, which is how it is released.
pub(crate) struct ZkRecipe {
    client: Client,
    label: String,
}

impl ZkRecipe {
    pub(crate) async fn connect(hosts: &str, label: &str) -> Result<Self, String> {
        let client = Client::connect(hosts).await.map_err(|e| e.to_string())?;
        Ok(ZkRecipe {
            client,
            label: format!("baseline: zookeeper-client Client::lock ({label})"),
        })
    }
}

struct RecipeGuard(#[allow(dead_code)] OwnedLockClient);

#[async_trait]
impl Guard for RecipeGuard {
    async fn unlock(self: Box<Self>) -> Result<(), String> {
        Ok(()) // dropping the handle deletes the node (in the background)
    }
}

#[async_trait]
impl Subject for ZkRecipe {
    fn label(&self) -> String {
        self.label.clone()
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let dir = format!("/bench-recipe/{name}");
        let prefix = LockPrefix::new_curator(&dir, "lock-").map_err(|e| e.to_string())?;
        let options = LockOptions::new(Acls::anyone_all())
            .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
            .map_err(|e| e.to_string())?;
        let lock = self
            .client
            .lock(prefix, b"", options)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Box::new(RecipeGuard(lock.into_owned())))
    }
}
