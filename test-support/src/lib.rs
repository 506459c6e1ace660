//! Helpers shared by this repository's fault tests and `lock-bench` (not published: the parts
//! a third-party driver needs live in `conformance-tests`).
//!
//! - [`serial`]: run a test on its own runtime, never two at once (fault tests stop and kill
//!   shared servers).
//! - [`services`], [`kill`]: drive `scripts/services.sh` and the server processes it started;
//!   [`test_ca`]: the CA certificate of its TLS-only servers.
//! - The servers' own request counters: [`redis_commands_processed`] / [`commands_processed`],
//!   [`zk_packets_received`] / [`zk_mode`], [`etcd_grpc_messages_received`].
//! - [`scratch`]: a temporary directory that is removed when the test ends, however it ends.
//! - [`partition`]: clusters a test starts itself, with proxies between their members, and
//!   the scenario that checks a lock under a partition or a frozen member; [`by_dialer`]: a
//!   link of its own for each member that dials one shared address;
//!   [`partition_history`]: the history checker's workload on such a cluster while the
//!   nemesis partitions it.
//! - [`clock`]: servers of a test's own whose wall clock it steps or skews, and clients whose
//!   monotonic clock runs slow or fast.
//! - [`ServicesSh`]: those servers as the conformance suite's `Servers` (freeze, crash and
//!   restart by pid; which member leads).

use parking_lot::Mutex;
use std::future::Future;
use std::process::Command;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod by_dialer;
pub mod clock;
pub mod partition;
pub mod partition_history;
mod servers;
mod shim;

pub use servers::ServicesSh;

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

/// `127.0.0.1:port`, where `scripts/services.sh` runs its servers.
pub fn loopback(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
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

/// The one `int8` that `sql` selects, as a count.
async fn pg_count(client: &tokio_postgres::Client, sql: &str) -> Option<u64> {
    let row = client.query_one(sql, &[]).await.ok()?;
    u64::try_from(row.get::<_, i64>(0)).ok()
}

/// Statements the PostgreSQL server at `conninfo` has run, from `pg_stat_statements`, which
/// counts each one as it ends (`pg_stat_database` lags by up to seconds): `None` where the
/// server was started without the module in `shared_preload_libraries` (`scripts/services.sh`
/// loads it, and leaves utility statements uncounted). Creates the extension if it is missing.
/// The read itself counts as one statement, in the next read.
pub async fn pg_statements(conninfo: &str) -> Option<u64> {
    let client = pg_client(conninfo).await.ok()?;
    // Concurrent first reads may race to create it: the loser's error is harmless.
    let _ = client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    pg_count(
        &client,
        "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements",
    )
    .await
}

/// A plain (no TLS) PostgreSQL connection for tests' and benchmarks' own statements, its
/// connection driven by a task of its own; `conninfo` is a URL or `key=value` pairs.
///
/// # Errors
/// The client library's, if it cannot connect.
pub async fn pg_client(conninfo: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// The server's `total_commands_processed` (Redis counts each command a Lua script runs).
pub async fn redis_commands_processed(url: &str) -> Option<u64> {
    let mut c = redis::Client::open(url)
        .ok()?
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    commands_processed(&mut c).await
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

/// [`redis_commands_processed`] on a connection the caller has (authenticated) already.
pub async fn commands_processed(c: &mut (impl redis::aio::ConnectionLike + Send)) -> Option<u64> {
    let info: String = redis::cmd("INFO").arg("stats").query_async(c).await.ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
}

/// One request over a fresh TCP connection, the whole answer (four-letter words, HTTP/1.0).
async fn ask(addr: &str, request: &[u8]) -> Option<String> {
    let talk = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(request).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    tokio::time::timeout(std::time::Duration::from_secs(2), talk)
        .await
        .ok()?
}

/// A ZooKeeper server's `srvr` line `KEY: value`.
async fn zk_srvr(host: &str, key: &str) -> Option<String> {
    let out = ask(host, b"srvr").await?;
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(": ").map(str::to_string))
}

/// Client packets received by every ZooKeeper server in `hosts` (`h1:p1,h2:p2`); session
/// pings and the `srvr` reads themselves count too.
pub async fn zk_packets_received(hosts: &str) -> Option<u64> {
    let mut total = 0;
    for host in hosts.split(',') {
        total += zk_srvr(host, "Received")
            .await?
            .trim()
            .parse::<u64>()
            .ok()?;
    }
    Some(total)
}

/// Whether the ZooKeeper server at `host` serves session `sid` (as `0x…`, the way
/// `zookeeper_client::SessionId` displays), from its `cons` list of connections.
pub async fn zk_serves_session(host: &str, sid: &str) -> bool {
    let out = ask(host, b"cons").await.unwrap_or_default();
    out.contains(&format!("sid={sid},")) || out.contains(&format!("sid={sid})"))
}

/// A ZooKeeper server's mode (`leader`, `follower`, `standalone`), if it answers.
pub async fn zk_mode(host: &str) -> Option<String> {
    zk_srvr(host, "Mode").await
}

/// Every gRPC message the etcd members received (unary requests and stream messages,
/// keep-alives included), from their Prometheus `/metrics` on the client port.
pub async fn etcd_grpc_messages_received(endpoints: &[String]) -> Option<u64> {
    let mut total = 0.0;
    for ep in endpoints {
        let out = ask(
            ep.trim_start_matches("http://"),
            b"GET /metrics HTTP/1.0\r\n\r\n",
        )
        .await?;
        total += out
            .lines()
            .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    Some(total as u64)
}

/// An etcd member's own id and the id of the leader it follows, from its `/v3/maintenance/status`
/// (the gRPC gateway on the client port).
pub async fn etcd_status(endpoint: &str) -> Option<(String, String)> {
    let request = b"POST /v3/maintenance/status HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}";
    let out = ask(endpoint.trim_start_matches("http://"), request).await?;
    // Ids are JSON strings: `"member_id":"123"` inside `header`, `"leader":"123"` at the top.
    let field = |key: &str| -> Option<String> {
        let at = out.find(&format!("\"{key}\":\""))? + key.len() + 4;
        let len = out.get(at..)?.find('"')?;
        out.get(at..at + len).map(str::to_string)
    };
    Some((field("member_id")?, field("leader")?))
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
