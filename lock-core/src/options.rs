//! How to acquire: TTL, waiting, renewal.

use std::time::{Duration, Instant};

use crate::{Capabilities, Error, LeaderValue, Mode, Result, MAX_TTL};

/// How long [`DistributedLock::acquire`](crate::DistributedLock::acquire) waits for a busy lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Wait {
    /// One attempt; a busy lock gives [`Error::Timeout`] at once.
    No,
    /// Wait at most this long, then [`Error::Timeout`].
    For(Duration),
    /// Wait until granted (or the future is dropped).
    Forever,
}

impl Wait {
    /// The instant the wait ends, counted from `start`; `None` means never (also when the
    /// duration is too large to represent).
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use lock_core::Wait;
    /// let now = Instant::now();
    /// assert_eq!(Wait::No.deadline(now), Some(now));
    /// assert_eq!(Wait::Forever.deadline(now), None);
    /// assert_eq!(Wait::For(Duration::MAX).deadline(now), None);
    /// ```
    pub fn deadline(self, start: Instant) -> Option<Instant> {
        match self {
            Wait::No => Some(start),
            Wait::For(d) => start.checked_add(d),
            Wait::Forever => None,
        }
    }
}

/// How long one acquisition may wait: what [`DistributedLock::acquire_until`] receives.
///
/// [`DistributedLock::acquire_until`]: crate::DistributedLock::acquire_until
///
/// ```
/// use std::time::{Duration, Instant};
/// use lock_core::{Deadline, Wait};
/// let now = Instant::now();
/// assert_eq!(Deadline::from_wait(Wait::No, now), Deadline::Now);
/// assert_eq!(Deadline::from_wait(Wait::Forever, now), Deadline::Never);
/// let d = Deadline::from_wait(Wait::For(Duration::from_secs(1)), now);
/// assert_eq!(d.at(), Some(now + Duration::from_secs(1)));
/// assert!(!d.passed() && Deadline::Now.passed());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Deadline {
    /// One attempt: if the lock is busy, give up at once and leave nothing behind (no queue
    /// entry on FIFO backends).
    Now,
    /// Wait, in the queue where the backend has one, until this instant. An instant that has
    /// already passed still gets one attempt.
    At(Instant),
    /// Wait as long as it takes.
    Never,
}

impl Deadline {
    /// The deadline of a call that started at `start` and may wait as `wait` says.
    pub fn from_wait(wait: Wait, start: Instant) -> Self {
        match wait {
            Wait::No => Deadline::Now,
            Wait::For(d) => start.checked_add(d).map_or(Deadline::Never, Deadline::At),
            Wait::Forever => Deadline::Never,
        }
    }

    /// The instant to give up at; `None` for [`Now`](Self::Now) (no waiting at all) and
    /// [`Never`](Self::Never).
    pub fn at(self) -> Option<Instant> {
        match self {
            Deadline::At(t) => Some(t),
            Deadline::Now | Deadline::Never => None,
        }
    }

    /// Whether the caller must not wait (any more): [`Now`](Self::Now), or an instant that has
    /// passed.
    pub fn passed(self) -> bool {
        match self {
            Deadline::Now => true,
            Deadline::At(t) => Instant::now() >= t,
            Deadline::Never => false,
        }
    }

    /// Sleeps until the deadline; never returns for [`Never`](Self::Never), at once for
    /// [`Now`](Self::Now). For `tokio::select!` against the backend's notification.
    pub async fn sleep(self) {
        match self {
            Deadline::Now => {}
            Deadline::At(t) => tokio::time::sleep_until(t.into()).await,
            Deadline::Never => std::future::pending().await,
        }
    }
}

/// Who keeps a lease alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Renewal {
    /// The caller calls [`Lease::renew`](crate::Lease::renew) before
    /// [`Lease::valid_until`](crate::Lease::valid_until).
    Manual,
    /// A watchdog renews when about a third of the validity window has passed (the window is
    /// the TTL, or less where the driver vouches for less; conformance case
    /// `renewal::watchdog_renews_at_about_a_third_of_the_ttl`), until the lease is released or
    /// dropped. A renewal that fails for a reason that may pass is tried again until
    /// `valid_until`, and one unanswered after half of the validity left gets another try
    /// beside it (a late answer still counts); the lease is AtRisk meanwhile. After
    /// `max_hold` (counted from the grant) it stops renewing, so the lease ends at most one TTL
    /// later and its lost signal fires: a hung holder cannot keep the lock forever.
    Auto {
        /// Upper bound on renewals; `None` renews for as long as the lease lives.
        max_hold: Option<Duration>,
    },
}

/// Options for one acquisition.
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockOptions, Renewal, Wait};
/// let opts = LockOptions::new(Duration::from_secs(10))
///     .wait_for(Duration::from_secs(3))
///     .auto_renew(Some(Duration::from_secs(3600)));
/// assert_eq!(opts.wait, Wait::For(Duration::from_secs(3)));
/// assert!(matches!(opts.renewal, Renewal::Auto { .. }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LockOptions {
    /// How long the backend keeps the lock after the last grant or renewal if the holder
    /// vanishes. Default 30 s.
    pub ttl: Duration,
    /// How long `acquire` waits. Default [`Wait::Forever`]; `try_acquire` ignores it.
    pub wait: Wait,
    /// Who renews. Default [`Renewal::Manual`].
    pub renewal: Renewal,
    /// Exclusive, shared, or one of K permits. Default [`Mode::Exclusive`].
    pub mode: Mode,
    /// What the holder says of itself, stored with the grant: a candidate's value in an
    /// [`Election`](crate::Election) (which sets it). Exclusive mode only; a driver that cannot
    /// store it refuses it ([`Error::Unsupported`]). Default none.
    pub value: Option<LeaderValue>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Wait::Forever,
            renewal: Renewal::Manual,
            mode: Mode::Exclusive,
            value: None,
        }
    }
}

impl LockOptions {
    /// Options with this TTL, waiting forever, manual renewal.
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            ..Self::default()
        }
    }
    /// Sets the TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// Sets how long `acquire` waits.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }
    /// `acquire` makes one attempt ([`Wait::No`]).
    pub fn no_wait(self) -> Self {
        self.wait(Wait::No)
    }
    /// `acquire` waits at most `d` ([`Wait::For`]).
    pub fn wait_for(self, d: Duration) -> Self {
        self.wait(Wait::For(d))
    }
    /// `acquire` waits until granted ([`Wait::Forever`]).
    pub fn wait_forever(self) -> Self {
        self.wait(Wait::Forever)
    }
    /// A watchdog renews the lease ([`Renewal::Auto`]).
    pub fn auto_renew(mut self, max_hold: Option<Duration>) -> Self {
        self.renewal = Renewal::Auto { max_hold };
        self
    }
    /// The caller renews ([`Renewal::Manual`]).
    pub fn manual_renewal(mut self) -> Self {
        self.renewal = Renewal::Manual;
        self
    }
    /// Sets the [`Mode`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
    /// The only holder ([`Mode::Exclusive`], the default).
    pub fn exclusive(self) -> Self {
        self.mode(Mode::Exclusive)
    }
    /// One of any number of shared holders ([`Mode::Shared`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{memory::MemoryLock, DistributedLock, LockName, LockOptions};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// let locks = MemoryLock::new();
    /// let schema = LockName::new("schema")?;
    /// let read = LockOptions::new(Duration::from_secs(10)).shared();
    /// let a = locks.try_acquire(&schema, &read).await?.expect("free");
    /// let b = locks.try_acquire(&schema, &read).await?.expect("readers share");
    /// let write = LockOptions::new(Duration::from_secs(10));
    /// assert!(locks.try_acquire(&schema, &write).await?.is_none(), "a writer waits for readers");
    /// # a.release().await?; b.release().await?; Ok(()) }
    /// ```
    pub fn shared(self) -> Self {
        self.mode(Mode::Shared)
    }
    /// One of `k` permits ([`Mode::Permits`]): at most `k` holders at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{memory::MemoryLock, DistributedLock, Error, LockName, LockOptions};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// let locks = MemoryLock::new();
    /// let exports = LockName::new("exports")?;
    /// let two = LockOptions::new(Duration::from_secs(10)).permits(2);
    /// let a = locks.try_acquire(&exports, &two).await?.expect("a permit");
    /// let b = locks.try_acquire(&exports, &two).await?.expect("the other permit");
    /// assert!(locks.try_acquire(&exports, &two).await?.is_none(), "both taken");
    /// let three = LockOptions::new(Duration::from_secs(10)).permits(3);
    /// let err = locks.try_acquire(&exports, &three).await.unwrap_err();
    /// assert!(matches!(err, Error::PermitsMismatch { held: 2, asked: 3, .. }));
    /// # a.release().await?; b.release().await?; Ok(()) }
    /// ```
    pub fn permits(self, k: u32) -> Self {
        self.mode(Mode::Permits(k))
    }
    /// Sets the holder's [`value`](Self::value).
    pub fn value(mut self, value: LeaderValue) -> Self {
        self.value = Some(value);
        self
    }

    /// Checks the options against a driver's capabilities and returns the effective TTL: the
    /// requested TTL rounded *up* to the backend's granularity, never shortened.
    ///
    /// Drivers call this first in `try_acquire` and `acquire`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{Capabilities, LockOptions};
    /// let caps = Capabilities::new().with_ttl_granularity(Duration::from_secs(1));
    /// let ttl = LockOptions::new(Duration::from_millis(1500)).validate(&caps)?;
    /// assert_eq!(ttl, Duration::from_secs(2));
    /// assert!(LockOptions::new(Duration::ZERO).validate(&caps).is_err());
    /// // Below the minimum: refused, never raised silently, and the message says what to ask.
    /// let session = Capabilities::new().with_min_ttl(Duration::from_secs(6));
    /// let err = LockOptions::new(Duration::from_secs(5)).validate(&session).unwrap_err();
    /// assert!(err.to_string().starts_with(
    ///     "invalid lock options: ttl 5s is below this backend's minimum 6s: ask for at least 6s"
    /// ));
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn validate(&self, caps: &Capabilities) -> Result<Duration> {
        let ttl = self.ttl;
        if ttl.is_zero() {
            return Err(Error::InvalidOptions(
                "ttl must be greater than zero".into(),
            ));
        }
        let max = caps.max_ttl.min(MAX_TTL);
        if ttl > max {
            return Err(Error::InvalidOptions(format!(
                "ttl {ttl:?} exceeds the maximum {max:?} (use automatic renewal for long holds)"
            )));
        }
        if ttl < caps.min_ttl {
            return Err(Error::InvalidOptions(format!(
                "ttl {ttl:?} is below this backend's minimum {min:?}: ask for at least {min:?} \
                 (where the lease is the session, ZooKeeper's and PostgreSQL's, the minimum is \
                 the session timeout, which session_timeout_ms in the URL sets)",
                min = caps.min_ttl
            )));
        }
        if self.value.is_some() && self.mode != Mode::Exclusive {
            return Err(Error::InvalidOptions(
                "a holder's value (a leader's) goes with an exclusive grant only".into(),
            ));
        }
        if self.mode == Mode::Permits(0) {
            return Err(Error::InvalidOptions(
                "a semaphore needs at least one permit".into(),
            ));
        }
        if let Renewal::Auto {
            max_hold: Some(max_hold),
        } = self.renewal
        {
            if max_hold.is_zero() {
                return Err(Error::InvalidOptions(
                    "max_hold must be greater than zero".into(),
                ));
            }
        }
        // In 64 bits: a TTL within the maximum (a day) is 2^47 ns at most, and a 128-bit
        // division took a hundred instructions of every acquisition.
        let too_large = || Error::InvalidOptions(format!("ttl {ttl:?} is too large"));
        let nanos = u64::try_from(ttl.as_nanos()).map_err(|_| too_large())?;
        let g = u64::try_from(caps.ttl_granularity.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        let effective = nanos
            .div_ceil(g)
            .checked_mul(g)
            .map(Duration::from_nanos)
            .ok_or_else(too_large)?;
        if effective > max {
            return Err(Error::InvalidOptions(format!(
                "ttl {ttl:?} rounds up to {effective:?}, above the maximum {max:?}"
            )));
        }
        Ok(effective)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_ttls_and_max_hold() {
        let caps = Capabilities::new().with_min_ttl(Duration::from_millis(10));
        for bad in [
            LockOptions::new(Duration::ZERO),
            LockOptions::new(Duration::from_millis(5)),
            LockOptions::new(MAX_TTL + Duration::from_secs(1)),
            LockOptions::new(Duration::from_secs(1)).auto_renew(Some(Duration::ZERO)),
            LockOptions::new(Duration::from_secs(1)).permits(0),
        ] {
            assert!(
                matches!(bad.validate(&caps), Err(Error::InvalidOptions(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn rounds_up_never_down() {
        let caps = Capabilities::new().with_ttl_granularity(Duration::from_secs(1));
        let ms = |m| {
            LockOptions::new(Duration::from_millis(m))
                .validate(&caps)
                .unwrap()
        };
        assert_eq!(ms(1), Duration::from_secs(1));
        assert_eq!(ms(1000), Duration::from_secs(1));
        assert_eq!(ms(1001), Duration::from_secs(2));
        let g = Capabilities::new().with_ttl_granularity(Duration::from_nanos(3));
        let ns = LockOptions::new(Duration::from_nanos(1_000_000_001)).validate(&g);
        assert_eq!(ns.ok(), Some(Duration::from_nanos(1_000_000_002)));
        // A granularity past any TTL (or past 64 bits of nanoseconds) is refused, not wrapped.
        for huge in [Duration::from_secs(2 * 24 * 60 * 60), Duration::MAX] {
            let caps = Capabilities::new().with_ttl_granularity(huge);
            let got = LockOptions::new(Duration::from_secs(1)).validate(&caps);
            assert!(
                matches!(got, Err(Error::InvalidOptions(_))),
                "{huge:?}: {got:?}"
            );
        }
    }
}
