//! The backend half of a held PostgreSQL lock: its session keeps it; a confirmation proves
//! the session (and the lock in it) alive; release unlocks and gives the session back.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use lock_core::driver::{drift, LeaseOps};
use lock_core::{Error, LockName, Result};

use crate::client::Opener;
use crate::config::BACKEND;
use crate::keys::Held;
use crate::polling::Waiting;
use crate::session::Session;
use crate::shared::SharedSession;

pub(crate) struct PgLeaseOps {
    opener: Arc<Opener>,
    /// The session holding the lock; taken out by release (or abandon).
    session: parking_lot::Mutex<Option<Arc<Session>>>,
    key: i64,
    name: LockName,
    /// The keys the grant took, which the release lets go of.
    held: Held,
    /// Granted with an election's value: its release is announced to observers.
    valued: bool,
    /// The lease's current `valid_until`, as the confirmations moved it.
    valid_until: parking_lot::Mutex<Instant>,
    /// The session is shared with other leases (`shared_sessions`): it is not closed when
    /// this lease ends, so its key is unlocked (or, if that fails, the session is ended).
    shared: Option<Arc<SharedSession>>,
    /// The waiting slot its session took (`wait_sessions`), kept while the lock is held.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The client's pollers (`wait_sessions`), woken when this lease lets go.
    pollers: Option<Arc<Waiting>>,
}

impl PgLeaseOps {
    pub(crate) fn new(
        opener: Arc<Opener>,
        session: Arc<Session>,
        held: Held,
        name: LockName,
        valued: bool,
        valid_until: Instant,
    ) -> Self {
        PgLeaseOps {
            opener,
            session: parking_lot::Mutex::new(Some(session)),
            key: held.key(),
            name,
            held,
            valued,
            valid_until: parking_lot::Mutex::new(valid_until),
            shared: None,
            _slot: None,
            pollers: None,
        }
    }

    /// A lease whose letting go wakes `pollers` of its name.
    pub(crate) fn waking(mut self, pollers: &Arc<Waiting>) -> Self {
        self.pollers = Some(pollers.clone());
        self
    }

    /// A lease granted on a session that took a waiting slot (`wait_sessions`): the slot is
    /// the lease's until it ends.
    pub(crate) fn in_slot(mut self, slot: Option<tokio::sync::OwnedSemaphorePermit>) -> Self {
        self._slot = slot;
        self
    }

    /// A lease on a shared session, whose key is claimed there.
    pub(crate) fn on_shared(mut self, shared: Arc<SharedSession>) -> Self {
        *self.session.get_mut() = Some(shared.session.clone());
        self.shared = Some(shared);
        self
    }

    /// The lease is over while its session may still hold the lock: a session of its own is
    /// closed (dropped); a shared one, whose other leases live on, is ended as well, since
    /// its requests go unanswered or the lock cannot be vouched for.
    fn close(&self) {
        if let (Some(_), Some(shared)) = (self.take(), &self.shared) {
            shared.close();
        }
    }

    /// The server let go of the key for this session (an unlock answered, or a check that
    /// found it not held): another lease may ask for it on the shared session.
    fn let_go(&self) {
        if let Some(shared) = &self.shared {
            shared.unclaim(self.key);
        }
        if let Some(p) = &self.pollers {
            p.released(self.key);
        }
    }

    fn valid_until(&self) -> Instant {
        *self.valid_until.lock()
    }

    fn current(&self) -> Option<Arc<Session>> {
        self.session.lock().clone()
    }

    fn take(&self) -> Option<Arc<Session>> {
        self.session.lock().take()
    }

    fn ended(&self, why: &str) -> Error {
        Error::Lost {
            name: self.name.clone(),
            reason: format!("PostgreSQL session {why}: its locks are gone with it"),
        }
    }
}

/// Whether `e` is the session's end: the server's FATAL (an operator's terminate, a shutdown),
/// which frees the session's locks as it is sent, or the connection closed. The FATAL can
/// answer a query before the client has seen the socket close, so `is_closed` alone is late.
fn ends_session(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::Severity;
    e.is_closed()
        || e.as_db_error()
            .and_then(|d| d.parsed_severity())
            .is_some_and(|s| matches!(s, Severity::Fatal | Severity::Panic))
}

#[async_trait]
impl LeaseOps for PgLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.key.to_string())
    }

    /// Finds the lock among its own session's in `pg_locks`. A closed connection is final:
    /// the session is gone (or going), and with it the lock.
    ///
    /// A lease that is over (refused, or its confirmation still unanswered at `valid_until`,
    /// when the watchdog gives up on it) closes its connection: a session that may still hold
    /// the lock on the server must not outlive the lease's belief in it.
    async fn renew(&self) -> Result<Instant> {
        let session = self.current().ok_or_else(|| self.ended("was closed"))?;
        if session.is_closed() {
            self.close();
            return Err(self.ended("ended (connection closed or backend terminated)"));
        }
        let mut expired = CloseIfExpired {
            ops: self,
            at: self.valid_until(),
            armed: true,
        };
        let bound = self.opener.config.session_timeout();
        let mut start = Instant::now();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.key];
        let check = async {
            match &self.shared {
                // The session's life vouches for the lock (see `SharedSession::confirm`).
                Some(shared) => {
                    start = shared.confirm(bound / 6).await?;
                    Ok(true)
                }
                None => session
                    .client
                    .query_one(&session.stmts.check, &params)
                    .await
                    .and_then(|r| r.try_get::<_, bool>(0)),
            }
        };
        // Unanswered at valid_until: the lease is over (the guard closes the connection).
        let Ok(held) = tokio::time::timeout_at(expired.at.into(), check).await else {
            return Err(self.ended("unconfirmed at valid_until; connection closed"));
        };
        expired.armed = false;
        let outcome = match held {
            Ok(true) => {
                let until = start + bound - drift(bound);
                *self.valid_until.lock() = until;
                return Ok(until);
            }
            Ok(false) => {
                // Not held by this session: nothing of this lease's stays in it.
                self.let_go();
                drop(self.take());
                return Err(Error::not_held(&self.name));
            }
            Err(e) if session.is_closed() || ends_session(&e) => {
                self.ended("ended (connection closed or backend terminated)")
            }
            Err(e) => return Err(self.opener.error(e)),
        };
        self.close();
        Err(outcome)
    }

    /// Sets the value in the counter row, if this session still holds the lock and its row
    /// (`election`).
    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        let session = self.current().ok_or_else(|| self.ended("was closed"))?;
        let text = self.name.as_str();
        let bytes = value.as_bytes();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&self.key, &text, &bytes];
        let sql = &self.opener.sql.proclaim;
        let bound = self.opener.request_bound();
        let set = self.opener.within("the proclaim", bound, async {
            match session.client.query(sql.as_str(), &params).await {
                Ok(rows) => Ok(rows.len()),
                Err(e) if session.is_closed() || ends_session(&e) => {
                    Err(self.ended("ended before the proclaim"))
                }
                Err(e) => Err(self.opener.error(e)),
            }
        });
        match set.await? {
            0 => Err(Error::not_held(&self.name)),
            _ => Ok(()),
        }
    }

    /// Unlocks; the session then goes back to the idle pool. If the unlock cannot be
    /// confirmed, the connection is closed instead, which ends the session and the lock.
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        let session = self.take().ok_or_else(|| self.ended("was closed"))?;
        if session.is_closed() {
            return Err(self.ended("ended before the release"));
        }
        let bound = self.opener.config.session_timeout();
        let mut under_way = UnlockUnderWay {
            shared: self.shared.as_ref(),
            held: self.held,
            bound: self.opener.request_bound(),
        };
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.key];
        let unlock = async {
            match (self.valued, self.held) {
                // Observers hear of it (`election`): a leader's release, announced.
                (true, _) => {
                    let sql = self.opener.sql.unlock_announced.as_str();
                    session.client.query_one(sql, &params).await?.try_get(0)
                }
                (false, Held::Exclusive(_)) => {
                    let stmt = &session.stmts.exclusive.unlock;
                    session.client.query_one(stmt, &params).await?.try_get(0)
                }
                // A reader's or permit holder's keys, each let go of once: the session may
                // hold other names' locks. The answer: whether the name's key was held.
                (false, held) => {
                    let sql = held.unlock_sql(self.opener.sql.announces);
                    let answer = session.client.simple_query(&sql).await?;
                    Ok(answer.iter().any(|m| {
                        matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("t"))
                    }))
                }
            }
        };
        let unlocked = tokio::time::timeout(bound, unlock).await;
        under_way.shared = None;
        let Ok(unlocked) = unlocked else {
            // Closing the connection ends the session, and the lock with it, once the server
            // hears of it (or its keepalive gives up); a shared one's other leases with it.
            if let Some(shared) = &self.shared {
                shared.close();
            }
            return Err(Error::unavailable(
                BACKEND,
                format!("unlock unanswered after {bound:?}; connection closed instead"),
            ));
        };
        match unlocked {
            Ok(true) => {
                self.let_go();
                // A shared session stays with the others (its Arc is not this lease's alone).
                if let Ok(s) = Arc::try_unwrap(session) {
                    self.opener.idle.put_back(s);
                }
                Ok(())
            }
            Ok(false) => {
                self.let_go();
                Err(Error::not_held(&self.name))
            }
            Err(e) if session.is_closed() || ends_session(&e) => {
                Err(self.ended("ended before the release"))
            }
            // Dropping the session closes the connection: the lock goes with the session. A
            // shared one is ended: the unlock's outcome is unknown.
            Err(e) => {
                if let Some(shared) = &self.shared {
                    shared.close();
                }
                Err(self.opener.error(e))
            }
        }
    }

    fn lapses_without_renewal(&self) -> bool {
        false
    }

    /// The lock went with the session when its connection closed.
    fn ended(&self) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        Some(Box::pin(self.current()?.ended()))
    }

    /// As if the holder had crashed: the connection is closed without unlocking, and the
    /// server frees the lock when it sees the session end. A shared session lives on for its
    /// other leases: the key is unlocked in the background instead (the session is ended if
    /// that goes unanswered).
    fn abandon(&self) {
        let session = self.take();
        if let (Some(_), Some(shared)) = (session, &self.shared) {
            shared.undo(self.held, self.opener.request_bound());
        }
    }
}

/// A release's unlock on a shared session, sent and not yet answered. If the release is
/// dropped here (a caller's timeout), the key is unlocked again in the background and its
/// claim goes once that is answered: the session answers in order, so by then the server has
/// let go (a second unlock of a key let go is refused, harmlessly). Without it the claim
/// would stay, and the client could never ask for the name on this session again.
struct UnlockUnderWay<'a> {
    shared: Option<&'a Arc<SharedSession>>,
    held: Held,
    bound: std::time::Duration,
}

impl Drop for UnlockUnderWay<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared {
            shared.undo(self.held, self.bound);
        }
    }
}

/// Closes the lease's connection if a confirmation is abandoned at or after `valid_until`
/// (the watchdog's timeout): the server may still hold the lock for a lease that is Lost.
struct CloseIfExpired<'a> {
    ops: &'a PgLeaseOps,
    at: Instant,
    armed: bool,
}

impl Drop for CloseIfExpired<'_> {
    fn drop(&mut self) {
        if self.armed && Instant::now() >= self.at {
            self.ops.close();
        }
    }
}

/// A lease dropped while its session still held its key (no release ran: the runtime is
/// gone, or its owner forgot it): a shared session, which lives on for other leases, must
/// not keep the lock.
impl Drop for PgLeaseOps {
    fn drop(&mut self) {
        if let (Some(_), Some(shared)) = (self.session.get_mut().take(), &self.shared) {
            shared.undo(self.held, self.opener.request_bound());
        }
    }
}
