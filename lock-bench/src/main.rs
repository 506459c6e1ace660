//! `lock-bench`: latency and throughput of distlock drivers, each beside a baseline measured in
//! the same run on the same machine.
//!
//! ```text
//! cargo run --release -p lock-bench -- --backend memory
//! ```
//!
//! Scenarios (each row reports median-of-runs figures, never a single sample):
//! - `uncontended`: one task, acquire + release on one name; p50/p99 latency and ops/s.
//! - `acquire`: the same loop, timing only the acquire (the release is done, not timed).
//! - `throughput`: K tasks on K distinct names for a fixed time; ops/s.
//! - `handoff`: K tasks contend for one name; latency from the holder starting its release to
//!   the next holder's acquire returning; p50/p99.
//! - `foreign-handoff` (backends that share their keys with another client: `redis-plain`):
//!   that client holds, each subject waits; latency from the release to the grant.
//!
//! Output: a markdown table on stdout (and `--markdown FILE`) and a JSON file (`--json FILE`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

mod catalog;
mod etcd_baselines;
mod memory_baselines;
mod pg_baselines;
mod redis_baselines;
mod scenarios;
mod subject;
mod zk_baselines;

use catalog::{baselines_for, driver_subject, Endpoints};
use scenarios::{
    foreign_handoff, handoff, idle, summarize, throughput, uncontended, CountFuture, Sample, Timed,
};
use subject::Subject;

#[derive(Parser, Debug)]
#[command(about = "Benchmarks distlock drivers beside baselines measured in the same run")]
struct Args {
    /// Backends to measure (comma separated). Available: memory, redis, redis-plain (plain
    /// keys, beside redis-py's algorithm), redlock, zookeeper, zookeeper-ensemble, etcd,
    /// etcd-cluster, postgres.
    #[arg(long, default_value = "memory", value_delimiter = ',')]
    backend: Vec<String>,
    /// Scenarios to run (comma separated): uncontended, acquire, throughput, handoff, idle,
    /// foreign-handoff.
    #[arg(
        long,
        value_enum,
        default_value = "uncontended,acquire,throughput,handoff,idle,foreign-handoff",
        value_delimiter = ','
    )]
    scenarios: Vec<Scenario>,
    /// Redis server for the `redis` backend and its baselines.
    #[arg(long, default_value = "redis://127.0.0.1:16379")]
    redis_url: String,
    /// Masters for the `redlock` backend; its baselines use the same masters.
    #[arg(
        long,
        default_value = "redlock://127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384"
    )]
    redlock_url: String,
    /// ZooKeeper single node for the `zookeeper` backend.
    #[arg(long, default_value = "127.0.0.1:12181")]
    zk_hosts: String,
    /// ZooKeeper ensemble for the `zookeeper-ensemble` backend.
    #[arg(
        long,
        default_value = "127.0.0.1:12281,127.0.0.1:12282,127.0.0.1:12283"
    )]
    zk_ensemble_hosts: String,
    /// etcd single member for the `etcd` backend.
    #[arg(long, default_value = "127.0.0.1:12379")]
    etcd_endpoints: String,
    /// etcd 3-member cluster for the `etcd-cluster` backend.
    #[arg(
        long,
        default_value = "127.0.0.1:12479,127.0.0.1:12579,127.0.0.1:12679"
    )]
    etcd_cluster_endpoints: String,
    /// PostgreSQL server for the `postgres` backend and its baselines (libpq key=value or URL;
    /// the driver gets it as a URL).
    #[arg(long, default_value = "postgres://locker@127.0.0.1:15432/postgres")]
    pg_url: String,
    /// Acquire+release cycles per uncontended run.
    #[arg(long, default_value_t = 2000)]
    iterations: u64,
    /// Concurrent tasks (distinct names) in the throughput scenario.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Length of each throughput run.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    duration: Duration,
    /// Tasks contending for one name in the handoff scenario.
    #[arg(long, default_value_t = 8)]
    waiters: usize,
    /// Length of each measuring window of the idle scenario (holder alone, then with a waiter).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    idle_window: Duration,
    /// Hand-offs measured per handoff run.
    #[arg(long, default_value_t = 400)]
    handoffs: u64,
    /// Repetitions of each scenario; the median run is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-results/bench.json")]
    json: PathBuf,
    /// Also write the markdown table here.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// What is measured; each is described in the crate docs.
#[derive(clap::ValueEnum, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum Scenario {
    Uncontended,
    Acquire,
    Throughput,
    Handoff,
    Idle,
    ForeignHandoff,
}

impl Scenario {
    const ALL: [Scenario; 6] = [
        Scenario::Uncontended,
        Scenario::Acquire,
        Scenario::Throughput,
        Scenario::Handoff,
        Scenario::Idle,
        Scenario::ForeignHandoff,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Uncontended => "uncontended",
            Scenario::Acquire => "acquire",
            Scenario::Throughput => "throughput",
            Scenario::Handoff => "handoff",
            Scenario::Idle => "idle",
            Scenario::ForeignHandoff => "foreign-handoff",
        }
    }
}

/// One line of the results table.
#[derive(Serialize, Debug, Clone)]
struct Row {
    backend: String,
    subject: String,
    baseline: bool,
    scenario: Scenario,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    ops_per_sec: f64,
    /// p50 (or, for throughput, ops/s) divided by the backend's first baseline's.
    ratio: Option<f64>,
    /// Requests the server processed per measured operation (where the server counts them).
    server_requests_per_op: Option<f64>,
}

async fn measure(args: &Args, backend: &str) -> Result<Vec<Row>, String> {
    let mut subjects: Vec<(Arc<dyn Subject>, bool)> = Vec::new();
    let ep = Endpoints {
        redis_url: args.redis_url.clone(),
        redlock_url: args.redlock_url.clone(),
        zk_hosts: args.zk_hosts.clone(),
        zk_ensemble_hosts: args.zk_ensemble_hosts.clone(),
        etcd_endpoints: args.etcd_endpoints.clone(),
        etcd_cluster_endpoints: args.etcd_cluster_endpoints.clone(),
        pg_url: args.pg_url.clone(),
    };
    for b in baselines_for(backend, &ep).await? {
        subjects.push((b, true));
    }
    subjects.push((driver_subject(backend, &ep).await?, false));
    let foreign = catalog::foreign_holder(backend, &ep).await?;
    let mut rows = Vec::new();
    for scenario in Scenario::ALL {
        if !args.scenarios.contains(&scenario) {
            continue;
        }
        // Interleave subjects run by run so drift in machine load hits all of them alike.
        let mut per_subject: Vec<Vec<Sample>> = subjects.iter().map(|_| Vec::new()).collect();
        for _ in 0..args.runs.max(1) {
            for (i, (s, _)) in subjects.iter().enumerate() {
                if matches!(
                    scenario,
                    Scenario::Handoff | Scenario::Idle | Scenario::ForeignHandoff
                ) && !s.waits()
                {
                    continue;
                }
                if scenario == Scenario::ForeignHandoff {
                    let Some(holder) = &foreign else { continue };
                    per_subject[i]
                        .push(foreign_handoff(holder.clone(), s.clone(), args.handoffs / 4).await?);
                    continue;
                }
                if scenario == Scenario::Idle {
                    let (backend, ep) = (backend.to_string(), ep.clone());
                    let count = move || {
                        let (backend, ep) = (backend.clone(), ep.clone());
                        Box::pin(async move { server_requests(&backend, &ep).await }) as CountFuture
                    };
                    per_subject[i].push(idle(s.clone(), args.idle_window, count).await?);
                    continue;
                }
                let before = server_requests(backend, &ep).await;
                let mut sample = match scenario {
                    Scenario::Uncontended => {
                        uncontended(s.as_ref(), args.iterations, Timed::Cycle).await?
                    }
                    Scenario::Acquire => {
                        uncontended(s.as_ref(), args.iterations, Timed::Acquire).await?
                    }
                    Scenario::Throughput => {
                        throughput(s.clone(), args.concurrency, args.duration).await?
                    }
                    Scenario::Handoff | Scenario::Idle | Scenario::ForeignHandoff => {
                        handoff(s.clone(), args.waiters, args.handoffs).await?
                    }
                };
                if let (Some(b), Some(a)) = (before, server_requests(backend, &ep).await) {
                    // The warm-up of `uncontended`/`acquire` is counted too: a small overestimate.
                    sample.requests_per_op =
                        Some(a.saturating_sub(b) as f64 / sample.ops.max(1) as f64);
                }
                per_subject[i].push(sample);
            }
        }
        let summaries: Vec<Option<Sample>> = per_subject
            .into_iter()
            .map(|v| (!v.is_empty()).then(|| summarize(v)))
            .collect();
        // Ratios are against the first baseline measured in this scenario.
        let Some(base) = summaries.iter().flatten().next() else {
            continue;
        };
        for ((s, is_base), sum) in subjects.iter().zip(summaries.iter()) {
            let Some(sum) = sum else { continue };
            let ratio = match scenario {
                Scenario::Throughput => Some(sum.ops_per_sec / base.ops_per_sec),
                _ => match (sum.p50_us, base.p50_us) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                },
            };
            rows.push(Row {
                backend: backend.to_string(),
                subject: s.label(),
                baseline: *is_base,
                scenario,
                p50_us: sum.p50_us,
                p99_us: sum.p99_us,
                ops_per_sec: sum.ops_per_sec,
                ratio,
                server_requests_per_op: sum.requests_per_op,
            });
        }
    }
    Ok(rows)
}

/// The server's own count of processed requests, where the backend has one.
async fn server_requests(backend: &str, ep: &Endpoints) -> Option<u64> {
    match backend {
        "redis" | "redis-plain" => test_support::redis_commands_processed(&ep.redis_url).await,
        "redlock" => {
            let mut total = 0;
            for url in ep.redlock_url.trim_start_matches("redlock://").split(',') {
                total += test_support::redis_commands_processed(&format!("redis://{url}")).await?;
            }
            Some(total)
        }
        "zookeeper" => test_support::zk_packets_received(&ep.zk_hosts).await,
        "zookeeper-ensemble" => test_support::zk_packets_received(&ep.zk_ensemble_hosts).await,
        b if ep.etcd(b).is_some() => {
            let (eps, _) = ep.etcd(b)?;
            test_support::etcd_grpc_messages_received(&eps).await
        }
        "postgres" => test_support::pg_statements(&ep.pg_url).await,
        _ => None,
    }
}

fn table(args: &Args, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Runs: {} (median reported); uncontended: {} cycles; throughput: {} tasks for {}; handoff: {} waiters, {} hand-offs.\n",
        args.runs,
        args.iterations,
        args.concurrency,
        humantime::format_duration(args.duration),
        args.waiters,
        args.handoffs
    );
    let _ = writeln!(
        out,
        "idle: server requests/op = requests per second one waiting `lock` adds (holder + waiter minus holder alone, {} windows).\n",
        humantime::format_duration(args.idle_window)
    );
    let _ = writeln!(
        out,
        "| backend | subject | scenario | p50 µs | p99 µs | ops/s | server requests/op | vs baseline |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---:|---:|---:|---:|");
    let f = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{v:.1}"));
    for r in rows {
        let ratio = if r.baseline {
            "baseline".to_string()
        } else {
            r.ratio.map_or("–".into(), |x| {
                if r.scenario == Scenario::Throughput {
                    format!("{x:.2}× ops/s")
                } else {
                    format!("{x:.2}× p50")
                }
            })
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.backend,
            r.subject,
            r.scenario.name(),
            f(r.p50_us),
            f(r.p99_us),
            // idle measures a rate of requests, not operations
            if r.scenario == Scenario::Idle {
                "–".to_string()
            } else {
                format!("{:.0}", r.ops_per_sec)
            },
            f(r.server_requests_per_op),
            ratio
        );
    }
    out
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lock-bench: cannot start a runtime: {e}");
            return std::process::ExitCode::from(70);
        }
    };
    let result = rt.block_on(async {
        let mut rows = Vec::new();
        for b in &args.backend {
            eprintln!("lock-bench: measuring {b} ...");
            rows.extend(measure(&args, b).await.map_err(|e| format!("{b}: {e}"))?);
        }
        Ok::<_, String>(rows)
    });
    let rows = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lock-bench: {e}");
            return std::process::ExitCode::from(69);
        }
    };
    let md = table(&args, &rows);
    print!("{md}");
    if let Some(p) = &args.markdown {
        if let Err(e) = std::fs::write(p, &md) {
            eprintln!("lock-bench: cannot write {}: {e}", p.display());
        }
    }
    if let Some(dir) = args.json.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match serde_json::to_string_pretty(&rows) {
        Ok(j) => {
            if let Err(e) = std::fs::write(&args.json, j) {
                eprintln!("lock-bench: cannot write {}: {e}", args.json.display());
            }
        }
        Err(e) => eprintln!("lock-bench: cannot encode results: {e}"),
    }
    std::process::ExitCode::SUCCESS
}
