//! The backend's server processes, which the safety nemesis freezes, crashes, restarts and
//! (where it can) partitions and steps the clocks of: what
//! [`Harness::servers`](crate::Harness::servers) returns.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::BoxError;

/// The server processes behind a harness's backend (one, or the members of an ensemble or a
/// cluster), with the means to break them as an operator's bad day would: by pid, on servers
/// the tests started themselves.
///
/// ```
/// use conformance_tests::{async_trait, BoxError, Servers};
///
/// /// A backend with no process to break (say, one served from memory).
/// #[derive(Debug)]
/// struct Nothing;
///
/// #[async_trait]
/// impl Servers for Nothing {
///     fn members(&self) -> Vec<String> {
///         Vec::new()
///     }
///     async fn freeze(&self, _: usize) -> Result<(), BoxError> {
///         Err("no such member".into())
///     }
///     async fn thaw(&self, _: usize) -> Result<(), BoxError> {
///         Err("no such member".into())
///     }
///     async fn restart(&self, _: &[usize]) -> Result<(), BoxError> {
///         Err("no such member".into())
///     }
///     fn restart_keeps_locks(&self) -> bool {
///         false
///     }
/// }
/// ```
#[async_trait]
pub trait Servers: Send + Sync + fmt::Debug {
    /// The members' names, for reports (`etcd-c2`), in a fixed order: member `i` is
    /// `members()[i]`.
    fn members(&self) -> Vec<String>;

    /// Stops member `i` (SIGSTOP): its sockets stay open and nothing answers, as a stalled
    /// disk or a paused VM would look from outside.
    async fn freeze(&self, i: usize) -> Result<(), BoxError>;

    /// Resumes member `i` after [`freeze`](Servers::freeze) (SIGCONT).
    async fn thaw(&self, i: usize) -> Result<(), BoxError>;

    /// Crashes `members` (SIGKILL), all of them before any starts again, and starts them again
    /// on the data they had, returning once each serves again.
    async fn restart(&self, members: &[usize]) -> Result<(), BoxError>;

    /// Whether a crash and restart keeps every lock and fencing counter the backend granted
    /// (a server that syncs its writes, or a quorum that outlives one member). `false` (a
    /// Redis without `appendfsync always`, say): the nemesis does not restart these servers,
    /// because forgetting locks on a restart is then the backend's documented limit, not a bug
    /// a history could blame on the driver.
    fn restart_keeps_locks(&self) -> bool;

    /// The member that leads right now, for a backend with a leader (a ZooKeeper ensemble,
    /// an etcd cluster); the nemesis aims half its server faults at it. `None`: no leader, or
    /// not known.
    async fn leader(&self) -> Option<usize> {
        None
    }

    /// Whether every member serves its clients again, as a cluster's members do after a fault
    /// only once they agree on a leader (a ZooKeeper ensemble's `srvr` says leader or follower
    /// on each; etcd members name one leader). After its last heal the nemesis waits for this
    /// and records when it first holds ([`Op::Serving`](crate::safety::Op::Serving)): the
    /// history's liveness bound counts from there, since how long an election takes is the
    /// servers' own, not the driver's. The default: `true` (members that serve once healed).
    async fn serving(&self) -> bool {
        true
    }

    /// Whether [`partition`](Servers::partition) works here: the members reach each other
    /// through links the tests can break (a cluster a test started itself). The nemesis
    /// partitions only such servers.
    fn can_partition(&self) -> bool {
        false
    }

    /// Makes partition `p` between the members (`on`), while every member's own clients still
    /// reach it, or heals it. The default: an error, for servers without links between their
    /// members.
    async fn partition(&self, p: Partition, on: bool) -> Result<(), BoxError> {
        let _ = (p, on);
        Err("these servers have no links between members to break".into())
    }

    /// Whether [`step_clock`](Servers::step_clock) works here: the members run under a clock
    /// the tests can set (servers a test started itself under a clock shim). The nemesis
    /// steps only such clocks.
    fn can_step_clock(&self) -> bool {
        false
    }

    /// Sets member `i`'s time of day to the real time moved by `step` (which replaces the
    /// previous step; `ClockStep::Ahead(Duration::ZERO)` puts the clock right), as an NTP step
    /// would; its monotonic clock is left alone. The default: an error, for servers whose
    /// clocks the tests cannot set.
    async fn step_clock(&self, i: usize, step: ClockStep) -> Result<(), BoxError> {
        let _ = (i, step);
        Err("these servers' clocks cannot be set".into())
    }
}

/// A server's time of day, away from the real time ([`Servers::step_clock`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockStep {
    /// This much ahead: a lock that ends at a time of day ends this much early.
    Ahead(Duration),
    /// This much behind.
    Behind(Duration),
}

impl ClockStep {
    /// The step in nanoseconds, ahead positive (saturating at ±292 years).
    ///
    /// ```
    /// use std::time::Duration;
    /// use conformance_tests::ClockStep;
    /// assert_eq!(ClockStep::Behind(Duration::from_secs(2)).nanos(), -2_000_000_000);
    /// ```
    pub fn nanos(self) -> i64 {
        match self {
            ClockStep::Ahead(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            ClockStep::Behind(d) => -i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        }
    }
}

impl fmt::Display for ClockStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClockStep::Ahead(d) => write!(f, "+{d:?}"),
            ClockStep::Behind(d) => write!(f, "-{d:?}"),
        }
    }
}

/// A partition between the members of a cluster ([`Servers::partition`]); members are
/// numbered as in [`Servers::members`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Partition {
    /// Member `i` cut off from every other member, both ways.
    Isolate(usize),
    /// Members `a` and `b` cut off from each other, both ways, while each still reaches the
    /// others: with three members, the third hears both sides (a bridge).
    Between(usize, usize),
    /// The connections other members dial to member `i` carry nothing (either way), while
    /// those `i` dials still work both ways, as behind a firewall that drops what comes in on
    /// connections to `i`: what `i` hears, and who hears it, then depends on which side
    /// dials which connection (a one-way partition for some backends).
    Mute(usize),
}
