//! What a backend can promise, read by users and by the conformance suite.

use std::time::Duration;

/// Longest TTL any driver accepts. A lock meant to be held longer should renew
/// ([`Renewal::Auto`](crate::Renewal::Auto)): a TTL of days means a crashed holder blocks
/// everyone for days.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How far a backend's fencing tokens can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fencing {
    /// Tokens strictly increase with every grant of a name, in real-time order, and survive the
    /// backend's own restarts (etcd `create_revision`, ZooKeeper `czxid`, a flushed file counter).
    Strict,
    /// Tokens strictly increase while the backend keeps its data, but a restart that loses data
    /// can repeat them (Redis without `appendfsync always`).
    BestEffort,
    /// No token is safe to hand out (Redlock over independent masters);
    /// [`Lease::fencing_token`](crate::Lease::fencing_token) returns `None`.
    None,
}

/// What ends a lock whose holder stopped renewing: time elapsed on the backend, or the
/// backend server's time of day ([`Capabilities::expires_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExpiryClock {
    /// Elapsed time (a monotonic clock, a session timeout counted in ticks) or no clock at
    /// all (a lock that ends with its holder's session or process): a step of a server's time
    /// of day, as NTP makes, neither ends a lock early nor keeps a dead holder's lock longer
    /// (etcd, ZooKeeper, PostgreSQL, files).
    Elapsed,
    /// The server's time of day: a step ahead ends locks early, one behind keeps them longer
    /// (Redis and so Redlock store each key's end as a time of day). Run such servers with a
    /// clock that slews rather than steps.
    TimeOfDay,
}

/// A driver's honest description of itself. The conformance suite reads it to pick cases; a
/// case whose capability is missing is reported as skipped with the reason, never passed.
///
/// The struct is `#[non_exhaustive]`: build one from [`Capabilities::new`] and the `with_*`
/// methods so that new fields do not break third-party drivers.
///
/// ```
/// use std::time::Duration;
/// use lock_core::{Capabilities, Fencing};
/// let caps = Capabilities::new()
///     .with_fencing(Fencing::Strict)
///     .with_fifo(true)
///     .with_ttl_granularity(Duration::from_secs(1));
/// assert_eq!(caps.fencing, Fencing::Strict);
/// assert!(caps.per_lock_ttl);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    /// Trust level of fencing tokens.
    pub fencing: Fencing,
    /// Waiters are granted in arrival order.
    pub fifo: bool,
    /// Each lock has its own TTL. False where the lease is a session shared by all locks of a
    /// client (ZooKeeper) or the holder's process lifetime (files).
    pub per_lock_ttl: bool,
    /// Smallest accepted TTL.
    pub min_ttl: Duration,
    /// Largest accepted TTL.
    pub max_ttl: Duration,
    /// TTLs are rounded up to a multiple of this (etcd: one second). Never rounded down.
    pub ttl_granularity: Duration,
    /// The driver signals loss through [`Lease::lost`](crate::Lease::lost) before another
    /// client can be granted the lock.
    pub lost_notification: bool,
    /// [`DistributedLock::inspect`](crate::DistributedLock::inspect) answers (who holds a lock,
    /// without acquiring it).
    pub inspect: bool,
    /// A held lock outlives its client's connection dropping: the driver reconnects and the
    /// lease carries on (a key with a TTL, an etcd lease, a ZooKeeper session). False where the
    /// lock belongs to the connection itself (a PostgreSQL session advisory lock): a dropped
    /// connection frees the lock on the server at once, and the lease turns Lost the moment
    /// the client sees its connection close.
    pub outlives_connection: bool,
    /// A lock held while the backend crashes and restarts stays its holder's: nobody else is
    /// granted it before the holder's lease ends, and the holder's renewals go on once the
    /// backend serves again (etcd, ZooKeeper, Redis that fsyncs every write, files). False
    /// where a restart frees held locks (a PostgreSQL session's: the holder's lease turns
    /// Lost) or may forget them (Redis without `appendfsync always`).
    pub survives_restart: bool,
    /// What ends a lock whose holder stopped renewing ([`ExpiryClock`]).
    pub expires_by: ExpiryClock,
    /// The driver grants [`Mode::Shared`](crate::Mode::Shared) (readers beside readers).
    /// Where false, a shared request is [`Error::Unsupported`](crate::Error::Unsupported),
    /// never an exclusive lock in its place.
    pub shared: bool,
    /// The driver grants [`Mode::Permits`](crate::Mode::Permits) (semaphores). Where false,
    /// a permit request is [`Error::Unsupported`](crate::Error::Unsupported).
    pub permits: bool,
    /// The driver holds [`Election`](crate::Election)s: it stores a holder's value with its
    /// grant ([`LockOptions::value`](crate::LockOptions::value)), reads it back
    /// ([`DistributedLock::leader`](crate::DistributedLock::leader)), lets the holder change it
    /// ([`Lease::proclaim`](crate::Lease::proclaim)) and notifies changes
    /// ([`DistributedLock::watch`](crate::DistributedLock::watch)). Where false, a value is
    /// [`Error::Unsupported`](crate::Error::Unsupported), never dropped.
    pub election: bool,
}

/// `with_<field>` setters of [`Capabilities`], one per field, each `const`.
macro_rules! setters {
    ($($with:ident => $field:ident: $ty:ty;)*) => {
        $(
            #[doc = concat!("Sets [`Capabilities::", stringify!($field), "`].")]
            pub const fn $with(mut self, $field: $ty) -> Self {
                self.$field = $field;
                self
            }
        )*
    };
}

impl Capabilities {
    /// The most conservative description: no fencing, no FIFO, per-lock TTLs from 1 ms to
    /// [`MAX_TTL`] at millisecond granularity, lost notification, locks that a restart of the
    /// backend may forget and that end by the server's time of day, exclusive mode only.
    pub const fn new() -> Self {
        Capabilities {
            fencing: Fencing::None,
            fifo: false,
            per_lock_ttl: true,
            min_ttl: Duration::from_millis(1),
            max_ttl: MAX_TTL,
            ttl_granularity: Duration::from_millis(1),
            lost_notification: true,
            inspect: false,
            outlives_connection: true,
            survives_restart: false,
            expires_by: ExpiryClock::TimeOfDay,
            shared: false,
            permits: false,
            election: false,
        }
    }
    setters! {
        with_fencing => fencing: Fencing;
        with_fifo => fifo: bool;
        with_per_lock_ttl => per_lock_ttl: bool;
        with_min_ttl => min_ttl: Duration;
        with_max_ttl => max_ttl: Duration;
        with_ttl_granularity => ttl_granularity: Duration;
        with_lost_notification => lost_notification: bool;
        with_inspect => inspect: bool;
        with_outlives_connection => outlives_connection: bool;
        with_survives_restart => survives_restart: bool;
        with_expires_by => expires_by: ExpiryClock;
        with_shared => shared: bool;
        with_permits => permits: bool;
        with_election => election: bool;
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Self::new()
    }
}
