//! An election over the advisory lock: the session holding the name's key exclusively leads,
//! its counter row holds its value (written by the grant's own statement, `value` column) and
//! its token, the term. Grants with a value, proclaims and a leader's release are announced
//! with `pg_notify` on the key's channel (`distlock_<key in hex>`), which observers `LISTEN` to
//! on a connection of their own. A session that ends without a release (a crash, a terminate)
//! is announced by nobody: observers read again when the session bound has passed.

use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Change, ChangeFeed, Error, FencingToken, Leader, LeaderValue, LockName, Result};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::client::{advisory_key, Opened, Opener};
use crate::config::BACKEND;
use crate::session::channel;

/// The exclusive holder of `name`, its value and its term; `frees` is how long a vanished
/// holder's lock lasts (the observer's next look, as nothing announces a session's end).
pub(crate) async fn leader(
    opener: &Opener,
    name: &LockName,
    frees: Duration,
) -> Result<Option<Leader>> {
    let session = match opener.idle.take() {
        Some(s) => s,
        None => opener.session().await?,
    };
    let rows = opener
        .answered(
            "the leader query",
            opener.request_bound(),
            session
                .client
                .query(&opener.sql.leader, &[&advisory_key(name), &name.as_str()]),
        )
        .await?;
    opener.idle.put_back(session);
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let token: Option<i64> = row.try_get(0).unwrap_or(None);
    let value: Option<Vec<u8>> = row.try_get(1).unwrap_or(None);
    let ours: bool = row.try_get(2).unwrap_or(false);
    let term = token
        .filter(|_| ours)
        .and_then(|t| u64::try_from(t).ok())
        .map(FencingToken::new)
        .ok_or(Error::Unsupported {
            backend: BACKEND,
            operation: "a leader that is another client than distlock (it has no term)",
        })?;
    let value = value.as_deref().map(LeaderValue::read).unwrap_or_default();
    Ok(Some(Leader::new(value, term, Some(frees))))
}

/// `LISTEN` on the name's channel, on a connection of its own.
pub(crate) async fn watch(opener: &Opener, name: &LockName) -> Result<Box<dyn ChangeFeed>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let opened = opener.open_with(Some(tx)).await?;
    let listen = format!("LISTEN \"{}\"", channel(advisory_key(name)));
    opener
        .answered(
            "the LISTEN",
            opener.request_bound(),
            opened.client.batch_execute(&listen),
        )
        .await?;
    Ok(Box::new(Feed {
        _opened: opened,
        rx,
    }))
}

struct Feed {
    /// The listening connection, open as long as the feed lives.
    _opened: Opened,
    rx: UnboundedReceiver<tokio_postgres::Notification>,
}

#[async_trait]
impl ChangeFeed for Feed {
    async fn changed(&mut self) -> Result<Change> {
        match self.rx.recv().await {
            Some(_) => Ok(Change::Notified),
            // The connection's task ended: the observer listens again on a new one.
            None => Err(Error::unavailable(
                BACKEND,
                "the listening connection closed",
            )),
        }
    }
}
