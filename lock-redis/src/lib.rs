//! # lock-redis: distlock on a single Redis server, or a Sentinel deployment's master
//!
//! [`RedisLock`] implements [`lock_core::DistributedLock`] on one Redis (≥ 6, for RESP3), or
//! on the master of a Sentinel deployment, followed through failovers (see Sentinel below).
//!
//! ## Algorithm
//!
//! - **Acquire** is one Lua script: `SET key token NX PX ttl` plus `INCR` of the lock's fencing
//!   counter, returning the token — or the holder's `PTTL` when busy. An error or timeout during
//!   acquire is ambiguous (the script may have run): the driver deletes the key if it holds its
//!   own token before returning the error. An `acquire` future dropped while its request is on
//!   its way (the caller's own timeout, a `select!`) does the same in the background: a grant
//!   that nobody will use does not hold the lock until its TTL.
//! - **Release** compares the token, deletes, and `PUBLISH`es on the lock's channel, atomically.
//!   **Renew** compares the token and `PEXPIRE`s; it never recreates a missing key. A client's
//!   leases renewed by their watchdogs renew together: the lease whose renewal is due sends one
//!   script that also renews every other lease of the client past half of its renewal period
//!   (each owner-checked), and their watchdogs take that confirmation when their turn comes,
//!   so N leases cost about two requests per third of the TTL, not N (at most 256 leases a
//!   request; measured in `tests/renewals.rs`). A lease renewed by hand, past its `max_hold`,
//!   being released, or refused once is renewed on nobody's behalf. On a Redis Cluster, whose
//!   scripts take one slot's keys only, each lease renews alone.
//! - **Waiting** never polls behind a distlock holder (behind another client's, see Keys): the
//!   one multiplexed RESP3 connection of a `RedisLock` subscribes to the channel of each name
//!   that has waiters (once, however many wait). A waiter subscribes
//!   before it retries, then sleeps until a release message or the holder's `PTTL`, whichever
//!   comes first, so a lost message costs at most one `PTTL`, never a hang.
//! - **Lost-lease signal**: `valid_until` = acquisition start + TTL − (TTL·1 % + 2 ms), on the
//!   monotonic clock, so a holder that cannot renew knows before the key can expire on the server.
//!
//! ## Shared holders and permits
//!
//! [`Mode::Shared`](lock_core::Mode::Shared) and [`Mode::Permits`](lock_core::Mode::Permits)
//! (not with plain keys: `Error::Unsupported`) form a *group* in the lock's own key: its value
//! is `distlock-group:s` or `distlock-group:p<K>`, with an expiry never shorter than its
//! longest-lived member's, so an exclusive `SET … NX` — distlock's or any other client's on the
//! key — is refused while the group holds, and the mutex's own script is unchanged. Members are
//! `<fence>:<token>` in the sorted set `<prefix>{<name>}:holders`, scored by their expiry in the
//! server's milliseconds (`TIME`, the clock of the key's `PX`); each script drops the members
//! whose score has passed before it counts, so a crashed holder's permit comes back at its
//! TTL. Every grant takes the next fence value (tokens increase across modes). A release ends
//! the group with its last member and announces itself on the lock's channel, as the mutex's
//! does. An operator's `DEL` of the key ends every member (their renewals are refused). Redis
//! has no queue: a request takes the lock if it is free when it tries, so readers that keep
//! overlapping can keep a writer waiting (`Capabilities::fifo` is false).
//!
//! ## Keys
//!
//! `<prefix>{<name>}` (owner token, PX expiry) and `<prefix>{<name>}:fence` (counter, no expiry)
//! share a hash tag, so both live in one Cluster slot. The prefix defaults to `distlock:`. The
//! fence key stays after the lock is released — one small key per lock name ever used — because
//! a token must never repeat. Owner tokens are `distlock-<uuid>`.
//!
//! **Plain keys** (`keys=plain`, [`RedisConfig::with_plain_keys`]) share locks with redis-py's
//! `Lock`, redsync, node-redlock and the redis.io recipe: the lock is the key `<prefix><name>`
//! holding the owner token (with `prefix=`, just `<name>`), released by compare-and-delete and
//! renewed by compare-and-`PEXPIRE`, as they do it. There is no counter, so fencing is `None`.
//!
//! **Other clients on the key** (in either layout) announce no release. A waiter that finds a
//! holder whose value lacks the `distlock-` tag looks again every 100 ms (redis-py's own
//! interval) rather than sleeping until the holder's `PTTL`; `inspect` reports such a holder as
//! [`HolderInfo::foreign`](lock_core::HolderInfo::foreign), with no token.
//!
//! ## Fencing: `BestEffort` unless the server is durable
//!
//! The counter lives in Redis memory. A server restarted without an AOF fsynced on every write
//! (`appendonly yes` + `appendfsync always`) forgets both the lock and the counter: a new holder
//! may be granted while the old one still works, and its token can repeat an old one. The driver
//! reads the server's configuration at connect time and reports `Fencing::Strict` only for a
//! durable server; otherwise `Fencing::BestEffort`. **`wait_aof=N`**
//! ([`RedisConfig::with_wait_aof`]) makes a server with any `appendfsync` durable for locks: a
//! grant or renewal counts once the master (and `N` replicas) fsynced it to the append-only
//! file (`WAITAOF`: Redis 7.2, Valkey 7.2 and later; a server without it, or without
//! `appendonly yes`, is refused at connect), so fencing is `Strict` on one server. Replication
//! does not help: Redis replicates asynchronously, and a promoted replica may not have seen the
//! last grant.
//!
//! ## Failure modes
//!
//! **Eviction is refused.**
//! A server with `maxmemory` set and an evicting `maxmemory-policy` can drop a held lock's key
//! (`volatile-*`: keys with a TTL) or also the fencing counter (`allkeys-*`), so a lock could be
//! granted twice and tokens restart at 1. The driver reads `INFO` at connect, before the first
//! grant after every reconnect (the server behind an address may have changed: a failover), and
//! at least once a minute, and refuses such a server with an `Error::Config` that says why. Only
//! `allow_eviction=true` in the URL ([`RedisConfig::with_allow_eviction`]) accepts it, and then
//! `Capabilities::fencing` is `None`. A `CONFIG SET` between two checks goes unnoticed until the
//! next one.
//!
//! **A Redis Cluster node named in a `redis://` URL is refused** at connect (`Error::Config`,
//! from `cluster_enabled:1` in `INFO`): that URL talks to one server, which would serve a lock
//! or answer `MOVED` by its name's slot. Name the cluster in a `redis+cluster://` URL instead
//! (below).
//!
//! **A replica is refused** by the same checks: a read-only one refuses every grant, and a
//! writable one (`replica-read-only no`) would take locks that its next sync with its master
//! erases.
//!
//! **A restart without durable persistence** forgets locks and counters (see Fencing). **A
//! failover** to an asynchronously replicated replica can lose the last grants; the single-node
//! driver cannot tell, which is what Redlock (`lock-redlock`) addresses for the lock itself.
//! **An unreachable server** is `Error::Unavailable` (retryable); a waiting `acquire` rides it
//! out with a growing pause while its deadline allows. **Drop and abandon**: dropping a lease
//! releases it in the background on the current runtime; `abandon()` leaves the key to expire
//! after its TTL.
//!
//! **The server's clock decides when a lock ends.** Redis expires a key at an absolute time
//! of day, so a step of the server's clock moves every lock's end with it: a forward step
//! past a key's expiry ends the lock at once, and a second holder can be granted while the
//! first still believes in its lease (its validity is counted on its own monotonic clock).
//! The fencing token still orders the two, and the first holder learns it at its next
//! renewal (`NotHeld`; with the watchdog, within a third of the TTL). A backward step keeps a
//! dead holder's lock for the TTL plus the step. A server clock that runs fast is covered by
//! the drift allowance (1 % of the TTL + 2 ms) up to about 1 %. Run the server with a clock
//! that slews rather than steps (chrony or ntpd without step corrections after boot), and
//! fence the data. Measured in `tests/clock.rs` and RELIABILITY.md, "Clock faults".
//!
//! **A grant that comes back after its own validity** (the TTL less the clock drift allowance,
//! counted from before the request) is released and reported as `Error::Unavailable`
//! (retryable), never handed out. TTLs near the 10 ms minimum meet this on a server that
//! fsyncs every write: against `appendfsync always` with a `dd` write loop on the same disk, 17
//! of 30 single tries at 10 ms were refused this way. Choose a TTL many round trips long.
//!
//! ## Sentinel
//!
//! `redis+sentinel://[user[:password]@]s1[:p1],s2[:p2],.../MASTER[/db][?…]` finds the master
//! that the sentinels listed (port 26379 by default) know as `MASTER` (`SENTINEL
//! get-master-addr-by-name`, asking each in turn), and follows it: the client listens for the
//! sentinels' `+switch-master`, asks them again every 2 s and whenever its connection drops,
//! and moves to a new master only once that server answers as a master itself (`INFO`), so it
//! never writes to a replica. Waiters' subscriptions move with it, and every waiter re-checks.
//! A lease granted before the move is **AtRisk until its key is confirmed on the new master**
//! (renewed at once, with automatic renewal; by its holder's `renew` otherwise): Held again if
//! its key is there with its token, Lost if not.
//!
//! An answer to a request sent before the client moved (the old master, frozen, answering
//! after its thaw) confirms nothing: such a grant is undone and the acquisition fails with
//! `Unavailable`, such a renewal is retried on the new master, such a release is sent again
//! there.
//!
//! Replication is asynchronous, and two things can give one lock to two holders across a
//! failover: a grant the old master acknowledged but had not yet passed to the replica the
//! sentinels promote is forgotten, and a deposed master that does not know it yet (frozen,
//! then thawed before the sentinels reconfigure it) still grants to a client that has not
//! yet heard of the failover. The first holder learns it at its next renewal (`Lost`, within
//! a third of the TTL with the watchdog). **`wait_replicas=N`**
//! ([`RedisConfig::with_wait_replicas`]) narrows both: a grant or renewal counts only once
//! `N` replicas acknowledged it (`WAIT`), and a deposed master has none left: in 109 failovers
//! under the nemesis with `wait_replicas=2` no lock had two holders and no token repeated,
//! against 81 overlaps and 5,278 repeated tokens in 74 failovers without it (RELIABILITY.md). It
//! does not make a write durable, a replica that acknowledged is not necessarily the one
//! promoted, and a grant waits for (and so needs) `N` replicas attached.
//! So on a Sentinel deployment fencing is `BestEffort` whatever the servers' fsync policy (the
//! counter can lose its last increments the same way), and elections are `Unsupported` (an
//! observer's connection of its own would not follow a failover). Measured in RELIABILITY.md,
//! "Redis Sentinel". Sentinels that want a login of their own (their `requirepass`, or an
//! ACL user) get it from `sentinel_password=` (and `sentinel_user=`) in the URL: the URL's
//! user info is the Redis servers'. A sentinel that refuses the login fails the connection
//! with `Error::Unauthenticated` saying which to set, unless another sentinel answers.
//! `rediss+sentinel://…[?tls_ca_file=/path/ca.pem]` (feature `tls`) speaks TLS to the
//! sentinels and to the servers they name alike, trusting one CA for both: a deployment with
//! TLS on its sentinels' `tls-port` and `tls-replication yes` (the sentinels then name the
//! servers' TLS ports).
//!
//! ## Cluster
//!
//! `redis+cluster://[user[:password]@]n1[:p1],n2[:p2],...[?…]` (port 6379 by default; no
//! database: a cluster has only 0) finds the cluster from any node listed that answers and
//! sends each lock's commands to the master of its slot (a lock's keys share one, by their
//! hash tag `{name}`), following the cluster's redirections (`MOVED`, `ASK`) and topology
//! changes through redis-rs's cluster client. Every master is checked at connect as a single
//! server is (`INFO` on each: none may evict keys), and after a reconnect the master a grant
//! goes to is checked before it (so a shard down holds up no grant on another; a master
//! deposed since, which a client's map may still name, answers as a replica and is let be:
//! the grant is redirected to the new one).
//!
//! Release announcements stay on the lock's shard where every master has sharded pub/sub
//! (Redis and Valkey 7.0 and later; read from `INFO` at connect, and fixed for the client's
//! life): the release scripts `SPUBLISH` on the lock's channel, which shares the lock key's
//! hash tag, and waiters `SSUBSCRIBE` on the master of its slot. A slot that moves takes its
//! subscriptions along: the cluster client subscribes again wherever the slot is after a
//! failover, and after a migration (the node that gives up a slot ends its subscriptions) the
//! waiters re-check and subscribe on the new master. Before 7.0, and with plain keys (no hash
//! tag for the channel to share), announcements go by classic pub/sub, which every node of
//! the cluster carries to every other. Clients that connected before and after an upgrade to
//! 7.0 announce in different forms until the older ones reconnect: their waiters then wake
//! at the holder's TTL rather than at its release (`tests/cluster.rs`, `pubsub::…`).
//!
//! A shard's failover (its master down for the cluster's node timeout, a replica promoted)
//! is followed: a held lease is renewed on the new master and stays Held if its key is there,
//! turns Lost if the failover forgot it (replication is asynchronous, as behind sentinels);
//! waiters are woken on the new master (`tests/cluster.rs`). A lease is not put in doubt the
//! moment its shard fails over (as behind sentinels): it learns at its next renewal. A master
//! frozen past its shard's failover answers, at its thaw, what was sent to it before: a grant
//! from a deposed master, with a fencing token the new master will hand out again.
//! `wait_replicas=N` narrows this as behind sentinels: each grant or renewal goes with its
//! `WAIT` in one pipeline to the master of the lock's slot (redirected as a whole when the slot
//! moves), so the count is of that master's replicas, and a deposed master has none left. So fencing is
//! `BestEffort` and elections are `Unsupported`. `rediss+cluster://` speaks TLS to every node
//! (the `tls` feature; `?tls_ca_file=PATH` trusts a private CA for the nodes listed and those
//! the cluster names), as a cluster with `tls-cluster yes` or a managed service's in-transit
//! encryption wants (`tests/cluster_tls.rs`).
//! Measured in RELIABILITY.md, "Redis Cluster".
//!
//! ## URL
//!
//! `redis://[user[:password]@]host[:port][/db][?prefix=P&keys=tagged|plain&allow_eviction=true&wait_replicas=N&wait_aof=N]`; `rediss://` with the
//! `tls` feature (`?tls_ca_file=PATH` trusts a private CA). Unknown or repeated parameters are
//! refused. Passwords never appear in `Debug`, `Display`, logs or errors.
//!
//! ## Example
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{DistributedLock, LockName, LockOptions};
//! let locks = lock_redis::RedisLock::from_url("redis://127.0.0.1:6379").await?;
//! let lease = locks.acquire(&LockName::new("invoices")?, &LockOptions::new(Duration::from_secs(10))).await?;
//! // ... pass lease.fencing_token() to the storage ...
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod acknowledged;
mod client;
mod cluster;
mod config;
mod conn;
mod election;
mod facts;
mod family;
mod lease;
mod lock;
mod renewals;
mod scripts;
mod sentinel;
mod undo;
mod wakeup;

pub use config::{RedisConfig, DEFAULT_PREFIX};
pub use conn::Conn;
pub use lock::RedisLock;
pub use lock_core;
pub use redis;

/// The building blocks `lock-redlock` shares with this driver: one master's connection with its
/// release announcements, the Lua scripts and the key layout.
///
/// **Not a stable API.** It changes whenever the two drivers need it to; depend on
/// [`RedisLock`] and [`RedisConfig`] instead.
pub mod raw {
    pub use crate::client::RedisNode;
    pub use crate::undo::ReleaseOnDrop;
    pub use crate::wakeup::ReleaseWatch;
    /// The Lua scripts and the key layout.
    pub mod scripts {
        pub use crate::scripts::*;
    }
    pub use crate::wakeup::ReleaseDedup;
    /// Shared holders and permits as a *group* in the lock's key (see the crate's docs).
    pub mod family {
        pub use crate::family::*;
    }
    pub use crate::undo::release_any;
    /// The renew script: one lease or many, of any mode, in one request.
    pub mod renewals {
        pub use crate::renewals::{renew, Renewing};
    }
    /// Whether this build speaks TLS (the `tls` feature): a driver built on this one checks
    /// it where its own URL turns TLS on.
    pub const TLS: bool = cfg!(feature = "tls");
}

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`RedisLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: config::BACKEND,
    schemes: if cfg!(feature = "tls") {
        &[
            "redis",
            "rediss",
            "redis+sentinel",
            "rediss+sentinel",
            "redis+cluster",
            "rediss+cluster",
        ]
    } else {
        &["redis", "redis+sentinel", "redis+cluster"]
    },
    connect: |url| lock_core::driver::connecting(async move { RedisLock::from_url(&url).await }),
};
