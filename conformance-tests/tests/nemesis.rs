//! The nemesis's two faults at once (`double`), on servers that only record what is done to
//! them (three members that can be partitioned, clock-stepped and restarted), under the
//! unbroken in-memory wrapper: the second fault is struck on another member while the first
//! is in force, and every fault is healed by the end of the run; the short run of the
//! conformance case makes none (its server faults come one at a time).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::controls::{Flaw, FlawedHarness};
use conformance_tests::safety::{run, Op, Workload};
use conformance_tests::{async_trait, BoxError, ClockStep, Harness, Partition, Servers, Timing};
use lock_core::DistributedLock;

/// What was done to a member: struck (`true`) or healed, and how.
#[derive(Clone, Debug)]
struct Done {
    member: usize,
    on: bool,
    what: String,
}

#[derive(Debug, Default)]
struct Recorder {
    done: Mutex<Vec<Done>>,
    /// `Some(d)`: the members serve their clients again only `d` after the last heal (a slow
    /// election); when they were first asked and said so.
    election: Option<Duration>,
    healed: Mutex<Option<Instant>>,
    first_serving: Mutex<Option<Instant>>,
}

impl Recorder {
    fn note(&self, member: usize, on: bool, what: &str) {
        let done = Done {
            member,
            on,
            what: what.to_string(),
        };
        self.done.lock().unwrap().push(done);
        if !on {
            *self.healed.lock().unwrap() = Some(Instant::now());
        }
    }
}

#[async_trait]
impl Servers for Recorder {
    fn members(&self) -> Vec<String> {
        vec!["m0".into(), "m1".into(), "m2".into()]
    }
    async fn freeze(&self, i: usize) -> Result<(), BoxError> {
        self.note(i, true, "freeze");
        Ok(())
    }
    async fn thaw(&self, i: usize) -> Result<(), BoxError> {
        self.note(i, false, "freeze");
        Ok(())
    }
    async fn restart(&self, members: &[usize]) -> Result<(), BoxError> {
        for i in members {
            self.note(*i, true, "restart");
            self.note(*i, false, "restart");
        }
        Ok(())
    }
    fn restart_keeps_locks(&self) -> bool {
        true
    }
    async fn leader(&self) -> Option<usize> {
        Some(1)
    }
    fn can_partition(&self) -> bool {
        true
    }
    async fn partition(&self, p: Partition, on: bool) -> Result<(), BoxError> {
        match p {
            Partition::Isolate(i) => self.note(i, on, "isolate"),
            Partition::Mute(i) => self.note(i, on, "mute"),
            other => return Err(format!("not a part of two at once: {other:?}").into()),
        }
        Ok(())
    }
    fn can_step_clock(&self) -> bool {
        true
    }
    async fn step_clock(&self, i: usize, step: ClockStep) -> Result<(), BoxError> {
        self.note(i, step != ClockStep::Ahead(Duration::ZERO), "clock");
        Ok(())
    }
    async fn serving(&self) -> bool {
        let healed = *self.healed.lock().unwrap();
        let serving = match (self.election, healed) {
            (Some(d), Some(h)) => h.elapsed() >= d,
            _ => true,
        };
        let mut first = self.first_serving.lock().unwrap();
        if serving && first.is_none() {
            *first = Some(Instant::now());
        }
        serving
    }
}

struct WithServers(FlawedHarness, Arc<Recorder>);

#[async_trait]
impl Harness for WithServers {
    async fn client(&self) -> Result<Arc<dyn DistributedLock>, BoxError> {
        self.0.client().await
    }
    fn timing(&self) -> Timing {
        self.0.timing()
    }
    fn servers(&self) -> Option<Arc<dyn Servers>> {
        Some(self.1.clone())
    }
}

/// Runs the short workload for `limit` with seed `seed` and only `kinds` (`None`: all), on the
/// recording servers; the history must be clean. Returns the faults per kind and what was
/// done to the servers.
async fn recorded(
    limit: Duration,
    seed: u64,
    kinds: Option<&'static [&'static str]>,
) -> (BTreeMap<&'static str, u64>, Vec<Done>) {
    let recorder = Arc::new(Recorder::default());
    let h = WithServers(FlawedHarness::new(Flaw::None), recorder.clone());
    let mut w = Workload::short(seed);
    (w.grants, w.limit, w.fault_kinds) = (100_000, limit, kinds);
    let report = run(&h, &w).await.expect("the run");
    report.verdict().expect("a clean history");
    let done = recorder.done.lock().unwrap().clone();
    (report.faults, done)
}

/// Servers that serve their clients again only 2 s after the last heal (an election): the
/// history records when they first did, and the run goes on long enough after that for
/// liveness to be judged from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_says_when_the_servers_serve_again_after_the_last_heal() {
    let election = Duration::from_secs(2);
    let recorder = Arc::new(Recorder {
        election: Some(election),
        ..Recorder::default()
    });
    let h = WithServers(FlawedHarness::new(Flaw::None), recorder.clone());
    let mut w = Workload::short(16);
    (w.grants, w.limit) = (100_000, Duration::from_secs(8));
    let report = run(&h, &w).await.expect("the run");
    report.verdict().expect("a clean history");
    let healed = (report.events.iter())
        .filter(|e| matches!(e.op, Op::Heal { .. }))
        .map(|e| e.at)
        .max()
        .expect("the run healed a fault");
    let serving: Vec<_> = (report.events.iter())
        .filter(|e| e.op == Op::Serving)
        .map(|e| e.at)
        .collect();
    let first = recorder
        .first_serving
        .lock()
        .unwrap()
        .expect("asked until serving");
    assert_eq!(serving.len(), 1, "one Serving event: {serving:?}");
    assert!(
        serving[0] >= first && serving[0] >= healed + election,
        "Serving recorded {:?} after the last heal, before the servers said so ({:?} after it)",
        serving[0] - healed,
        first - healed
    );
    let after = report
        .serving_after_last_heal()
        .expect("the report's figure");
    assert!(after >= election && after < election * 2, "{after:?}");
    assert!(
        report.summary().contains("servers serving again Some("),
        "{}",
        report.summary()
    );
    // (d) is judged only when the run lasts the bound past its start: it must.
    let t = h.timing();
    let end = report.events.iter().map(|e| e.at).max().unwrap();
    assert!(
        end >= serving[0] + (t.ttl + t.slack) * 4,
        "the run ended {:?} after the servers served again: (d) was not judged",
        end - serving[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_faults_at_once_overlap_on_two_members_and_are_all_healed() {
    let (faults, done) = recorded(Duration::from_secs(10), 14, Some(&["double"])).await;
    let doubles = faults.get("double").copied().unwrap_or(0);
    assert!(doubles >= 3, "only {doubles} doubles: {faults:?}");
    let parts: u64 = (faults.iter())
        .filter(|(k, _)| **k != "double")
        .map(|(_, n)| *n)
        .sum();
    assert_eq!(
        parts,
        doubles * 2,
        "each double counts two parts: {faults:?}"
    );
    assert_eq!(
        most_at_once(&done, doubles),
        doubles,
        "of {doubles} doubles, not all had two members struck at once: {done:#?}"
    );
}

/// The short run of the conformance case makes its server faults one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_short_run_makes_server_faults_one_at_a_time() {
    let (faults, done) = recorded(Duration::from_secs(8), 15, None).await;
    assert_eq!(faults.get("double"), Some(&0), "{faults:?}");
    assert!(!done.is_empty(), "no server fault in the short run");
    most_at_once(&done, 0);
}

/// Replays `done`: every fault healed, never one member struck twice, never three at once;
/// returns how often two were struck at once (`doubles` at most, for the message).
fn most_at_once(done: &[Done], doubles: u64) -> u64 {
    let mut struck: Vec<(usize, String)> = Vec::new();
    let mut two_at_once = 0;
    for d in done {
        if d.on {
            assert!(
                !struck.iter().any(|(m, _)| *m == d.member),
                "member {} struck ({}) while already struck: {struck:?}",
                d.member,
                d.what
            );
            struck.push((d.member, d.what.clone()));
            if struck.len() == 2 {
                two_at_once += 1;
            }
            assert!(struck.len() <= 2, "three faults at once: {struck:?}");
        } else {
            let k = (struck
                .iter()
                .position(|(m, w)| *m == d.member && *w == d.what))
            .unwrap_or_else(|| panic!("healed {d:?}, which was not struck: {struck:?}"));
            struck.remove(k);
        }
    }
    assert!(
        struck.is_empty(),
        "faults left in force after the run: {struck:?}"
    );
    assert!(
        two_at_once <= doubles,
        "{two_at_once} times two members struck at once, with {doubles} doubles"
    );
    two_at_once
}
