//! The safety workload's own knobs do what they say, on the unbroken in-memory wrapper (TTL
//! 200 ms): `long_per_mille` makes holds of one TTL and more, `fault_kinds` limits the nemesis.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::collections::HashMap;
use std::time::Duration;

use conformance_tests::controls::{Flaw, FlawedHarness};
use conformance_tests::safety::{run, Op, Workload};
use conformance_tests::Harness;

/// With every hold long, each lease is held (grant to release or let-go) for at least the TTL,
/// and looked at every quarter TTL: four looks at least.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_holds_last_at_least_a_ttl() {
    let h = FlawedHarness::new(Flaw::None);
    let ttl = h.timing().ttl;
    let w = Workload {
        clients: 3,
        names: 2,
        grants: 12,
        limit: Duration::from_secs(30),
        faults: false,
        long_per_mille: 1000,
        ..Workload::short(11)
    };
    let report = run(&h, &w).await.expect("the run");
    report.verdict().expect("a clean history");
    let mut granted = HashMap::new();
    let mut held = Vec::new();
    let mut looks: HashMap<_, usize> = HashMap::new();
    for e in &report.events {
        match &e.op {
            Op::Looked { lease, .. } => *looks.entry(*lease).or_default() += 1,
            Op::Granted { lease, .. } => {
                granted.insert(*lease, e.at);
            }
            Op::Release { lease } | Op::LetGo { lease } => {
                if let Some(at) = granted.get(lease) {
                    held.push(e.at - *at);
                }
            }
            _ => {}
        }
    }
    assert!(
        held.len() >= 12,
        "only {} holds ended: {held:?}",
        held.len()
    );
    let short: Vec<_> = held.iter().filter(|d| **d < ttl).collect();
    assert!(
        short.is_empty(),
        "holds shorter than the TTL ({ttl:?}) with long_per_mille 1000: {short:?}"
    );
    let few: Vec<_> = (granted.keys())
        .map(|l| looks.get(l).copied().unwrap_or(0))
        .filter(|n| *n < 4)
        .collect();
    assert!(
        few.is_empty(),
        "leases looked at fewer than four times: {few:?}"
    );
}

/// With `fault_kinds` naming pauses only, the nemesis makes pauses and nothing else, though
/// the wrapper's clients have links it could break.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_kinds_limit_the_nemesis() {
    let h = FlawedHarness::new(Flaw::None);
    let w = Workload {
        grants: 100_000,
        limit: Duration::from_secs(8),
        fault_kinds: Some(&["pause"]),
        ..Workload::short(12)
    };
    let report = run(&h, &w).await.expect("the run");
    report.verdict().expect("a clean history");
    let others: Vec<_> = (report.faults.iter())
        .filter(|(k, n)| **k != "pause" && **n > 0)
        .collect();
    assert!(others.is_empty(), "faults of other kinds: {others:?}");
    let pauses = report.faults.get("pause").copied().unwrap_or(0);
    assert!(pauses >= 3, "only {pauses} pauses: {:?}", report.faults);
}

/// `fault_kinds` naming kinds the harness cannot make (partitions: the wrapper has no members
/// to cut off) fails the run before it starts, rather than running it without a fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_kinds_the_harness_cannot_make_fail_the_run() {
    let h = FlawedHarness::new(Flaw::None);
    for kinds in [&["partition", "bridge", "one-way"][..], &["partiton"][..]] {
        let w = Workload {
            limit: Duration::from_secs(8),
            fault_kinds: Some(kinds),
            ..Workload::short(13)
        };
        let started = std::time::Instant::now();
        match run(&h, &w).await {
            Ok(r) => panic!("a run limited to {kinds:?} ran, with faults {:?}", r.faults),
            Err(e) => assert!(
                e.to_string().contains(kinds[0]),
                "the error does not name {:?}: {e}",
                kinds[0]
            ),
        }
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "refusing {kinds:?} took {:?}: the run started",
            started.elapsed()
        );
    }
}

/// Each family takes the names in its modes: read-write names shared about 3 times in 5 and
/// else exclusive, never a permit; permits only permits; exclusive only exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_family_takes_the_names_in_its_modes() {
    use conformance_tests::safety::Family;
    let h = FlawedHarness::new(Flaw::None);
    for (name, want) in [
        ("read-write", [true, true, false]),
        ("permits", [false, false, true]),
        ("exclusive", [true, false, false]),
    ] {
        let w = Workload {
            clients: 4,
            names: 3,
            grants: 200,
            limit: Duration::from_secs(30),
            faults: false,
            family: Family::named(name).expect("a family"),
            ..Workload::short(12)
        };
        let report = run(&h, &w).await.expect("the run");
        report.verdict().expect("a clean history");
        let by = report.grants_by_mode();
        let got = by.map(|n| n > 0);
        assert_eq!(got, want, "{name}: grants exclusive/shared/permits {by:?}");
        if name == "read-write" {
            let share = by[1] as f64 / (by[0] + by[1]) as f64;
            assert!((0.45..0.75).contains(&share), "{name}: {by:?} shared");
        }
    }
}
