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

/// Scripts the server ran (`EVALSHA` and `EVAL` calls, `INFO commandstats`): each is one
/// request of a client, whatever commands it runs inside.
pub async fn redis_scripts_run(url: &str) -> Option<u64> {
    let text: String = redis_ask(url, redis::cmd("INFO").arg("commandstats")).await?;
    let calls = |verb: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{verb}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(calls("evalsha") + calls("eval"))
}

/// The `host:port` of the master that the sentinels of `scripts/services.sh` (`sentinel1` to
/// `sentinel3`) name for `distlock` now: the first that answers.
pub async fn sentinel_master() -> Option<String> {
    let mut ask = redis::cmd("SENTINEL");
    ask.arg("get-master-addr-by-name").arg("distlock");
    for port in servers::numbered::<3>("sentinel") {
        let url = format!("redis://127.0.0.1:{port}");
        if let Some(Some((host, port))) = redis_ask::<Option<(String, u16)>>(&url, &ask).await {
            return Some(format!("{host}:{port}"));
        }
    }
    None
}

/// `cmd`'s answer from the Redis server at `url`, over a connection of its own, 2 s at most.
async fn redis_ask<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> Option<T> {
    let asked = async {
        let mut c = redis::Client::open(url)
            .ok()?
            .get_multiplexed_async_connection()
            .await
            .ok()?;
        cmd.query_async(&mut c).await.ok()
    };
    tokio::time::timeout(std::time::Duration::from_secs(2), asked)
        .await
        .ok()
        .flatten()
}

/// The value of the line `key:value` in `text` (the form of `INFO` and `CLUSTER INFO`).
fn info_field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// The URL (`redis://host:port`) of the master that serves `key`'s slot in the Redis Cluster
/// of `scripts/services.sh` now, as the first of `cluster1` to `cluster6` that answers
/// `CLUSTER SLOTS` says.
///
/// # Errors
/// The client library's, or a message when no node answers or none serves the slot.
pub async fn redis_cluster_owner(key: &str) -> Result<String, String> {
    let mut keyslot = redis::cmd("CLUSTER");
    keyslot.arg("KEYSLOT").arg(key);
    let mut slots = redis::cmd("CLUSTER");
    slots.arg("SLOTS");
    for port in servers::numbered::<6>("cluster") {
        let url = format!("redis://127.0.0.1:{port}");
        let Some(slot) = redis_ask::<u16>(&url, &keyslot).await else {
            continue;
        };
        // Each range: [first slot, last slot, [master host, port, id, …], replicas…].
        let Some(ranges) = redis_ask::<Vec<Vec<redis::Value>>>(&url, &slots).await else {
            continue;
        };
        let owner = ranges.into_iter().find_map(|r| {
            let first: u16 = redis::from_redis_value(r.first()?.clone()).ok()?;
            let last: u16 = redis::from_redis_value(r.get(1)?.clone()).ok()?;
            let master: Vec<redis::Value> = redis::from_redis_value(r.get(2)?.clone()).ok()?;
            let host: String = redis::from_redis_value(master.first()?.clone()).ok()?;
            let port: u16 = redis::from_redis_value(master.get(1)?.clone()).ok()?;
            (first..=last)
                .contains(&slot)
                .then(|| format!("redis://{host}:{port}"))
        });
        if let Some(url) = owner {
            return Ok(url);
        }
    }
    Err(format!(
        "no node of the Redis Cluster (cluster1 to 6) names the master of the slot of {key:?}"
    ))
}

/// `cluster_state` (`ok` or `fail`) of `CLUSTER INFO` on the Redis Cluster node at `addr`
/// (`host:port`).
pub async fn redis_cluster_state(addr: &str) -> Option<String> {
    let mut info = redis::cmd("CLUSTER");
    info.arg("INFO");
    let text: String = redis_ask(&format!("redis://{addr}"), &info).await?;
    info_field(&text, "cluster_state")
}

/// What the Redis server at `addr` (`host:port`) says it is: `master` or `slave`.
pub async fn redis_role(addr: &str) -> Option<String> {
    redis_info(&format!("redis://{addr}"), "replication", "role").await
}

/// How many replicas the Redis server at `addr` (`host:port`) has connected and online.
pub async fn redis_replicas(addr: &str) -> Option<usize> {
    let url = format!("redis://{addr}");
    let n: usize = redis_info(&url, "replication", "connected_slaves")
        .await?
        .parse()
        .ok()?;
    Some(n)
}

/// The field `field` of `INFO section` of the Redis server at `url`, over a connection of its
/// own, 2 s at most.
async fn redis_info(url: &str, section: &str, field: &str) -> Option<String> {
    let mut info = redis::cmd("INFO");
    info.arg(section);
    let text: String = redis_ask(url, &info).await?;
    info_field(&text, field)
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
    zk_srvr_total(hosts, "Received").await
}

/// The sum of a numeric `srvr` line over every ZooKeeper server in `hosts` (`h1:p1,h2:p2`).
async fn zk_srvr_total(hosts: &str, key: &str) -> Option<u64> {
    let mut total = 0;
    for host in hosts.split(',') {
        total += zk_srvr(host, key).await?.trim().parse::<u64>().ok()?;
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
    etcd_metric_sum(endpoints, |l| {
        l.starts_with("grpc_server_msg_received_total{")
    })
    .await
}

/// The gRPC calls of `method` (`LeaseKeepAlive`, `Range`, …) the etcd members started: for a
/// stream, how many streams were opened.
pub async fn etcd_calls_started(endpoints: &[String], method: &str) -> Option<u64> {
    let method = format!("grpc_method=\"{method}\"");
    etcd_metric_sum(endpoints, |l| {
        l.starts_with("grpc_server_started_total{") && l.contains(&method)
    })
    .await
}

/// The gRPC messages of `method` (`LeaseKeepAlive`, …) the etcd members received: for a stream,
/// every request sent on it.
pub async fn etcd_messages_received(endpoints: &[String], method: &str) -> Option<u64> {
    let method = format!("grpc_method=\"{method}\"");
    etcd_metric_sum(endpoints, |l| {
        l.starts_with("grpc_server_msg_received_total{") && l.contains(&method)
    })
    .await
}

/// Watchers the etcd members serve from their *unsynced* group (`etcd_debugging_mvcc_slow_watcher_total`):
/// etcd 3.4 catches those up from a loop that runs every 100 ms.
pub async fn etcd_slow_watchers(endpoints: &[String]) -> Option<u64> {
    etcd_metric_sum(endpoints, |l| {
        l.starts_with("etcd_debugging_mvcc_slow_watcher_total ")
    })
    .await
}

/// The sum over `endpoints` of the `/metrics` lines that `pick` keeps.
async fn etcd_metric_sum(endpoints: &[String], pick: impl Fn(&str) -> bool) -> Option<u64> {
    let mut total = 0.0;
    for ep in endpoints {
        let out = ask(
            ep.trim_start_matches("http://"),
            b"GET /metrics HTTP/1.0\r\n\r\n",
        )
        .await?;
        total += out
            .lines()
            .filter(|l| pick(l))
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
    redis_info(url, "clients", "connected_clients")
        .await?
        .parse()
        .ok()
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
    zk_srvr_total(hosts, "Connections").await
}
