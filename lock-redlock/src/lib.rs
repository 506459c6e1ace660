//! # lock-redlock: distlock over N independent Redis masters
//!
//! [`RedlockLock`] implements the Redlock algorithm with the corrections its critics ask for.
//!
//! ## Algorithm
//!
//! - every request goes to all masters **in parallel**, each with a per-node timeout far below
//!   the TTL (default 50 ms, never more than TTL/4), and the answer is taken **as soon as a
//!   majority agrees**: a grant costs the round trip of the median master, not the slowest.
//!   The requests to the other masters are not dropped: they finish in the background, so the
//!   lock lands on every master that answers, not on a bare majority;
//! - the grant is a plain `SET key token NX PX ttl` (pipelined with a `GET` of the holder and a
//!   `PTTL` a waiter sleeps by), not a script: the cheapest write Redis has, paid N times per
//!   lock;
//! - the lock is **held elsewhere only when one holder has a majority**. Racers that each took a
//!   minority refuse each other on a majority of masters; that is a split vote, and
//!   `try_acquire` retries it after a random pause (up to `retry_count` attempts of
//!   `retry_delay`), so racers on a free lock elect one winner rather than all giving up;
//! - a grant needs **N/2 + 1** masters **and** positive validity = TTL − elapsed − drift
//!   (drift = TTL × factor + 2 ms, factor 0.01 unless set), measured on the monotonic clock
//!   from before the first send;
//! - a failed acquisition is **released on every master**, including the ones that timed out or
//!   errored (they may have granted after all);
//! - renew extends on all masters and needs a quorum; a failed renew does not release the
//!   masters it did extend; release is complete once a majority released. Renewals and
//!   releases still in flight to slower masters finish in a background task (bounded by the
//!   per-node timeout), so every master that answers gets them;
//! - an `acquire` dropped (cancelled, timed out by the caller) after its requests went out
//!   releases its token on every master in the background, so it leaves no ghost holder;
//! - waiters wake on release announcements from any master (pub/sub, reusing lock-redis's
//!   connections and scripts), with a random pause as the fallback — never a fixed-interval spin;
//! - `QuorumNotReached { granted, needed }` (too few masters answered) is reported apart from
//!   `Timeout` (the lock stayed busy) and `Unavailable` (a majority granted too late).
//!
//! ## Shared mode: readers by majority
//!
//! A reader joins, on every master, the group of readers that `lock-redis` keeps in the lock's
//! own key (`distlock-group:s`, members in `<prefix>{<name>}:holders`), and holds when a
//! majority took it, within the same validity as a writer. A writer's majority and a reader's
//! always share a master, whose key holds either the writer or the group, never both: so no
//! reader holds beside a writer, whatever the other masters store. Renewal and release go to
//! every master (a reader's member carries each master's own counter, so the release finds it
//! by its token). `holders` is a quorum read: each reader that is a member on a majority. No
//! queue: readers that keep overlapping can keep a writer waiting (`Capabilities::fifo` is
//! false), as on one Redis server.
//!
//! ## Permits: `Error::Unsupported`
//!
//! **Permits cannot be made correct over independent masters.** Each master can count the
//! permits it stores, but no master sees the others': with 3 masters and 2 permits, holders
//! A on masters 1 and 2, B on 2 and 3 and C on 1 and 3 each have a majority, and no master
//! stores more than 2 — yet 3 hold a semaphore of 2. A majority vote bounds holders only when
//! the bound is 1 (the mutex, or the writer against readers), because two majorities always
//! share a master. So a permit request is refused with
//! [`Error::Unsupported`](lock_core::Error::Unsupported), never served as a weaker lock. Use
//! `lock-redis` on one server for permits.

//! ## Keys
//!
//! On every master, the layout of `lock-redis`: `<prefix>{<name>}` holds the owner token with
//! a PX expiry (prefix `distlock:` by default), and releases are announced on
//! `<prefix>{<name>}:released`. A reader's group also writes `<prefix>{<name>}:holders` and
//! the group's counter `<prefix>{<name>}:fence` (each master's own: not a token).
//!
//! ## Fencing: none
//!
//! Independent masters have no shared monotonic counter: an `INCR` on each master gives N
//! different numbers, and taking the maximum is not safe when a master restarts or a client
//! pauses. Rather than invent a token that would mislead, `Capabilities::fencing` is
//! `Fencing::None` and `fencing_token()` returns `None`. If the protected resource needs
//! fencing, use the etcd (`create_revision`) or ZooKeeper (`czxid`) driver.
//!
//! ## Failure modes
//!
//! **The operational rule**: a master that restarts must either have persisted its keys
//! (`appendonly yes` + `appendfsync always`) or stay down for longer than the longest TTL in
//! use. Otherwise it comes back empty, a second client can collect a majority with it, and two
//! clients hold the lock. **A minority of masters down** costs nothing but their votes (at most
//! one per-node timeout per retry delay is spent re-checking them); **a majority down** is
//! `QuorumNotReached`. A master whose connection was re-established is checked again (`INFO`:
//! no eviction, not a replica, and not the same server as another master by `run_id`) before
//! it votes; at connect, a master that fails those checks is refused. **A master's clock that
//! steps forward** ends the lock on that master at once (Redis expires keys at an absolute
//! time of day): exclusion holds while such masters are a minority, and
//! breaks once a majority has stepped past the key's expiry, with no fencing to catch it.
//! Measured in `tests/clock.rs` (2 of 5 stepped: refused; 3 of 5: a second holder); run the
//! masters with clocks that slew rather than step. **A
//! paused client** (GC, a stopped VM) can outlive its validity: no lock service prevents that,
//! and without fencing nothing downstream catches it — watch `Lease::lost`.
//!
//! ## URL
//!
//! `redlock://[user[:password]@]h1:p1,h2:p2,h3:p3[/db][?prefix=P&node_timeout_ms=N&retry_delay_ms=N&retry_count=N&min_validity_ms=N&drift_factor=F&tls=true&tls_ca_file=PATH]`
//! (`tls=true` needs this crate's `tls` feature). Unknown or repeated parameters are refused;
//! the password never shows.
//!
//! ## Example
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
//! use std::time::Duration;
//! use lock_core::{DistributedLock, LockName, LockOptions};
//! let locks = lock_redlock::RedlockLock::from_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?;
//! let opts = LockOptions::new(Duration::from_secs(10)).auto_renew(None);
//! let lease = locks.acquire(&LockName::new("nightly-report")?, &opts).await?;
//! assert!(lease.fencing_token().is_none()); // Redlock has none
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod client;
mod config;
mod lease;
mod lock;
mod quorum;
mod round;

pub use config::RedlockConfig;
pub use lock::RedlockLock;
pub use lock_core;
pub use lock_redis;

/// This driver for `distlock::connect`: the URL schemes it serves, and connecting from a URL
/// ([`RedlockLock::from_url`]).
pub const DRIVER: lock_core::driver::Driver = lock_core::driver::Driver {
    backend: config::BACKEND,
    schemes: &["redlock"],
    connect: |url| lock_core::driver::connecting(async move { RedlockLock::from_url(&url).await }),
};
