//! Metric handles kept per label set, for the telemetry (`telemetry.rs`): registering a metric
//! (building its key, allocating its labels, hashing them in the recorder) cost more than the
//! memory driver's whole acquire-and-release, also with no recorder installed; a kept handle
//! costs one lookup here and an atomic add.
//!
//! Kept per thread and per recorder: each handle is kept with the address of the recorder it
//! came from and used only while that one is installed, so the no-op handles taken before an
//! application installed its recorder are never used after. With the lock name as a label
//! (unbounded values), nothing is kept.
//!
//! Built without the `telemetry` feature, every handle is a no-op one, with no look-up.

use std::cell::RefCell;

use metrics::{Counter, Gauge, Histogram, Label};

use crate::convention::{label, lock_names_labelled, metric};
use crate::LockName;

/// One series: the addresses of the metric's name, its backend and its other label values in
/// their fixed order (0 where unused). Every one is a `&'static str` of this crate or a
/// driver's, so its address names it; the same text at two addresses only keeps two handles of
/// one series.
type Series = [usize; 6];

/// The handles of one kind this thread keeps, with the recorder each came from, searched
/// linearly: a process has a few dozen series, and comparing addresses costs less than hashing
/// them (SipHash of the texts cost more than the registration it saved).
type Kept<H> = RefCell<Vec<(usize, Series, H)>>;

/// How many handles of one kind a thread keeps before it starts again (a bound, never reached
/// by the backends and outcomes of one process).
const KEEP: usize = 256;

thread_local! {
    static COUNTERS: Kept<Counter> = const { RefCell::new(Vec::new()) };
    static HISTOGRAMS: Kept<Histogram> = const { RefCell::new(Vec::new()) };
    static OUTCOMES: Kept<(Counter, Histogram)> = const { RefCell::new(Vec::new()) };
    static STARTS: Kept<(Gauge, Counter, Histogram)> = const { RefCell::new(Vec::new()) };
    static GRANTS: Kept<(Gauge, Histogram)> = const { RefCell::new(Vec::new()) };
}

/// The address of the recorder metrics go to now (the no-op one when none is installed).
fn recorder() -> usize {
    metrics::with_recorder(|r| (r as *const dyn metrics::Recorder).cast::<()>() as usize)
}

/// The labels of a series of `name`: `lock.backend`, the lock name if labelled, then `more`.
fn labels(
    backend: &'static str,
    name: &LockName,
    more: &[(&'static str, &'static str)],
) -> Vec<Label> {
    let mut v = Vec::with_capacity(more.len() + 2);
    v.push(Label::from_static_parts(label::BACKEND, backend));
    if lock_names_labelled() {
        v.push(Label::new(label::NAME, name.as_str().to_owned()));
    }
    v.extend(more.iter().map(|(k, val)| Label::from_static_parts(k, val)));
    v
}

/// The handle of `metric` for `name` on `backend` with `more` labels: kept, or registered with
/// `register` (and kept unless the name is a label).
fn handle<H: Clone>(
    kept: &'static std::thread::LocalKey<Kept<H>>,
    metric: &'static str,
    backend: &'static str,
    name: &LockName,
    more: &[(&'static str, &'static str)],
    register: fn(&'static str, Vec<Label>) -> H,
) -> H {
    if lock_names_labelled() {
        return register(metric, labels(backend, name, more));
    }
    let mut series = [0; 6];
    series[0] = metric.as_ptr() as usize;
    series[1] = backend.as_ptr() as usize;
    for (slot, (_, v)) in series[2..].iter_mut().zip(more) {
        *slot = v.as_ptr() as usize;
    }
    let now = recorder();
    kept.with(|kept| {
        let mut kept = kept.borrow_mut();
        // Word by word, not `==` on the arrays (a `memcmp` call each).
        let same = |(r, s, _): &&(usize, Series, H)| {
            *r == now && s.iter().zip(&series).all(|(a, b)| a == b)
        };
        if let Some((_, _, h)) = kept.iter().find(same) {
            return h.clone();
        }
        if kept.len() >= KEEP {
            kept.clear();
        }
        let h = register(metric, labels(backend, name, more));
        kept.push((now, series, h.clone()));
        h
    })
}

/// The counter `metric` (see [`handle`]).
pub(crate) fn counter(
    metric: &'static str,
    backend: &'static str,
    name: &LockName,
    more: &[(&'static str, &'static str)],
) -> Counter {
    if !cfg!(feature = "telemetry") {
        return Counter::noop();
    }
    handle(&COUNTERS, metric, backend, name, more, |m, l| {
        metrics::counter!(m, l)
    })
}

/// The histogram `metric` (see [`handle`]).
pub(crate) fn histogram(
    metric: &'static str,
    backend: &'static str,
    name: &LockName,
    more: &[(&'static str, &'static str)],
) -> Histogram {
    if !cfg!(feature = "telemetry") {
        return Histogram::noop();
    }
    handle(&HISTOGRAMS, metric, backend, name, more, |m, l| {
        metrics::histogram!(m, l)
    })
}

/// The acquisitions counter and the acquisition-duration histogram of one outcome, which
/// share their labels: one look-up for the two (see [`handle`]).
pub(crate) fn outcome(
    backend: &'static str,
    name: &LockName,
    more: &[(&'static str, &'static str)],
) -> (Counter, Histogram) {
    if !cfg!(feature = "telemetry") {
        return (Counter::noop(), Histogram::noop());
    }
    handle(
        &OUTCOMES,
        metric::ACQUISITIONS,
        backend,
        name,
        more,
        |_, l| outcome_handles(l),
    )
}

/// Registers the acquisitions counter and the acquisition-duration histogram of `labels`.
fn outcome_handles(labels: Vec<Label>) -> (Counter, Histogram) {
    (
        metrics::counter!(metric::ACQUISITIONS, labels.clone()),
        metrics::histogram!(metric::ACQUIRE_DURATION, labels),
    )
}

/// What an acquisition starting now reports to, in one look-up: the waiting gauge and the
/// [`outcome`] handles of its grant (`granted`: the outcome in `more`), the one outcome most
/// acquisitions have, so that it needs no second look-up.
pub(crate) fn start(
    backend: &'static str,
    name: &LockName,
    granted: &[(&'static str, &'static str)],
) -> (Gauge, Counter, Histogram) {
    if !cfg!(feature = "telemetry") {
        return (Gauge::noop(), Counter::noop(), Histogram::noop());
    }
    handle(&STARTS, metric::WAITING, backend, name, granted, |m, l| {
        let waiting = metrics::gauge!(m, own(&l));
        let (count, duration) = outcome_handles(l);
        (waiting, count, duration)
    })
}

/// What a lease granted now reports to, in one look-up: the held gauge and the hold-time
/// histogram of its usual end (`released`: the end in `more`).
pub(crate) fn grant(
    backend: &'static str,
    name: &LockName,
    released: &[(&'static str, &'static str)],
) -> (Gauge, Histogram) {
    if !cfg!(feature = "telemetry") {
        return (Gauge::noop(), Histogram::noop());
    }
    handle(&GRANTS, metric::HELD, backend, name, released, |m, l| {
        (
            metrics::gauge!(m, own(&l)),
            metrics::histogram!(metric::HOLD_DURATION, l),
        )
    })
}

/// The labels of a lock's own series (its backend, and its name if labelled) among `all`.
fn own(all: &[Label]) -> Vec<Label> {
    (all.iter())
        .filter(|l| l.key() == label::BACKEND || l.key() == label::NAME)
        .cloned()
        .collect()
}

#[cfg(all(test, feature = "telemetry"))]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    /// The counter `lock.test` on `backend`'s series as `recorder` saw it.
    fn count(
        snapshot: Vec<(
            metrics_util::CompositeKey,
            Option<metrics::Unit>,
            Option<metrics::SharedString>,
            DebugValue,
        )>,
    ) -> u64 {
        snapshot
            .into_iter()
            .filter(|(k, ..)| k.key().name() == "lock.test")
            .map(|(.., v)| match v {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum()
    }

    #[test]
    fn kept_handles_follow_the_recorder_installed_now() {
        let name = LockName::new("kept").unwrap_or_else(|e| panic!("{e}"));
        // Kept while no recorder is installed: a no-op handle.
        counter("lock.test", "memory", &name, &[("lock.outcome", "granted")]).increment(1);
        let first = DebuggingRecorder::new();
        let seen = first.snapshotter();
        metrics::with_local_recorder(&first, || {
            for _ in 0..3 {
                counter("lock.test", "memory", &name, &[("lock.outcome", "granted")]).increment(1);
            }
            // Another label value is another series.
            counter("lock.test", "memory", &name, &[("lock.outcome", "busy")]).increment(10);
        });
        assert_eq!(
            count(seen.snapshot().into_vec()),
            13,
            "the no-op handle kept before was used"
        );
        let second = DebuggingRecorder::new();
        let seen = second.snapshotter();
        metrics::with_local_recorder(&second, || {
            counter("lock.test", "memory", &name, &[("lock.outcome", "granted")]).increment(2);
        });
        assert_eq!(
            count(seen.snapshot().into_vec()),
            2,
            "a handle of the first recorder was used"
        );
    }
}

/// Built without the `telemetry` feature (`cargo test -p lock-core --no-default-features --lib
/// telemetry_off`, a step of `scripts/test.sh`).
#[cfg(all(test, not(feature = "telemetry")))]
#[path = "handles_off_tests.rs"]
mod telemetry_off;
