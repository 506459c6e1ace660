//! The backend half of a held Redis lock: renew and release, each one owner-checked script —
//! the lock key's for an exclusive holder, the group's member for a shared holder or a permit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{lease_end, LeaseOps};
use lock_core::{Error, Mode, Result};

use crate::client::RedisNode;
use crate::family::{self, Held};
use crate::scripts::{self, LockKeys};

pub(crate) struct RedisLeaseOps {
    /// Behind sentinels: the node's count of failovers, as it was when the grant was asked
    /// for (see [`LeaseOps::doubts`]).
    pub(crate) doubts: Option<tokio::sync::watch::Receiver<u64>>,
    pub(crate) keys: Arc<LockKeys>,
    /// The owner token (exclusive), or the group member `<fence>:<token>`.
    pub(crate) token: Arc<str>,
    pub(crate) mode: Mode,
    /// Granted with an election's value: the value key is renewed with the lock.
    pub(crate) valued: bool,
    pub(crate) ttl: Duration,
    pub(crate) timeout: Duration,
    pub(crate) node: RedisNode,
}

#[async_trait]
impl LeaseOps for RedisLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.keys.lock.clone())
    }

    fn doubts(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.doubts.clone()
    }

    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let switches = self.node.switches();
        // The renewal and its WAIT (`wait_replicas`) in one pipeline, to one server: a
        // renewal a failover forgets would leave the lease's key to expire early on the new
        // master.
        let mut conn = self.node.acknowledged();
        let renewing = async {
            let renewed = match self.mode {
                Mode::Exclusive => {
                    let (keys, token) = (&self.keys, &self.token);
                    scripts::renew(&mut conn, keys, token, self.ttl, self.valued).await
                }
                mode => family::renew(&mut conn, &self.keys, &self.token, self.ttl, mode).await,
            }?;
            Ok::<_, redis::RedisError>((renewed, !renewed || conn.replicated()))
        };
        match tokio::time::timeout(self.timeout, renewing).await {
            Ok(Ok(_)) if self.node.switches() != switches => Err(self.node.unavailable(
                "the master changed while the renewal was on its way: it confirms nothing",
            )),
            Ok(Ok((true, true))) => Ok(lease_end(start, self.ttl)),
            Ok(Ok((true, false))) => Err(self.node.unavailable(&format!(
                "{} the renewal in time",
                crate::acknowledged::short_of(self.node.config())
            ))),
            Ok(Ok((false, _))) => Err(Error::not_held(&self.keys.name())),
            Ok(Err(e)) => Err(self.node.error(&e)),
            Err(_) => Err(self.node.unavailable("renew timed out")),
        }
    }

    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        let mut conn = self.node.connection();
        let setting = scripts::proclaim(&mut conn, &self.keys, &self.token, value.as_bytes());
        match tokio::time::timeout(self.timeout, setting).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Error::not_held(&self.keys.name())),
            Ok(Err(e)) => Err(self.node.error(&e)),
            Err(_) => Err(self.node.unavailable("proclaim timed out")),
        }
    }

    async fn release(&self) -> Result<()> {
        // A release a deposed master answered (sent before the node moved) freed nothing on
        // the new one: sent again there (owner-checked, so once it did land nothing changes).
        let mut tries = 0;
        loop {
            let switches = self.node.switches();
            let released = self.release_once().await;
            tries += 1;
            if self.node.switches() == switches || tries == 3 {
                return released;
            }
        }
    }
}

impl RedisLeaseOps {
    async fn release_once(&self) -> Result<()> {
        let mut conn = self.node.connection();
        let releasing = async {
            match self.mode {
                Mode::Exclusive => scripts::release(&mut conn, &self.keys, &self.token).await,
                mode => {
                    family::release(&mut conn, &self.keys, &Held::Member(&self.token), mode).await
                }
            }
        };
        match tokio::time::timeout(self.timeout, releasing).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Error::not_held(&self.keys.name())),
            Ok(Err(e)) => Err(self.node.error(&e)),
            Err(_) => Err(self.node.unavailable("release timed out")),
        }
    }
}
