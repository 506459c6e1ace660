//! An election over the lock key: the exclusive holder leads, its value lives beside the lock
//! in `<lock>:value` (stamped with the owner token, so that a value outliving its lock by a
//! millisecond is never read as a successor's), the fence counter is the term. Observers hear
//! releases on the lock's release channel and grants and proclaimed values on `<lock>:changed`,
//! on a connection of their own; a lapse, which Redis announces to nobody, they read when it
//! is due.

use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Change, ChangeFeed, Error, FencingToken, Leader, LeaderValue, Result};
use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::client::RedisNode;
use crate::scripts::{self, LockKeys, TOKEN_TAG};

/// The exclusive holder, its value (empty if it has none of its own) and its term.
pub(crate) async fn leader(node: &RedisNode, keys: &LockKeys) -> Result<Option<Leader>> {
    let mut conn = node.connection();
    let reading = scripts::read_leader(&mut conn, keys);
    let (holder, pttl, fence, value) =
        match tokio::time::timeout(node.config().request_timeout(), reading).await {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => return Err(node.error(&e)),
            Err(_) => return Err(node.unavailable("leader read timed out")),
        };
    let Some(holder) = holder.filter(|_| pttl != -2) else {
        return Ok(None);
    };
    if crate::family::group_mode(&holder).is_some() {
        return Ok(None); // readers or permits: nobody leads
    }
    if !holder.starts_with(TOKEN_TAG) {
        // The counter counts distlock's grants only: another client's lock has no term.
        return Err(Error::Unsupported {
            backend: crate::config::BACKEND,
            operation: "a leader that is another client than distlock (it has no term)",
        });
    }
    let term = fence
        .map(FencingToken::new)
        .ok_or_else(|| Error::backend(crate::config::BACKEND, "a holder without a fence"))?;
    let own = |v: &[u8]| {
        v.strip_prefix(format!("{holder} ").as_bytes())
            .map(LeaderValue::read)
    };
    let value = value.as_deref().and_then(own).unwrap_or_default();
    let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
    Ok(Some(Leader::new(value, term, remaining)))
}

/// A subscription to the name's releases and changes, on a connection of its own.
pub(crate) async fn watch(node: &RedisNode, keys: &LockKeys) -> Result<Box<dyn ChangeFeed>> {
    let (conn, rx) = node.subscriber(&[&keys.channel, &keys.changed]).await?;
    Ok(Box::new(Feed { _conn: conn, rx }))
}

struct Feed {
    /// Kept open for as long as the feed lives.
    _conn: ConnectionManager,
    rx: UnboundedReceiver<PushInfo>,
}

#[async_trait]
impl ChangeFeed for Feed {
    async fn changed(&mut self) -> Result<Change> {
        loop {
            let Some(push) = self.rx.recv().await else {
                return Err(Error::unavailable(
                    crate::config::BACKEND,
                    "the subscription ended",
                ));
            };
            match push.kind {
                PushKind::Message => return Ok(Change::Notified),
                // Messages may have been lost meanwhile; the connection resubscribes by itself.
                PushKind::Disconnection => return Ok(Change::Resumed),
                _ => {} // (un)subscription confirmations
            }
        }
    }
}
