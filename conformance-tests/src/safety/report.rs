//! What a run did, what the checker found, and the figures RELIABILITY.md reports: how long a
//! cut-off holder went on believing, and how long the struck party took to be granted again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::checker::{last_heal, settled, Violation};
use super::history::{fault_spans, Event, LeaseId, Op, NOBODY};
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
    /// as a cut race ([`CUT_NOTICE`](super::CUT_NOTICE)), as long as it lasted.
    pub cut_races: Vec<Duration>,
    /// Every step of the machine's wall clock against its monotonic clock during the run
    /// (over 1 ms): servers that expire keys by the wall clock drop them early by a forward
    /// step, which a history on the monotonic clock cannot show.
    pub clock_steps: Vec<super::ClockStep>,
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
    /// (d) liveness, (e) observers.
    pub fn violations_by_kind(&self) -> [usize; 5] {
        use super::checker::Kind;
        let mut out = [0; 5];
        for v in &self.violations {
            let i = match v.kind {
                Kind::Overlap => 0,
                Kind::Fencing => 1,
                Kind::LossNotSeen => 2,
                Kind::Liveness => 3,
                Kind::Observer => 4,
            };
            out[i] += 1;
        }
        out
    }

    /// The grants by mode (exclusive, shared, permits), from the history's [`Op::Mode`]
    /// events: which of the lock family a run exercised.
    pub fn grants_by_mode(&self) -> [u64; 3] {
        let mut by = [0u64; 3];
        for e in &self.events {
            match e.op {
                Op::Granted { .. } => by[0] += 1,
                Op::Mode { mode, .. } => {
                    let i = if mode == lock_core::Mode::Shared {
                        1
                    } else {
                        2
                    };
                    by[0] = by[0].saturating_sub(1);
                    by[i] += 1;
                }
                _ => {}
            }
        }
        by
    }

    /// How late the nemesis's witnesses saw its cuts ([`Op::CutSeen`]), the median and the
    /// longest: the machine's load, which a cut race's notice is counted after.
    pub fn witness_lag(&self) -> Option<(Duration, Duration)> {
        let mut cut: std::collections::HashMap<usize, std::time::Instant> = Default::default();
        let mut lags = Vec::new();
        for e in &self.events {
            match e.op {
                Op::Cut => {
                    cut.insert(e.client, e.at);
                }
                Op::CutSeen => {
                    if let Some(c) = cut.remove(&e.client) {
                        lags.push(e.at.saturating_duration_since(c));
                    }
                }
                _ => {}
            }
        }
        lags.sort();
        Some((*lags.get(lags.len() / 2)?, *lags.last()?))
    }

    /// How many leader changes the run's election observers showed ([`Op::Observed`]).
    pub fn observations(&self) -> usize {
        let seen = |e: &&Event| matches!(e.op, Op::Observed { .. });
        self.events.iter().filter(seen).count()
    }

    /// One line for a log: grants, time, faults, figures, seed.
    pub fn summary(&self) -> String {
        let [a, b, c, d, e] = self.violations_by_kind();
        let [excl, shared, permits] = self.grants_by_mode();
        format!(
            "{} grants ({excl} exclusive, {shared} shared, {permits} permits) in {:.1?} \
             (refused {}, unknown {}, stale writes refused {}), faults {:?}, \
             violations a/b/c/d/e {a}/{b}/{c}/{d}/{e}, observations {}, cut-off holder to lost signal p50 {:?} p99 {:?} \
             (n={}), heal to next grant p50 {:?} p99 {:?} (n={}), hand-off p50 {:?} p99 {:?} \
             (n={}), cut races {} (longest {:?}; cuts seen by a witness p50/max {:?}), servers serving again {:?} after the last heal, \
             wall clock steps {}, seed {}",
            self.grants,
            self.elapsed,
            self.refused,
            self.unknown,
            self.stale_writes_refused,
            self.faults,
            self.observations(),
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
            self.witness_lag(),
            self.serving_after_last_heal(),
            self.clock_steps_text(),
            self.seed
        )
    }

    /// How long after the last heal the servers were first seen serving their clients again
    /// ([`Op::Serving`]); `None` if the history does not say (no server fault, or servers that
    /// did not serve again). Liveness (d) counts from there.
    pub fn serving_after_last_heal(&self) -> Option<Duration> {
        let healed = last_heal(&self.events)?;
        (self.events.iter())
            .find(|e| e.op == Op::Serving && e.at >= healed)
            .map(|e| e.at - healed)
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
        let evidence = self
            .violations
            .first()
            .map(|v| self.evidence(v))
            .unwrap_or_default();
        Err(Failure(format!(
            "{} violation(s) in a history of {} grants (seed {}, faults {:?}):\n  {}\n\
             the machine's wall clock against its monotonic clock: {}\n\
             the history around the first (seconds from its start):\n{evidence}",
            self.violations.len(),
            self.grants,
            self.seed,
            self.faults,
            shown.join("\n  "),
            self.clock_steps_text(),
        )))
    }

    /// The wall clock's steps, each as far as it moved and when (seconds from the history's
    /// start), or that there was none; servers that expire keys by the wall clock (Redis)
    /// drop them early by a forward step.
    pub fn clock_steps_text(&self) -> String {
        let Some(origin) = self.events.first().map(|e| e.at) else {
            return format!("{} step(s)", self.clock_steps.len());
        };
        if self.clock_steps.is_empty() {
            return "no step over 1 ms".into();
        }
        let steps: Vec<String> = (self.clock_steps.iter().take(10))
            .map(|s| {
                let at = s.at.saturating_duration_since(origin).as_secs_f64();
                format!("{:+.3} ms at {at:.3} s", s.by_ns as f64 / 1e6)
            })
            .collect();
        format!("{} step(s): {}", self.clock_steps.len(), steps.join(", "))
    }

    /// The history around `v`, one event a line: every event of the clients whose leases it
    /// involves, and every fault and heal, from the earliest of their acquisitions to just
    /// after it (the last 40 up to it and the first 20 after), times relative to the history's
    /// start. For a name that
    /// was not granted again (no lease involved): every event on that name, and every fault
    /// and heal, from its last grant before the last heal to its first grant after it (or the
    /// end), in three parts of at most 15, 30 and 15 lines: the first 3 and last 12 before the
    /// heal, the first from the heal to the violation, the last after it — the window the
    /// checker judged is never crowded out by what came long before or after — and, whatever
    /// else is left out, how the last holder before the heal let go (its release, its lost
    /// signal), where a name stuck behind it starts.
    pub fn evidence(&self, v: &Violation) -> String {
        let Some(origin) = self.events.first().map(|e| e.at) else {
            return String::new();
        };
        let rel = |t: Instant| t.saturating_duration_since(origin).as_secs_f64();
        let grants: Vec<(usize, Instant)> = self
            .events
            .iter()
            .filter_map(|e| match e.op {
                Op::Granted { lease, .. } if v.leases.contains(&lease) => Some((e.client, e.at)),
                _ => None,
            })
            .collect();
        // From the earliest acquisition that led to one of these grants.
        let from = grants
            .iter()
            .filter_map(|&(c, g)| {
                self.events
                    .iter()
                    .rev()
                    .find(|e| e.client == c && e.at <= g && e.op == Op::Acquire)
                    .map(|e| e.at)
            })
            .min()
            .unwrap_or(v.at);
        // A name that stopped being granted involves no lease: show what happened on it from
        // its last grant before the heal (who held it, who asked, what they were told) to its
        // next grant.
        let stuck = v.leases.is_empty() && v.name != NOBODY;
        // Where the checker's window starts: after the last heal, once the servers serve.
        let healed = settled(&self.events).filter(|t| *t <= v.at).unwrap_or(v.at);
        let is_grant = |e: &&Event| e.name == v.name && matches!(e.op, Op::Granted { .. });
        let last_grant = (self.events.iter().rev()).find(|e| e.at <= healed && is_grant(e));
        // How the name's last holder before the heal let go (or did not): shown whatever
        // else is left out, since a name stuck behind it starts there.
        let last_lease = match last_grant.map(|e| &e.op) {
            Some(Op::Granted { lease, .. }) if stuck => Some(*lease),
            _ => None,
        };
        let ends_last = |e: &Event| match e.op {
            Op::Release { lease }
            | Op::Released { lease, .. }
            | Op::LostSignal { lease }
            | Op::LetGo { lease } => Some(lease) == last_lease,
            _ => false,
        };
        let (from, to) = if stuck {
            let next_grant = (self.events.iter()).find(|e| e.at > healed && is_grant(e));
            let end = self.events.iter().map(|e| e.at).max().unwrap_or(v.at);
            (
                last_grant.map_or(origin, |e| e.at),
                next_grant.map_or(end, |e| e.at),
            )
        } else {
            (from, v.at + EVIDENCE_AFTER)
        };
        let involved = |e: &Event| {
            e.client == NOBODY
                || grants.iter().any(|&(c, _)| c == e.client)
                || (stuck && e.name == v.name)
        };
        // Faults still open at `from` (a freeze that began earlier) belong to the picture too.
        let open = fault_spans(&self.events)
            .into_iter()
            .filter(|(f, heal)| f.at < from && heal.map_or(true, |h| h.at >= from))
            .map(|(f, _)| f)
            .filter(|f| involved(f));
        let shown: Vec<&Event> = open
            .chain(
                self.events
                    .iter()
                    .filter(|e| from <= e.at && e.at <= to && involved(e)),
            )
            .collect();
        // Which of them to show: for each consecutive part, its length and how many of its
        // first and of its last events.
        let parts: Vec<(usize, usize, usize)> = if stuck {
            let before = shown.iter().filter(|e| e.at < healed).count();
            let window = shown.iter().filter(|e| e.at <= v.at).count();
            vec![
                // Who held it (the last grant), then what led up to the heal.
                (before, 3, 12),
                (window - before, EVIDENCE_LINES / 2, 0),
                // What the name's next grant came after.
                (shown.len() - window, 0, EVIDENCE_LINES / 4),
            ]
        } else {
            // What led up to the violation first (the grants, the faults just before); then
            // the start of what followed, which a busy client fills fast.
            let before = shown.iter().filter(|e| e.at <= v.at).count();
            vec![
                (before, 0, EVIDENCE_LINES * 2 / 3),
                (shown.len() - before, EVIDENCE_LINES / 3, 0),
            ]
        };
        let mut keep = Vec::with_capacity(shown.len());
        for (len, head, tail) in parts {
            keep.extend((0..len).map(|i| i < head || i + tail >= len));
        }
        for (k, e) in keep.iter_mut().zip(&shown) {
            *k |= ends_last(e);
        }
        let mut out: Vec<String> = Vec::new();
        let mut left_out = 0;
        for (e, keep) in shown.iter().zip(keep) {
            if !keep {
                left_out += 1;
                continue;
            }
            if left_out > 0 {
                out.push(format!("  ({left_out} events left out)"));
                left_out = 0;
            }
            let who = if e.client == NOBODY {
                "nemesis".to_string()
            } else {
                format!("client {} name {}", e.client, e.name)
            };
            out.push(format!(
                "  {:>10.4} {who}: {}",
                rel(e.at),
                describe(&e.op, &rel)
            ));
        }
        if left_out > 0 {
            out.push(format!("  ({left_out} events left out)"));
        }
        out.join("\n")
    }
}

/// How many lines of history [`Report::evidence`] shows at the most.
const EVIDENCE_LINES: usize = 60;

/// How far past a violation [`Report::evidence`] reads.
const EVIDENCE_AFTER: Duration = Duration::from_millis(100);

/// `op` in words, its instants in seconds from the history's start.
fn describe(op: &Op, rel: &dyn Fn(Instant) -> f64) -> String {
    let at = |t: Option<Instant>| t.map_or("-".to_string(), |t| format!("{:.4}", rel(t)));
    match op {
        Op::Granted {
            lease,
            token,
            valid_until,
        } => format!(
            "granted lease {lease} (token {token:?}), valid until {:.4}",
            rel(*valid_until)
        ),
        Op::Polled {
            lease,
            woken,
            polled,
        } => format!(
            "lease {lease}'s acquisition was last woken at {}, last polled at {}",
            at(*woken),
            at(*polled)
        ),
        Op::Looked {
            lease,
            valid_until,
            lost,
        } => format!(
            "looked at lease {lease}: valid until {:.4}{}",
            rel(*valid_until),
            if *lost { ", Lost" } else { "" }
        ),
        other => format!("{other:?}"),
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

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
