//! Refusing a transaction-pooling proxy (PgBouncer's `pool_mode = transaction`, say) before the
//! first grant: it hands each transaction to whichever server connection is free, so a session
//! advisory lock lands on a server connection this client does not own and stays there, held,
//! after the client lets go.
//!
//! The probe must not depend on which server connection such a pooler hands out next: other
//! clients, and server connections that finish logging in, change that at any moment. So it
//! makes the pooler show itself either way. A second connection opens a transaction: served by
//! the first one's backend, or seeing the first one's session setting, it gives the pooler
//! away. Otherwise it ends that transaction, which puts its backend back in a pooler's hands
//! (PgBouncer hands the one freed last out first), and the first connection's next statement
//! must still run on its own backend, with its own setting. On an idle pooler that is certain;
//! where other clients share it, they may take that backend first, so the probe goes round a
//! few times. A direct connection, or a proxy
//! that keeps sessions (a TCP proxy, `pool_mode = session`), passes every step. Only simple
//! queries are sent: a pooler that moves a connection between backends loses its prepared
//! statements, and that error would hide the explanation below.

use std::time::Duration;

use lock_core::{Error, Result};
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::client::{Opened, Opener};
use crate::config::BACKEND;

/// What the errors of a probe that was not answered call it.
const CHECK: &str = "the pooler check";

/// Rounds of the probe. One is enough on an idle pooler; where other clients keep taking and
/// freeing its server connections, each round catches it on its own most of the time (figures
/// in RELIABILITY.md).
const ROUNDS: usize = 3;

/// The backend that runs the statement, and the probe's setting in its session.
const LOOK: &str = "SELECT pg_backend_pid(), current_setting('distlock.probe', true)";

impl Opener {
    /// `Err(Config)` naming the fix if `first` goes through a transaction-pooling proxy. Each
    /// statement is bounded as every request is, and the second connection's login as every
    /// login: the whole takes ten round trips and a login, which one bound for all of it
    /// (three request bounds) did not fit through a link with a 200 ms delay each way.
    pub(crate) async fn refuse_pooler(&self, first: &Opened) -> Result<()> {
        let marker = marker(first.pid);
        // The marker is digits and a dash: safe inside the literal.
        let set =
            format!("SELECT pg_backend_pid(), set_config('distlock.probe', '{marker}', false)");
        let hopped = |pid: i32| {
            self.pooled(format!(
                "one connection's statements ran on backends {} and {pid}",
                first.pid
            ))
        };
        let shared = || {
            self.pooled(format!(
                "a second connection was served by the first one's backend, pid {}",
                first.pid
            ))
        };
        let (pid, _) = self.look(&first.client, &set).await?;
        if pid != first.pid {
            return hopped(pid);
        }
        let second = self.open().await?;
        if second.pid == first.pid {
            return shared();
        }
        for _ in 0..ROUNDS {
            let begin = format!("BEGIN; {LOOK}");
            let (pid, seen) = match look(&second.client, &begin, self.request_bound()).await {
                Ok(r) => r,
                Err(Looked::Sql(e)) if e.code().is_some() => {
                    // A statement-pooling proxy refuses the transaction itself.
                    return self.pooled(format!("a transaction was refused: {}", self.scrub(&e)));
                }
                Err(e) => return Err(self.looked(e)),
            };
            if pid == first.pid || seen.as_deref() == Some(marker.as_str()) {
                return shared();
            }
            let rollback = async {
                let done = second.client.simple_query("ROLLBACK").await;
                done.map_err(|e| self.error(e))
            };
            self.within(CHECK, self.request_bound(), rollback).await?;
            let (pid, seen) = self.look(&first.client, LOOK).await?;
            if pid != first.pid {
                return hopped(pid);
            }
            if seen.as_deref() != Some(marker.as_str()) {
                // Same backend, but its session was reset under the client: as bad.
                return self.pooled(format!(
                    "the first connection's session setting was gone at its next statement, on \
                     backend {pid}"
                ));
            }
        }
        Ok(())
    }

    async fn look(&self, client: &Client, sql: &str) -> Result<(i32, Option<String>)> {
        let looked = look(client, sql, self.request_bound()).await;
        looked.map_err(|e| self.looked(e))
    }

    fn looked(&self, e: Looked) -> Error {
        match e {
            Looked::Sql(e) => self.error(e),
            Looked::Odd(what) => self.odd(what),
            Looked::Late(bound) => Error::unavailable(
                BACKEND,
                format!(
                    "{}: no answer to {CHECK} within {bound:?}",
                    self.config.redacted_url()
                ),
            ),
        }
    }

    fn pooled(&self, why: String) -> Result<()> {
        Err(Error::config(format!(
            "{} goes through a transaction-pooling proxy ({why}): a session advisory lock would \
             stay on a server connection this client no longer has. Connect to PostgreSQL \
             directly, or through a pool in session mode (PgBouncer: pool_mode = session)",
            self.config.redacted_url()
        )))
    }
}

/// Why a probe statement gave no answer.
enum Looked {
    Sql(tokio_postgres::Error),
    Odd(&'static str),
    /// None within this bound.
    Late(Duration),
}

/// The last row `sql` returns within `bound`: a backend pid and a setting.
async fn look(
    client: &Client,
    sql: &str,
    bound: Duration,
) -> std::result::Result<(i32, Option<String>), Looked> {
    let answer = tokio::time::timeout(bound, client.simple_query(sql)).await;
    let messages = answer
        .map_err(|_| Looked::Late(bound))?
        .map_err(Looked::Sql)?;
    let row = messages
        .iter()
        .rev()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .ok_or(Looked::Odd("no row in the pooler probe's reply"))?;
    let pid = row.get(0).and_then(|p| p.parse().ok()).ok_or(Looked::Odd(
        "unreadable backend pid in the pooler probe's reply",
    ))?;
    Ok((pid, row.get(1).filter(|s| !s.is_empty()).map(str::to_owned)))
}

/// A value for the probe's session setting, unique enough per connection attempt.
fn marker(pid: i32) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{pid}-{nanos}")
}
