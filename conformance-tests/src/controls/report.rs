//! What the wrapper reports of its own leases, as a driver with a `Lease` of its own must
//! (`lock_core::telemetry::LeaseReport`): the store's leases report under the store's backend
//! name, which the telemetry cases do not read.

use std::sync::Arc;
use std::time::Instant;

use lock_core::telemetry::{LeaseReport, LossReason};
use lock_core::{LockName, LostSignal};
use tokio::sync::Notify;

use super::Flaw;

/// One lease's report, and the notice that it ended (released, abandoned, dropped), which
/// stops the task that waits for its loss.
#[derive(Debug)]
pub(super) struct Reports {
    pub(super) report: Arc<LeaseReport>,
    ends: Arc<Notify>,
}

impl Reports {
    /// A lease of `name` granted now, valid until `valid_until`, whose loss `lost` tells:
    /// reported when it fires before the lease ended — as refused before `valid_until`,
    /// expired after — except under [`Flaw::LossNotReported`].
    pub(super) fn granted(
        backend: &'static str,
        name: &LockName,
        flaw: Flaw,
        lost: LostSignal,
        valid_until: Instant,
    ) -> Self {
        let report = Arc::new(LeaseReport::granted(backend, name));
        let ends = Arc::new(Notify::new());
        if flaw != Flaw::LossNotReported {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (report, ends) = (report.clone(), ends.clone());
                rt.spawn(async move {
                    tokio::select! {
                        () = lost.wait() => {
                            let reason = if Instant::now() < valid_until {
                                LossReason::Refused
                            } else {
                                LossReason::Expired
                            };
                            // A no-op if the lease ended first.
                            report.lost(reason, None);
                        }
                        () = ends.notified() => {}
                    }
                });
            }
        }
        Reports { report, ends }
    }

    /// The lease ended `how`: reported (once), and its loss no longer awaited.
    pub(super) fn ended(&self, how: &'static str) {
        self.report.ended(how);
        self.ends.notify_one();
    }
}
