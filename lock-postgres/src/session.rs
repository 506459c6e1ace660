//! One server session on a connection of the driver's own: how it is bounded (the server's
//! keepalive settings), its four prepared statements, and how it ends (cancelled and closed,
//! so that no waiter or lock of it outlives the caller).

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::{Client, Statement};

use crate::keys::let_go;

/// How the server is told to drop a vanished client's session within the session timeout:
/// TCP keepalives (whole seconds), and `tcp_user_timeout` where the server has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keepalive {
    pub(crate) idle_s: u64,
    pub(crate) interval_s: u64,
    pub(crate) count: u64,
    pub(crate) user_timeout_ms: u128,
}

impl Keepalive {
    /// Probes start after a third of the bound, one per `interval` (a sixth, at least 1 s),
    /// and enough of them that `idle + count × interval` reaches the bound: the server cannot
    /// drop the session sooner than `bound` after it last heard from the client (with or
    /// without `tcp_user_timeout`), nor much later than `bound + interval`.
    pub(crate) fn for_bound(bound: Duration) -> Self {
        // Whole seconds, rounded up: rounding down would let a server without
        // `tcp_user_timeout` give up before the bound (2.5 s would probe out after 2 s).
        let b = (bound.as_secs() + u64::from(bound.subsec_nanos() > 0)).max(1);
        let idle_s = (b / 3).max(1);
        let interval_s = (b / 6).max(1);
        let count = b.saturating_sub(idle_s).div_ceil(interval_s).max(1);
        Keepalive {
            idle_s,
            interval_s,
            count,
            user_timeout_ms: bound.as_millis(),
        }
    }

    /// The longest a vanished client's session can outlive its last word.
    pub(crate) fn frees_within(&self, bound: Duration) -> Duration {
        let probes = Duration::from_secs(self.idle_s + self.count * self.interval_s);
        bound.max(probes) + Duration::from_secs(self.interval_s)
    }

    /// The values asked for the server's TCP settings, by name.
    pub(crate) fn tcp_settings(&self) -> [(&'static str, String); 4] {
        [
            ("tcp_keepalives_idle", self.idle_s.to_string()),
            ("tcp_keepalives_interval", self.interval_s.to_string()),
            ("tcp_keepalives_count", self.count.to_string()),
            ("tcp_user_timeout", self.user_timeout_ms.to_string()),
        ]
    }

    /// One simple-query batch that sets this session's server settings (each row: a name and
    /// the value in force afterwards, as the socket reports it) and reports the backend pid,
    /// whether the server is a standby, and whether `tcp_user_timeout` exists.
    /// Settings the server does not have (older versions) are skipped, not errors. Timeouts
    /// an administrator may have set for every session are turned off for this one: a
    /// `statement_timeout` would cut a waiting `pg_advisory_lock`, an `idle_session_timeout`
    /// would end a holder's idle session and free its lock. `client_connection_check_interval`
    /// makes a backend waiting for a lock notice that its client closed the connection.
    ///
    /// Two defaults an administrator may set for a database or role are pinned too: the grant
    /// statement must read the counter row after it waited for the lock, which only `read
    /// committed` does (under `repeatable read` or `serializable` its snapshot predates the
    /// wait, and a second queued waiter fails with 40001); and a grant's counter commit must be
    /// flushed before its token is handed out, so `synchronous_commit = off` becomes `on`
    /// (tokens are `Strict`: a crash must not issue one twice). A stronger setting
    /// (`remote_apply`, …) is left as it is.
    pub(crate) fn setup_sql(&self) -> String {
        let [idle, interval, count, user] = self.tcp_settings();
        let settings = [
            idle,
            interval,
            count,
            user,
            ("statement_timeout", "0".into()),
            ("lock_timeout", "0".into()),
            ("idle_session_timeout", "0".into()),
            ("idle_in_transaction_session_timeout", "0".into()),
            ("client_connection_check_interval", "1000".into()),
            ("default_transaction_isolation", "read committed".into()),
        ];
        let values: Vec<String> = settings
            .iter()
            .map(|(k, v)| format!("('{k}', '{v}')"))
            .collect();
        format!(
            "SELECT s.name, set_config(s.name, s.value, false) FROM (VALUES {}) AS s(name, value) \
             WHERE s.name IN (SELECT name FROM pg_catalog.pg_settings); \
             SELECT set_config('synchronous_commit', 'on', false) \
             WHERE current_setting('synchronous_commit') = 'off'; \
             SELECT pg_backend_pid()::text, pg_is_in_recovery()::text, \
             (current_setting('tcp_user_timeout', true) IS NOT NULL)::text",
            values.join(", ")
        )
    }
}

/// The SQL of the statements every session prepares, for one fencing table: a grant and an
/// unlock per mode, and the check.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) exclusive: ModeSql,
    /// Readers' and permit holders' token (`$1`: the name), once `family` has taken their
    /// locks.
    pub(crate) family_token: String,
    /// A reader's try and token in one statement (`family`'s keys: `$1` the name's, `$3` the
    /// gate, `$4` the permits', `$5` the readers'; `$2` the name): no row when refused, and
    /// then it has let go of what it took (the session may hold other names' locks).
    pub(crate) reader_try_grant: String,
    pub(crate) check: String,
    pub(crate) inspect: String,
    pub(crate) create_table: String,
    /// The table has the `value` column of elections: exclusive grants then take the holder's
    /// value as `$3` (NULL for a plain lock) and announce a valued grant (`election`).
    pub(crate) valued: bool,
    /// An election's reads and writes on this table (`election`).
    pub(crate) leader: String,
    pub(crate) proclaim: String,
    /// A leader's release: the unlock of `$1`, announced.
    pub(crate) unlock_announced: String,
    /// Every release is announced, a reader's and a permit holder's too
    /// ([`announcing_releases`](Self::announcing_releases)).
    pub(crate) announces: bool,
}

/// One mode's statements: a try, a waiting grant, an unlock.
#[derive(Debug)]
pub(crate) struct ModeSql {
    pub(crate) try_grant: String,
    pub(crate) wait_grant: String,
    pub(crate) unlock: String,
}

/// `"schema"."name"` from a validated `[schema.]name`.
pub(crate) fn quoted(table: &str) -> String {
    table
        .split('.')
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join(".")
}

/// The advisory lock `$1` (a bigint key) among `pg_locks`' rows: a bigint key shows as its
/// high half in `classid`, its low half in `objid`, with `objsubid` 1.
const KEY_IS: &str = "l.locktype = 'advisory' AND l.objsubid = 1 \
                      AND ((l.classid::int8 << 32) | l.objid::int8) = $1";

/// The channel an election's changes on the key `$1` are announced on
/// ([`channel`](crate::keys::channel)).
pub(crate) const CHANNEL_OF: &str = "'distlock_' || lpad(to_hex($1::int8), 16, '0')";

impl Sql {
    /// The same, whose exclusive unlock announces itself on the key's channel, as an
    /// election's does: polling waiters (`wait_sessions`) of other clients listen there.
    pub(crate) fn announcing_releases(mut self) -> Self {
        self.exclusive.unlock = self.unlock_announced.clone();
        self.announces = true;
        self
    }

    /// The statements for `table`; `valued` when it has the `value` column (`election`).
    pub(crate) fn for_table(table: &str, valued: bool) -> Self {
        let t = quoted(table);
        // Lock and count in one statement: a grant costs one round trip, and the counter
        // moves only under the lock. On any error the session is closed, never reused: a
        // session advisory lock taken in a transaction that failed stays held.
        // The next token of the name `name` (a parameter), for this session, if `only`; with
        // `value` (an expression) as the holder's value, announced on the key `$1`'s channel
        // when it is not NULL if `announce`.
        let bump = |name: &str, only: &str, value: Option<(&str, bool)>| {
            let (column, set, announce) = match value {
                Some((v, announce)) => (
                    format!(", value) SELECT {name}, 1, pg_backend_pid(), now(), {v}"),
                    ", value = excluded.value",
                    if announce {
                        format!(
                            ", CASE WHEN f.value IS NOT NULL THEN pg_notify({CHANNEL_OF}, '') END"
                        )
                    } else {
                        String::new()
                    },
                ),
                None => (
                    format!(") SELECT {name}, 1, pg_backend_pid(), now()"),
                    "",
                    String::new(),
                ),
            };
            format!(
                "INSERT INTO {t} AS f (name, token, holder_pid, granted_at{column} {only} \
                 ON CONFLICT (name) DO UPDATE SET token = f.token + 1, \
                 holder_pid = excluded.holder_pid, granted_at = excluded.granted_at{set} \
                 RETURNING f.token, pg_backend_pid(){announce}"
            )
        };
        // A writer's value is `$3`; a reader has none (its `$3` is a key).
        let (value, none) = (
            valued.then_some(("$3::bytea", true)),
            valued.then_some(("NULL::bytea", false)),
        );
        let grant = |lock: &str, value| {
            format!(
                "WITH l AS (SELECT {lock}) {}",
                bump("$2", "FROM l WHERE l.got", value)
            )
        };
        Sql {
            exclusive: ModeSql {
                try_grant: grant("pg_try_advisory_lock($1) AS got", value),
                wait_grant: grant("pg_advisory_lock($1), true AS got", value),
                unlock: "SELECT pg_advisory_unlock($1)".into(),
            },
            // Taken by `family` before: the counter moves after the locks, as for a writer. A
            // reader has no value; a valued table's row forgets the last leader's.
            family_token: bump("$1::text", "", none),
            // CASE tries in order and stops at the first refusal, which lets go of what the
            // steps before it took (an unlock that fails cannot: its key is this try's).
            reader_try_grant: {
                let (name, gate, permits, readers) = (
                    "pg_advisory_unlock_shared($1)",
                    "pg_advisory_unlock($3)",
                    "pg_advisory_unlock($4)",
                    "pg_advisory_unlock_shared($5)",
                );
                let case = format!(
                    "CASE WHEN NOT pg_try_advisory_lock_shared($1) THEN false \
                     WHEN NOT pg_try_advisory_lock($3) THEN {} \
                     WHEN NOT pg_try_advisory_lock($4) THEN {} \
                     WHEN NOT {permits} THEN {} \
                     WHEN NOT pg_try_advisory_lock_shared($5) THEN {} \
                     WHEN NOT {gate} THEN {} ELSE true END AS got",
                    let_go(&[name]),
                    let_go(&[gate, name]),
                    let_go(&[gate, name]),
                    let_go(&[gate, name]),
                    let_go(&[readers, name]),
                );
                grant(&case, none)
            },
            check: format!(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l \
                 WHERE {KEY_IS} AND l.granted AND l.pid = pg_backend_pid())"
            ),

            // The holder is ours if the counter row names its session: same pid, and granted
            // after that backend started (a pid reused by a foreign session is not ours).
            // A family member still at the gate (`$3`) or waiting in it holds the name's key
            // without holding the lock; a permit holder's mark (class `$4`) says its count.
            inspect: format!(
                "SELECT f.token, coalesce(f.holder_pid = l.pid \
                 AND f.granted_at >= a.backend_start, false), l.mode = 'ShareLock', \
                 (SELECT m.objid::int8 FROM pg_catalog.pg_locks m \
                 WHERE m.locktype = 'advisory' AND m.objsubid = 2 AND m.classid::int8 = $4 \
                 AND m.pid = l.pid AND m.granted LIMIT 1), \
                 EXISTS (SELECT 1 FROM pg_catalog.pg_locks g WHERE g.locktype = 'advisory' \
                 AND g.objsubid = 1 AND ((g.classid::int8 << 32) | g.objid::int8) = $3 \
                 AND g.pid = l.pid) \
                 FROM pg_catalog.pg_locks l \
                 LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
                 LEFT JOIN {t} f ON f.name = $2 \
                 WHERE {KEY_IS} AND l.granted AND l.database = \
                 (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())"
            ),
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (name text PRIMARY KEY, token bigint NOT NULL, \
                 holder_pid int, granted_at timestamptz, value bytea)"
            ),
            valued,
            announces: false,
            unlock_announced: format!("SELECT pg_advisory_unlock($1), pg_notify({CHANNEL_OF}, '')"),
            // The exclusive holder of `$1`: its row's token and value, and whether the row is
            // its own (as `inspect` tells).
            leader: format!(
                "SELECT f.token, f.value, coalesce(f.holder_pid = l.pid \
                 AND f.granted_at >= a.backend_start, false) \
                 FROM pg_catalog.pg_locks l \
                 LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
                 LEFT JOIN {t} f ON f.name = $2 \
                 WHERE {KEY_IS} AND l.granted AND l.mode = 'ExclusiveLock' AND l.database = \
                 (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())"
            ),
            // The value `$3` of `$2`, if this session holds its key `$1` exclusively and its
            // row is this session's; announced.
            proclaim: format!(
                "UPDATE {t} AS f SET value = $3::bytea WHERE f.name = $2 \
                 AND f.holder_pid = pg_backend_pid() AND EXISTS (SELECT 1 \
                 FROM pg_catalog.pg_locks l WHERE {KEY_IS} AND l.granted \
                 AND l.mode = 'ExclusiveLock' AND l.pid = pg_backend_pid()) \
                 RETURNING pg_notify({CHANNEL_OF}, '')"
            ),
        }
    }
}

/// The prepared statements of one session.
pub(crate) struct Statements {
    pub(crate) exclusive: ModeStatements,
    pub(crate) family_token: Statement,
    pub(crate) reader_try_grant: Statement,
    pub(crate) check: Statement,
}

/// One mode's prepared statements ([`ModeSql`]).
pub(crate) struct ModeStatements {
    pub(crate) try_grant: Statement,
    pub(crate) wait_grant: Statement,
    pub(crate) unlock: Statement,
}

impl ModeStatements {
    /// Prepares `sql` on `c`, pipelined.
    pub(crate) async fn prepare(
        c: &Client,
        sql: &ModeSql,
    ) -> std::result::Result<Self, tokio_postgres::Error> {
        let (try_grant, wait_grant, unlock) = tokio::try_join!(
            c.prepare(&sql.try_grant),
            c.prepare(&sql.wait_grant),
            c.prepare(&sql.unlock)
        )?;
        Ok(ModeStatements {
            try_grant,
            wait_grant,
            unlock,
        })
    }
}

/// A server session: a connection the driver owns, set up and prepared. Dropping it closes
/// the connection at once (the connection task is aborted), which ends the session on the
/// server and frees every lock it holds.
pub(crate) struct Session {
    pub(crate) client: Client,
    pub(crate) task: JoinHandle<()>,
    /// Turns true when the connection has closed.
    pub(crate) closed: tokio::sync::watch::Receiver<bool>,
    /// The backend's pid, which every grant must report again (else a pooler is in the way).
    pub(crate) pid: i32,
    pub(crate) stmts: Statements,
}

impl Session {
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed() || self.task.is_finished() || *self.closed.borrow()
    }

    /// Resolves once the connection has closed (or the session was dropped).
    pub(crate) fn ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut closed = self.closed.clone();
        async move {
            let _ = closed.wait_for(|c| *c).await;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalives_reach_the_bound_and_not_much_more() {
        for ms in [
            1000, 1001, 1500, 2000, 2500, 2999, 3000, 5000, 6000, 10_000, 60_000, 3_600_000,
        ] {
            let bound = Duration::from_millis(ms);
            let k = Keepalive::for_bound(bound);
            // Without tcp_user_timeout the server gives up after idle + count × interval.
            let kill = Duration::from_secs(k.idle_s + k.count * k.interval_s);
            assert!(kill >= bound, "{bound:?}: probes give up after {kill:?}");
            assert!(kill <= k.frees_within(bound), "{bound:?}: {kill:?}");
            assert!(k.frees_within(bound) <= bound + Duration::from_secs(2 + ms / 6000));
            assert_eq!(k.user_timeout_ms, bound.as_millis());
        }
    }

    #[test]
    fn table_names_are_quoted() {
        for valued in [false, true] {
            let sql = Sql::for_table("ops.fences", valued);
            assert!(sql
                .exclusive
                .try_grant
                .contains("INSERT INTO \"ops\".\"fences\" AS f"));
            assert_eq!(sql.exclusive.try_grant.contains("$3"), valued);
        }
    }
}

/// Idle sessions, holding no lock, kept for the next acquisitions.
#[derive(Default)]
pub(crate) struct Pool(parking_lot::Mutex<Vec<Session>>);

impl Pool {
    /// More idle sessions than this are closed on release.
    const MAX: usize = 16;

    /// An idle session whose connection is still open, if any.
    pub(crate) fn take(&self) -> Option<Session> {
        let mut idle = self.0.lock();
        while let Some(s) = idle.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    /// Keeps a session that holds nothing for the next acquisition.
    pub(crate) fn put_back(&self, session: Session) {
        if session.is_closed() {
            return;
        }
        let mut idle = self.0.lock();
        if idle.len() < Self::MAX {
            idle.push(session);
        }
    }
}
