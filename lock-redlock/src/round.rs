//! One request to every master at once, each bounded by the per-node timeout, counted as the
//! answers arrive so a caller can stop at a majority.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lock_core::Mode;
use lock_redis::raw::scripts::LockKeys;
use lock_redis::raw::RedisNode;
use lock_redis::Conn;

/// One master's answer: the request's result, or the per-node timeout elapsed.
pub(crate) type NodeReply<T> =
    std::result::Result<redis::RedisResult<T>, tokio::time::error::Elapsed>;

/// One request to each of several masters, all in flight at once, each bounded by the per-node
/// timeout; answers are taken as they arrive, so a caller can stop at a majority.
pub(crate) struct Round<T> {
    pub(crate) pending: FuturesUnordered<BoxFuture<'static, (usize, NodeReply<T>)>>,
}

impl<T: Send + 'static> Round<T> {
    /// Sends `request` to every master.
    pub(crate) fn new<F, Fut>(nodes: &[RedisNode], node_timeout: Duration, request: F) -> Self
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'static,
    {
        Self::on(nodes, &vec![false; nodes.len()], node_timeout, |_, c| {
            request(c)
        })
    }

    /// Sends `request(index, connection)` to every master whose `skip` entry is false (a
    /// reader's member differs from master to master).
    pub(crate) fn on<F, Fut>(
        nodes: &[RedisNode],
        skip: &[bool],
        node_timeout: Duration,
        request: F,
    ) -> Self
    where
        F: Fn(usize, Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'static,
    {
        let pending = nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| !skip.get(*i).copied().unwrap_or(false))
            .map(|(i, n)| {
                let reply = tokio::time::timeout(node_timeout, request(i, n.connection()));
                Box::pin(async move { (i, reply.await) }) as BoxFuture<'static, _>
            })
            .collect();
        Round { pending }
    }

    /// The next answer (master index, reply); `None` once every master answered.
    pub(crate) async fn next(&mut self) -> Option<(usize, NodeReply<T>)> {
        self.pending.next().await
    }

    /// Lets the requests still in flight run to their answer or timeout in a background task,
    /// so a release or renewal reaches every master that answers even after the caller moved
    /// on. The task lives at most one per-node timeout.
    pub(crate) fn finish_in_background(self) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = self.pending;
        // Always inside a runtime here (the requests use its timers); never panic if not.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { while pending.next().await.is_some() {} });
        }
    }
}

/// The release script for one master, owning what it needs (for [`Round`]): `token`'s hold of
/// `mode`, found by its token (a reader's member has each master's own fence).
pub(crate) fn release_request(
    keys: &Arc<LockKeys>,
    token: &Arc<str>,
    mode: Mode,
) -> impl Fn(Conn) -> BoxFuture<'static, redis::RedisResult<bool>> {
    let (keys, token) = (keys.clone(), token.clone());
    move |mut c| {
        let (keys, token) = (keys.clone(), token.clone());
        Box::pin(async move { lock_redis::raw::release_any(&mut c, &keys, &token, mode).await })
    }
}

/// Counts a compare-and-act round (release, renew) until `quorum` masters said yes or every
/// master answered; returns (yes, no, failed) and the requests still in flight.
pub(crate) async fn until_quorum(
    mut round: Round<bool>,
    quorum: usize,
) -> ((usize, usize, usize), Round<bool>) {
    let (mut yes, mut no, mut failed) = (0, 0, 0);
    while let Some((_, r)) = round.next().await {
        match r {
            Ok(Ok(true)) => yes += 1,
            Ok(Ok(false)) => no += 1,
            _ => failed += 1,
        }
        if yes >= quorum {
            break;
        }
    }
    ((yes, no, failed), round)
}
