//! Readers and permit holders on advisory locks: the keys they take beside the name's own, and
//! the steps that take them.
//!
//! Both hold the name's key shared (`pg_advisory_lock_shared`), so a writer (the exclusive
//! `pg_advisory_lock`, distlock's or any program's) and they exclude each other through the
//! server's one queue. What keeps readers and permit holders apart, and counts the permits,
//! are more keys of the name (all in the bigint space, derived from the name's SHA-256 past the
//! bytes of its own key):
//!
//! - the *gate*: every reader and permit request passes it, one at a time, in the server's
//!   queue order, so they are served first come, first served among themselves, and nobody
//!   waits on a key while another waits on its own (no deadlock);
//! - the *readers'* key, held shared by each reader; a permit request takes it exclusive for a
//!   moment inside the gate (it waits there until the readers are gone), a reader takes the
//!   *permits'* key so (until the permit holders are gone);
//! - `K` *slot* keys, one held exclusive by each permit holder: at most `K` holders;
//! - a *mark* for the number of permits, the two-integer key (name's class, `K`) held shared
//!   from before the request waits: a request with another `K` sees it in `pg_locks` and is
//!   refused ([`Error::PermitsMismatch`](lock_core::Error::PermitsMismatch)).
//!
//! A request that has passed the gate and finds every slot taken keeps the gate (later requests
//! queue behind it) and waits for one slot, the next each time, for at most a second or two
//! (`lock_timeout`), then looks at all of them again: a slot freed by its holder's end (a
//! crash frees the locks with the session) wakes it at once when it is the slot it waits on,
//! and within that pause otherwise.
//!
//! A refused try lets go, in its own statements, of exactly what it took, and a held lease
//! lets go of exactly its keys ([`Held`]): the session may hold other names' locks
//! (`shared_sessions`). Only a wait, always on a session of its own, lets go of everything with
//! `pg_advisory_unlock_all()` when it ends without a grant.
//!
//! `pg_advisory_lock_shared` of another program is a reader that passes no gate: it keeps
//! writers out, not permit holders.

use std::time::Duration;

use crate::client::Opener;
use crate::keys::{let_go, FamilyKeys, Held, Tried};
use crate::session::Session;

use lock_core::driver::{random_below, Acquisition};
use lock_core::{Error, LockName, Mode, Result};
use tokio_postgres::{Client, SimpleQueryMessage};

/// What a request of the family came to.
#[derive(Debug, PartialEq, Eq)]
enum Entered {
    /// Held (a permit: in this slot).
    Held(Option<i64>),
    /// Not now; nothing of it is held.
    Busy,
    /// Requests with this many permits hold or wait; nothing of it is held.
    Mismatch(u32),
}

type PgResult<T> = std::result::Result<T, tokio_postgres::Error>;

/// The rows of each statement of `sql` (one simple-query batch, one round trip), each row's
/// columns.
async fn batch(c: &Client, sql: &str) -> PgResult<Vec<Vec<Vec<Option<String>>>>> {
    let mut out = vec![Vec::new()];
    for m in c.simple_query(sql).await? {
        match m {
            SimpleQueryMessage::Row(r) => {
                if let Some(last) = out.last_mut() {
                    last.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect());
                }
            }
            SimpleQueryMessage::CommandComplete(_) => out.push(Vec::new()),
            _ => {}
        }
    }
    Ok(out)
}

/// Column `col` of the first row of statement `i` of a batch's answer.
fn cell(rows: &[Vec<Vec<Option<String>>>], i: usize, col: usize) -> Option<&str> {
    rows.get(i)?.first()?.get(col)?.as_deref()
}

/// The number of permits `k` as the mark's second integer; above `i32::MAX` is refused
/// earlier ([`permits_fit`]).
fn k_of(mode: Mode) -> i64 {
    i64::from(mode.limit().unwrap_or(1))
}

/// Whether this driver can take `mode`: at most `i32::MAX` permits (the mark is an `int4`).
pub(crate) fn permits_fit(mode: Mode) -> bool {
    !matches!(mode, Mode::Permits(k) if i32::try_from(k).is_err())
}

/// The refusal of `mode` with more than `i32::MAX` permits.
pub(crate) fn too_many_permits(mode: Mode) -> Error {
    Error::config(format!(
        "{}: at most {} permits on PostgreSQL",
        mode.describe(),
        i32::MAX
    ))
}

/// A reader's or permit holder's try on session `s`, the token's row with it when granted: it
/// never waits (a lock is only tried; the permits' key, taken shared inside the gate, is taken
/// exclusive by nobody else there), and leaves nothing held unless granted, so it may run on a
/// session that others share.
pub(crate) async fn try_grant(s: &Session, name: &LockName, mode: Mode) -> PgResult<Tried> {
    let keys = FamilyKeys::of(name);
    if mode == Mode::Shared {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &keys.name,
            &name.as_str(),
            &keys.gate,
            &keys.permits,
            &keys.readers,
        ];
        let row = s
            .client
            .query_opt(&s.stmts.reader_try_grant, &params)
            .await?;
        return Ok(match row {
            Some(row) => Tried::Granted(row, Held::Reader(keys)),
            None => Tried::Busy,
        });
    }
    let n = k_of(mode);
    Ok(match permit_try(&s.client, &keys, n).await? {
        Entered::Held(slot) => {
            let slot = slot.unwrap_or(0);
            let row = (s.client)
                .query_one(&s.stmts.family_token, &[&name.as_str()])
                .await?;
            Tried::Granted(row, Held::Permit { keys, slot, n })
        }
        Entered::Busy => Tried::Busy,
        Entered::Mismatch(k) => Tried::Mismatch(k),
    })
}

/// The statement that marks this request's count `n` (before anything waits, so that a
/// waiting request's count is seen too).
fn mark(k: &FamilyKeys, n: i64) -> String {
    format!("SELECT pg_advisory_lock_shared({}, {n})", k.mark_class)
}

/// Another count's mark on the name, if any (a scalar subquery).
fn other_count(k: &FamilyKeys, n: i64) -> String {
    format!(
        "SELECT x.objid::int8 FROM pg_catalog.pg_locks x WHERE x.locktype = 'advisory' \
         AND x.objsubid = 2 AND x.classid::int8 = {mc} AND x.objid::int8 <> {n} AND x.granted \
         AND x.database = (SELECT oid FROM pg_catalog.pg_database \
         WHERE datname = current_database()) LIMIT 1",
        mc = k.mark_class
    )
}

/// The first free slot, taken (a scalar subquery; NULL if every slot is taken).
fn scan(k: &FamilyKeys, n: i64) -> String {
    format!(
        "SELECT g.s FROM generate_series(0, {last}) g(s) \
         WHERE pg_try_advisory_lock({slots} + g.s) LIMIT 1",
        last = n - 1,
        slots = k.slots
    )
}

/// A permit's try, in two round trips; refused, it has let go of everything it took.
async fn permit_try(c: &Client, k: &FamilyKeys, n: i64) -> PgResult<Entered> {
    let (name, gate, readers, permits) = (k.name, k.gate, k.readers, k.permits);
    let mark_unlock = format!("pg_advisory_unlock_shared({}, {n})", k.mark_class);
    let name_unlock = format!("pg_advisory_unlock_shared({name})");
    let gate_unlock = format!("pg_advisory_unlock({gate})");
    // The other count is read once (`OFFSET 0` keeps the planner from copying the subquery
    // into both columns); CASE tries in order and stops at the first refusal.
    let rows = batch(
        c,
        &format!(
            "{mark}; SELECT m.held, CASE WHEN m.held IS NOT NULL THEN {no_mark} \
             WHEN NOT pg_try_advisory_lock_shared({name}) THEN {no_mark} \
             WHEN NOT pg_try_advisory_lock({gate}) THEN {no_name} \
             WHEN NOT pg_try_advisory_lock({readers}) THEN {no_gate} ELSE true END \
             FROM (SELECT ({other}) AS held OFFSET 0) m",
            mark = mark(k, n),
            other = other_count(k, n),
            no_mark = let_go(&[&mark_unlock]),
            no_name = let_go(&[&name_unlock, &mark_unlock]),
            no_gate = let_go(&[&gate_unlock, &name_unlock, &mark_unlock]),
        ),
    )
    .await?;
    if let Some(held) = cell(&rows, 1, 0).and_then(|v| v.parse::<u32>().ok()) {
        return Ok(Entered::Mismatch(held));
    }
    if cell(&rows, 1, 1) != Some("t") {
        return Ok(Entered::Busy);
    }
    let rows = batch(
        c,
        &format!(
            "SELECT pg_advisory_unlock({readers}); SELECT pg_advisory_lock_shared({permits}); \
             SELECT s.slot, CASE WHEN s.slot IS NULL THEN {none} ELSE {gate_unlock} END \
             FROM (SELECT ({scan}) AS slot OFFSET 0) s",
            scan = scan(k, n),
            none = let_go(&[
                &gate_unlock,
                &format!("pg_advisory_unlock_shared({permits})"),
                &name_unlock,
                &mark_unlock
            ]),
        ),
    )
    .await?;
    Ok(
        match cell(&rows, 2, 0).and_then(|v| v.parse::<i64>().ok()) {
            Some(s) => Entered::Held(Some(s)),
            None => Entered::Busy,
        },
    )
}

/// A reader's wait on its own session, once its try was refused: in the server's queue for
/// the name's key, then the gate, then until the permit holders are gone. A caller that
/// gives up closes the session.
async fn reader_wait(c: &Client, k: &FamilyKeys) -> PgResult<Entered> {
    let (name, gate, readers, permits) = (k.name, k.gate, k.readers, k.permits);
    batch(
        c,
        &format!(
            "SELECT pg_advisory_lock_shared({name}); SELECT pg_advisory_lock({gate}); \
             SELECT pg_advisory_lock({permits}); SELECT pg_advisory_unlock({permits}); \
             SELECT pg_advisory_lock_shared({readers}); SELECT pg_advisory_unlock({gate})"
        ),
    )
    .await?;
    Ok(Entered::Held(None))
}

/// A permit request's wait on its own session, once its try was refused: it ends held or
/// mismatched (then it lets go of everything); a caller that gives up closes the session.
async fn permit_wait(
    c: &Client,
    k: &FamilyKeys,
    n: i64,
    pause: impl Fn() -> Duration,
) -> PgResult<Entered> {
    let entered = async {
        let rows = batch(c, &format!("{}; {}", mark(k, n), other_count(k, n))).await?;
        if let Some(held) = cell(&rows, 1, 0).and_then(|v| v.parse::<u32>().ok()) {
            return Ok(Entered::Mismatch(held));
        }
        let (name, gate, readers, permits) = (k.name, k.gate, k.readers, k.permits);
        let rows = batch(
            c,
            &format!(
                "SELECT pg_advisory_lock_shared({name}); SELECT pg_advisory_lock({gate}); \
                 SELECT pg_advisory_lock({readers}); SELECT pg_advisory_unlock({readers}); \
                 SELECT pg_advisory_lock_shared({permits}); SELECT ({})",
                scan(k, n)
            ),
        )
        .await?;
        let slot = match cell(&rows, 5, 0).and_then(|v| v.parse::<i64>().ok()) {
            Some(s) => s,
            None => wait_for_slot(c, k, n, pause).await?,
        };
        c.simple_query(&format!("SELECT pg_advisory_unlock({gate})"))
            .await?;
        Ok(Entered::Held(Some(slot)))
    }
    .await?;
    if !matches!(entered, Entered::Held(_)) {
        c.simple_query("SELECT pg_advisory_unlock_all()").await?;
    }
    Ok(entered)
}

/// Inside the gate with every slot taken: waits on one slot at a time for `pause()`, looking
/// at all of them after each.
async fn wait_for_slot(
    c: &Client,
    k: &FamilyKeys,
    n: i64,
    pause: impl Fn() -> Duration,
) -> PgResult<i64> {
    let mut next = 0;
    loop {
        let ms = pause().as_millis().max(1);
        let waited = batch(
            c,
            &format!(
                "SET lock_timeout = {ms}; SELECT pg_advisory_lock({} + {next}); \
                 SET lock_timeout = 0",
                k.slots
            ),
        )
        .await;
        match waited {
            Ok(_) => return Ok(next),
            // 55P03: not free within the pause. The batch ran as one implicit transaction,
            // whose rollback undid its `SET`; set again all the same, as nothing else here may
            // run under a lock timeout.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                let rows =
                    batch(c, &format!("SET lock_timeout = 0; SELECT ({})", scan(k, n))).await?;
                if let Some(s) = cell(&rows, 1, 0).and_then(|v| v.parse::<i64>().ok()) {
                    return Ok(s);
                }
            }
            Err(e) => return Err(e),
        }
        next = (next + 1) % n;
    }
}

/// A reader's or permit holder's grant on a session of its own: the try, and the wait if it
/// `waits` and the try was refused. `None`: the wait ran out (the caller closes the
/// session). As the exclusive grant: the token's row and what the lease holds (`Ok(None)`:
/// not granted, nothing held) and whether it waited.
pub(crate) async fn grant(
    opener: &Opener,
    s: &Session,
    req: &Acquisition<'_>,
    waits: bool,
) -> Result<Option<(Result<Option<(tokio_postgres::Row, Held)>>, bool)>> {
    let (name, mode) = (req.name(), req.mode());
    let mismatch = |held| Error::PermitsMismatch {
        name: name.clone(),
        held,
        asked: mode.limit().unwrap_or(0),
    };
    let tried = opener
        .answered(
            "the lock request",
            opener.request_bound(),
            try_grant(s, name, mode),
        )
        .await;
    match tried {
        Ok(Tried::Granted(row, held)) => return Ok(Some((Ok(Some((row, held))), false))),
        Ok(Tried::Mismatch(held)) => return Ok(Some((Err(mismatch(held)), false))),
        Ok(Tried::Busy) if waits => {}
        Ok(Tried::Busy) => return Ok(Some((Ok(None), false))),
        Err(e) => return Ok(Some((Err(e), false))),
    }
    let keys = FamilyKeys::of(name);
    let n = k_of(mode);
    let pause = || Duration::from_secs(1) + random_below(Duration::from_secs(1));
    let wait = async {
        match mode {
            Mode::Shared => reader_wait(&s.client, &keys).await,
            _ => permit_wait(&s.client, &keys, n, pause).await,
        }
    };
    let entered = match req.deadline().at() {
        Some(at) => match tokio::time::timeout_at(at.into(), wait).await {
            Ok(r) => r,
            Err(_) => return Ok(None),
        },
        None => wait.await,
    };
    let held = match entered.map_err(|e| opener.error(e))? {
        Entered::Held(_) if mode == Mode::Shared => Held::Reader(keys),
        Entered::Held(slot) => Held::Permit {
            keys,
            slot: slot.unwrap_or(0),
            n,
        },
        Entered::Mismatch(held) => return Ok(Some((Err(mismatch(held)), true))),
        Entered::Busy => return Ok(Some((Ok(None), true))),
    };
    let row = opener
        .answered(
            "the token",
            opener.request_bound(),
            s.client.query_one(&s.stmts.family_token, &[&name.as_str()]),
        )
        .await;
    Ok(Some((row.map(|r| Some((r, held))), true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_counts_that_fit_an_int4() {
        assert!(permits_fit(Mode::Permits(1)));
        assert!(permits_fit(Mode::Permits(i32::MAX as u32)));
        assert!(!permits_fit(Mode::Permits(i32::MAX as u32 + 1)));
        assert!(permits_fit(Mode::Shared));
    }
}
