//! The one back-off of every driver: how long to pause before the next attempt.
//!
//! Exponential, capped, and jittered so that clients that failed together do not retry
//! together: each pause lies between half and all of its step, and the step doubles from
//! `first` to `most`. The schedule is `backon`'s; the numbers are this file's.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Pauses between attempts: steps that double from `first` to `most`, each pause a random
/// point in the second half of its step.
///
/// [`Backoff::transient`] is the schedule for a request that failed in a way that may pass
/// (a dropped connection, a timeout): every driver retries those on it.
///
/// ```
/// use std::time::Duration;
/// use lock_core::driver::Backoff;
///
/// let mut pauses = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
/// let steps = [100, 200, 400, 400];
/// for step in steps.map(Duration::from_millis) {
///     let pause = pauses.pause();
///     assert!(pause >= step / 2 && pause <= step, "{pause:?} outside {step:?}'s half");
/// }
/// ```
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    most: Duration,
    steps: backon::ExponentialBackoff,
}

impl Backoff {
    /// The schedule for transient failures: 50 ms doubling to 1 s.
    pub const TRANSIENT: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

    /// Steps doubling from `first` to `most` (`most` is raised to `first` if below it).
    pub fn new(first: Duration, most: Duration) -> Self {
        let most = most.max(first);
        Self {
            first,
            most,
            steps: Self::build(first, most),
        }
    }

    /// [`Backoff::TRANSIENT`]: for a request that failed in a way that may pass.
    pub fn transient() -> Self {
        Self::new(Self::TRANSIENT.0, Self::TRANSIENT.1)
    }

    fn build(first: Duration, most: Duration) -> backon::ExponentialBackoff {
        // backon adds a random part of the step to the step: from half-steps, that is a point
        // in the second half of each step.
        ExponentialBuilder::default()
            .with_min_delay(first / 2)
            .with_max_delay(most / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// The next pause; the step after it doubles, up to `most`.
    pub fn pause(&mut self) -> Duration {
        // Without a limit on attempts the schedule never ends; `most` stands in should it.
        self.steps.next().unwrap_or(self.most).min(self.most)
    }

    /// Back to the first step (after a success: the next failure starts small again).
    pub fn reset(&mut self) {
        self.steps = Self::build(self.first, self.most);
    }
}

/// A uniformly random duration in `0..below` (zero for a zero bound): for a protocol that
/// prescribes a random delay rather than a back-off, such as Redlock's retry after a split vote.
///
/// ```
/// use std::time::Duration;
/// let d = lock_core::driver::random_below(Duration::from_millis(200));
/// assert!(d < Duration::from_millis(200));
/// ```
pub fn random_below(below: Duration) -> Duration {
    let nanos = u64::try_from(below.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(fastrand::u64(0..nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_stay_in_the_second_half_of_doubling_steps_and_reset() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(20), ms(100));
        for _ in 0..3 {
            for step in [20, 40, 80, 100, 100, 100].map(ms) {
                let p = b.pause();
                assert!(p >= step / 2 && p <= step, "{p:?} for step {step:?}");
            }
            b.reset();
        }
    }

    #[test]
    fn pauses_are_not_all_alike() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1));
        let pauses: std::collections::HashSet<_> = (0..20).map(|_| b.pause()).collect();
        assert!(pauses.len() > 10, "jitter: {pauses:?}");
    }

    #[test]
    fn random_below_stays_below_and_spreads() {
        let bound = Duration::from_millis(10);
        let seen: std::collections::HashSet<_> = (0..50).map(|_| random_below(bound)).collect();
        assert!(seen.iter().all(|d| *d < bound));
        assert!(seen.len() > 25);
        assert_eq!(random_below(Duration::ZERO), Duration::ZERO);
    }
}
