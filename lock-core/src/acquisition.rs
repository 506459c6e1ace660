//! [`Acquisition`]: one acquisition as a driver receives it, with its TTL already validated.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::telemetry::AcquireReport;
use crate::{Capabilities, Deadline, LockName, LockOptions, Result};

/// One acquisition, as [`DistributedLock::acquire_until`](crate::DistributedLock::acquire_until)
/// receives it. The only way to make one is [`new`](Self::new), which validates the options
/// against the driver's capabilities: a driver cannot be handed an unchecked TTL, and cannot
/// forget to check one.
///
/// ```
/// use std::time::{Duration, Instant};
/// use lock_core::driver::Acquisition;
/// use lock_core::{Capabilities, Deadline, LockName, LockOptions};
///
/// let name = LockName::new("jobs")?;
/// let caps = Capabilities::new().with_ttl_granularity(Duration::from_secs(1));
/// let opts = LockOptions::new(Duration::from_millis(1500));
/// let req = Acquisition::new(&name, &opts, &caps, Deadline::Now)?;
/// assert_eq!(req.ttl(), Duration::from_secs(2)); // rounded up to the backend's granularity
/// assert_eq!(req.deadline(), Deadline::Now);
///
/// let zero = LockOptions::new(Duration::ZERO);
/// assert!(Acquisition::new(&name, &zero, &caps, Deadline::Now).is_err());
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Acquisition<'a> {
    name: &'a LockName,
    opts: &'a LockOptions,
    ttl: Duration,
    deadline: Deadline,
    /// Raised by [`queued`](Self::queued), for the report that follows this acquisition.
    queued: Option<&'a AtomicBool>,
}

impl<'a> Acquisition<'a> {
    /// An acquisition of `name` with `opts`, waiting until `deadline`; the TTL is
    /// [`LockOptions::validate`]d against `caps` (the one place it is checked).
    pub fn new(
        name: &'a LockName,
        opts: &'a LockOptions,
        caps: &Capabilities,
        deadline: Deadline,
    ) -> Result<Self> {
        let ttl = opts.validate(caps)?;
        Ok(Acquisition {
            name,
            opts,
            ttl,
            deadline,
            queued: None,
        })
    }

    /// The same acquisition, reported by `report`: a grant after [`queued`](Self::queued) is
    /// counted as a hand-off. The trait's `try_acquire` and `acquire` do this.
    pub fn reported_by(self, report: &'a AcquireReport) -> Self {
        Acquisition {
            queued: Some(report.queue_flag()),
            ..self
        }
    }

    /// Says that this acquisition found the lock held and waits for it (behind its holder, or
    /// in the backend's queue): if it is granted later, the grant is a hand-off
    /// (`lock.handoffs`, and `lock.queued` on its span). Drivers call it where a busy attempt
    /// turns into a wait; calling it again, or before a timeout, is harmless.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::driver::Acquisition;
    /// use lock_core::telemetry::AcquireReport;
    /// use lock_core::{Capabilities, Deadline, LockName, LockOptions};
    ///
    /// let name = LockName::new("jobs")?;
    /// let opts = LockOptions::new(Duration::from_secs(5));
    /// let report = AcquireReport::start("my", &name, &opts, true);
    /// let req = Acquisition::new(&name, &opts, &Capabilities::new(), Deadline::Never)?
    ///     .reported_by(&report);
    /// req.queued(); // the first attempt found it held
    /// assert!(report.was_queued());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn queued(&self) {
        if let Some(flag) = self.queued {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// The same acquisition with another deadline (a driver that retries on a fresh session,
    /// say, with what is left of the wait).
    pub fn with_deadline(self, deadline: Deadline) -> Self {
        Acquisition { deadline, ..self }
    }

    /// The lock's name.
    pub fn name(&self) -> &'a LockName {
        self.name
    }

    /// The options as the caller gave them (renewal, wait).
    pub fn opts(&self) -> &'a LockOptions {
        self.opts
    }

    /// How the acquisition shares its name: `opts().mode`, which the trait's `try_acquire`
    /// and `acquire` have checked against the driver's capabilities.
    pub fn mode(&self) -> crate::Mode {
        self.opts.mode
    }

    /// The holder's value to store with the grant (`opts().value`), which the trait's
    /// `try_acquire` and `acquire` have checked the driver declares it can store.
    pub fn value(&self) -> Option<&'a crate::LeaderValue> {
        self.opts.value.as_ref()
    }

    /// The effective TTL: the caller's, validated and rounded up to the backend's granularity.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Until when the acquisition may wait.
    pub fn deadline(&self) -> Deadline {
        self.deadline
    }
}
