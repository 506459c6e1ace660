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

use crate::client::{Opened, Opener};
use crate::config::BACKEND;
use crate::keys::advisory_key;
use crate::keys::channel;

/// The exclusive holder of `name`, its value and its term; `frees` is how long a vanished
/// holder's lock lasts (the observer's next look, as nothing announces a session's end).
///
/// A holder whose counter row is not its own is read again a few times: a grant takes the
/// lock before its statement's row commits, and a read in between sees the new holder beside
/// the last one's row. One that stays so may still be a distlock grant in progress (its row
/// held by a transaction that has not ended: a holder's release or proclaim cut off mid-way
/// keeps it until its session ends) or another client than distlock, which has no term: the
/// server cannot tell the two apart, so the answer is a retryable `Unavailable` (an observer
/// reads again), never `Unsupported`, which would end an observer for good.
pub(crate) async fn leader(
    opener: &Opener,
    name: &LockName,
    frees: Duration,
) -> Result<Option<Leader>> {
    for pause in [10, 20, 40, 80, 160].map(Duration::from_millis) {
        match read_leader(opener, name).await? {
            Read::Nobody => return Ok(None),
            Read::Ours(token, value) => {
                let value = value.as_deref().map(LeaderValue::read).unwrap_or_default();
                return Ok(Some(Leader::new(value, token, Some(frees))));
            }
            Read::NotOurs => tokio::time::sleep(pause).await,
        }
    }
    Err(Error::unavailable(
        BACKEND,
        format!(
            "the holder of {name} has no committed grant: a distlock grant still in progress \
             (read again), or another client than distlock, which has no term"
        ),
    ))
}

enum Read {
    Nobody,
    Ours(FencingToken, Option<Vec<u8>>),
    NotOurs,
}

async fn read_leader(opener: &Opener, name: &LockName) -> Result<Read> {
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
        return Ok(Read::Nobody);
    };
    let token: Option<i64> = row.try_get(0).unwrap_or(None);
    let value: Option<Vec<u8>> = row.try_get(1).unwrap_or(None);
    let ours: bool = row.try_get(2).unwrap_or(false);
    Ok(
        match token.filter(|_| ours).and_then(|t| u64::try_from(t).ok()) {
            Some(t) => Read::Ours(FencingToken::new(t), value),
            None => Read::NotOurs,
        },
    )
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
