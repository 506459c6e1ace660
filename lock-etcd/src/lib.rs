//! # lock-etcd: distlock on etcd
//!
//! [`EtcdLock`] implements [`lock_core::DistributedLock`] with a lease per lock kept alive by
//! the driver, a queue ordered by `create_revision`, and a watch on the predecessor only.
//!
//! ## Algorithm
//!
//! Each acquisition grants its own etcd lease (TTL rounded *up* to whole seconds, at least the
//! server's minimum, measured at connect) and puts its key with it, only if that key does not
//! exist. The key with the lowest `create_revision` under the name holds the lock; every other
//! contender watches the deletion of the key just before its own, so a release wakes exactly
//! one waiter and waiters are served in revision order (FIFO). A waiter keeps its own lease
//! alive while it waits. **Renew** is a keep-alive, then a read of the lock key (a key deleted
//! behind the holder's back is `NotHeld`); the read's `raft_term` says whether the keep-alive
//! was answered in the term the lease was granted in. After a leader change it was not, and
//! the key moves onto a lease granted in the new term (same `create_revision`, so the same
//! fencing token) before the lock counts as renewed: a deposed leader's stale view of the old
//! lease then guards nothing. **Release** deletes the key only if it is still this grant's
//! (compare on `create_revision`). A released lease is kept as a spare for the next
//! acquisition with the same TTL, saving two consensus writes per lock. A lease's keep-alives
//! after its first go on one gRPC stream kept open for it, not a stream each (opened and
//! dropped per renewal, a few thousand held locks made the client's HTTP/2 layer close the
//! connection); a stream whose exchange was cut short is dropped, never read again.
//! [`EtcdLock::guarded_txn`] writes only while a lease still holds its lock. Details on
//! [`EtcdLock`].
//!
//! ## A lease shared by many locks
//!
//! With [`EtcdConfig::with_shared_lease`] (`?shared_lease=true`) the locks of a client and TTL
//! put their keys on one lease instead, as Go's `concurrency.Session` does: one keep-alive and
//! one transaction of reads answer the renewals of them all, and no lease is granted or revoked
//! per lock. Keys are then
//! `<lease-hex>_<n>`; a leader change moves each key onto the client's lease of the new term; a
//! lock that ends unreleased is deleted at the end of its validity, as its lease would have
//! expired; an acquisition cut short deletes its key or, its put still in flight, leaves a
//! tombstone the put requires absent. The price: a lease that cannot be kept alive loses every
//! lock on it at once. docs/backends.md, "etcd: many locks on one lease".
//!
//! ## Keys
//!
//! `<prefix>/<name>/<lease-id-hex>`, prefix `/distlock` by default; the value is empty. The
//! prefix may be relative (`?prefix=jobs`) or empty (`?prefix=`: keys `<name>/<lease-id-hex>`),
//! which is the layout of `etcdctl lock <name>`, etcd's `Lock` RPC and Go's
//! `concurrency.Mutex`: they and distlock then queue in one line, in order of creation.
//!
//! A lock's queue is the keys directly under `<prefix>/<name>/`. A client whose prefix nests
//! inside that range (prefix `/distlock/jobs` beside a lock `jobs` under `/distlock`) puts
//! keys of its own locks there, one level deeper; distlock passes over them, where etcd's own
//! recipe (which reads the whole range) would make the lock `jobs` wait for every lock of the
//! nested prefix. Either way a holder's key is the oldest key of the name, so distlock and
//! `etcdctl lock` on one name still exclude each other.
//!
//! ## Shared holders and permits
//!
//! [`Mode::Shared`](lock_core::Mode::Shared) and [`Mode::Permits`](lock_core::Mode::Permits)
//! join the same queue: a contender's key says its mode in its name (`<lease-hex>` for
//! exclusive, as `etcdctl lock` names its keys; `<lease-hex>-s`, or `-p<K>`; the value stays
//! empty, free for an election's proposal), and a contender holds once it and every key before
//! it may hold together ([`queue_turn`](lock_core::driver::queue_turn)). So a reader that
//! arrives behind a waiting writer waits behind it (writers are not starved), an
//! `etcdctl lock` holder or waiter is a writer to distlock's readers and they are all older
//! keys to it, and the first count of permits on a name wins (a later request with another
//! count is `PermitsMismatch`). A reader waits for the deletion of the newest key before it
//! that it cannot hold beside; a permit request behind `K` permit keys watches the name's range
//! and looks again at each deletion under it. Each grant's token is its key's
//! `create_revision`, as for the mutex.
//!
//! ## Fencing: `Strict`
//!
//! The key's `create_revision`: strictly increasing across the whole cluster, across restarts
//! (etcd persists it) and across holders of every name. It is also the fencing token across
//! clients: an `etcdctl lock` holder's key has one too. (etcdctl's `ETCD_LOCK_REV` is the
//! revision at which it saw its grant, not its key's `create_revision`: not comparable.)
//!
//! ## Failure modes
//!
//! **A holder that cannot reach the cluster** turns AtRisk when a keep-alive goes unanswered
//! and Lost at `valid_until`, before the lease can expire on the server; etcd then deletes the
//! key and the next waiter is woken. **A waiter whose keep-alives go unanswered** keeps
//! waiting: its lease guards nothing yet, and a new leader extends every lease, so it comes
//! through an election longer than its TTL. It asks again (each try bounded by half the TTL)
//! until the server says whether the lease lives, and fails with `Lost` when it does not; with
//! the backend's error (`Unavailable`) when the cluster has not answered for a request timeout
//! past the lease's validity, or at its deadline. It is never granted on an unconfirmed or
//! expired lease. **A cancelled, timed-out or failed
//! acquire** (say, one whose reply was lost with its connection) revokes its lease, so no key
//! of it stays in the queue; a revoke that fails is sent again until it is answered or the
//! lease has expired by itself. **Requests** are bounded by the request
//! timeout and retried only when they were certainly not sent. **Leader elections** make
//! requests fail transiently (`Unavailable`); a waiting `acquire` re-checks its place.
//! **A stalled leader that resumes** can, on etcd older than the fix of etcd-io/etcd#15247
//! (3.4.31 and 3.5.13; Debian's 3.4.23 has the bug), revoke by its stale view a lease that
//! the next leader has renewed. A holder's validity therefore rests only on keep-alives
//! answered in its lease's own term, and after a leader change its key moves to a lease of the
//! new term, as does a waiter's at its turn; the old lease is revoked. What is left: a resuming
//! leader that answers a keep-alive itself, or serves a stale linearizable read
//! (etcd-io/etcd#20418, fixed in 3.4.42), in the milliseconds before it steps down. Run an etcd
//! with those fixes where that matters, or fence. See RELIABILITY.md, "etcd: a lease revoked
//! by a leader that had been frozen".
//!
//! ## URL
//!
//! `etcd://[user:password@]h1:p1,h2:p2[/prefix][?prefix=P&timeout_ms=N&connect_timeout_ms=N&shared_lease=true&tls=true&tls_ca_file=PATH]`
//! (`tls=true` needs this crate's `tls` feature). Unknown or repeated parameters are refused;
//! the password never shows. On a cluster with authentication off the credentials are not
//! used (a warning is logged), as etcd's own clients do.
//!
//! ## Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_etcd::{EtcdLock, lock_core::{DistributedLock, LockName, LockOptions}};
//! # async fn demo() -> lock_core::Result<()> {
//! let locks = EtcdLock::from_url("etcd://127.0.0.1:2379").await?;
//! let name = LockName::new("nightly-report")?;
//! let lease = locks.acquire(&name, &LockOptions::new(Duration::from_secs(10))).await?;
//! let token = lease.fencing_token(); // Some(create_revision)
//! lease.release().await?;
//! # let _ = token; Ok(()) }
//! ```

mod client;
mod config;
mod election;
mod grant;
mod guarded;
mod keepers;
mod layout;
mod lease;
mod lock;
mod queue;
mod revoke;
mod shared;
mod spares;
mod term;
mod waiting;

pub use config::EtcdConfig;
pub use etcd_client;
pub use lock::EtcdLock;
pub use lock_core;

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`EtcdLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: config::BACKEND,
    schemes: &["etcd"],
    connect: |url| lock_core::driver::connecting(async move { EtcdLock::from_url(&url).await }),
};
