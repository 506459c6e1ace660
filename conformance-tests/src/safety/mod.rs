//! Safety under faults, Jepsen-style: a [`Workload`] of independent clients over a few names,
//! a nemesis that breaks their links and pauses them on a seeded schedule, a [`History`] of
//! every operation on one monotonic clock, and a [`check`]er that reads the history and
//! reports every violation of:
//!
//! - **(a) no overlap**: no two clients believe they hold a name at the same instant (a client
//!   believes from its grant's return until the earliest of its release, its `valid_until`
//!   and its lost signal); every overlapping pair is judged. The one excuse is the cut race of
//!   a session-bound lock, bounded by a measured constant ([`CUT_NOTICE`]);
//! - **(b) fencing**: tokens strictly increase in grant order per name (skipped for
//!   `Fencing::None`), and once the [`FencedStore`] accepted a write of a lease it accepts
//!   none of a lease granted earlier — judged by the history's grant order, which the store
//!   never sees;
//! - **(c) loss before re-grant**: a holder that did not release saw its lost signal or passed
//!   its `valid_until` before the next holder's grant returned;
//! - **(d) liveness**: after the last fault healed, every name is granted again within a bound
//!   derived from the TTL, every client that asks is answered by its backend again (a grant,
//!   a wait that ran out, a release), and every acquisition returns within its bounded wait
//!   and the workload's margin;
//! - **(e) observers**, where the driver holds elections (its writers then campaign with a
//!   value): each name's election observers never show a term go back or return after its
//!   end, never fail, and show nobody once every lease has ended (within the recovery bound).
//!
//! The suite's `safety::history_is_clean` case runs [`Workload::short`] on every driver; the
//! negative controls prove that the checker reports each broken promise as its own kind.
//!
//! ```no_run
//! # async fn f(h: &dyn conformance_tests::Harness) -> Result<(), conformance_tests::Failure> {
//! use conformance_tests::safety::{run, Workload};
//! let report = run(h, &Workload::short(42)).await?;
//! println!("{} grants, faults {:?}", report.grants, report.faults);
//! report.verdict()?;
//! # Ok(()) }
//! ```

mod belief;
mod checker;
mod family;
mod history;
mod nemesis;
mod observers;
mod overlap;
mod polled;
mod report;
mod sharing;
mod store;
mod timeline;
mod violation;
mod wall_clock;
mod workload;

pub use checker::{check, cut_races, Kind, Rules, Violation, CUT_NOTICE};
pub use family::Family;
pub use history::{Event, History, LeaseId, Op, NOBODY};
pub use nemesis::{Rng, FAULT_KINDS};
pub use report::{quantile, Report};
pub use store::FencedStore;
pub use timeline::draw;
pub use wall_clock::ClockStep;
pub use workload::{run, seed, Workload};
