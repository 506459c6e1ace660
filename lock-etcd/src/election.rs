//! An election over the lock's keys, laid out as etcd's own `concurrency.Election` lays it
//! out: the leader is the oldest contender's key under `<prefix>/<name>/`, its value the
//! leader's proposal, its `create_revision` the term. So `etcdctl elect NAME PROPOSAL` and
//! distlock's election on one prefix are one election.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, WatchOptions, WatchStream};
use lock_core::driver::{queue_turn, Turn};
use lock_core::{
    Change, ChangeFeed, Error, FencingToken, Leader, LeaderValue, LockName, Mode, Result,
};

use crate::client::{map_error, txn_call, Cluster};
use crate::config::BACKEND;
use crate::layout::{contenders, dir, range_up_to};

/// The oldest contender, if its turn has come and it holds exclusively: its value, its
/// `create_revision` as the term, and its lease's remaining TTL.
pub(crate) async fn leader(c: &Cluster, name: &LockName) -> Result<Option<Leader>> {
    let dir = dir(&c.config, name);
    let range = c
        .call(|mut cl| {
            let dir = dir.clone();
            async move { cl.get(dir, Some(range_up_to(0))).await }
        })
        .await?;
    let queue = contenders(&dir, range.kvs());
    let modes: Vec<Mode> = queue.iter().map(|(_, m)| *m).collect();
    let Some((kv, Mode::Exclusive)) = queue.first() else {
        return Ok(None);
    };
    if queue_turn(&modes, 0) != Turn::Granted {
        return Ok(None);
    }
    let lease = kv.lease();
    let remaining = c
        .call(|mut cl| async move { cl.lease_time_to_live(lease, None).await })
        .await
        .ok()
        .and_then(|r| u64::try_from(r.ttl()).ok())
        .map(Duration::from_secs);
    let term = u64::try_from(kv.create_revision())
        .map(FencingToken::new)
        .map_err(|_| Error::backend(BACKEND, "a key with a negative create_revision"))?;
    Ok(Some(Leader::new(
        LeaderValue::read(kv.value()),
        term,
        remaining,
    )))
}

/// Changes the value of the key created at `rev` to `value`, if that key still exists: the
/// compare and the put are one transaction, as etcd's `Election.Proclaim`. The key keeps its
/// lease.
pub(crate) async fn proclaim(
    c: &Cluster,
    key: &str,
    rev: i64,
    name: &LockName,
    value: &LeaderValue,
) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, rev)])
        .and_then([TxnOp::put(
            key,
            value.as_bytes(),
            Some(PutOptions::new().with_ignore_lease()),
        )]);
    let resp = txn_call(&c.config, &c.client, txn).await?;
    c.observe(resp.header());
    if resp.succeeded() {
        Ok(())
    } else {
        Err(Error::not_held(name))
    }
}

/// A watch on the name's range: every put (a contender, a proclaim) and every deletion (a
/// release, a lapse: etcd deletes the key of an expired lease) under it.
pub(crate) async fn watch(c: &Cluster, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
    let dir = dir(&c.config, name);
    let stream = c
        .call(|mut cl| {
            let dir = dir.clone();
            async move { cl.watch(dir, Some(WatchOptions::new().with_prefix())).await }
        })
        .await?;
    Ok(Box::new(Feed {
        stream,
        config: c.config.clone(),
    }))
}

struct Feed {
    stream: WatchStream,
    config: crate::EtcdConfig,
}

#[async_trait]
impl ChangeFeed for Feed {
    /// Cancel-safe: the stream keeps what arrives while nobody asks.
    async fn changed(&mut self) -> Result<Change> {
        loop {
            match self.stream.message().await {
                Ok(Some(resp)) if resp.canceled() => {
                    // Compacted past, or the watch ended: the observer makes a new one.
                    return Err(Error::unavailable(BACKEND, "the watch was cancelled"));
                }
                Ok(Some(resp)) if !resp.events().is_empty() => return Ok(Change::Notified),
                // The watch's creation, or a progress notice.
                Ok(Some(_)) => {}
                Ok(None) => return Err(Error::unavailable(BACKEND, "the watch ended")),
                // Every error ends the stream: retryable, whatever its kind, so the observer
                // makes a new watch (a refused credential shows again when it does).
                Err(e) => {
                    let e = map_error(e, &self.config);
                    return Err(Error::unavailable(BACKEND, e));
                }
            }
        }
    }

    fn reports_expiry(&self) -> bool {
        true
    }
}
