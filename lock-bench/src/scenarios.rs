//! The scenarios: each runs one subject and returns a [`Sample`] of latency quantiles and
//! throughput.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::subject::Subject;

pub(crate) fn micros(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

#[allow(clippy::expect_used)] // constant bounds, checked once by any run
pub(crate) fn new_hist() -> Histogram<u64> {
    // 1 ns .. 60 s at 3 significant digits; larger values are clamped by `saturating_record`.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) static NAME_SEQ: AtomicU64 = AtomicU64::new(0);

/// A lock name no other run used.
pub(crate) fn fresh(tag: &str) -> String {
    let n = NAME_SEQ.fetch_add(1, Ordering::Relaxed);
    format!("bench-{}-{tag}-{n}", std::process::id())
}

pub(crate) struct Sample {
    pub(crate) p50_us: Option<f64>,
    pub(crate) p99_us: Option<f64>,
    pub(crate) ops_per_sec: f64,
    pub(crate) ops: u64,
    pub(crate) requests_per_op: Option<f64>,
    /// Operations that ended in an error, not counted in `ops` (throughput only).
    pub(crate) errors: u64,
}

impl Sample {
    /// The quantiles of the hand-off latencies in `h`, recorded since `start`.
    fn of_hand_offs(h: &Histogram<u64>, start: Instant) -> Sample {
        Sample {
            p50_us: Some(micros(h, 0.5)),
            p99_us: Some(micros(h, 0.99)),
            ops_per_sec: h.len() as f64 / start.elapsed().as_secs_f64(),
            ops: h.len(),
            requests_per_op: None,
            errors: 0,
        }
    }
}

/// What the one-task loop times: the whole acquire + release cycle, or only the acquire (the
/// latency a caller waits for a free lock; the release still runs, untimed, so every acquire
/// finds the lock free).
#[derive(Clone, Copy)]
pub(crate) enum Timed {
    Cycle,
    Acquire,
}

pub(crate) async fn uncontended(
    s: &dyn Subject,
    iterations: u64,
    timed: Timed,
) -> Result<Sample, String> {
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
        errors: 0,
    })
}

pub(crate) async fn throughput(
    s: Arc<dyn Subject>,
    tasks: usize,
    duration: Duration,
) -> Result<Sample, String> {
    let (count, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let start = Instant::now();
    let deadline = start + duration;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (s, count, errors, first_error) = (
            s.clone(),
            count.clone(),
            errors.clone(),
            first_error.clone(),
        );
        let name = fresh("thr");
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                match s.cycle(&name).await {
                    Ok(()) => count.fetch_add(1, Ordering::Relaxed),
                    // Counted, not fatal: under many tasks a quorum driver's release can fall
                    // short of a majority now and then, which says nothing about its speed.
                    Err(e) => {
                        first_error
                            .lock()
                            .map_err(|e| e.to_string())?
                            .get_or_insert(e);
                        errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            Ok::<_, String>(())
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    let (ops, errors) = (
        count.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    // More than one cycle in a hundred failing is a broken run, not a figure.
    if errors * 100 > ops + errors {
        let first = first_error.lock().map_err(|e| e.to_string())?.take();
        return Err(format!(
            "{}: {errors} of {} cycles failed; the first: {}",
            s.label(),
            ops + errors,
            first.unwrap_or_default()
        ));
    }
    Ok(Sample {
        p50_us: None,
        p99_us: None,
        ops_per_sec: ops as f64 / start.elapsed().as_secs_f64(),
        ops,
        requests_per_op: None,
        errors,
    })
}

/// A true hand-off: after releasing, a task waits until some *other* task was granted before it
/// contends again, so every measured grant goes to a waiter (a releaser that re-grabs its own
/// lock would flatter clients that poll).
pub(crate) async fn handoff(
    s: Arc<dyn Subject>,
    waiters: usize,
    handoffs: u64,
) -> Result<Sample, String> {
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
    Ok(Sample::of_hand_offs(&h, start))
}

/// Another client (`holder`) holds the lock; `waiter` waits for it; the holder releases at a
/// random moment of 0–100 ms after the waiter started waiting (so that a waiter that polls is
/// caught at every phase of its cycle). Latency from the holder starting its release to the
/// waiter's acquire returning; `n` hand-offs.
pub(crate) async fn foreign_handoff(
    holder: Arc<dyn Subject>,
    waiter: Arc<dyn Subject>,
    n: u64,
) -> Result<Sample, String> {
    let name = fresh("foreign-hand");
    let mut hist = new_hist();
    let start = Instant::now();
    for i in 0..n {
        let held = holder.lock(&name).await?;
        let (w, nm) = (waiter.clone(), name.clone());
        let waiting = tokio::spawn(async move {
            let g = w.lock(&nm).await;
            (Instant::now(), g)
        });
        // A settle time, then a pseudo-random phase (no rand crate needed for a spread).
        let phase = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 100;
        tokio::time::sleep(Duration::from_millis(20 + phase)).await;
        let released = Instant::now();
        held.unlock().await?;
        let (granted, guard) = waiting.await.map_err(|e| e.to_string())?;
        hist.saturating_record(ns(granted.saturating_duration_since(released)));
        guard?.unlock().await?;
    }
    Ok(Sample::of_hand_offs(&hist, start))
}

/// A pending read of the server's request counter.
pub(crate) type CountFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<u64>> + Send>>;

/// Server requests per second that one waiting `lock` call causes: the rate while a holder
/// holds and a waiter waits, minus the rate while the holder holds alone (heartbeats, renewals).
/// A waiter woken by notification adds ~0; a poller adds its polling rate.
pub(crate) async fn idle(
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
        errors: 0,
    })
}

pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Median of each figure over several runs.
pub(crate) fn summarize(samples: Vec<Sample>) -> Sample {
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
        errors: samples.iter().map(|s| s.errors).sum(),
    }
}
