//! What the test servers say about themselves, read the way an operator would: request
//! counters (Redis `INFO`, ZooKeeper's `srvr`, etcd's `/metrics`, PostgreSQL's
//! `pg_stat_statements`), a ZooKeeper server's mode and sessions, an etcd member's leader.
//! And [`servers`]: the table of the test servers, which `scripts/services.sh` reads too.
//! The fault tests (through `test-support`) and `lock-bench` both read them; this crate
//! depends on no test framework, so the bench does not build the conformance suite.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod servers;

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

/// Client connections the Redis server at `url` has open (`INFO clients`), this probe's own
/// among them.
pub async fn redis_clients(url: &str) -> Option<u64> {
    let mut c = redis::Client::open(url)
        .ok()?
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut c)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Client sessions the PostgreSQL server at `conninfo` has open (`pg_stat_activity`'s client
/// backends), this probe's own among them.
pub async fn pg_sessions(conninfo: &str) -> Option<u64> {
    let client = pg_client(conninfo).await.ok()?;
    pg_count(
        &client,
        "SELECT count(*)::int8 FROM pg_stat_activity WHERE backend_type = 'client backend'",
    )
    .await
}

/// Client connections every ZooKeeper server in `hosts` has open (`srvr`'s `Connections`),
/// this probe's own among them.
pub async fn zk_connections(hosts: &str) -> Option<u64> {
    let mut total = 0;
    for host in hosts.split(',') {
        total += zk_srvr(host, "Connections")
            .await?
            .trim()
            .parse::<u64>()
            .ok()?;
    }
    Some(total)
}
