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
//! - `foreign-handoff` (backends that share their keys with another client: `redis-plain`
//!   with redis-py's algorithm; PostgreSQL with a distlock client of its own, for distlock
//!   only): that client holds, each subject waits; latency from the release to the grant.
//! - `resign`, `failover` (not run by default; backends that hold elections): a leader
//!   resigns, or crashes (its lease left to lapse); latency until an observer shows the
//!   waiting candidate as leader; on etcd beside the server's own Campaign/Observe RPCs
//!   (`election.rs`).
//!
//! `--modes exclusive,shared,permits` measures the lock family too (`--permits K`, default
//! 2): each mode's rows beside that mode's own baselines (`pg_advisory_lock_shared`; an
//! expiring sorted-set semaphore on Redis), where the backend has one. Readers never wait for
//! each other, so shared rows have no hand-off.
//!
//! `--scale 10,100,1000` runs none of those: one client of each backend holds that many
//! auto-renewed locks for `--scale-window` (`scale.rs`): connections, memory, renewals and the
//! servers' requests per held lock, and an acquire + release meanwhile.
//!
//! `--watch-delay N` runs none of those either: on etcd, how late a new watch hears of a
//! deletion, with and without other writes while it is created (`etcd_watch.rs`).
//!
//! Output: a markdown table on stdout (and `--markdown FILE`) and a JSON file (`--json FILE`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde::Serialize;

mod catalog;
mod election;
mod etcd_baselines;
mod etcd_watch;
mod memory_baselines;
mod pg_baselines;
mod redis_baselines;
mod scale;
mod scale_plot;
mod scenarios;
mod subject;
mod zk_baselines;

use catalog::{baselines_for, driver_subject, value_name, Backend, Endpoints};
use scenarios::{
    foreign_handoff, handoff, idle, summarize, throughput, uncontended, CountFuture, Sample, Timed,
};
use subject::Subject;

#[derive(Parser, Debug)]
#[command(about = "Benchmarks distlock drivers beside baselines measured in the same run")]
struct Args {
    /// Backends to measure (comma separated).
    #[arg(long, value_enum, default_value = "memory", value_delimiter = ',')]
    backend: Vec<Backend>,
    /// Scenarios to run (comma separated).
    #[arg(
        long,
        value_enum,
        default_value = "uncontended,acquire,throughput,handoff,idle,foreign-handoff",
        value_delimiter = ','
    )]
    scenarios: Vec<Scenario>,
    #[command(flatten)]
    endpoints: Endpoints,
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
    /// Leader changes measured per resign run (a failover run measures a fifth as many: each
    /// waits out a lease's TTL).
    #[arg(long, default_value_t = 25)]
    elections: u64,
    /// Modes of the lock family to measure (comma separated): each beside its own baselines.
    #[arg(long, value_enum, default_value = "exclusive", value_delimiter = ',')]
    modes: Vec<ModeArg>,
    /// The permits of the `permits` mode's semaphore.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    permits: u32,
    /// Measures only the subjects whose label contains this text (`distlock` for the driver,
    /// `baseline` for its baselines): one subject per process, so that a count of the whole
    /// process's instructions is that subject's (`scripts/instructions.sh`).
    #[arg(long)]
    only: Option<String>,
    /// Repetitions of each scenario; the median run is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-results/bench.json")]
    json: PathBuf,
    /// Also write the markdown table here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// `on`: install a tracing subscriber (formatting INFO lines to nowhere) and a Prometheus
    /// recorder first, as a service that exports both would: the cost of distlock's spans and
    /// metrics (docs/observability.md) against a run with `off`, where nothing is installed.
    #[arg(long, value_enum, default_value = "off")]
    telemetry: Telemetry,
    /// Instead of the scenarios: one client of each backend holds this many locks at once
    /// (comma separated: one row per count), auto-renewed, for `--scale-window` (`scale.rs`).
    #[arg(long, value_delimiter = ',')]
    scale: Vec<usize>,
    /// The TTL of the locks `--scale` holds.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    scale_ttl: Duration,
    /// How long `--scale` holds them (renewals counted, cycles timed meanwhile).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    scale_window: Duration,
    /// Where `--scale` draws its pictures (`scale-*.svg`: each figure against the number of
    /// locks held, one line per backend).
    #[arg(long, default_value = "bench-results")]
    scale_svg: PathBuf,
    /// Instead of the scenarios: this many watches on the etcd single member, each told of a
    /// deletion, with and without other writes meanwhile (`etcd_watch.rs`).
    #[arg(long)]
    watch_delay: Option<usize>,
}

/// `--telemetry`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Telemetry {
    Off,
    On,
}

/// Installs what `--telemetry on` measures; the Prometheus handle is kept so that its
/// histograms are drained as a scrape would (every second).
fn install_telemetry(rt: &tokio::runtime::Runtime) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink))
        .with(tracing_subscriber::filter::LevelFilter::INFO);
    tracing::subscriber::set_global_default(subscriber).map_err(|e| e.to_string())?;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| e.to_string())?;
    rt.spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let _ = handle.render();
        }
    });
    Ok(())
}

/// What is measured (the crate docs say how), in the order the scenarios run.
#[derive(ValueEnum, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum Scenario {
    /// Acquire + release on one name, one task.
    Uncontended,
    /// The same loop, timing only the acquire.
    Acquire,
    /// Many tasks on distinct names for a fixed time.
    Throughput,
    /// Tasks contending for one name: release to the next grant.
    Handoff,
    /// Server requests one waiting `lock` adds per second.
    Idle,
    /// Another client holds, the subject waits: release to grant.
    ForeignHandoff,
    /// A leader resigns: resign to the observer showing the next leader.
    Resign,
    /// A leader crashes: crash to the observer showing the next leader.
    Failover,
}

/// A mode of the lock family on the command line.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ModeArg {
    /// The lock (the default).
    Exclusive,
    /// Shared holders (readers).
    Shared,
    /// One of `--permits K` permits.
    Permits,
}

impl ModeArg {
    fn mode(self, k: u32) -> lock_core::Mode {
        match self {
            ModeArg::Exclusive => lock_core::Mode::Exclusive,
            ModeArg::Shared => lock_core::Mode::Shared,
            ModeArg::Permits => lock_core::Mode::Permits(k),
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
    /// Operations that ended in an error over every run (throughput), not in `ops_per_sec`.
    errors: u64,
}

impl Row {
    fn of(
        backend: Backend,
        subject: String,
        baseline: bool,
        scenario: Scenario,
        sum: &Sample,
        ratio: Option<f64>,
    ) -> Row {
        Row {
            backend: value_name(&backend),
            subject,
            baseline,
            scenario,
            p50_us: sum.p50_us,
            p99_us: sum.p99_us,
            ops_per_sec: sum.ops_per_sec,
            ratio,
            server_requests_per_op: sum.requests_per_op,
            errors: sum.errors,
        }
    }
}

async fn measure(args: &Args, backend: Backend, mode: lock_core::Mode) -> Result<Vec<Row>, String> {
    let mut subjects: Vec<(Arc<dyn Subject>, bool)> = Vec::new();
    let ep = &args.endpoints;
    for b in baselines_for(backend, ep, mode).await? {
        subjects.push((b, true));
    }
    match driver_subject(backend, ep, mode).await? {
        Some(d) => subjects.push((d, false)),
        None => {
            eprintln!("lock-bench: {} has no {mode} mode", value_name(&backend));
            return Ok(vec![]);
        }
    }
    if let Some(only) = &args.only {
        subjects.retain(|(s, _)| s.label().contains(only.as_str()));
        if subjects.is_empty() {
            return Err(format!(
                "--only {only:?}: no subject of {} has it in its label",
                value_name(&backend)
            ));
        }
    }
    let foreign = catalog::foreign_holder(backend, ep).await?;
    let mut rows = Vec::new();
    for &scenario in Scenario::value_variants() {
        // Elections are measured once per backend, beside their own baselines.
        if !args.scenarios.contains(&scenario)
            || matches!(scenario, Scenario::Resign | Scenario::Failover)
        {
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
                    let Some(f) = &foreign else { continue };
                    if subjects[i].1 && !f.baselines {
                        continue;
                    }
                    let holder = &f.holder;
                    per_subject[i]
                        .push(foreign_handoff(holder.clone(), s.clone(), args.handoffs / 4).await?);
                    continue;
                }
                if scenario == Scenario::Idle {
                    let ep = ep.clone();
                    let count = move || {
                        let ep = ep.clone();
                        Box::pin(async move { ep.server_requests(backend).await }) as CountFuture
                    };
                    per_subject[i].push(idle(s.clone(), args.idle_window, count).await?);
                    continue;
                }
                let before = ep.server_requests(backend).await;
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
                    Scenario::Handoff
                    | Scenario::Idle
                    | Scenario::ForeignHandoff
                    | Scenario::Resign
                    | Scenario::Failover => handoff(s.clone(), args.waiters, args.handoffs).await?,
                };
                if let (Some(b), Some(a)) = (before, ep.server_requests(backend).await) {
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
        // Ratios are against the first baseline measured in this scenario (none: no ratio).
        let base = (subjects.iter().zip(summaries.iter()))
            .find_map(|((_, is_base), sum)| sum.as_ref().filter(|_| *is_base));
        for ((s, is_base), sum) in subjects.iter().zip(summaries.iter()) {
            let Some(sum) = sum else { continue };
            let ratio = match (scenario, base) {
                (_, None) => None,
                (Scenario::Throughput, Some(base)) => Some(sum.ops_per_sec / base.ops_per_sec),
                (_, Some(base)) => match (sum.p50_us, base.p50_us) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                },
            };
            rows.push(Row::of(backend, s.label(), *is_base, scenario, sum, ratio));
        }
    }
    Ok(rows)
}

/// The election scenarios asked for, on `backend`: etcd's own RPCs first where it has them
/// (the baseline), then distlock's `Election`.
async fn elections(args: &Args, backend: Backend) -> Result<Vec<Row>, String> {
    let asked: Vec<Scenario> = (args.scenarios.iter().copied())
        .filter(|s| matches!(s, Scenario::Resign | Scenario::Failover))
        .collect();
    if asked.is_empty() {
        return Ok(vec![]);
    }
    let mut subjects: Vec<(Arc<dyn election::Elector>, bool)> = Vec::new();
    if let Some(base) = catalog::etcd_election(backend, &args.endpoints).await? {
        subjects.push((base, true));
    }
    let lock = catalog::connect(backend, &args.endpoints).await?;
    match election::Distlock::new(lock) {
        Some(d) => subjects.push((Arc::new(d), false)),
        None => {
            eprintln!("lock-bench: {} holds no elections", value_name(&backend));
            return Ok(vec![]);
        }
    }
    let mut rows = Vec::new();
    for scenario in asked {
        let (ending, n) = match scenario {
            Scenario::Failover => (election::Ending::Crash, (args.elections / 5).max(1)),
            _ => (election::Ending::Resign, args.elections),
        };
        let mut per: Vec<Vec<Sample>> = subjects.iter().map(|_| Vec::new()).collect();
        for _ in 0..args.runs.max(1) {
            for (i, (e, _)) in subjects.iter().enumerate() {
                per[i].push(election::failovers(e.clone(), n, ending).await?);
            }
        }
        let sums: Vec<Sample> = per.into_iter().map(summarize).collect();
        let base = (subjects.iter().zip(&sums)).find_map(|((_, b), s)| b.then_some(s));
        for ((e, is_base), sum) in subjects.iter().zip(&sums) {
            let ratio = match (sum.p50_us, base.and_then(|b| b.p50_us)) {
                (Some(a), Some(b)) if b > 0.0 && !is_base => Some(a / b),
                _ => None,
            };
            rows.push(Row::of(backend, e.label(), *is_base, scenario, sum, ratio));
        }
    }
    Ok(rows)
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
            value_name(&r.scenario),
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
    for r in rows.iter().filter(|r| r.errors > 0) {
        let _ = writeln!(
            out,
            "\n{} ({}): {} operations ended in an error over the runs, not counted in ops/s.",
            r.subject,
            value_name(&r.scenario),
            r.errors
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
    if args.telemetry == Telemetry::On {
        if let Err(e) = install_telemetry(&rt) {
            eprintln!("lock-bench: cannot install the telemetry: {e}");
            return std::process::ExitCode::from(70);
        }
    }
    if !args.scale.is_empty() {
        return scale_only(&args, &rt);
    }
    if let Some(trials) = args.watch_delay {
        let (eps, _) = args.endpoints.etcd(Backend::Etcd).unwrap_or_default();
        return match rt.block_on(etcd_watch::watch_delay(&eps, trials)) {
            Ok(md) => {
                print!("{md}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("lock-bench: etcd: {e}");
                std::process::ExitCode::from(69)
            }
        };
    }
    // A backend that fails ends the run, but what was measured before it is still written.
    let (rows, failed) = rt.block_on(async {
        let mut rows = Vec::new();
        for b in &args.backend {
            for m in &args.modes {
                let (name, mode) = (value_name(b), m.mode(args.permits));
                eprintln!("lock-bench: measuring {name}, {mode} ...");
                match measure(&args, *b, mode).await {
                    Ok(r) => rows.extend(r),
                    Err(e) => return (rows, Some(format!("{name}: {e}"))),
                }
            }
            match elections(&args, *b).await {
                Ok(r) => rows.extend(r),
                Err(e) => return (rows, Some(format!("{}: {e}", value_name(b)))),
            }
        }
        (rows, None)
    });
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
    match failed {
        None => std::process::ExitCode::SUCCESS,
        Some(e) => {
            eprintln!("lock-bench: {e}");
            std::process::ExitCode::from(69)
        }
    }
}

/// `--scale`: its table on stdout (and `--markdown`), its rows as JSON (`--json`).
fn scale_only(args: &Args, rt: &tokio::runtime::Runtime) -> std::process::ExitCode {
    let plan = scale::Plan {
        ttl: args.scale_ttl,
        window: args.scale_window,
    };
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        for b in &args.backend {
            for &n in &args.scale {
                eprintln!("lock-bench: {} holding {n} locks ...", value_name(b));
                rows.push(scale::scale(*b, &args.endpoints, n, plan).await);
            }
        }
        rows
    });
    let md = scale::table(&rows);
    print!("{md}");
    if let Err(e) = scale_plot::draw(&rows, &args.scale_svg) {
        eprintln!("lock-bench: cannot draw the pictures: {e}");
    }
    if let Some(p) = &args.markdown {
        if let Err(e) = std::fs::write(p, &md) {
            eprintln!("lock-bench: cannot write {}: {e}", p.display());
        }
    }
    if let Some(dir) = args.json.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(j) = serde_json::to_string_pretty(&rows) {
        if let Err(e) = std::fs::write(&args.json, j) {
            eprintln!("lock-bench: cannot write {}: {e}", args.json.display());
        }
    }
    std::process::ExitCode::SUCCESS
}
