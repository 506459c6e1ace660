//! The backend half of a held ZooKeeper lock: the session keeps it; release deletes the node.

use std::time::Instant;

use async_trait::async_trait;
use lock_core::driver::LeaseOps;
use lock_core::{Error, LockName, Result};
use zookeeper_client::Client;

use crate::client::{map_error, transient, until_definite};
use crate::config::BACKEND;
use crate::confirm::{Confirmation, Pace};
use crate::ZkConfig;

pub(crate) struct ZkLeaseOps {
    pub(crate) name: LockName,
    pub(crate) client: Client,
    pub(crate) path: String,
    pub(crate) session: i64,
    pub(crate) pace: Pace,
    pub(crate) config: ZkConfig,
}

impl ZkLeaseOps {
    fn error(&self, e: zookeeper_client::Error) -> Error {
        map_error(e, &self.config, Some(&self.name))
    }
}

#[async_trait]
impl LeaseOps for ZkLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.path.clone())
    }

    async fn renew(&self) -> Result<Instant> {
        match self
            .pace
            .confirm(&self.client, &self.path, self.session)
            .await
        {
            Ok(Confirmation::Until(t)) => Ok(t),
            Ok(Confirmation::Late) => Err(Error::unavailable(
                BACKEND,
                "the confirmation came back too late to vouch for the session",
            )),
            Ok(Confirmation::Gone) => Err(Error::not_held(&self.name)),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Sets the node's data: this session's own node (its name is unique), so a node that is
    /// gone is a leadership that ended.
    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        match self
            .client
            .set_data(&self.path, value.as_bytes(), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => Err(Error::not_held(&self.name)),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Deletes the node; a delete lost with the connection is retried (in a task of its own,
    /// which a cancelled `release` does not stop) until it succeeds or the session ends. Waits
    /// for that at most one session timeout: then `Unavailable`, and the retries go on.
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        let first = self.client.delete(&self.path, None).await;
        match first {
            Ok(()) => return Ok(()),
            Err(zookeeper_client::Error::NoNode) => return Err(Error::not_held(&self.name)),
            Err(ref e) if !transient(e) => return Err(self.error(e.clone())),
            Err(_) => {}
        }
        let Some(deleting) = delete_in_background(&self.client, &self.path) else {
            return Err(Error::unavailable(
                BACKEND,
                "no runtime to retry the delete on",
            ));
        };
        match tokio::time::timeout(self.pace.session_timeout, deleting).await {
            // After a lost request, "no node" is most likely that request having landed.
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(e))) => Err(self.error(e)),
            Ok(Err(_)) => Err(Error::unavailable(BACKEND, "the delete task failed")),
            Err(_) => Err(Error::unavailable(
                BACKEND,
                format!(
                    "lock node {} not deleted within {:?} (connection lost); retrying until the \
                     session ends",
                    self.path, self.pace.session_timeout
                ),
            )),
        }
    }

    fn lapses_without_renewal(&self) -> bool {
        false
    }

    /// The session is shared by every lock of the client, so it cannot be left to expire for
    /// one lock: abandoning deletes the node in the background, as dropping does.
    fn abandon(&self) {
        drop(delete_in_background(&self.client, &self.path));
    }
}

/// Deletes this session's node at `path` in a task of its own, retrying until it is gone or
/// the session has ended (which removes it too): a delete lost with the connection would
/// otherwise leave the node — and the lock — held for the life of the session. The task
/// outlives a cancelled caller; `Ok(true)`: deleted now, `Ok(false)`: already gone.
pub(crate) fn delete_in_background(
    client: &Client,
    path: &str,
) -> Option<tokio::task::JoinHandle<std::result::Result<bool, zookeeper_client::Error>>> {
    let rt = tokio::runtime::Handle::try_current().ok()?; // none: the node goes with the session
    let (client, path) = (client.clone(), path.to_string());
    Some(rt.spawn(async move {
        let r = until_definite(&client, || client.delete(&path, None)).await;
        match r {
            Ok(()) => Ok(true),
            Err(zookeeper_client::Error::NoNode) => Ok(false),
            Err(_) if client.state().is_terminated() => Ok(false),
            Err(e) => {
                tracing::warn!(node = %path, error = %e, "could not delete a lock node");
                Err(e)
            }
        }
    }))
}
