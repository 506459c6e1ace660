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
//! and within that pause otherwise. A session holds one lease's locks only, so a failed try
//! lets go of everything with `pg_advisory_unlock_all()`.
//!
//! `pg_advisory_lock_shared` of another program is a reader that passes no gate: it keeps
//! writers out, not permit holders.

use std::time::Duration;

use crate::client::Opener;
use crate::session::Session;

use lock_core::driver::{random_below, Acquisition};
use lock_core::{Error, LockName, Mode, Result};
use sha2::{Digest, Sha256};
use tokio_postgres::{Client, SimpleQueryMessage};

/// The keys of one name's family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FamilyKeys {
    /// The name's own key ([`crate::advisory_key`]).
    pub(crate) name: i64,
    pub(crate) gate: i64,
    pub(crate) readers: i64,
    pub(crate) permits: i64,
    /// Slot `s` is `slots + s`.
    pub(crate) slots: i64,
    /// The first half of the marks' two-integer keys (non-negative).
    pub(crate) mark_class: i32,
}

impl FamilyKeys {
    pub(crate) fn of(name: &LockName) -> Self {
        let digest = Sha256::digest(name.as_str().as_bytes());
        let mut base = [0u8; 8];
        base.copy_from_slice(&digest[8..16]);
        // Below 2^62: `slots + s` stays a bigint for every `s` below 2^31.
        let base = i64::from_be_bytes(base) & 0x3fff_ffff_ffff_ffff;
        let mut class = [0u8; 4];
        class.copy_from_slice(&digest[16..20]);
        FamilyKeys {
            name: crate::advisory_key(name),
            gate: base,
            readers: base + 1,
            permits: base + 2,
            slots: base + 3,
            mark_class: i32::from_be_bytes(class) & 0x7fff_ffff,
        }
    }
}

/// What a request of the family came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Entered {
    /// Held (a permit: in this slot).
    Held(Option<i64>),
    /// Not now (the try path lets go of everything it took).
    Busy,
    /// Requests with this many permits hold or wait.
    Mismatch(u32),
}

type PgResult<T> = std::result::Result<T, tokio_postgres::Error>;

/// The rows of each statement of `sql` (one simple-query batch, one round trip), first column
/// only.
async fn batch(c: &Client, sql: &str) -> PgResult<Vec<Vec<Option<String>>>> {
    let mut out = vec![Vec::new()];
    for m in c.simple_query(sql).await? {
        match m {
            SimpleQueryMessage::Row(r) => {
                if let Some(last) = out.last_mut() {
                    last.push(r.get(0).map(str::to_string));
                }
            }
            SimpleQueryMessage::CommandComplete(_) => out.push(Vec::new()),
            _ => {}
        }
    }
    Ok(out)
}

/// The first column of the first row of statement `i` of a batch's answer.
fn cell(rows: &[Vec<Option<String>>], i: usize) -> Option<&str> {
    rows.get(i)?.first()?.as_deref()
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

/// A reader's wait on this session, once its try (`Sql::reader_try_grant`, one statement) was
/// refused and let go: in the server's queue for the name's key, then the gate, then until the
/// permit holders are gone. A caller that gives up closes the session.
pub(crate) async fn reader_wait(c: &Client, k: &FamilyKeys) -> PgResult<Entered> {
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

/// Takes one of `mode`'s permits on this session, waiting (`wait`) or not. On the try path
/// whatever was taken is let go when the answer is not `Held`; on the waiting path a caller
/// that gives up closes the session (which lets go of everything with it).
pub(crate) async fn permit(
    c: &Client,
    k: &FamilyKeys,
    mode: Mode,
    wait: bool,
    pause: impl Fn() -> Duration,
) -> PgResult<Entered> {
    let entered = async {
        let (name, gate, readers, permits) = (k.name, k.gate, k.readers, k.permits);
        let (slots, mark_class) = (k.slots, k.mark_class);
        let n = k_of(mode);
        // Marked before anything waits: a waiting request's count is seen too.
        let mark = format!(
            "SELECT pg_advisory_lock_shared({mark_class}, {n}); \
             SELECT m.objid::int8 FROM pg_catalog.pg_locks m WHERE m.locktype = 'advisory' \
             AND m.objsubid = 2 AND m.classid::int8 = {mark_class} AND m.objid::int8 <> {n} \
             AND m.granted AND m.database = (SELECT oid FROM pg_catalog.pg_database \
             WHERE datname = current_database()) LIMIT 1"
        );
        let scan = format!(
            "SELECT s FROM generate_series(0, {last}) s WHERE pg_try_advisory_lock({slots} + s) \
             LIMIT 1",
            last = n - 1
        );
        let mismatch = |rows: &[Vec<Option<String>>]| {
            cell(rows, 1)
                .and_then(|v| v.parse::<u32>().ok())
                .map(Entered::Mismatch)
        };
        let slot_in =
            |rows: &[Vec<Option<String>>], i| cell(rows, i).and_then(|v| v.parse::<i64>().ok());
        if !wait {
            // CASE tries in order and stops at the first refusal; whatever was taken before a
            // refusal (or a mismatch) goes with `pg_advisory_unlock_all`.
            let rows = batch(
                c,
                &format!(
                    "{mark}; SELECT CASE WHEN NOT pg_try_advisory_lock_shared({name}) THEN 'busy' \
                     WHEN NOT pg_try_advisory_lock({gate}) THEN 'busy' \
                     WHEN NOT pg_try_advisory_lock({readers}) THEN 'busy' ELSE 'in' END"
                ),
            )
            .await?;
            if let Some(m) = mismatch(&rows) {
                return Ok(m);
            }
            if cell(&rows, 2) != Some("in") {
                return Ok(Entered::Busy);
            }
            let rows = batch(
                c,
                &format!(
                    "SELECT pg_advisory_unlock({readers}); \
                     SELECT pg_advisory_lock_shared({permits}); {scan}; \
                     SELECT pg_advisory_unlock({gate})"
                ),
            )
            .await?;
            return Ok(match slot_in(&rows, 2) {
                Some(s) => Entered::Held(Some(s)),
                None => Entered::Busy,
            });
        }
        let rows = batch(c, &mark).await?;
        if let Some(m) = mismatch(&rows) {
            return Ok(m);
        }
        let rows = batch(
            c,
            &format!(
                "SELECT pg_advisory_lock_shared({name}); SELECT pg_advisory_lock({gate}); \
                 SELECT pg_advisory_lock({readers}); SELECT pg_advisory_unlock({readers}); \
                 SELECT pg_advisory_lock_shared({permits}); {scan}"
            ),
        )
        .await?;
        let slot = match slot_in(&rows, 5) {
            Some(s) => s,
            None => wait_for_slot(c, slots, n, &scan, pause).await?,
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
    slots: i64,
    n: i64,
    scan: &str,
    pause: impl Fn() -> Duration,
) -> PgResult<i64> {
    let mut next = 0;
    loop {
        let ms = pause().as_millis().max(1);
        let waited = batch(
            c,
            &format!(
                "SET lock_timeout = {ms}; SELECT pg_advisory_lock({slots} + {next}); \
                 SET lock_timeout = 0"
            ),
        )
        .await;
        match waited {
            Ok(_) => return Ok(next),
            // 55P03: not free within the pause. The batch ran as one implicit transaction,
            // whose rollback undid its `SET`; set again all the same, as nothing else here may
            // run under a lock timeout.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                let rows = batch(c, &format!("SET lock_timeout = 0; {scan}")).await?;
                if let Some(s) = cell(&rows, 1).and_then(|v| v.parse::<i64>().ok()) {
                    return Ok(s);
                }
            }
            Err(e) => return Err(e),
        }
        next = (next + 1) % n;
    }
}

/// A reader's or permit holder's locks (`family`), then its token: the try, and the wait
/// if it `waits` and the try was refused. `None`: the wait ran out (the caller closes the
/// session). As the exclusive grant: the token's row (`Ok(None)`: not granted, nothing
/// held) and whether it waited.
pub(crate) async fn grant(
    opener: &Opener,
    s: &Session,
    req: &Acquisition<'_>,
    waits: bool,
) -> Result<Option<(Result<Option<tokio_postgres::Row>>, bool)>> {
    let (name, mode) = (req.name(), req.mode());
    if !permits_fit(mode) {
        return Err(Error::config(format!(
            "{}: at most {} permits on PostgreSQL",
            mode.describe(),
            i32::MAX
        )));
    }
    let keys = FamilyKeys::of(name);
    let pause = || Duration::from_secs(1) + random_below(Duration::from_secs(1));
    if mode == Mode::Shared {
        // A reader's try and token in one round trip, as a writer's.
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &keys.name,
            &name.as_str(),
            &keys.gate,
            &keys.permits,
            &keys.readers,
        ];
        let tried = opener
            .answered(
                "the lock request",
                opener.request_bound(),
                s.client.query_opt(&s.stmts.reader_try_grant, &params),
            )
            .await;
        match tried {
            Ok(Some(row)) => return Ok(Some((Ok(Some(row)), false))),
            Ok(None) => {
                opener
                    .answered(
                        "letting go of a refused try",
                        opener.request_bound(),
                        s.client.simple_query("SELECT pg_advisory_unlock_all()"),
                    )
                    .await?;
                if !waits {
                    return Ok(Some((Ok(None), false)));
                }
            }
            Err(e) => return Ok(Some((Err(e), false))),
        }
    }
    let tried = if mode == Mode::Shared {
        Entered::Busy
    } else {
        opener
            .answered(
                "the lock request",
                opener.request_bound(),
                permit(&s.client, &keys, mode, false, pause),
            )
            .await?
    };
    let (entered, waited) = match tried {
        Entered::Busy if waits => {
            let wait = async {
                match mode {
                    Mode::Shared => reader_wait(&s.client, &keys).await,
                    _ => permit(&s.client, &keys, mode, true, pause).await,
                }
            };
            let r = match req.deadline().at() {
                Some(at) => match tokio::time::timeout_at(at.into(), wait).await {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                },
                None => wait.await,
            };
            (r.map_err(|e| opener.error(e))?, true)
        }
        other => (other, false),
    };
    let row = match entered {
        Entered::Held(_) => {
            opener
                .answered(
                    "the token",
                    opener.request_bound(),
                    s.client.query_opt(&s.stmts.family_token, &[&name.as_str()]),
                )
                .await
        }
        Entered::Busy => Ok(None),
        Entered::Mismatch(held) => Err(Error::PermitsMismatch {
            name: name.clone(),
            held,
            asked: mode.limit().unwrap_or(0),
        }),
    };
    Ok(Some((row, waited)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_apart_and_in_range() {
        for name in ["a", "jobs", "reindex", "x".repeat(100).as_str()] {
            let k = FamilyKeys::of(&LockName::new(name).unwrap());
            assert!(k.gate >= 0 && k.slots.checked_add(i64::from(i32::MAX)).is_some());
            assert!(k.mark_class >= 0);
            let all = [k.name, k.gate, k.readers, k.permits, k.slots];
            for (i, a) in all.iter().enumerate() {
                assert!(!all[i + 1..].contains(a), "{name}: {all:?}");
            }
        }
        let (a, b) = (
            FamilyKeys::of(&LockName::new("a").unwrap()),
            FamilyKeys::of(&LockName::new("b").unwrap()),
        );
        assert_ne!(a.gate, b.gate);
        assert_ne!(a.mark_class, b.mark_class);
    }

    #[test]
    fn only_counts_that_fit_an_int4() {
        assert!(permits_fit(Mode::Permits(1)));
        assert!(permits_fit(Mode::Permits(i32::MAX as u32)));
        assert!(!permits_fit(Mode::Permits(i32::MAX as u32 + 1)));
        assert!(permits_fit(Mode::Shared));
    }
}
