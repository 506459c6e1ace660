//! # lock-zookeeper: distlock on ZooKeeper
//!
//! [`ZkLock`] implements [`lock_core::DistributedLock`] with the protected
//! ephemeral-sequential recipe: a container node per lock name, one
//! `_c_<uuid>-lock-<seq>` node per contender, the lowest sequence holds, each waiter watches
//! only its predecessor (no herd, FIFO), a contender that loses the connection while creating
//! its node finds it again by its uuid instead of leaving an orphan behind (it creates again
//! only once a lookup said for certain that the first create was not applied). See [`ZkLock`]
//! for how the session serves as every lock's lease and what the TTL option means here.
//!
//! **Other clients' nodes count.** Every child of the lock node whose name ends in a ZooKeeper
//! sequence suffix (ten digits) is a contender, ordered by that number, whoever made it:
//! Curator's `_c_<uuid>-lock-`, kazoo's `<id>__lock__`, the WriteLock recipe's `x-<session>-`.
//! A foreign holder therefore holds the lock for distlock too, in waiting and in `inspect`.
//!
//! **Deletes are retried.** A lock node whose delete is lost with the connection would stay
//! for the life of the session (which survives the reconnect); the delete is repeated until it
//! succeeds or the session ends. `release` waits for that at most one session timeout.
//!
//! Built on `zookeeper-client` with its `tokio` feature (without it the client panics with
//! "no spawner"); the crate is re-exported.
//!
//! URL: `zk://[user:password@]h1:p1,h2:p2[/chroot][?session_timeout_ms=N&base=/distlock]`.
//! Digest credentials are sent before the first request, lock nodes then carry ACLs that only
//! that user can delete, and the password never appears in `Debug`, `Display` or errors.

mod client;
mod config;
mod lease;
mod lock;
mod queue;

pub use config::ZkConfig;
pub use lock::ZkLock;
pub use lock_core;
pub use zookeeper_client;

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`ZkLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: "zookeeper",
    schemes: &["zk"],
    connect: |url| lock_core::driver::connecting(async move { ZkLock::from_url(&url).await }),
};
