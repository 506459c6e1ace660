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
//!
//! Output: a markdown table on stdout (and `--markdown FILE`) and a JSON file (`--json FILE`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use serde::Serialize;

mod catalog;
mod etcd_baselines;
mod memory_baselines;
mod redis_baselines;
mod subject;
mod zk_baselines;

use catalog::{baselines_for, driver_subject, Endpoints};
use subject::Subject;

#[derive(Parser, Debug)]
#[command(about = "Benchmarks distlock drivers beside baselines measured in the same run")]
struct Args {
    /// Backends to measure (comma separated). Available: memory, redis, redlock, zookeeper,
    /// zookeeper-ensemble, etcd, etcd-cluster.
    #[arg(long, default_value = "memory", value_delimiter = ',')]
    backend: Vec<String>,
    /// Scenarios to run (comma separated): uncontended, acquire, throughput, handoff, idle.
    #[arg(
        long,
        value_enum,
        default_value = "uncontended,acquire,throughput,handoff,idle",
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
#[serde(rename_all = "lowercase")]
enum Scenario {
    Uncontended,
    Acquire,
    Throughput,
    Handoff,
    Idle,
}

impl Scenario {
    const ALL: [Scenario; 5] = [
        Scenario::Uncontended,
        Scenario::Acquire,
        Scenario::Throughput,
        Scenario::Handoff,
        Scenario::Idle,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Uncontended => "uncontended",
            Scenario::Acquire => "acquire",
            Scenario::Throughput => "throughput",
            Scenario::Handoff => "handoff",
            Scenario::Idle => "idle",
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

fn micros(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

#[allow(clippy::expect_used)] // constant bounds, checked once by any run
fn new_hist() -> Histogram<u64> {
    // 1 ns .. 60 s at 3 significant digits; larger values are clamped by `saturating_record`.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

static NAME_SEQ: AtomicU64 = AtomicU64::new(0);

/// A lock name no other run used.
fn fresh(tag: &str) -> String {
    let n = NAME_SEQ.fetch_add(1, Ordering::Relaxed);
    format!("bench-{}-{tag}-{n}", std::process::id())
}

struct Sample {
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    ops_per_sec: f64,
    ops: u64,
    requests_per_op: Option<f64>,
}

/// What the one-task loop times: the whole acquire + release cycle, or only the acquire (the
/// latency a caller waits for a free lock; the release still runs, untimed, so every acquire
/// finds the lock free).
#[derive(Clone, Copy)]
enum Timed {
    Cycle,
    Acquire,
}

async fn uncontended(s: &dyn Subject, iterations: u64, timed: Timed) -> Result<Sample, String> {
    let name = fresh("unc");
    let mut h = new_hist();
    for _ in 0..iterations / 10 {
        s.cycle(&name).await?; // warm-up: connections, scripts, caches
    }
    let start = Instant::now();
    for _ in 0..iterations {
        let t = Instant::now();
        match timed {
            Timed::Cycle => {
                s.cycle(&name).await?;
                h.saturating_record(ns(t.elapsed()));
            }
            Timed::Acquire => {
                let guard = s.lock(&name).await?;
                h.saturating_record(ns(t.elapsed()));
                guard.unlock().await?;
            }
        }
    }
    let total = start.elapsed().as_secs_f64();
    Ok(Sample {
        p50_us: Some(micros(&h, 0.5)),
        p99_us: Some(micros(&h, 0.99)),
        ops_per_sec: iterations as f64 / total,
        ops: iterations,
        requests_per_op: None,
    })
}

async fn throughput(
    s: Arc<dyn Subject>,
    tasks: usize,
    duration: Duration,
) -> Result<Sample, String> {
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (s, count) = (s.clone(), count.clone());
        let name = fresh("thr");
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                s.cycle(&name).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(())
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    let ops = count.load(Ordering::Relaxed);
    Ok(Sample {
        p50_us: None,
        p99_us: None,
        ops_per_sec: ops as f64 / start.elapsed().as_secs_f64(),
        ops,
        requests_per_op: None,
    })
}

/// A true hand-off: after releasing, a task waits until some *other* task was granted before it
/// contends again, so every measured grant goes to a waiter (a releaser that re-grabs its own
/// lock would flatter clients that poll).
async fn handoff(s: Arc<dyn Subject>, waiters: usize, handoffs: u64) -> Result<Sample, String> {
    let name = fresh("hand");
    let hist = Arc::new(Mutex::new(new_hist()));
    // When the current holder started releasing; the next grant measures from it.
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let (grants, _) = tokio::sync::watch::channel(0u64);
    let grants = Arc::new(grants);
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..waiters {
        let (s, name, hist, released_at, grants) = (
            s.clone(),
            name.clone(),
            hist.clone(),
            released_at.clone(),
            grants.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut seen = grants.subscribe();
            loop {
                if *seen.borrow_and_update() >= handoffs {
                    return Ok::<_, String>(());
                }
                let guard = s.lock(&name).await?;
                let now = Instant::now();
                if let Some(at) = released_at.lock().map_err(|e| e.to_string())?.take() {
                    hist.lock()
                        .map_err(|e| e.to_string())?
                        .saturating_record(ns(now - at));
                }
                let mine = {
                    let mut n = 0;
                    grants.send_modify(|g| {
                        *g += 1;
                        n = *g;
                    });
                    n
                };
                seen.borrow_and_update();
                *released_at.lock().map_err(|e| e.to_string())? = Some(Instant::now());
                guard.unlock().await?;
                if mine >= handoffs {
                    return Ok(());
                }
                // Back of the line: contend again only after someone else got the lock.
                while *seen.borrow_and_update() <= mine {
                    if seen.changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    let h = hist.lock().map_err(|e| e.to_string())?;
    Ok(Sample {
        p50_us: Some(micros(&h, 0.5)),
        p99_us: Some(micros(&h, 0.99)),
        ops_per_sec: h.len() as f64 / start.elapsed().as_secs_f64(),
        ops: h.len(),
        requests_per_op: None,
    })
}

/// A pending read of the server's request counter.
type CountFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<u64>> + Send>>;

/// Server requests per second that one waiting `lock` call causes: the rate while a holder
/// holds and a waiter waits, minus the rate while the holder holds alone (heartbeats, renewals).
/// A waiter woken by notification adds ~0; a poller adds its polling rate.
async fn idle(
    s: Arc<dyn Subject>,
    window: Duration,
    count: impl Fn() -> CountFuture,
) -> Result<Sample, String> {
    let name = fresh("idle");
    let holder = s.lock(&name).await?;
    let rate = |before: Option<u64>, after: Option<u64>| match (before, after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / window.as_secs_f64()),
        _ => None,
    };
    let before = count().await;
    tokio::time::sleep(window).await;
    let alone = rate(before, count().await);
    let (ws, wn) = (s.clone(), name.clone());
    let waiter = tokio::spawn(async move { ws.lock(&wn).await });
    tokio::time::sleep(Duration::from_millis(300)).await; // let the waiter settle
    let before = count().await;
    tokio::time::sleep(window).await;
    let waiting = rate(before, count().await);
    if waiter.is_finished() {
        return Err(format!("{}: the waiter was granted a held lock", s.label()));
    }
    holder.unlock().await?;
    waiter.await.map_err(|e| e.to_string())??.unlock().await?;
    Ok(Sample {
        p50_us: None,
        p99_us: None,
        ops_per_sec: 0.0,
        ops: 1,
        requests_per_op: match (waiting, alone) {
            (Some(w), Some(a)) => Some((w - a).max(0.0)),
            _ => None,
        },
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Median of each figure over several runs.
fn summarize(samples: Vec<Sample>) -> Sample {
    let opt = |f: fn(&Sample) -> Option<f64>| {
        let v: Vec<f64> = samples.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    Sample {
        p50_us: opt(|s| s.p50_us),
        p99_us: opt(|s| s.p99_us),
        ops_per_sec: median(samples.iter().map(|s| s.ops_per_sec).collect()),
        ops: samples.iter().map(|s| s.ops).sum(),
        requests_per_op: opt(|s| s.requests_per_op),
    }
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
    };
    for b in baselines_for(backend, &ep).await? {
        subjects.push((b, true));
    }
    subjects.push((driver_subject(backend, &ep).await?, false));
    let mut rows = Vec::new();
    for scenario in Scenario::ALL {
        if !args.scenarios.contains(&scenario) {
            continue;
        }
        // Interleave subjects run by run so drift in machine load hits all of them alike.
        let mut per_subject: Vec<Vec<Sample>> = subjects.iter().map(|_| Vec::new()).collect();
        for _ in 0..args.runs.max(1) {
            for (i, (s, _)) in subjects.iter().enumerate() {
                if matches!(scenario, Scenario::Handoff | Scenario::Idle) && !s.waits() {
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
                    Scenario::Handoff | Scenario::Idle => {
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
        "redis" => test_support::redis_commands_processed(&ep.redis_url).await,
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
