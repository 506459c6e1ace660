//! Sessions that many held locks share (`shared_sessions=N`): which session a grant is asked
//! on, the keys each one holds or is asking for, and how a grant whose caller is gone is
//! undone.
//!
//! Advisory locks are re-entrant within a session: a second request of a key the session
//! holds is granted at once on the server. So a name's key is *claimed* on a session from
//! before its request is sent until the server has let go of it (its unlock answered, or the
//! session ended), and no two claims of one key meet on one session. The claim stands for
//! every key of the name's family (a reader's or permit holder's, `family.rs`): a session
//! holds or asks for one lease of a name at most, in any mode. A grant is asked by a task of
//! its own: if the caller is gone when the answer comes (its future dropped, its request
//! bound passed), the task unlocks what was granted, so no lock stays in a session that lives
//! on for other leases.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{Error, Result};
use parking_lot::Mutex;
use tokio_postgres::Row;

use crate::config::BACKEND;
use crate::keys::{Held, Tried};
use crate::session::Session;

/// One shared session and the keys claimed on it.
pub(crate) struct SharedSession {
    pub(crate) session: Arc<Session>,
    keys: Mutex<HashSet<i64>>,
    /// When the latest confirmation that the session lives was sent, once answered: one
    /// round trip vouches for every lock in the session.
    confirmed: tokio::sync::Mutex<Option<Instant>>,
}

impl SharedSession {
    fn new(session: Session, keys: HashSet<i64>) -> Self {
        SharedSession {
            session: Arc::new(session),
            keys: Mutex::new(keys),
            confirmed: tokio::sync::Mutex::new(None),
        }
    }

    /// When a request was sent that the session answered: a session advisory lock ends only
    /// by an unlock in its own session (this driver's) or with the session, so a live
    /// session vouches for each lock of its leases. One confirmation is shared by the leases
    /// that ask within `fresh` of its sending (they wait for it when it is under way); the
    /// others send one. Renewing N leases costs one request per session and period, not N.
    pub(crate) async fn confirm(
        &self,
        fresh: Duration,
    ) -> std::result::Result<Instant, tokio_postgres::Error> {
        let mut last = self.confirmed.lock().await;
        if let Some(at) = *last {
            if at.elapsed() < fresh {
                return Ok(at);
            }
        }
        let sent = Instant::now();
        self.session.client.simple_query("").await?;
        *last = Some(sent);
        Ok(sent)
    }

    /// The server no longer holds `key` for this session: another lease may ask for it here.
    pub(crate) fn unclaim(&self, key: i64) {
        self.keys.lock().remove(&key);
    }

    /// Ends the session at once (its connection task stops, the socket closes): the server
    /// frees every lock in it, and every lease on it turns Lost as its connection closes.
    /// For a request on it left unanswered, or a lock it may hold that nobody can unlock.
    pub(crate) fn close(&self) {
        self.session.task.abort();
    }

    /// Lets go of what `held` holds in the background (a lease that ends without its
    /// release: abandoned, or a grant nobody took), then of the claim; closes the session if
    /// the unlock is not answered within `bound`, or if there is no runtime to send it on.
    pub(crate) fn undo(self: &Arc<Self>, held: Held, bound: Duration) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.close();
            return;
        };
        let me = self.clone();
        rt.spawn(async move {
            let sql = held.unlock_sql(false);
            let sent = me.session.client.simple_query(&sql);
            match tokio::time::timeout(bound, sent).await {
                Ok(Ok(_)) => me.unclaim(held.key()),
                _ => me.close(),
            }
        });
    }
}

/// The shared sessions of one client: at most `max`, opened as grants need them, kept while
/// open.
pub(crate) struct SharedSessions {
    max: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sessions: Vec<Arc<SharedSession>>,
    /// Sessions being opened for a [`Reservation`].
    opening: usize,
}

/// Where a grant of a key can be asked.
pub(crate) enum Pick<'a> {
    /// On this session, the key claimed on it (and whether it is new).
    Claimed(Arc<SharedSession>),
    /// On a session still to be opened: the slot is reserved.
    Open(Reservation<'a>),
    /// Every session (all `max` of them) has a claim on the key: this client holds it, or is
    /// asking for it, already.
    Busy,
}

impl SharedSessions {
    pub(crate) fn new(max: usize) -> Self {
        SharedSessions {
            max,
            state: Mutex::new(State::default()),
        }
    }

    /// Whether locks share sessions at all (`shared_sessions` > 0).
    pub(crate) fn enabled(&self) -> bool {
        self.max > 0
    }

    /// Keeps `session` (which holds nothing) as a shared one, if fewer than `max` are: the
    /// connection's first session, so that the first grant needs no new one. Else it is
    /// handed back.
    pub(crate) fn adopt(&self, session: Session) -> Option<Session> {
        let mut st = self.state.lock();
        if st.sessions.len() + st.opening >= self.max {
            return Some(session);
        }
        st.sessions
            .push(Arc::new(SharedSession::new(session, HashSet::new())));
        None
    }

    /// The session to ask for `key` on, spreading the locks over up to `max` sessions (one
    /// backend process serves a session's requests one after the other, and a session's end
    /// loses every lock in it): an open one that holds nothing, else a new one while fewer
    /// than `max` are open or being opened, else the open one with the fewest claims. Never a
    /// session with a claim on `key`.
    pub(crate) fn pick(&self, key: i64) -> Pick<'_> {
        let mut st = self.state.lock();
        st.sessions.retain(|s| !s.session.is_closed());
        let free = st.sessions.iter().find(|s| s.keys.lock().is_empty());
        if let Some(s) = free {
            s.keys.lock().insert(key);
            return Pick::Claimed(s.clone());
        }
        if st.sessions.len() + st.opening < self.max {
            st.opening += 1;
            return Pick::Open(Reservation {
                of: self,
                filled: false,
            });
        }
        let fewest = (st.sessions.iter())
            .filter(|s| !s.keys.lock().contains(&key))
            .min_by_key(|s| s.keys.lock().len());
        match fewest {
            Some(s) => {
                s.keys.lock().insert(key);
                Pick::Claimed(s.clone())
            }
            None => Pick::Busy,
        }
    }
}

/// A slot for a session being opened; given back if dropped unfilled (the opening failed or
/// its future was dropped).
pub(crate) struct Reservation<'a> {
    of: &'a SharedSessions,
    filled: bool,
}

impl Reservation<'_> {
    /// The opened session joins the shared ones, with `key` claimed on it.
    pub(crate) fn fill(mut self, session: Session, key: i64) -> Arc<SharedSession> {
        self.filled = true;
        let s = Arc::new(SharedSession::new(session, HashSet::from([key])));
        let mut st = self.of.state.lock();
        st.opening -= 1;
        st.sessions.push(s.clone());
        s
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.filled {
            self.of.state.lock().opening -= 1;
        }
    }
}

/// The owned parameters of an exclusive grant: the key, the name, and the holder's value
/// where the table keeps one (`valued`).
pub(crate) struct GrantParams {
    pub(crate) key: i64,
    pub(crate) name: String,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) valued: bool,
}

impl GrantParams {
    /// The exclusive try on `me`, with its token.
    pub(crate) async fn ask(self, me: Arc<SharedSession>) -> PgResult<Tried> {
        let stmt = &me.session.stmts.exclusive.try_grant;
        let all: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&self.key, &self.name, &self.value];
        let params = &all[..if self.valued { 3 } else { 2 }];
        Ok(match me.session.client.query_opt(stmt, params).await? {
            Some(row) => Tried::Granted(row, Held::Exclusive(self.key)),
            None => Tried::Busy,
        })
    }
}

type PgResult<T> = std::result::Result<T, tokio_postgres::Error>;

/// A granted row on its way from the request's task to the caller. Dropped untaken (the
/// caller's future dropped with the row in its channel, or before the channel was read), the
/// grant is undone: the session lives on for other leases, and nobody would unlock it.
struct Granted {
    row: Option<(Row, Held)>,
    shared: Arc<SharedSession>,
    bound: Duration,
}

impl Granted {
    /// The row and what it holds, the grant now the caller's to keep or undo.
    fn take(mut self) -> Option<(Row, Held)> {
        self.row.take()
    }
}

impl Drop for Granted {
    fn drop(&mut self) {
        if let Some((_, held)) = self.row.take() {
            self.shared.undo(held, self.bound);
        }
    }
}

/// What the request's task hands the caller.
enum Answer {
    Granted(Granted),
    Busy,
    Mismatch(u32),
}

/// Runs `ask` (a try that never waits, on the name whose key `key` is claimed on `shared`) on
/// a task of its own, and waits up to `bound` for the answer. If the caller is gone or `bound`
/// passes first, a grant is undone when it comes, or where it lies unread ([`Granted`]). An
/// error of the request lets go of `on_error` (a failed statement may have taken it before it
/// failed), or ends the session when that is `None` (what a failed step of several holds is
/// not known); the claim goes once the server has let go.
pub(crate) async fn try_grant<F, Fut>(
    shared: &Arc<SharedSession>,
    key: i64,
    bound: Duration,
    on_error: Option<Held>,
    error: impl Fn(tokio_postgres::Error) -> Error,
    ask: F,
) -> Result<Tried>
where
    F: FnOnce(Arc<SharedSession>) -> Fut + Send + 'static,
    Fut: Future<Output = PgResult<Tried>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let me = shared.clone();
    tokio::spawn(async move {
        let answer = match ask(me.clone()).await {
            Ok(Tried::Granted(row, held)) => Ok(Answer::Granted(Granted {
                row: Some((row, held)),
                shared: me.clone(),
                bound,
            })),
            Ok(Tried::Busy) => {
                me.unclaim(key);
                Ok(Answer::Busy)
            }
            Ok(Tried::Mismatch(k)) => {
                me.unclaim(key);
                Ok(Answer::Mismatch(k))
            }
            Err(e) => {
                match on_error {
                    Some(held) => me.undo(held, bound),
                    None => me.close(),
                }
                Err(e)
            }
        };
        // A grant is undone if nobody takes it: the send fails, or the caller is gone before
        // it reads the channel (a value sent is not a value received).
        let _ = tx.send(answer);
    });
    match tokio::time::timeout(bound, rx).await {
        Ok(Ok(Ok(Answer::Granted(granted)))) => Ok(match granted.take() {
            Some((row, held)) => Tried::Granted(row, held),
            None => Tried::Busy,
        }),
        Ok(Ok(Ok(Answer::Busy))) => Ok(Tried::Busy),
        Ok(Ok(Ok(Answer::Mismatch(k)))) => Ok(Tried::Mismatch(k)),
        Ok(Ok(Err(e))) => Err(error(e)),
        Ok(Err(_)) => Err(Error::unavailable(
            BACKEND,
            "the shared session's request task ended without an answer",
        )),
        Err(_) => Err(Error::unavailable(
            BACKEND,
            format!("no answer to the lock request within {bound:?} on a shared session"),
        )),
    }
}
