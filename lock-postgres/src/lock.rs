//! `PgLock`: a session advisory lock on a connection of the lock's own, counted in the same
//! statement.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{drift, Acquisition, Grant, ManagedLease};
use lock_core::{
    Capabilities, Deadline, DistributedLock, Error, ExpiryClock, Fencing, FencingToken, HolderInfo,
    Lease, LockName, Mode, Renewal, Result,
};
use tokio::sync::OwnedSemaphorePermit;

use crate::client::Opener;
use crate::config::BACKEND;
use crate::keys::advisory_key;
use crate::keys::{Held, Tried};
use crate::lease::PgLeaseOps;
use crate::polling::{Place, Polled};
use crate::session::{Session, Sql};
use crate::shared::{self, GrantParams, Pick, SharedSession};
use crate::PgConfig;

/// A PostgreSQL lock client: sessions of its own, one per held or awaited lock (or, with
/// `shared_sessions`, a few that the locks granted at once share).
///
/// **Exclusion** is a session advisory lock on the key [`advisory_key`](crate::advisory_key)
/// of the name, taken on a connection this client owns for as long as the lease lives (kept
/// in a small pool of idle sessions between leases). **Waiting** is the blocking
/// `pg_advisory_lock`: the waiter sits in the server's own lock queue, FIFO, without polling.
/// A waiter that gives up (deadline, or its future dropped) sends a cancel request and closes
/// its connection, so no waiter — and no grant that raced the cancel — stays behind.
///
/// **The session is the lease.** The driver sets the server's TCP keepalive settings (and
/// `tcp_user_timeout`) for each session, so that the server drops the session of a client
/// that vanished, and with it the lock, no sooner than the session timeout after it last
/// heard from it (and at most one keepalive interval later). Each lease confirms its session
/// every third of the session timeout, whatever the [`Renewal`](lock_core::Renewal) option
/// says (a query that finds the lock among the session's own in `pg_locks`); `valid_until` is
/// the start of the last confirmed query plus the session timeout, minus drift. A closed
/// connection, a terminated backend or a failed confirmation makes the lease AtRisk, then
/// Lost before the server can free the lock.
///
/// **TTL option**: the TTL must be at least the session timeout (`InvalidOptions` below it);
/// a vanished holder frees the lock after the session timeout, whatever the TTL. `max_hold`
/// is honoured by unlocking.
///
/// **Fencing (Strict)**: a per-name counter in the fencing table, incremented in the
/// statement that takes the lock, committed before `acquire` returns.
#[derive(Clone)]
pub struct PgLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// Shared with the leases, which give their sessions back to its pool.
    pub(crate) opener: Arc<Opener>,
    pub(crate) caps: Capabilities,
    /// Waiters' turns per name (`shared_waits`).
    turns: crate::waits::Turns,
    /// Where waiters wait (`wait_sessions`; on the server, unbounded, by default).
    waiting: Arc<crate::polling::Waiting>,
}

impl PgLock {
    /// Connects, refuses a standby and a transaction-pooling proxy, and creates the fencing
    /// table if it is absent. The first session stays open for the first acquisition.
    pub async fn connect(config: PgConfig) -> Result<Self> {
        let mut opener = Opener::new(config).await?;
        let first = opener.open().await?;
        opener.refuse_pooler(&first).await?;
        // Three round trips, on a server that answered the login a moment ago.
        let checks = opener.request_bound() * 3;
        let valued = opener
            .within(
                "the fencing table check",
                checks,
                opener.ensure_table(&first),
            )
            .await?;
        opener.sql = Sql::for_table(opener.config.table(), valued);
        if opener.config.wait_sessions().is_some() {
            opener.sql = opener.sql.announcing_releases();
        }
        opener.warn_unbounded(&first);
        let first = opener.prepare(first).await?;
        // The first grant's session: a shared one where locks share them.
        if let Some(first) = opener.shared.adopt(first) {
            opener.idle.put_back(first);
        }
        let bound = opener.config.session_timeout();
        Ok(PgLock {
            inner: Arc::new(Inner {
                caps: Capabilities::new()
                    .with_fencing(Fencing::Strict)
                    .with_fifo(
                        !opener.config.shared_waits() && opener.config.wait_sessions().is_none(),
                    )
                    .with_inspect(true)
                    .with_per_lock_ttl(false)
                    .with_outlives_connection(false)
                    // A restart ends every session and so every lock; the holder's lease
                    // turns Lost as its connection closes. No clock ends a session's lock.
                    .with_survives_restart(false)
                    .with_expires_by(ExpiryClock::Elapsed)
                    .with_min_ttl(bound)
                    // `pg_advisory_lock_shared`: the same lock, in the server's one queue.
                    .with_shared(true)
                    // Slot keys behind a gate (`family`).
                    .with_permits(true)
                    // The holder's value in its counter row (`election`).
                    .with_election(valued),
                turns: crate::waits::Turns::new(opener.config.shared_waits()),
                waiting: Arc::new(crate::polling::Waiting::new(opener.config.wait_sessions())),
                opener: Arc::new(opener),
            }),
        })
    }

    /// [`connect`](Self::connect) from a `postgres://` or `postgresql://` URL.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(PgConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &PgConfig {
        &self.inner.opener.config
    }

    /// The longest a vanished holder's lock stays held: the session timeout plus one
    /// keepalive interval — on a direct connection. Behind a pooler (PgBouncer in
    /// `pool_mode = session`) the server's keepalives probe the pooler, which stays: the lock
    /// is freed only when the pooler gives up the client and closes its server connection
    /// (PgBouncer's own TCP keepalive settings and `client_idle_timeout`), which this bound
    /// does not cover.
    pub fn frees_within(&self) -> Duration {
        let bound = self.config().session_timeout();
        self.inner.opener.keepalive.frees_within(bound)
    }

    /// Elections need the table's `value` column (`Opener::ensure_table`).
    fn elects(&self) -> Result<()> {
        if self.inner.caps.election {
            return Ok(());
        }
        Err(Error::Unsupported {
            backend: BACKEND,
            operation: "leader election (the fencing table has no value column)",
        })
    }

    /// An idle session (one whose connection is still open), or a new one.
    pub(crate) async fn session(&self) -> Result<(Session, bool)> {
        match self.inner.opener.idle.take() {
            Some(s) => Ok((s, true)),
            None => Ok((self.inner.opener.session().await?, false)),
        }
    }

    async fn contend_on(
        &self,
        session: Session,
        req: Acquisition<'_>,
        slot: &mut Option<OwnedSemaphorePermit>,
    ) -> Result<Option<Box<dyn Lease>>> {
        let name = req.name();
        let key = advisory_key(name);
        let opener = &self.inner.opener;
        // Until it holds a lease, the session is cancelled and closed if this future is
        // dropped: a waiter in the server's queue, or a grant on its way, must not outlive it.
        let mut pending = Pending(Some(session), &opener.connector);
        let s = pending.session()?;
        let text = name.as_str();
        let value = req.value().map(|v| v.as_bytes());
        let valued: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&key, &text, &value];
        // A table without the value column takes the grant's two parameters.
        let params = &valued[..if opener.sql.valued { 3 } else { 2 }];
        // One try first: an uncontended grant costs one round trip, and vouches for the
        // session by itself (sent just now). Only a busy lock takes the waiting path.
        let sent = Instant::now();
        let waits = !matches!(req.deadline(), Deadline::Now) && !req.deadline().passed();
        let (granted, waited) = if req.mode() == Mode::Exclusive {
            let (try_grant, wait_grant) =
                (&s.stmts.exclusive.try_grant, &s.stmts.exclusive.wait_grant);
            let tried = opener
                .answered(
                    "the lock request",
                    opener.request_bound(),
                    s.client.query_opt(try_grant, params),
                )
                .await;
            let held = Held::Exclusive(key);
            match tried {
                Ok(None) if waits => {
                    let wait = s.client.query_opt(wait_grant, params);
                    let r = match req.deadline().at() {
                        Some(at) => match tokio::time::timeout_at(at.into(), wait).await {
                            Ok(r) => r,
                            Err(_) => return Ok(None), // `pending` cancels the wait
                        },
                        None => wait.await,
                    };
                    let r = r.map_err(|e| opener.error(e));
                    (r.map(|row| row.map(|row| (row, held))), true)
                }
                other => (other.map(|row| row.map(|row| (row, held))), false),
            }
        } else {
            match crate::family::grant(&self.inner.opener, s, &req, waits).await? {
                Some(granted) => granted,
                None => return Ok(None), // `pending` cancels the wait
            }
        };
        let (row, held) = match granted {
            Ok(Some(granted)) => {
                if waited {
                    req.queued();
                }
                granted
            }
            Ok(None) => {
                // Not granted, nothing taken: the session stays usable.
                if let Some(s) = pending.0.take() {
                    self.inner.opener.idle.put_back(s);
                }
                return Ok(None);
            }
            // `pending` closes the session on the way out.
            Err(e) => return Err(e),
        };
        let token = self.granted_row(&row, pending.session()?.pid)?;
        // The server heard from this session when the statement arrived (after `sent`), so it
        // cannot end it before `sent + bound`: that bounds the lease also after a wait. Only a
        // wait long enough to eat a third of the bound is followed by a fresh confirmation.
        let bound = opener.config.session_timeout();
        let confirmed_at = if !waited || sent.elapsed() < bound / 3 {
            sent
        } else {
            let s = pending.session()?;
            let start = Instant::now();
            let held: bool = opener
                .answered("the grant's confirmation", opener.request_bound(), async {
                    s.client
                        .query_one(&s.stmts.check, &[&key])
                        .await?
                        .try_get(0)
                })
                .await?;
            if !held {
                return Err(self.pooled_after_all());
            }
            start
        };
        let session = pending.0.take().ok_or_else(|| self.pooled_after_all())?;
        let grant = Grant {
            token: Some(FencingToken::new(token)),
            ttl: req.ttl(),
            valid_until: confirmed_at + bound - drift(bound),
        };
        let ops = PgLeaseOps::new(
            self.inner.opener.clone(),
            Arc::new(session),
            held,
            name.clone(),
            req.value().is_some(),
            grant.valid_until,
        )
        .in_slot(slot.take())
        .waking(&self.inner.waiting);
        Ok(Some(self.managed(&req, grant, ops)))
    }

    /// A try on a shared session (`shared_sessions`), in any mode. A shared session that was
    /// open already may have died with the server since: an error there earns one more try.
    async fn try_shared(&self, req: &Acquisition<'_>) -> Result<OnShared> {
        let opener = &self.inner.opener;
        let (name, mode) = (req.name(), req.mode());
        let key = advisory_key(name);
        let mut again = true;
        loop {
            let (shared, reused) = match opener.shared.pick(key) {
                Pick::Claimed(s) => (s, true),
                Pick::Busy => return Ok(OnShared::NoSession),
                Pick::Open(slot) => (slot.fill(opener.session().await?, key), false),
            };
            let sent = Instant::now();
            let bound = opener.request_bound();
            let error = |e| opener.error(e);
            let tried = if mode == Mode::Exclusive {
                let params = GrantParams {
                    key,
                    name: name.as_str().to_owned(),
                    value: req.value().map(|v| v.as_bytes().to_vec()),
                    valued: opener.sql.valued,
                };
                let on_error = Some(Held::Exclusive(key));
                shared::try_grant(&shared, key, bound, on_error, error, |me| params.ask(me)).await
            } else {
                let name = name.clone();
                let ask = move |me: Arc<SharedSession>| async move {
                    crate::family::try_grant(&me.session, &name, mode).await
                };
                shared::try_grant(&shared, key, bound, None, error, ask).await
            };
            let (row, held) = match tried {
                Ok(Tried::Granted(row, held)) => (row, held),
                Ok(Tried::Busy) => return Ok(OnShared::Refused),
                Ok(Tried::Mismatch(held)) => {
                    return Err(Error::PermitsMismatch {
                        name: name.clone(),
                        held,
                        asked: mode.limit().unwrap_or(0),
                    })
                }
                Err(e) if reused && again && e.is_retryable() && shared.session.is_closed() => {
                    again = false;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // From here to the lease nothing awaits: a grant cannot be dropped half-taken.
            let token = match self.granted_row(&row, shared.session.pid) {
                Ok(token) => token,
                Err(e) => {
                    shared.undo(held, bound);
                    return Err(e);
                }
            };
            let timeout = opener.config.session_timeout();
            let grant = Grant {
                token: Some(FencingToken::new(token)),
                ttl: req.ttl(),
                valid_until: sent + timeout - drift(timeout),
            };
            let ops = PgLeaseOps::new(
                opener.clone(),
                shared.session.clone(),
                held,
                name.clone(),
                req.value().is_some(),
                grant.valid_until,
            )
            .on_shared(shared)
            .waking(&self.inner.waiting);
            return Ok(OnShared::Granted(self.managed(req, grant, ops)));
        }
    }

    /// A grant's token, checked: the row's pid must be the session's (else a pooler is in
    /// the way). Its detail goes to the acquisition's span.
    fn granted_row(&self, row: &tokio_postgres::Row, session_pid: i32) -> Result<u64> {
        let opener = &self.inner.opener;
        let token: i64 = row
            .try_get(0)
            .map_err(|e| Error::backend(BACKEND, opener.scrub(&e)))?;
        let pid: i32 = row
            .try_get(1)
            .map_err(|e| Error::backend(BACKEND, opener.scrub(&e)))?;
        if pid != session_pid {
            return Err(self.pooled_after_all());
        }
        // The backend's detail of the grant, in the acquisition's span (docs/observability.md):
        // the server process that holds it, as pg_locks and pg_stat_activity name it.
        tracing::debug!(
            lock.postgres.pid = pid,
            "granted in the session of backend pid"
        );
        u64::try_from(token)
            .map_err(|_| Error::backend(BACKEND, format!("fencing counter {token} < 0")))
    }

    /// The lease of `grant`. The session is confirmed in the background whatever the renewal
    /// option says: the lock lives as long as the session, so only confirmations can vouch
    /// for it.
    fn managed(&self, req: &Acquisition<'_>, grant: Grant, ops: PgLeaseOps) -> Box<dyn Lease> {
        let renewal = match req.opts().renewal {
            Renewal::Manual => Renewal::Auto { max_hold: None },
            auto => auto,
        };
        Box::new(ManagedLease::new(req.name().clone(), grant, renewal, ops))
    }

    fn pooled_after_all(&self) -> Error {
        Error::config(format!(
            "{}: the lock granted on this connection is not held by its session; a \
             transaction-pooling proxy is in the way",
            self.config().redacted_url()
        ))
    }
}

/// What a try on the shared sessions came to.
enum OnShared {
    Granted(Box<dyn Lease>),
    /// Not granted now; nothing of it is held.
    Refused,
    /// Every shared session has a claim on the name already: not tried.
    NoSession,
}

/// A session between being taken and becoming a lease's: dropped with it still inside (an
/// error, a timeout, a cancelled future), it is cancelled and closed.
struct Pending<'a>(Option<Session>, &'a crate::client::Connector);

impl Pending<'_> {
    fn session(&self) -> Result<&Session> {
        self.0
            .as_ref()
            .ok_or_else(|| Error::backend(BACKEND, "session already handed on"))
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            self.1.cancel_and_close(s);
        }
    }
}

#[async_trait]
impl DistributedLock for PgLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// On a session of its own; a session kept idle may have died with the server since: an
    /// error there earns one more try on a new one.
    async fn acquire_until(&self, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
        let opener = &self.inner.opener;
        let mode = req.mode();
        if !crate::family::permits_fit(mode) {
            return Err(crate::family::too_many_permits(mode));
        }
        let now = matches!(req.deadline(), Deadline::Now) || req.deadline().passed();
        if opener.shared.enabled() {
            match self.try_shared(&req).await? {
                OnShared::Granted(lease) => return Ok(Some(lease)),
                OnShared::Refused if now => return Ok(None),
                // Every shared session has a claim on the name: this client holds it (or asks
                // for it) on each. Exclusive, it is not free; readers and permit holders may
                // share it, on a session of their own.
                OnShared::NoSession if now && mode == Mode::Exclusive => return Ok(None),
                OnShared::Refused | OnShared::NoSession => {}
            }
        }
        // With `shared_waits`, it waits on the server only in its turn (`waits.rs`).
        let Some(_turn) = self.inner.turns.wait(&req).await else {
            return Ok(None);
        };
        // Busy: the wait takes a session of its own (a waiting session serves nothing else),
        // and keeps it while it holds the lock; with `wait_sessions`, only while a slot is
        // free, else it polls (`polling.rs`).
        let waiting = &self.inner.waiting;
        let mut slot = match opener.shared.enabled().then(|| waiting.place()) {
            Some(Place::Polls) => {
                let key = advisory_key(req.name());
                let try_once = || async {
                    match self.try_shared(&req).await? {
                        OnShared::Granted(lease) => Ok(Some(lease)),
                        OnShared::Refused => Ok(None),
                        OnShared::NoSession if mode == Mode::Exclusive => Ok(None),
                        // A name this client reads (or holds a permit of) on every shared
                        // session: tried on a session of its own, kept idle after a refusal.
                        OnShared::NoSession => {
                            let (session, _) = self.session().await?;
                            let now = req.with_deadline(Deadline::Now);
                            self.contend_on(session, now, &mut None).await
                        }
                    }
                };
                match waiting.poll(opener, &req, key, try_once).await? {
                    Polled::Granted(lease) => return Ok(Some(lease)),
                    Polled::GaveUp => return Ok(None),
                    Polled::Slot(slot) => Some(slot),
                }
            }
            Some(Place::Server(slot)) => slot,
            None => None,
        };
        let (session, reused) = self.session().await?;
        match self.contend_on(session, req, &mut slot).await {
            Err(e) if reused && e.is_retryable() && !req.deadline().passed() => {
                let session = opener.session().await?;
                self.contend_on(session, req, &mut slot).await
            }
            r => r,
        }
    }

    /// The exclusive holder with its value (`election.rs`).
    async fn leader(&self, name: &LockName) -> Result<Option<lock_core::Leader>> {
        self.elects()?;
        crate::election::leader(&self.inner.opener, name, self.frees_within()).await
    }

    async fn watch(&self, name: &LockName) -> Result<Box<dyn lock_core::ChangeFeed>> {
        self.elects()?;
        crate::election::watch(&self.inner.opener, name).await
    }

    /// The newest holder ([`holders`](DistributedLock::holders)'s last).
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        Ok(self.holders(name).await?.pop())
    }

    /// Every session holding the advisory lock, from `pg_locks`. A holder's token comes from
    /// the fencing table, which names the session of the newest grant: an exclusive holder
    /// that is not that session is another program locking the same key (reported as
    /// foreign); a shared holder that is not is an earlier reader or a foreign one, told apart
    /// by nothing on the server (no token reported). The newest grant's holder comes last.
    /// The lock lives as long as its holder's session: no remaining time to report.
    async fn holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let (session, _) = self.session().await?;
        let opener = &self.inner.opener;
        let family = crate::keys::FamilyKeys::of(name);
        let rows = opener
            .answered(
                "the holder query",
                opener.request_bound(),
                session.client.query(
                    &opener.sql.inspect,
                    &[
                        &advisory_key(name),
                        &name.as_str(),
                        &family.gate,
                        &i64::from(family.mark_class),
                    ],
                ),
            )
            .await?;
        // Only a session that answered goes back to the pool.
        opener.idle.put_back(session);
        let mut holders: Vec<(bool, HolderInfo)> = (rows.iter())
            .filter(|row| !row.try_get::<_, bool>(4).unwrap_or(false))
            .map(|row| {
                let token: Option<i64> = row.try_get(0).unwrap_or(None);
                let ours: bool = row.try_get(1).unwrap_or(false);
                let shared: bool = row.try_get(2).unwrap_or(false);
                let permits: Option<i64> = row.try_get(3).unwrap_or(None);
                let token = token
                    .and_then(|t| u64::try_from(t).ok())
                    .filter(|_| ours)
                    .map(FencingToken::new);
                let permits = permits.and_then(|k| u32::try_from(k).ok());
                let info = match (token, shared, permits) {
                    (_, true, Some(k)) => HolderInfo::new(token, None).with_mode(Mode::Permits(k)),
                    (_, true, None) => HolderInfo::new(token, None).with_mode(Mode::Shared),
                    (Some(_), false, _) => HolderInfo::new(token, None),
                    (None, false, _) => HolderInfo::foreign(None),
                };
                (ours, info)
            })
            .collect();
        holders.sort_by_key(|(ours, _)| *ours);
        Ok(holders.into_iter().map(|(_, h)| h).collect())
    }
}

impl fmt::Debug for PgLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLock")
            .field("config", self.config())
            .finish_non_exhaustive()
    }
}
