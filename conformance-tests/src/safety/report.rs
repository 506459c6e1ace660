//! What a run did, what the checker found, and the figures RELIABILITY.md reports: how long a
//! cut-off holder went on believing, and how long the struck party took to be granted again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::checker::Violation;
use super::history::{Event, LeaseId, Op, NOBODY};
use crate::Failure;

/// What a run did and what the checker found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed (a failing run replays with it).
    pub seed: u64,
    /// Grants returned.
    pub grants: u64,
    /// Acquisitions that ended without a grant (timeouts, errors).
    pub refused: u64,
    /// Acquisitions cancelled by the workload's own limit (outcome unknown).
    pub unknown: u64,
    /// Writes the fenced store refused (a stale holder stopped by its token).
    pub stale_writes_refused: u64,
    /// Faults injected per kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Server faults the nemesis could not inject or heal: the run is not what it claims, and
    /// [`verdict`](Self::verdict) fails.
    pub server_errors: Vec<String>,
    /// How long the run took.
    pub elapsed: Duration,
    /// For holders cut off or paused while holding: from the fault's start to their lost
    /// signal (how long a cut-off holder went on believing), one sample per such lease.
    pub loss_to_signal: Vec<Duration>,
    /// For each fault that stops progress (blackhole, pause, freeze, restart): from its heal to
    /// the next grant of the party it struck (that client; any client for a server fault).
    pub recovery: Vec<Duration>,
    /// For each successful release of a name another client was waiting for: from the release
    /// call to the next grant of that name (the hand-off as the waiter sees it).
    pub handoff: Vec<Duration>,
    /// For a driver whose lock is its connection's session: each overlap the checker let pass
    /// as a cut race ([`Rules::cut_notice`](super::Rules::cut_notice)), as long as it lasted.
    pub cut_races: Vec<Duration>,
    /// Every violation found.
    pub violations: Vec<Violation>,
    /// The history itself, in order.
    pub events: Vec<Event>,
}

/// The `q`-quantile (0.0–1.0) of `samples`, if any (nearest rank).
pub fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    let mut v = samples.to_vec();
    v.sort();
    let last = v.len().checked_sub(1)?;
    let i = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
    v.get(i).copied()
}

impl Report {
    /// The `q`-quantile (0.0–1.0) of [`loss_to_signal`](Self::loss_to_signal), if any.
    pub fn loss_to_signal_quantile(&self, q: f64) -> Option<Duration> {
        quantile(&self.loss_to_signal, q)
    }

    /// The `q`-quantile (0.0–1.0) of [`recovery`](Self::recovery), if any.
    pub fn recovery_quantile(&self, q: f64) -> Option<Duration> {
        quantile(&self.recovery, q)
    }

    /// The `q`-quantile (0.0–1.0) of [`handoff`](Self::handoff), if any.
    pub fn handoff_quantile(&self, q: f64) -> Option<Duration> {
        quantile(&self.handoff, q)
    }

    /// Violations of each kind, in the order (a) overlap, (b) fencing, (c) loss not seen,
    /// (d) liveness.
    pub fn violations_by_kind(&self) -> [usize; 4] {
        use super::checker::Kind;
        let mut out = [0; 4];
        for v in &self.violations {
            let i = match v.kind {
                Kind::Overlap => 0,
                Kind::Fencing => 1,
                Kind::LossNotSeen => 2,
                Kind::Liveness => 3,
            };
            out[i] += 1;
        }
        out
    }

    /// One line for a log: grants, time, faults, figures, seed.
    pub fn summary(&self) -> String {
        let [a, b, c, d] = self.violations_by_kind();
        format!(
            "{} grants in {:.1?} (refused {}, unknown {}, stale writes refused {}), faults {:?}, \
             violations a/b/c/d {a}/{b}/{c}/{d}, cut-off holder to lost signal p50 {:?} p99 {:?} \
             (n={}), heal to next grant p50 {:?} p99 {:?} (n={}), hand-off p50 {:?} p99 {:?} \
             (n={}), cut races {} (longest {:?}), seed {}",
            self.grants,
            self.elapsed,
            self.refused,
            self.unknown,
            self.stale_writes_refused,
            self.faults,
            self.loss_to_signal_quantile(0.5),
            self.loss_to_signal_quantile(0.99),
            self.loss_to_signal.len(),
            self.recovery_quantile(0.5),
            self.recovery_quantile(0.99),
            self.recovery.len(),
            self.handoff_quantile(0.5),
            self.handoff_quantile(0.99),
            self.handoff.len(),
            self.cut_races.len(),
            self.cut_races.iter().max(),
            self.seed
        )
    }

    /// A failure listing the violations (at most 10) and any server fault the nemesis could
    /// not inject, or `Ok` if there are none.
    pub fn verdict(&self) -> Result<(), Failure> {
        if !self.server_errors.is_empty() {
            return Err(Failure(format!(
                "the nemesis could not break the servers as it claims (seed {}): {}",
                self.seed,
                self.server_errors.join("; ")
            )));
        }
        if self.violations.is_empty() {
            return Ok(());
        }
        let shown: Vec<String> = self
            .violations
            .iter()
            .take(10)
            .map(|v| v.to_string())
            .collect();
        Err(Failure(format!(
            "{} violation(s) in a history of {} grants (seed {}, faults {:?}):\n  {}",
            self.violations.len(),
            self.grants,
            self.seed,
            self.faults,
            shown.join("\n  ")
        )))
    }
}

/// For each lease whose holder was cut off or paused while holding it (a blackhole or a pause
/// of its client began after the grant) and that ended by its lost signal, not a release: how
/// long after that fault began the signal fired — how long a cut-off holder went on believing.
pub(super) fn loss_to_signal(events: &[Event]) -> Vec<Duration> {
    let mut holder: HashMap<LeaseId, (usize, Instant)> = HashMap::new();
    let mut let_go: HashSet<LeaseId> = HashSet::new();
    let mut struck: HashMap<usize, Instant> = HashMap::new();
    let mut out = Vec::new();
    for e in events {
        match &e.op {
            Op::Granted { lease, .. } => {
                holder.insert(*lease, (e.client, e.at));
            }
            Op::Fault { what } if what.starts_with("blackhole") || what.starts_with("pause") => {
                struck.insert(e.client, e.at);
            }
            Op::Release { lease } | Op::LetGo { lease } => {
                let_go.insert(*lease);
            }
            Op::LostSignal { lease } if !let_go.contains(lease) => {
                if let Some((c, granted)) = holder.get(lease) {
                    if let Some(at) = struck.get(c).filter(|at| *at >= granted) {
                        out.push(e.at.saturating_duration_since(*at));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Faults after which the struck party cannot make progress until healed.
const STOPPING: [&str; 4] = ["blackhole", "pause", "freeze", "restart"];

/// For each healed fault that stops progress: from the heal to the next grant returned to the
/// struck client (to any client, for a server fault). A fault still unrecovered at the end of
/// the history gives no sample (liveness (d) judges that).
pub(super) fn recovery(events: &[Event]) -> Vec<Duration> {
    // Heals waiting for their party's next grant: (client or NOBODY, healed at).
    let mut waiting: Vec<(usize, Instant)> = Vec::new();
    let mut out = Vec::new();
    for e in events {
        match &e.op {
            Op::Heal { what } if STOPPING.iter().any(|k| what.starts_with(k)) => {
                waiting.push((e.client, e.at));
            }
            Op::Granted { .. } => waiting.retain(|(party, healed)| {
                if *party == NOBODY || *party == e.client {
                    out.push(e.at.saturating_duration_since(*healed));
                    false
                } else {
                    true
                }
            }),
            _ => {}
        }
    }
    out
}

/// For each release that returned `Ok` while another client was acquiring the same name: from
/// the release call to that name's next grant.
pub(super) fn handoff(events: &[Event]) -> Vec<Duration> {
    let released_ok: HashSet<LeaseId> = events
        .iter()
        .filter_map(|e| match e.op {
            Op::Released { lease, ok: true } => Some(lease),
            _ => None,
        })
        .collect();
    // Per client: the name it is acquiring, if any.
    let mut acquiring: HashMap<usize, usize> = HashMap::new();
    // Per name: when a release with a waiter began.
    let mut released: HashMap<usize, Instant> = HashMap::new();
    let mut out = Vec::new();
    for e in events {
        match &e.op {
            Op::Acquire => {
                acquiring.insert(e.client, e.name);
            }
            Op::Refused { .. } | Op::Unknown => {
                acquiring.remove(&e.client);
            }
            Op::Granted { .. } => {
                acquiring.remove(&e.client);
                if let Some(at) = released.remove(&e.name) {
                    out.push(e.at.saturating_duration_since(at));
                }
            }
            Op::Release { lease } if released_ok.contains(lease) => {
                let waited = acquiring
                    .iter()
                    .any(|(c, n)| *n == e.name && *c != e.client);
                if waited {
                    released.insert(e.name, e.at);
                }
            }
            _ => {}
        }
    }
    out
}
