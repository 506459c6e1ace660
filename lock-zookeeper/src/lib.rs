//! # lock-zookeeper: distlock on ZooKeeper
//!
//! [`ZkLock`] implements [`lock_core::DistributedLock`] with the protected
//! ephemeral-sequential recipe.
//!
//! ## Algorithm
//!
//! A container node per lock name, one ephemeral sequential node per contender; the lowest
//! sequence holds, each waiter watches only its predecessor (no herd, FIFO). A contender that
//! loses the connection while creating its node finds it again by its uuid instead of leaving
//! an orphan behind (it creates again only once a lookup said for certain that the first create
//! was not applied; in an ensemble that lookup goes through the leader with a `sync`, because
//! the session may have moved to a server that has not yet applied the create). **The session is the lease**: every lock of a client lives as long as its
//! session, confirmed in the background; in an ensemble each confirmation (and each grant) goes
//! through the leader with a `sync` and vouches for half the session timeout, on a standalone
//! server for all of it. See [`ZkLock`] for the pacing and for what the TTL option means here.
//!
//! ## Keys
//!
//! `<chroot><base>/<name>/_c_<uuid>-lock-<seq>` (base `/distlock` by default; other modes'
//! marks below). **Other clients'
//! nodes count**: every child of the lock node whose name ends in a ZooKeeper sequence suffix
//! (ten digits) is a contender, ordered by that number, whoever made it — Curator's
//! `_c_<uuid>-lock-`, kazoo's `<id>__lock__`, the WriteLock recipe's `x-<session>-`. A foreign
//! holder therefore holds the lock for distlock too, in waiting and in `inspect`. `base=/`
//! puts lock `name` at `/name`: Curator's `InterProcessMutex(client, "/name")` and kazoo's
//! `Lock(client, "/name")` (with `extra_lock_patterns=["-lock-"]`, so that kazoo counts
//! distlock's nodes) are then the same lock; see the README's Interoperability section. Lock
//! nodes are containers, which ZooKeeper removes once empty; `parents=persistent` keeps them
//! (a reused kazoo `Lock` object needs its node to stay).
//!
//! ## Shared holders and permits
//!
//! A contender's node name says its mode: `_c_<uuid>-__READ__<seq>` for a shared holder (the
//! name Curator's `InterProcessReadWriteLock` gives its readers), `_c_<uuid>-permit-<K>-<seq>`
//! for one of `K` permits, and the exclusive mark otherwise; other clients' readers
//! (`__READ__`, kazoo's `__rlock__`) count as shared, every other node as exclusive. A
//! contender holds once it and every node before it may hold together
//! ([`queue_turn`](lock_core::driver::queue_turn)): readers behind a waiting writer wait
//! behind it, and the first count of permits wins. A reader watches the newest node before it
//! that it cannot hold beside; a permit waiter behind `K` permits watches the name's children
//! (any of them may go first). **Curator's read-write lock**: with `nodes=rwlock`, exclusive
//! nodes are named `_c_<uuid>-__WRIT__<seq>`, as its writers are, and the two share one FIFO
//! queue both ways. Each Curator recipe orders only nodes it names itself (its readers wait
//! only for `__WRIT__` nodes; its mutex sorts any other node after its own), so one lock name
//! is shared with either Curator's mutex (the default, `-lock-`) or its read-write lock, and
//! distlock's shared or permit nodes must not meet a Curator mutex on one name.
//!
//! ## Fencing: `Strict`
//!
//! The lock node's `czxid`, a zxid: strictly increasing across the ensemble, across restarts
//! and across re-creation of the parent node (the sequence suffix is not).
//!
//! ## Failure modes
//!
//! **A disconnected holder** turns AtRisk at its next confirmation and Lost no later than the
//! server can expire its session — before anyone else can be granted its lock. **An expired
//! session** ends all its leases (Lost for good); the next acquisition opens a new session.
//! **Deletes are retried**: a lock node whose delete is lost with the connection would stay
//! for the life of the session (which survives the reconnect); the delete is repeated until it
//! succeeds or the session ends, and `release` waits for that at most one session timeout.
//! **A crashed holder** frees its locks one session timeout later. **A follower behind its
//! leader** answers reads from its old state — it can still list a node whose session the
//! leader has ended — so grants and confirmations in an ensemble start with a `sync`. **A
//! stalled leader** (a freeze, a long GC pause) may expire on resuming sessions its followers
//! kept alive: confirmations stall with it, and a stall longer than half the session timeout
//! turns the leases Lost before it ends. One narrow race is left: a `sync` sent just before the
//! leader resumes and handled before its expiry pass (RELIABILITY.md). **A member cut off from
//! its leader** but not from its clients cannot answer a `sync`, so its clients' leases lapse
//! within half the session timeout (not tested: the fault proxy sits between clients and
//! servers). **The servers' time of day does not matter**: ZooKeeper counts sessions on its
//! monotonic clock, so a step of a server's clock neither ends a held lock nor keeps a dead
//! holder's (`tests/clock.rs`: 60 s forward and back). Fence the protected data with the
//! token.
//!
//! Built on `zookeeper-client` with its `tokio` feature (without it the client panics with
//! "no spawner"); the crate is re-exported.
//!
//! ## URL
//!
//! `zk://[user:password@]h1:p1,h2:p2[/chroot][?session_timeout_ms=N&base=/distlock&parents=container|persistent&nodes=mutex|rwlock]`.
//! Digest credentials are sent before the first request, lock nodes then carry ACLs that only
//! that user can delete, and the password never appears in `Debug`, `Display` or errors. The
//! chroot and base path get the same ACLs when this driver creates them, so other users cannot
//! lock under them: create them beforehand with the ACLs you want to share them. A chroot or
//! base path inside `/zookeeper`, the tree the server reserves, is refused at connect.
//! Unknown or repeated parameters are refused.
//!
//! ## Example
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{DistributedLock, LockName, LockOptions};
//! let locks = lock_zookeeper::ZkLock::from_url("zk://10.0.0.1:2181,10.0.0.2:2181/app").await?;
//! // The TTL must be at least the session timeout (6 s by default).
//! let lease = locks.acquire(&LockName::new("reindex")?, &LockOptions::new(Duration::from_secs(10))).await?;
//! let token = lease.fencing_token(); // the node's czxid
//! # let _ = token;
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod client;
mod config;
mod confirm;
mod election;
mod lease;
mod lock;
mod modes;
mod queue;
mod sequence;

pub use config::ZkConfig;
pub use lock::ZkLock;
pub use lock_core;
pub use zookeeper_client;

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`ZkLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: config::BACKEND,
    schemes: &["zk"],
    connect: |url| lock_core::driver::connecting(async move { ZkLock::from_url(&url).await }),
};
