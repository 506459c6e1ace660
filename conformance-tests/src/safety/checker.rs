//! Reads a history and reports every violation of (a) no overlap, (b) fencing, (c) loss before
//! re-grant and (d) liveness, with the operations involved.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use super::belief::{beliefs, Belief};
use super::history::{Event, LeaseId, Op, NOBODY};

/// Which promise a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// (a) Two clients believed they held one name at the same instant.
    Overlap,
    /// (b) Tokens did not strictly increase in grant order, or the store accepted a write with
    /// a token lower than one it had accepted.
    Fencing,
    /// (c) A holder that had not released was still believing it held (no lost signal, its
    /// `valid_until` ahead) when the next holder's grant returned.
    LossNotSeen,
    /// (d) After the last fault healed (and the servers served again, where they say so), a
    /// name was not granted within the bound, or a client's acquisition never finished.
    Liveness,
}

/// One broken promise, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which promise.
    pub kind: Kind,
    /// The name (index into the run's names; `usize::MAX` if none).
    pub name: usize,
    /// The leases involved, earlier first.
    pub leases: Vec<LeaseId>,
    /// When it happened.
    pub at: Instant,
    /// What happened, in words (times relative to the start of the history).
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} on name {}: {}", self.kind, self.name, self.detail)
    }
}

/// How long after a cut a grant that was answered on the connection being cut may still be
/// recorded (see [`Rules::cut_notice`]).
const CUT_SETTLE: Duration = Duration::from_millis(1);

/// What the checker needs besides the history.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// The driver gives fencing tokens: (b) applies.
    pub fencing: bool,
    /// (d): every name must be granted again within this long after the last fault healed,
    /// or after the servers serve again where the history says when ([`Op::Serving`]).
    pub recovery: Duration,
    /// When the run stopped issuing operations (open beliefs end here).
    pub end: Instant,
    /// `Some(notice)` for a driver whose lock is its connection's session
    /// (`outlives_connection = false`): a cut of the holder's connection frees the lock on the
    /// server the moment the server sees it, and the holder's own notice of the same closed
    /// connection cannot be ordered before that — the next holder's grant may return first.
    /// An overlap that begins after a cut of the holder's link (made after its grant), and
    /// that the holder's belief leaves within `notice` of the cut, is counted as a cut race
    /// (see [`cut_races`]), not a violation; a later notice is one. `None`: every overlap is
    /// a violation.
    pub cut_notice: Option<Duration>,
}

/// Every violation in `events` (time-ordered, as [`History::events`](super::History::events)
/// gives them).
pub fn check(events: &[Event], rules: &Rules) -> Vec<Violation> {
    analyse(events, rules).0
}

/// The overlaps [`Rules::cut_notice`] lets pass, each as long as it lasted: how far the next
/// holder's grant ran ahead of a cut holder's own notice.
pub fn cut_races(events: &[Event], rules: &Rules) -> Vec<Duration> {
    analyse(events, rules).1
}

/// The violations and the cut races of one history.
pub(super) fn analyse(events: &[Event], rules: &Rules) -> (Vec<Violation>, Vec<Duration>) {
    let origin = events.first().map_or(rules.end, |e| e.at);
    let rel = |t: Instant| t.saturating_duration_since(origin);
    let beliefs = beliefs(events, rules.end);
    let mut out = Vec::new();
    let mut races = Vec::new();
    let mut by_name: BTreeMap<usize, Vec<&Belief>> = BTreeMap::new();
    for b in beliefs.values() {
        by_name.entry(b.name).or_default().push(b);
    }
    let mut cuts: HashMap<usize, Vec<Instant>> = HashMap::new();
    for e in events.iter().filter(|e| e.op == Op::Cut) {
        cuts.entry(e.client).or_default().push(e.at);
    }
    // An overlap from `s` to `re` of a lease granted at `g` is a race with a cut of its
    // client's link if the cut came after the grant (give or take a reply already on its way
    // as the connection was cut: a grant on a new connection takes a connect and more) and
    // before the successor's grant, and the holder's belief ended within the notice.
    let raced = |b: &Belief, s: Instant, re: Instant| {
        rules.cut_notice.is_some_and(|notice| {
            cuts.get(&b.client).is_some_and(|at| {
                at.iter()
                    .any(|&c| b.granted <= c + CUT_SETTLE && c <= s && re <= c + notice)
            })
        })
    };
    for (&name, leases) in &by_name {
        overlaps(name, leases, &rel, &raced, &mut out, &mut races);
        if rules.fencing {
            token_order(name, leases, &rel, &mut out);
        }
    }
    store_order(events, &rel, &mut out);
    liveness(events, rules, &by_name, &rel, &mut out);
    out.sort_by_key(|v| (v.kind, v.at));
    (out, races)
}

fn overlaps(
    name: usize,
    leases: &[&Belief],
    rel: &dyn Fn(Instant) -> Duration,
    raced: &dyn Fn(&Belief, Instant, Instant) -> bool,
    out: &mut Vec<Violation>,
    races: &mut Vec<Duration>,
) {
    let mut spans: Vec<(Instant, Instant, &Belief)> = leases
        .iter()
        .flat_map(|b| b.spans.iter().map(move |&(s, e)| (s, e, *b)))
        .collect();
    spans.sort_by_key(|s| s.0);
    // The span reaching furthest so far.
    let mut reach: Option<(Instant, Instant, &Belief)> = None;
    for span in spans {
        let (s, e, b) = span;
        if let Some((rs, re, rb)) = reach {
            if s < re && rb.lease != b.lease && raced(rb, s, re) {
                races.push(re.min(e) - s);
            } else if s < re && rb.lease != b.lease {
                out.push(Violation {
                    kind: Kind::Overlap,
                    name,
                    leases: vec![rb.lease, b.lease],
                    at: s,
                    detail: format!(
                        "client {} (lease {}, believing {:?}..{:?}) and client {} (lease {}, \
                         granted at {:?}) both believed they held it for {:?}",
                        rb.client,
                        rb.lease,
                        rel(rs),
                        rel(re),
                        b.client,
                        b.lease,
                        rel(s),
                        re.min(e) - s
                    ),
                });
                // The earlier holder had lost the lock (it had not let go, and its release, if
                // any, failed) yet did not know when the successor's grant returned.
                if rb.let_go.map_or(true, |g| g > s) && !rb.released_ok && b.granted == s {
                    out.push(Violation {
                        kind: Kind::LossNotSeen,
                        name,
                        leases: vec![rb.lease, b.lease],
                        at: s,
                        detail: format!(
                            "lease {} of client {} had not released and still believed it held \
                             (lost signal {}, valid until {:?}) when lease {} of client {} was \
                             granted at {:?}",
                            rb.lease,
                            rb.client,
                            rb.lost_signal
                                .map_or("never".to_string(), |t| format!("at {:?}", rel(t))),
                            rel(re),
                            b.lease,
                            b.client,
                            rel(s)
                        ),
                    });
                }
            }
        }
        if reach.map_or(true, |(_, re, _)| e > re) {
            reach = Some(span);
        }
    }
}

fn token_order(
    name: usize,
    leases: &[&Belief],
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    // A belief that starts again (a resurrected lease) after a newer grant holds an old token:
    // its holder writes with a token the newer holder already superseded.
    let mut starts: Vec<(Instant, &Belief)> = leases
        .iter()
        .flat_map(|b| b.spans.iter().map(move |&(s, _)| (s, *b)))
        .collect();
    starts.sort_by_key(|s| s.0);
    let mut newest: Option<(u64, LeaseId)> = None;
    for (s, b) in starts {
        let Some(t) = b.token else { continue };
        match newest {
            Some((n, l)) if t < n && s > b.granted => out.push(Violation {
                kind: Kind::Fencing,
                name,
                leases: vec![l, b.lease],
                at: s,
                detail: format!(
                    "lease {} (token {t}) believed it held again at {:?}, after lease {l} was \
                     granted token {n}",
                    b.lease,
                    rel(s)
                ),
            }),
            _ => {}
        }
        if newest.map_or(true, |(n, _)| t > n) {
            newest = Some((t, b.lease));
        }
    }
    // Grants that were believed at all, in the order they returned.
    let mut held: Vec<&&Belief> = leases.iter().filter(|b| !b.spans.is_empty()).collect();
    held.sort_by_key(|b| b.granted);
    for w in held.windows(2) {
        let (a, b) = (w[0], w[1]);
        let ok = matches!((a.token, b.token), (Some(x), Some(y)) if y > x);
        if !ok {
            out.push(Violation {
                kind: Kind::Fencing,
                name,
                leases: vec![a.lease, b.lease],
                at: b.granted,
                detail: format!(
                    "lease {} granted at {:?} has token {:?}, not greater than {:?} of lease {} \
                     granted at {:?}",
                    b.lease,
                    rel(b.granted),
                    b.token,
                    a.token,
                    a.lease,
                    rel(a.granted)
                ),
            });
        }
    }
}

/// The store itself: an accepted write never carries a token lower than one accepted before.
fn store_order(events: &[Event], rel: &dyn Fn(Instant) -> Duration, out: &mut Vec<Violation>) {
    let mut highest: HashMap<usize, (u64, LeaseId)> = HashMap::new();
    for e in events {
        if let Op::Write {
            lease,
            token: Some(t),
            accepted: true,
        } = e.op
        {
            let h = highest.entry(e.name).or_insert((t, lease));
            if t < h.0 {
                out.push(Violation {
                    kind: Kind::Fencing,
                    name: e.name,
                    leases: vec![h.1, lease],
                    at: e.at,
                    detail: format!(
                        "the store accepted token {t} of lease {lease} at {:?} after token {} \
                         of lease {}",
                        rel(e.at),
                        h.0,
                        h.1
                    ),
                });
            } else {
                *h = (t, lease);
            }
        }
    }
}

fn liveness(
    events: &[Event],
    rules: &Rules,
    by_name: &BTreeMap<usize, Vec<&Belief>>,
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    let start = events.first().map_or(rules.end, |e| e.at);
    let healed = last_heal(events).unwrap_or(start);
    let from = settled(events).unwrap_or(start);
    let due = from + rules.recovery;
    if due <= rules.end {
        let names: Vec<usize> = events
            .iter()
            .filter(|e| e.name != NOBODY)
            .map(|e| e.name)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for name in names {
            let again = by_name
                .get(&name)
                .into_iter()
                .flatten()
                .any(|b| b.granted > from && b.granted <= due);
            if !again {
                let since = if from > healed {
                    format!(
                        "the servers serving again at {:?}, {:?} after the last heal at {:?}",
                        rel(from),
                        from - healed,
                        rel(healed)
                    )
                } else {
                    format!("the last heal at {:?}", rel(healed))
                };
                out.push(Violation {
                    kind: Kind::Liveness,
                    name,
                    leases: vec![],
                    at: due,
                    detail: format!("not granted within {:?} of {since}", rules.recovery),
                });
            }
        }
    }
    // Every acquisition finishes: a client's Acquire is followed by its outcome.
    let mut pending: HashMap<usize, &Event> = HashMap::new();
    for e in events {
        match e.op {
            Op::Acquire => {
                pending.insert(e.client, e);
            }
            Op::Granted { .. } | Op::Refused { .. } | Op::Unknown => {
                pending.remove(&e.client);
            }
            _ => {}
        }
    }
    for (client, e) in pending {
        out.push(Violation {
            kind: Kind::Liveness,
            name: e.name,
            leases: vec![],
            at: e.at,
            detail: format!(
                "client {client}'s acquisition begun at {:?} never finished",
                rel(e.at)
            ),
        });
    }
}

/// When the last fault was healed, if any was.
pub(super) fn last_heal(events: &[Event]) -> Option<Instant> {
    (events.iter())
        .filter(|e| matches!(e.op, Op::Heal { .. }))
        .map(|e| e.at)
        .max()
}

/// Where liveness (d) counts from: when the servers were first seen serving again after the
/// last heal ([`Op::Serving`]), or the last heal if they were not (or serve once healed).
/// `None`: nothing was healed.
pub(super) fn settled(events: &[Event]) -> Option<Instant> {
    let healed = last_heal(events)?;
    let serving = (events.iter())
        .filter(|e| e.op == Op::Serving && e.at >= healed)
        .map(|e| e.at)
        .min();
    Some(serving.unwrap_or(healed))
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
