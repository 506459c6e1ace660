//! The suite must catch every deliberately broken driver, and pass the same wrapper unbroken:
//! one trial per [`Flaw`] in `Flaw::ALL` (so a new flaw is tested without a line here), plus the
//! unbroken wrapper.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::ExitCode;

use conformance_tests::controls::{Flaw, FlawedHarness};
use conformance_tests::safety::{self, Family, Kind, Workload};
use conformance_tests::{run_case, run_case_on_one_thread, CASES};
use libtest_mimic::{Failed, Trial};
use std::time::Duration;

fn case(name: &str) -> Result<&'static conformance_tests::Case, Failed> {
    CASES
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("Flaw::caught_by names an unknown case {name}").into())
}

/// The cases a lock that outlives its connection cannot pass (and the ones below, that a lock
/// that is its connection's session cannot): each wrapper runs every case but its own
/// contradiction.
const SESSION_CASES: &[&str] = &[
    "faults::dropped_connection_is_lost_at_once",
    "telemetry::a_cut_session_is_reported_lost_as_connection_closed",
];
/// The cases that need a lease to survive a dropped connection (`outlives_connection`).
const RECONNECT_CASES: &[&str] = &[
    "faults::dropped_connection_is_survived_by_an_auto_renewed_lease",
    "faults::lost_fires_after_a_reconnect",
];
/// The history check under faults: its controls are the `checker::` trials below.
const SAFETY_CASE: &str = "safety::history_is_clean";

/// The controls of the history checker: each flaw, run under the nemesis, must be reported as
/// this kind of violation. A flaw that only the safety case names is tested here alone (one
/// short run could miss it: the nemesis is random). A flaw that only one kind of fault shows
/// is run under that kind alone: among every kind, the three cuts or so of a run missed
/// `SessionLostByPolling` on all three seeds in 1 of 5 trials here (2026-11-28).
const CHECKER: &[(Flaw, Kind, Option<&[&str]>, Family)] = &[
    (
        Flaw::NoMutualExclusion,
        Kind::Overlap,
        None,
        Family::Exclusive,
    ),
    (Flaw::EarlyExpiry, Kind::Overlap, None, Family::Exclusive),
    (
        Flaw::LostSignalNeverFires,
        Kind::LossNotSeen,
        None,
        Family::Exclusive,
    ),
    (
        Flaw::NonMonotonicFencing,
        Kind::Fencing,
        None,
        Family::Exclusive,
    ),
    (
        Flaw::RenewResurrects,
        Kind::Overlap,
        None,
        Family::Exclusive,
    ),
    // A session-bound lock whose lease notices a cut only by polling: the cut race excused
    // nothing wider than what was measured.
    (
        Flaw::SessionLostByPolling,
        Kind::Overlap,
        Some(&["cut"]),
        Family::Exclusive,
    ),
    // Two uncut waiters granted together right after a cut: the excuse of the cut holder's
    // race must not hide them.
    (
        Flaw::CutGrantsTwoWaiters,
        Kind::Overlap,
        Some(&["cut"]),
        Family::Exclusive,
    ),
    // An acquisition that never returns on one client: (d) judges every acquisition.
    (
        Flaw::DeadlineHangsOnOneClient,
        Kind::Liveness,
        None,
        Family::Exclusive,
    ),
    // A client that never reconnects while the others are granted: (d) judges every client.
    (
        Flaw::NeverReconnects,
        Kind::Liveness,
        None,
        Family::Exclusive,
    ),
    // A semaphore of 2 whose waiters are granted at once after any cut, however many hold:
    // the cut holder's race must not excuse the K + 1st holder.
    (
        Flaw::CutGrantsPermitBeyondK,
        Kind::Overlap,
        Some(&["cut"]),
        Family::Permits(2),
    ),
    // An observer that never sees a leadership end: (e) judges what observers show once
    // every lease has ended.
    (
        Flaw::LeaderNeverGone,
        Kind::Observer,
        None,
        Family::Exclusive,
    ),
];

fn unbroken_wrapper_passes_every_case() -> Result<(), Failed> {
    // A renamed case must not silently widen what the wrappers skip.
    for c in SESSION_CASES.iter().chain(RECONNECT_CASES) {
        case(c)?;
    }
    let h = FlawedHarness::new(Flaw::None);
    let mut failures: Vec<String> = CASES
        .iter()
        .filter(|c| !SESSION_CASES.contains(&c.name))
        .filter_map(|c| run_case(&h, c).err().map(|f| format!("{}: {f}", c.name)))
        .collect();
    // The same wrapper with session-bound locks (PostgreSQL's kind), on the fault cases and
    // the safety run: the checker's cut-race rule must pass a driver that keeps the promise.
    let session = FlawedHarness::session_bound(Flaw::None);
    failures.extend(
        CASES
            .iter()
            .filter(|c| {
                (c.name.starts_with("faults::") && !RECONNECT_CASES.contains(&c.name))
                    || SESSION_CASES.contains(&c.name)
                    || c.name == SAFETY_CASE
            })
            .filter_map(|c| {
                // The safety run's cut races are judged against a witness of the same
                // scheduler (`run_case_on_one_thread`).
                let run = if c.name == SAFETY_CASE {
                    run_case_on_one_thread(&session, c)
                } else {
                    run_case(&session, c)
                };
                run.err()
                    .map(|f| format!("{} (session-bound): {f}", c.name))
            }),
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("the unbroken wrapper failed:\n{}", failures.join("\n")).into())
    }
}

/// The cases no flaw names, and why none needs to. A new case gets a control or a line here;
/// a case that gains a control must leave this list: the trial checks both ways.
const WITHOUT_A_CONTROL: &[(&str, &str)] = &[(
    "input::rejects_bad_names",
    "`LockName::new` rejects the names before any driver sees them",
)];

/// Every case is named by some flaw's `caught_by`, or listed in `WITHOUT_A_CONTROL` with why.
fn every_case_has_a_control() -> Result<(), Failed> {
    let named: std::collections::HashSet<&str> =
        Flaw::ALL.iter().flat_map(|f| f.caught_by()).collect();
    let exempt: Vec<&str> = WITHOUT_A_CONTROL.iter().map(|(n, _)| *n).collect();
    let mut wrong = Vec::new();
    for c in CASES {
        match (named.contains(c.name), exempt.contains(&c.name)) {
            (false, false) => wrong.push(format!("{}: no flaw names it", c.name)),
            (true, true) => wrong.push(format!(
                "{}: a flaw names it, yet it is listed as without a control",
                c.name
            )),
            _ => {}
        }
    }
    for n in exempt
        .iter()
        .filter(|n| CASES.iter().all(|c| c.name != **n))
    {
        wrong.push(format!(
            "{n}: listed as without a control, but no such case"
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("\n").into())
    }
}

/// Every flaw that names the safety case is a `checker::` control, with the kind it must show.
fn safety_case_controls_are_checker_trials() -> Result<(), Failed> {
    let missing: Vec<String> = (Flaw::ALL.iter())
        .filter(|f| f.caught_by().contains(&SAFETY_CASE))
        .filter(|f| CHECKER.iter().all(|(c, _, _, _)| c != *f))
        .map(|f| format!("{f:?}"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(
            format!("these flaws name {SAFETY_CASE} but have no checker:: trial: {missing:?}")
                .into(),
        )
    }
}

/// At least one of the cases `flaw` names must fail (the safety case is left to the
/// `checker::` trials).
fn caught(flaw: Flaw) -> Result<(), Failed> {
    let h = FlawedHarness::new(flaw);
    let names: Vec<&str> = (flaw.caught_by().into_iter())
        .filter(|n| *n != SAFETY_CASE)
        .collect();
    if names.is_empty() {
        return Err(format!("{flaw:?} names no case but the safety case").into());
    }
    let mut caught = Vec::new();
    for n in &names {
        if let Err(f) = run_case(&h, case(n)?) {
            caught.push(format!("{n}: {f}"));
        }
    }
    if caught.is_empty() {
        return Err(format!("{flaw:?} passed every case meant to catch it: {names:?}").into());
    }
    eprintln!("{flaw:?} caught by:\n  {}", caught.join("\n  "));
    Ok(())
}

/// The history checker reports `flaw` as a violation of the right kind, under the nemesis.
///
/// The nemesis is random: a run whose faults happen to miss the moments where a flaw shows
/// (a holder cut off early in its lease, with waiters) reports nothing: `EarlyExpiry` was
/// missed once in about ten single-seed runs here, and `SessionLostByPolling` (on one thread)
/// showed on the third seed only in one of two runs on 2026-11-30. So up to five seeds are
/// tried, the first that shows the flaw ends the trial, and five misses in a row fail it.
fn checker_reports(
    flaw: Flaw,
    kind: Kind,
    fault_kinds: Option<&'static [&'static str]>,
    family: Family,
) -> Result<(), Failed> {
    // On one thread, as the unbroken wrapper's safety run: a flaw must show on the scheduler
    // the excuse is judged on, not by the noise of another.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut misses = Vec::new();
    for seed in [7, 8, 9, 10, 11] {
        let h = FlawedHarness::new(flaw);
        // One name, held most of the time (holds longer than the TTL), so that every fault
        // lands on a holder with others waiting.
        let w = Workload {
            clients: 4,
            names: 1,
            grants: 300,
            limit: Duration::from_secs(20),
            hold: Duration::from_millis(400),
            fault_kinds,
            family,
            ..Workload::short(seed)
        };
        let report = rt.block_on(safety::run(&h, &w))?;
        let kinds: Vec<Kind> = report.violations.iter().map(|v| v.kind).collect();
        if kinds.contains(&kind) {
            eprintln!("{flaw:?} (seed {seed}): {}", report.violations[0]);
            return Ok(());
        }
        misses.push(format!(
            "seed {seed}: {} grants, faults {:?}, found {kinds:?}",
            report.grants, report.faults
        ));
    }
    Err(format!(
        "{flaw:?}: the checker did not report {kind:?} in five runs: {}",
        misses.join("; ")
    )
    .into())
}

fn main() -> ExitCode {
    let mut trials = vec![
        Trial::test(
            "unbroken_wrapper_passes_every_case",
            unbroken_wrapper_passes_every_case,
        ),
        Trial::test("every_case_has_a_control", every_case_has_a_control),
        Trial::test(
            "safety_case_controls_are_checker_trials",
            safety_case_controls_are_checker_trials,
        ),
    ];
    trials.extend(
        (Flaw::ALL.iter())
            .filter(|f| **f != Flaw::None && f.caught_by() != [SAFETY_CASE])
            .map(|&flaw| Trial::test(format!("catches::{flaw:?}"), move || caught(flaw))),
    );
    for &(flaw, kind, faults, family) in CHECKER {
        trials.push(Trial::test(format!("checker::{flaw:?}"), move || {
            checker_reports(flaw, kind, faults, family)
        }));
    }
    // One control at a time: the cases' timing margins (slack 150 ms on a 200 ms TTL) assume
    // the runtime is not starved; sixteen controls at once on a two-core machine made a
    // correct wrapper's wait end 200 ms late.
    conformance_tests::run_trials(trials)
}
