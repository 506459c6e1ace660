//! The libtest-mimic runner: lists every case by name, honours filters, shows capability skips
//! as ignored with the reason in brackets.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Trial};

use crate::{gather_facts, Case, Failure, Harness, CASES};

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("cannot start a tokio runtime: {e}")))
}

/// Runs the whole suite against `harness` with the command line's arguments (`--list`, name
/// filters, `--exact`, `--test-threads`, ...) and returns the process exit code.
///
/// Cases run one at a time unless `--test-threads` says otherwise: they measure timings, and a
/// small machine running many at once would turn scheduling noise into failures.
pub fn run<H: Harness>(harness: H) -> ExitCode {
    run_with_args(Arc::new(harness), Arguments::from_args())
}

/// [`run`] with explicit arguments.
pub fn run_with_args(harness: Arc<dyn Harness>, args: Arguments) -> ExitCode {
    run_trials_with_args(trials(harness), args)
}

/// Runs trials made by [`trials_prefixed`] for several deployments (a single node and a
/// cluster, say) in one test binary, one at a time unless `--test-threads` says otherwise.
///
/// ```no_run
/// # use std::sync::Arc;
/// # fn harness(_url: &str) -> Arc<dyn conformance_tests::Harness> { unimplemented!() }
/// let mut trials = conformance_tests::trials_prefixed(harness("my://one"), "single");
/// trials.extend(conformance_tests::trials_prefixed(harness("my://a,b,c"), "cluster"));
/// std::process::exit(if conformance_tests::run_trials(trials) == std::process::ExitCode::SUCCESS { 0 } else { 1 });
/// ```
pub fn run_trials(trials: Vec<Trial>) -> ExitCode {
    run_trials_with_args(trials, Arguments::from_args())
}

fn run_trials_with_args(trials: Vec<Trial>, mut args: Arguments) -> ExitCode {
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    libtest_mimic::run(&args, trials).exit_code()
}

/// One libtest-mimic trial per case. Reads the driver's capabilities once (which needs a
/// client); if no client can be made, every case fails with that reason — a missing server is
/// a failure, never a skip.
pub fn trials(harness: Arc<dyn Harness>) -> Vec<Trial> {
    trials_prefixed(harness, "")
}

/// [`trials`] with every case named `<prefix>::<area>::<case>`, for a driver that runs the
/// suite against several deployments (a single node and a cluster) in one test binary.
pub fn trials_prefixed(harness: Arc<dyn Harness>, prefix: &str) -> Vec<Trial> {
    let named = |case: &Case| {
        if prefix.is_empty() {
            case.name.to_string()
        } else {
            format!("{prefix}::{}", case.name)
        }
    };
    let facts = runtime().and_then(|rt| {
        let h = harness.clone();
        let r = rt.block_on(async move {
            tokio::time::timeout(Duration::from_secs(60), gather_facts(&*h)).await
        });
        rt.shutdown_timeout(Duration::from_secs(2));
        match r {
            Ok(Ok(f)) => Ok(f),
            Ok(Err(e)) => Err(Failure(format!(
                "cannot create a client for the backend: {e}"
            ))),
            Err(_) => Err(Failure(
                "creating a client for the backend took over 60 s".into(),
            )),
        }
    });
    let soak = {
        let h = harness.clone();
        let label = if prefix.is_empty() { "default" } else { prefix }.to_string();
        Trial::test(named_soak(prefix), move || {
            let rt = runtime()?;
            let r = rt.block_on(crate::cases::safety::soak(&*h, &label));
            rt.shutdown_timeout(Duration::from_secs(2));
            r.map_err(|f| f.0.into())
        })
        .with_ignored_flag(true)
        .with_kind("soak")
    };
    CASES
        .iter()
        .map(|case| match &facts {
            Err(f) => {
                let msg = f.0.clone();
                Trial::test(named(case), move || Err(msg.into()))
            }
            Ok(facts) => match (case.requires)(facts) {
                Err(reason) => Trial::test(named(case), || Ok(()))
                    .with_ignored_flag(true)
                    .with_kind(format!("skipped: {reason}")),
                Ok(()) => {
                    let h = harness.clone();
                    Trial::test(named(case), move || {
                        run_case(&*h, case).map_err(|f| f.0.into())
                    })
                }
            },
        })
        .chain(std::iter::once(soak))
        .collect()
}

/// The soak's trial name: `safety::soak` under `prefix`.
fn named_soak(prefix: &str) -> String {
    if prefix.is_empty() {
        "safety::soak".into()
    } else {
        format!("{prefix}::safety::soak")
    }
}

/// Runs one case on a fresh runtime, with an overall time limit so a hang is a failure.
pub fn run_case(harness: &dyn Harness, case: &Case) -> Result<(), Failure> {
    run_case_on(runtime()?, harness, case)
}

/// [`run_case`] on a runtime of one thread, for a driver that lives in this process (the
/// negative controls' wrapper): its simulated server and its client then share the scheduler
/// with the nemesis's witness, as two processes share a machine. On two workers, a worker the
/// operating system descheduled holds the tasks queued on it, while the witness, on the other,
/// sees nothing late: the unbroken session-bound wrapper's lost signal came 22 ms after its
/// witness saw the cut (a clean run's lanes, 2026-11-30), an overlap the cut race's notice
/// could not excuse.
pub fn run_case_on_one_thread(harness: &dyn Harness, case: &Case) -> Result<(), Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("cannot start a tokio runtime: {e}")))?;
    run_case_on(rt, harness, case)
}

fn run_case_on(
    rt: tokio::runtime::Runtime,
    harness: &dyn Harness,
    case: &Case,
) -> Result<(), Failure> {
    let limit = harness.timing().ttl * 60 + Duration::from_secs(30);
    let result = rt.block_on(async { tokio::time::timeout(limit, (case.run)(harness)).await });
    // Background tasks of the drivers (watchdogs, connections) die with the runtime.
    rt.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(r) => r,
        Err(_) => Err(Failure(format!(
            "{} did not finish within {limit:?}",
            case.name
        ))),
    }
}
