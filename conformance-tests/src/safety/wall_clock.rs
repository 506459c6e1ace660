//! The machine's wall clock watched against its monotonic clock during a run: servers that
//! expire keys by the wall clock (Redis, so Redlock) drop them early when it steps forward,
//! which no driver can see and the history (on the monotonic clock) cannot show. A run's
//! report names every step, so that an overlap beside one is explained by its evidence.
//!
//! Each reading brackets the wall clock between two monotonic readings at most
//! [`BRACKET`] apart, and is skipped otherwise: a thread descheduled between two reads would
//! look like a step of the time it lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A step of the wall clock against the monotonic one, seen during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockStep {
    /// When it was seen (between the reading before and the reading that saw it).
    pub at: Instant,
    /// How far the wall clock moved against the monotonic one, in ns: positive forward.
    pub by_ns: i64,
}

/// The widest bracket a reading is taken from.
pub(crate) const BRACKET: Duration = Duration::from_micros(200);
/// The smallest step reported: well over the two clocks' drift between readings (5 ms apart)
/// and a bracket's width.
pub(crate) const STEP: Duration = Duration::from_millis(1);
/// How often the clocks are read.
const EVERY: Duration = Duration::from_millis(5);

/// One reading: the monotonic clock before and after the wall clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reading {
    pub(crate) before: Instant,
    pub(crate) wall: SystemTime,
    pub(crate) after: Instant,
}

impl Reading {
    fn now() -> Self {
        let before = Instant::now();
        let wall = SystemTime::now();
        Reading {
            before,
            wall,
            after: Instant::now(),
        }
    }
}

/// The steps in a series of readings.
pub(crate) struct Steps {
    base: Instant,
    /// The last bracketed reading's wall clock minus monotonic clock, in ns.
    last: Option<i128>,
    pub(crate) seen: Vec<ClockStep>,
}

impl Steps {
    pub(crate) fn new(base: Instant) -> Self {
        Steps {
            base,
            last: None,
            seen: Vec::new(),
        }
    }

    /// Takes `r` if its bracket is narrow enough, and notes a step from the last one taken.
    pub(crate) fn push(&mut self, r: Reading) {
        let width = r.after.saturating_duration_since(r.before);
        if width > BRACKET {
            return;
        }
        let mid = r.before + width / 2;
        let mono = mid.saturating_duration_since(self.base).as_nanos() as i128;
        let wall = match r.wall.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i128,
            Err(e) => -(e.duration().as_nanos() as i128),
        };
        let offset = wall - mono;
        if let Some(last) = self.last {
            let by = offset - last;
            if by.unsigned_abs() > STEP.as_nanos() {
                let by_ns = i64::try_from(by).unwrap_or(if by > 0 { i64::MAX } else { i64::MIN });
                self.seen.push(ClockStep { at: mid, by_ns });
            }
        }
        self.last = Some(offset);
    }
}

/// Reads the clocks on a thread of its own until stopped.
pub(crate) struct WallClockWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<ClockStep>>>,
}

impl WallClockWatch {
    pub(crate) fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wall-clock-watch".into())
            .spawn(move || {
                let mut steps = Steps::new(Instant::now());
                while !flag.load(Ordering::Relaxed) {
                    steps.push(Reading::now());
                    std::thread::sleep(EVERY);
                }
                steps.seen
            })
            .ok();
        WallClockWatch { stop, thread }
    }

    /// The steps seen since the start (none if its thread could not be started).
    pub(crate) fn stop(mut self) -> Vec<ClockStep> {
        self.stop.store(true, Ordering::Relaxed);
        (self.thread.take())
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for WallClockWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readings `ms` apart on both clocks, the wall clock moved by `jump_ms` at reading
    /// `at`, each bracket `width_us` wide.
    fn series(n: u64, at: u64, jump_ms: i64, width_us: u64) -> Vec<ClockStep> {
        let base = Instant::now();
        let wall0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut steps = Steps::new(base);
        for i in 0..n {
            let before = base + Duration::from_millis(5 * i);
            let after = before + Duration::from_micros(width_us);
            let mid = before + Duration::from_micros(width_us / 2);
            let mut wall = wall0 + (mid - base);
            if i >= at {
                wall = match jump_ms {
                    j if j >= 0 => wall + Duration::from_millis(j as u64),
                    j => wall - Duration::from_millis(j.unsigned_abs()),
                };
            }
            steps.push(Reading {
                before,
                wall,
                after,
            });
        }
        steps.seen
    }

    #[test]
    fn a_step_either_way_is_seen_once_where_it_happened() {
        for jump in [250, -250, 2] {
            let seen = series(100, 40, jump, 10);
            assert_eq!(seen.len(), 1, "{jump} ms: {seen:?}");
            assert_eq!(seen[0].by_ns, jump * 1_000_000);
        }
    }

    #[test]
    fn steady_clocks_and_small_moves_are_no_step() {
        assert!(series(100, 40, 0, 10).is_empty());
        // Under the threshold: drift, not a step.
        assert!(series(100, 40, 1, 10).is_empty());
    }

    #[test]
    fn a_wide_bracket_is_not_taken_for_a_step() {
        // Every reading too wide: nothing is judged, whatever the wall clock did.
        assert!(series(100, 40, 250, 300).is_empty());
    }

    #[test]
    fn the_watch_runs_and_stops() {
        let w = WallClockWatch::start();
        std::thread::sleep(Duration::from_millis(30));
        // This machine's clocks are not stepped by the test; only that it stops is asserted.
        let _ = w.stop();
    }
}
