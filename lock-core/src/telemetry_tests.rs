//! The telemetry's reports as a recorder sees them, where the handles are kept
//! (`handles.rs`) rather than registered at each report (lock names not labelled).

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use super::{AcquireReport, Acquired, LeaseReport};
use crate::convention::{label, metric};
use crate::LockName;

type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The value of `metric` in the series labelled with `want` (and the backend `kept-test`).
fn value<'s>(snap: &'s Snapshot, metric: &str, want: &[(&str, &str)]) -> Option<&'s DebugValue> {
    let of = |k: &metrics_util::CompositeKey| {
        let labels: Vec<(&str, &str)> = k.key().labels().map(|l| (l.key(), l.value())).collect();
        k.key().name() == metric
            && labels.contains(&(label::BACKEND, "kept-test"))
            && labels.len() == want.len() + 1
            && want.iter().all(|w| labels.contains(w))
    };
    snap.iter().find(|(k, ..)| of(k)).map(|(.., v)| v)
}

/// The reports take the handles of an acquisition's grant at its start and of a lease's
/// release at its grant (one look-up each): every other outcome and end still goes to
/// its own series, and the gauges go back down.
#[test]
fn kept_handles_serve_only_the_outcome_and_end_they_were_kept_for() {
    let name = LockName::new("kept-reports").unwrap_or_else(|e| panic!("{e}"));
    let opts = crate::LockOptions::new(std::time::Duration::from_secs(1));
    let recorder = DebuggingRecorder::new();
    let seen = recorder.snapshotter();
    let held = metrics::with_local_recorder(&recorder, || {
        for _ in 0..2 {
            AcquireReport::start("kept-test", &name, &opts, true).finish(Acquired::Granted(None));
        }
        AcquireReport::start("kept-test", &name, &opts, true).finish(Acquired::Timeout);
        AcquireReport::start("kept-test", &name, &opts, false).finish(Acquired::Busy);
        LeaseReport::granted("kept-test", &name).ended("released");
        LeaseReport::granted("kept-test", &name).ended("dropped");
        LeaseReport::granted("kept-test", &name)
    });
    let snap = seen.snapshot().into_vec();
    let (ex, wait, try_) = (
        (label::MODE, "exclusive"),
        (label::ATTEMPT, "wait"),
        (label::ATTEMPT, "try"),
    );
    let outcome = |o| (label::OUTCOME, o);
    let count = |want: &[(&str, &str)]| match value(&snap, metric::ACQUISITIONS, want) {
        Some(DebugValue::Counter(n)) => *n,
        _ => 0,
    };
    let times = |m, want: &[(&str, &str)]| match value(&snap, m, want) {
        Some(DebugValue::Histogram(v)) => v.len(),
        _ => 0,
    };
    let gauge = |m| match value(&snap, m, &[]) {
        Some(DebugValue::Gauge(g)) => g.into_inner(),
        other => panic!("{m}: {other:?}"),
    };
    assert_eq!(count(&[ex, wait, outcome("granted")]), 2, "waits granted");
    assert_eq!(count(&[ex, wait, outcome("timeout")]), 1, "waits timed out");
    assert_eq!(count(&[ex, try_, outcome("busy")]), 1, "tries busy");
    assert_eq!(count(&[ex, try_, outcome("granted")]), 0, "tries granted");
    let duration = metric::ACQUIRE_DURATION;
    assert_eq!(times(duration, &[ex, wait, outcome("granted")]), 2);
    assert_eq!(times(duration, &[ex, wait, outcome("timeout")]), 1);
    assert_eq!(times(duration, &[ex, try_, outcome("busy")]), 1);
    assert_eq!(
        gauge(metric::WAITING),
        0.0,
        "waiting after every acquisition ended"
    );
    let end = |e| [(label::END, e)];
    assert_eq!(
        times(metric::HOLD_DURATION, &end("released")),
        1,
        "holds released"
    );
    assert_eq!(
        times(metric::HOLD_DURATION, &end("dropped")),
        1,
        "holds dropped"
    );
    assert_eq!(
        gauge(metric::HELD),
        1.0,
        "held: one of three leases not ended"
    );
    drop(held);
}
