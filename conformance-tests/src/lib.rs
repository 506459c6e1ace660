//! # conformance-tests: the distlock driver conformance suite
//!
//! Every distlock driver — ours and third parties' — runs the same cases against a real
//! backend. A driver's test implements [`Harness`] (how to make an independent client, which
//! timings to use) and hands it to [`run`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use conformance_tests::{async_trait, BoxError, Harness, Timing};
//! use lock_core::{memory::MemoryLock, DistributedLock};
//!
//! struct Memory(MemoryLock);
//!
//! #[async_trait]
//! impl Harness for Memory {
//!     async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
//!         Ok(Arc::new(self.0.clone()))
//!     }
//!     fn timing(&self) -> Timing {
//!         Timing::for_ttl(std::time::Duration::from_millis(200))
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     conformance_tests::run(Memory(MemoryLock::new()))
//! }
//! ```
//!
//! Cases are plain `pub async fn(&dyn Harness) -> Result<(), Failure>` in [`cases`], grouped by
//! area; [`CASES`] lists them with the capability each needs. A case whose capability the
//! driver does not declare is listed as ignored, with the reason in brackets, never passed.
//! [`controls`] holds deliberately broken drivers that the suite must catch, and [`FaultProxy`]
//! is a loopback TCP proxy that cuts, blackholes or delays a client's connection.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use async_trait::async_trait;
pub use lock_core::BoxError;
use lock_core::{Capabilities, DistributedLock, LockName};

pub mod cases;
pub mod controls;
mod link;
mod proxy;
mod proxy_mode;
mod runner;
pub mod safety;
mod secured;
mod servers;
pub mod telemetry;
mod tls_peer;
mod witness;

pub use cases::{record_states, Case, Facts, CASES};
pub use link::{Fault, Faulty, Link};
pub use proxy::FaultProxy;
pub use runner::{
    run, run_case, run_case_on_one_thread, run_trials, run_with_args, trials, trials_prefixed,
};
pub use secured::{assert_bad_urls_rejected, assert_refused_at_connect, Secured, UrlParts};
pub use servers::{ClockStep, Partition, Servers};
pub use witness::Witness;

/// What the suite needs from a driver's test.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A new, independent client: its own connection or session, as a separate process would
    /// have. Called many times per case.
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError>;

    /// Timings the cases use. Margins in every case derive from these, never from fixed sleeps.
    fn timing(&self) -> Timing {
        Timing::for_ttl(Duration::from_millis(500))
    }

    /// How many requests the backend has served so far, across all clients (a server's command
    /// counter, say). Lets the suite prove that a waiter does not poll. `None`: not countable,
    /// and the idle-waiting case is skipped.
    async fn backend_requests(&self) -> Option<u64> {
        None
    }

    /// Deletes `name`'s lock on the backend behind its holder's back, like an operator would.
    /// Lets the suite prove that a refused renewal turns the lease Lost. `None`: not supported,
    /// and those cases are skipped.
    async fn break_lock(&self, name: &LockName) -> Option<Result<(), BoxError>> {
        let _ = name;
        None
    }

    /// Whether `key`, as a lease's [`Lease::backend_key`](lock_core::Lease::backend_key) names
    /// it, is on the backend now: a Redis or etcd key, a ZooKeeper node, a row of `pg_locks`,
    /// a file. Lets the suite check that the key a lease reports is the one the server
    /// stores, namespace and all. `None`: not supported, and that case is skipped.
    async fn key_exists(&self, key: &str) -> Option<Result<bool, BoxError>> {
        let _ = key;
        None
    }

    /// A new client behind a link the suite can break — typically a [`FaultProxy`] per server
    /// (`Vec<FaultProxy>` is a [`Link`]), set to [`Fault::Delay`]`(delay)` to begin with, so
    /// the client's timeouts can be sized for it. Feeds the `faults` cases (a partitioned
    /// holder, a cut connection) and the cases that cancel an `acquire` while its request is
    /// on the way. `None`: not supported (an in-process or local backend), and those cases are
    /// skipped.
    async fn faulty_client(&self, delay: Duration) -> Option<Result<Faulty, BoxError>> {
        let _ = delay;
        None
    }

    /// The backend's servers that require a password or TLS, and how to write the driver's URL
    /// for them. Feeds the `security` cases (credentials, secrets in errors, certificates).
    /// `None`: those cases are skipped.
    fn secured(&self) -> Option<Secured> {
        None
    }

    /// The backend's server processes, which the safety nemesis freezes, and crashes and
    /// restarts where [`Servers::restart_keeps_locks`]. `None` (the default): no server
    /// faults in the safety runs.
    fn servers(&self) -> Option<Arc<dyn Servers>> {
        None
    }

    /// Whether [`restart_backend`](Harness::restart_backend) works. By default: where
    /// [`servers`](Harness::servers) can be restarted without losing locks.
    fn can_restart_backend(&self) -> bool {
        self.servers().is_some_and(|s| s.restart_keeps_locks())
    }

    /// Crashes the backend's server (or servers) and starts it again on the data it had, as an
    /// operator's restart or a host reboot would, and returns once it serves again. Lets the
    /// suite check that `Fencing::Strict` tokens survive a restart. Clients made before may
    /// have to reconnect; the cases make new ones. By default: every member of
    /// [`servers`](Harness::servers) at once. For a backend with no server
    /// process (a directory of lock files), a new client *is* a restart: return `Ok(())`.
    async fn restart_backend(&self) -> Result<(), BoxError> {
        let servers = self
            .servers()
            .ok_or("this harness cannot restart its backend")?;
        let all: Vec<usize> = (0..servers.members().len()).collect();
        servers.restart(&all).await
    }

    /// Whether [`step_clock`](Harness::step_clock) works. By default: where
    /// [`servers`](Harness::servers) can step their clocks.
    fn can_step_clock(&self) -> bool {
        self.servers().is_some_and(|s| s.can_step_clock())
    }

    /// Sets the time of day of every server of the backend to the real time moved by `step`
    /// (which replaces the previous step; `ClockStep::Ahead(Duration::ZERO)` puts the clocks
    /// right), as an NTP step would, leaving their monotonic clocks alone. Lets the suite check
    /// what a driver declares in [`Capabilities::expires_by`](lock_core::Capabilities), and that
    /// tokens never follow a server's time of day. By default: every member of
    /// [`servers`](Harness::servers).
    async fn step_clock(&self, step: ClockStep) -> Result<(), BoxError> {
        let servers = self
            .servers()
            .filter(|s| s.can_step_clock())
            .ok_or("this harness cannot step its servers' clocks")?;
        for i in 0..servers.members().len() {
            servers.step_clock(i, step).await?;
        }
        Ok(())
    }
}

/// Timings for one driver's run of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timing {
    /// TTL the cases acquire with. Short, so expiry cases are quick; long enough that the
    /// backend's round trips are a small part of it.
    pub ttl: Duration,
    /// How late an event may be and still count as prompt (a wake-up after release, expiry
    /// after `valid_until`). Scheduling noise on a loaded machine must fit in it.
    pub slack: Duration,
}

impl Timing {
    /// `ttl` with a slack of half the TTL, at least 150 ms.
    pub fn for_ttl(ttl: Duration) -> Self {
        Timing {
            ttl,
            slack: (ttl / 2).max(Duration::from_millis(150)),
        }
    }

    /// How soon a lease whose lock is its connection's session (`outlives_connection =
    /// false`) must turn Lost after that connection dropped:
    /// [`safety::CUT_NOTICE`], whatever the TTL. The server frees
    /// such a lock the moment it sees the connection close, and nothing orders that moment
    /// against the client's own notice, so this is the promise both the case and the safety
    /// checker hold a session-bound driver to: a lease that learns of the close only at its
    /// next renewal or poll breaks it.
    pub fn dropped_connection_notice(&self) -> Duration {
        crate::safety::CUT_NOTICE
    }

    /// Overrides the slack.
    pub fn with_slack(mut self, slack: Duration) -> Self {
        self.slack = slack;
        self
    }
}

/// Why a case failed, in words a driver author can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

impl From<lock_core::Error> for Failure {
    fn from(e: lock_core::Error) -> Self {
        Failure(format!("unexpected error: {e} ({e:?})"))
    }
}

impl From<BoxError> for Failure {
    fn from(e: BoxError) -> Self {
        Failure(format!("harness error: {e}"))
    }
}

/// Fails the case with a formatted message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($msg)+)));
        }
    };
}

/// A lock name no other run has used: `ct-<run id>-<n>-<tag>`, so reruns against a live server
/// never collide with leftovers.
pub fn fresh_name(tag: &str) -> LockName {
    static RUN: OnceLock<String> = OnceLock::new();
    static N: AtomicU64 = AtomicU64::new(0);
    let run = RUN.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..8].to_string());
    let n = N.fetch_add(1, Ordering::Relaxed);
    let raw = format!("ct-{run}-{n}-{tag}");
    // Tags are the suite's own ASCII words; fall back to a plain name rather than panic.
    LockName::new(&raw).unwrap_or_else(|_| {
        LockName::new(format!("ct-{run}-{n}")).unwrap_or_else(|_| unreachable!())
    })
}

/// Facts the runner gathers once, before listing cases: the driver's capabilities and which
/// optional harness hooks work.
pub(crate) async fn gather_facts(h: &dyn Harness) -> Result<Facts, BoxError> {
    let client = h.client().await?;
    let caps: Capabilities = client.capabilities();
    let counts_requests = h.backend_requests().await.is_some();
    let can_break = h.break_lock(&fresh_name("probe")).await.is_some();
    let sees_keys = h.key_exists(fresh_name("probe").as_str()).await.is_some();
    let can_fault = h.faulty_client(Duration::ZERO).await.is_some();
    let secured = h.secured();
    Ok(Facts {
        caps,
        counts_requests,
        can_break,
        sees_keys,
        can_fault,
        auth: secured
            .as_ref()
            .and_then(|s| s.auth.as_ref())
            .map(|a| a.checks_passwords),
        tls: secured.as_ref().is_some_and(|s| s.tls.is_some()),
        tls_pem: secured.as_ref().is_some_and(|s| s.pem.is_some()),
        by_url: secured.is_some(),
        can_restart: h.can_restart_backend(),
        can_step_clock: h.can_step_clock(),
        lease_window: crate::cases::server::lease_window(&*client).await,
        backend: client.backend(),
    })
}
