//! # lock-postgres: distlock on PostgreSQL
//!
//! [`PgLock`] implements [`lock_core::DistributedLock`] with session advisory locks: the
//! database most applications already run, without the footguns that usually come with it.
//!
//! ## Algorithm
//!
//! Each lease owns a connection (a session) for its whole life; idle sessions are kept for the
//! next acquisitions. `try_acquire` is one statement: `pg_try_advisory_lock` on the name's key
//! and, if granted, the fencing counter's increment. A waiting `acquire` runs the blocking
//! `pg_advisory_lock` instead: the waiter waits in the server's own lock queue (FIFO, no
//! polling) and is granted the moment the holder unlocks or its session ends. A waiter that
//! gives up (its deadline, or its future dropped) sends a cancel request and closes its
//! connection: nothing stays queued, and a grant that raced the cancel is freed with the
//! session.
//!
//! **The session is the lease**, as with ZooKeeper. For each session the driver sets the
//! server's `tcp_keepalives_idle` / `_interval` / `_count` and `tcp_user_timeout` so that
//! the server ends the session of a client that vanished — and frees its locks — no sooner
//! than the session timeout after it last heard from the client, and at most one keepalive
//! interval later (a crashed host, a cut cable: by default TCP takes hours to notice). Each
//! lease confirms its session every third of the session timeout; `valid_until` is the start
//! of the last confirmed query plus the session timeout, minus drift, so the holder turns
//! AtRisk, then Lost, before the server can free the lock. It also turns off, for its own
//! sessions, the `statement_timeout` and `idle_session_timeout` an administrator may have set:
//! they would cut a waiting acquire, or end a holder's idle session and free its lock.
//!
//! **What it costs.** A connection (a server process) per held or awaited lock — or, with
//! [`shared_sessions=N`](PgConfig::with_shared_sessions), at most `N` connections for every
//! lock granted at once (in any mode), one confirmation per session for all of them, and the
//! loss of every lock of a session when it ends (see `docs/backends.md`). A waiter's
//! statement holds a snapshot while it waits, which holds back the `xmin` horizon (and
//! vacuum) for as long as it waits, like any long-running statement. Every grant writes one
//! row (the counter), so it costs a commit.
//!
//! ## Shared mode
//!
//! [`Mode::Shared`](lock_core::Mode::Shared) is `pg_advisory_lock_shared` on the same key, so
//! another program's `pg_advisory_lock_shared(key)` / `pg_advisory_lock(key)` and distlock's
//! shared and exclusive modes are one lock (`tests/shared.rs`). The server's one lock queue
//! serves both modes in order: a reader that comes after a waiting writer waits (also a
//! `try_acquire`, which the server refuses), so readers cannot starve a writer. Every grant,
//! shared or not, takes the next token. `holders` lists every session that holds the key
//! (`pg_locks`); the fencing table names only the newest grant's session, so only that
//! reader's token is shown, and a foreign reader is not told apart from an earlier distlock
//! reader. A reader also passes the name's *gate* and holds a readers' key beside it (see
//! below), which keeps it apart from permit holders; its try is still one statement (keys
//! and token together), a permit's three round trips.
//!
//! ## Permits
//!
//! [`Mode::Permits`](lock_core::Mode::Permits)`(k)`: a permit holder's session holds the name's
//! key shared (so writers, distlock's or another program's `pg_advisory_lock(key)`, and permits
//! exclude each other) and one of `k` *slot* keys. Advisory locks have two modes and a session
//! waits on one key at a time, so more keys of the name do the rest: every reader and permit
//! request passes a *gate* key one at a time, in the server's queue order (first come, first
//! served); inside it a permit request waits for the readers to leave (their key, exclusive,
//! for a moment) and a reader for the permit holders; a *mark* of the count, held from before
//! the request waits, makes a request with another count a
//! [`Error::PermitsMismatch`](lock_core::Error::PermitsMismatch). A request that finds every
//! slot taken keeps the gate and waits on one slot at a time for 1–2 s (`lock_timeout`), then
//! looks at all again: a holder's end (release, crash, terminate) wakes it at once when it is
//! the slot it waits on, and within that pause otherwise — about one statement a second while
//! it waits. Another program's `pg_advisory_lock_shared(key)` passes no gate: it is a reader
//! that keeps writers out but not permit holders. `holders` lists each permit holder with its
//! count, and leaves out requests still at the gate.
//!
//! ## Keys
//!
//! The advisory lock's key is [`advisory_key`]: the first 8 bytes of the name's SHA-256, a
//! big-endian `bigint`; in SQL `('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'),
//! 16))::bit(64)::bigint`. Advisory locks are per database; other programs' advisory locks on
//! the same key are the same lock. `distlock run` exports the key as `DISTLOCK_KEY`.
//!
//! ## Fencing: `Strict`
//!
//! A per-name counter in the table `distlock_fencing` (`table=` to change it; created if
//! absent: `name text PRIMARY KEY, token bigint, holder_pid int, granted_at timestamptz`),
//! incremented in the statement that takes the lock and committed before `acquire` returns:
//! strictly increasing, and durable across server restarts. A failover to an asynchronous
//! replica can lose the last increments (and every advisory lock: they are not replicated).
//! The advisory key does not depend on the table, so clients of one lock with different
//! `table=` settings still exclude each other but count in two counters: their tokens are
//! not comparable. Every client of a lock (and every version of it in a rolling deploy) must
//! name the same table.
//!
//! ## Failure modes
//!
//! **A vanished holder** (crash, partition) frees its lock between one session timeout and
//! one keepalive interval more after the server last heard from it ([`PgLock::frees_within`]),
//! on a direct connection; behind a session pooler, when the pooler gives the client up.
//! **A closed connection** — a terminated backend (`pg_terminate_backend`), a server restart,
//! a reset from the network — frees the lock on the server the moment the server sees it. The
//! lease turns Lost the moment its own client sees the same close (within milliseconds), not
//! at its next confirmation; but nothing orders the two, so another client's grant can return
//! a fraction of a millisecond before the old holder's lost signal (measured: in 10 of 40
//! cuts, by at most 1.6 ms). Fence writes that must not overlap. **A transaction-pooling
//! proxy** (PgBouncer's `pool_mode = transaction`) would move a session's statements between
//! server connections, so a lock would stay on a connection nobody owns: connecting through
//! one is refused with a `Config` error; connect directly, or through `pool_mode = session`.
//! **A standby** is refused (its locks would not exclude the primary's clients). **Defaults
//! set for a database or role** are pinned in the driver's own sessions where they would
//! break a promise: `read committed` (under `repeatable read` or `serializable` a queued
//! waiter's grant failed with 40001), and `synchronous_commit = off` becomes `on` (a crash
//! re-issued `Strict` tokens). **A frozen
//! or partitioned server** whose kernel (or a proxy) still takes the bytes is `Unavailable`,
//! never a hang: the login gets `connect_timeout` plus the session timeout, and every other
//! request the session timeout. The one exception is the blocking wait in the server's lock
//! queue: the caller's deadline bounds it (TCP keepalives end it when the host is gone, not
//! when the server process is frozen).
//!
//! ## URL
//!
//! `postgres[ql]://[user[:password]@]host[:port][/dbname][?sslmode=…&tls_ca_file=…&session_timeout_ms=N&table=…]`;
//! see [`PgConfig::from_url`] and [`PgConfig::URL_PARAMS`] (libpq's `sslrootcert` and
//! `connect_timeout` are aliases). TLS (`sslmode=require`, `verify-ca`, `verify-full`, or
//! `prefer` when the server offers it) needs the `tls` feature and always verifies the
//! certificate. The password never appears in `Debug`, `Display` or errors.
//!
//! ## Example
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{DistributedLock, LockName, LockOptions};
//! let locks = lock_postgres::PgLock::from_url("postgres://app:pw@db.internal/app").await?;
//! // The TTL must be at least the session timeout (6 s by default).
//! let opts = LockOptions::new(Duration::from_secs(10)).auto_renew(None);
//! let lease = locks.acquire(&LockName::new("reindex")?, &opts).await?;
//! let token = lease.fencing_token(); // the name's counter
//! # let _ = token;
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod client;
mod config;
mod election;
mod family;
mod keys;
mod lease;
mod lock;
mod polling;
mod pooler;
mod session;
mod shared;
mod waits;

pub use config::PgConfig;
pub use keys::advisory_key;
pub use lock::PgLock;
pub use lock_core;
pub use tokio_postgres;

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`PgLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: config::BACKEND,
    schemes: config::SCHEMES,
    connect: |url| lock_core::driver::connecting(async move { PgLock::from_url(&url).await }),
};
