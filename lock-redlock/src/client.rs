//! Connecting to the masters, and checking each one (no eviction, not one server under two
//! names) whenever its connection was re-established.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lock_core::{Error, LockName, Result};
use lock_redis::raw::scripts::LockKeys;
use lock_redis::raw::RedisNode;

use crate::config::BACKEND;
use crate::RedlockConfig;

/// The masters of one client: their connections and the configuration they were made from.
pub(crate) struct Masters {
    pub(crate) config: RedlockConfig,
    pub(crate) nodes: Arc<[RedisNode]>,
}

impl Masters {
    /// Connects to every master in parallel. Succeeds when a majority answers; masters that are
    /// down are retried in the background. Rejected credentials on any master are a
    /// [`Error::Config`]; fewer than a majority reachable is [`Error::Unavailable`].
    pub(crate) async fn connect(config: RedlockConfig) -> Result<Self> {
        config.check()?;
        // One release is announced by every master that held it; count it once.
        let dedup = lock_redis::raw::ReleaseDedup::default();
        let mut nodes: Vec<RedisNode> = Vec::with_capacity(config.masters().len());
        for m in config.masters() {
            nodes.push(RedisNode::lazy_shared(m.clone(), BACKEND, dedup.clone()).await?);
        }
        // One INFO per master: reachable, credentials accepted, no eviction, and its identity.
        let checks = join_all(
            nodes
                .iter()
                .map(|n| n.verify(n.config().connect_timeout() + n.config().request_timeout())),
        )
        .await;
        let mut reachable = 0;
        let mut down = Vec::new();
        for (node, r) in nodes.iter().zip(checks) {
            match r {
                Ok(()) => reachable += 1,
                Err(e @ (Error::Config { .. } | Error::Unauthenticated { .. })) => return Err(e),
                Err(_) => down.push(node.config().redacted_url()),
            }
        }
        same_server_twice(&nodes)?;
        if reachable < config.quorum() {
            return Err(Error::unavailable(
                BACKEND,
                format!(
                    "only {reachable} of {} masters answered (need {}); down: {}",
                    nodes.len(),
                    config.quorum(),
                    down.join(", ")
                ),
            ));
        }
        if !down.is_empty() {
            tracing::warn!(down = ?down, "Redlock starts with masters down; they are retried");
        }
        Ok(Masters {
            config,
            nodes: nodes.into(),
        })
    }

    /// The keys of `name`'s lock on every master.
    pub(crate) fn keys(&self, name: &LockName) -> Arc<LockKeys> {
        Arc::new(LockKeys::new(self.config.masters()[0].prefix(), name))
    }

    /// Checks, in parallel and within `node_timeout`, every master whose connection dropped
    /// since its last check (see [`RedisNode::verify`]): the server behind an address may be
    /// another one now. Returns which masters are still unchecked (unreachable: no vote this
    /// time). A master whose check failed less than `retry_delay` ago is not tried again yet,
    /// so a master that is down costs an acquire at most one `node_timeout` per `retry_delay`.
    /// [`Error::Config`] for a master that may evict keys, or one server listed twice.
    pub(crate) async fn verify(&self, node_timeout: Duration) -> Result<Vec<bool>> {
        let nodes = &self.nodes;
        let pause = self.config.retry_delay();
        let due = |n: &RedisNode| {
            n.needs_verify()
                && n.last_verify_attempt()
                    .map_or(true, |t| t.elapsed() >= pause)
        };
        let checks = join_all(nodes.iter().map(|n| async move {
            if due(n) {
                n.verify(node_timeout).await
            } else {
                Ok(())
            }
        }))
        .await;
        let mut unchecked = Vec::with_capacity(nodes.len());
        for (n, r) in nodes.iter().zip(checks) {
            match r {
                Err(e @ (Error::Config { .. } | Error::Unauthenticated { .. })) => return Err(e),
                _ => unchecked.push(n.is_stale()),
            }
        }
        same_server_twice(nodes)?;
        Ok(unchecked)
    }
}

/// Refuses masters that are one server under two names (`localhost` and `127.0.0.1`, two
/// addresses of one host): by `run_id`, which is unique per server process. It would count
/// twice towards the majority, so one server could grant the lock alone.
pub(crate) fn same_server_twice(nodes: &[RedisNode]) -> Result<()> {
    let mut seen: std::collections::HashMap<Arc<str>, &RedisNode> = Default::default();
    for n in nodes {
        let Some(id) = n.run_id() else { continue };
        if let Some(first) = seen.insert(id.clone(), n) {
            return Err(Error::config(format!(
                "masters {} and {} are the same Redis server (run_id {id}): it would count twice \
                 towards the majority",
                first.config().redacted_url(),
                n.config().redacted_url()
            )));
        }
    }
    Ok(())
}
