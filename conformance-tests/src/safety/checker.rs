//! Reads a history and reports every violation of (a) no overlap, (b) fencing, (c) loss before
//! re-grant and (d) liveness, with the operations involved.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use lock_core::Mode;

use super::belief::{beliefs, Belief};
use super::history::{Event, LeaseId, Op, NOBODY};
use super::overlap::overlaps;
pub use super::violation::{Kind, Violation};

/// How long after a cut a grant that was answered on the connection being cut may still be
/// recorded (see [`CUT_NOTICE`]).
const CUT_SETTLE: Duration = Duration::from_millis(1);

/// The one excuse the checker gives, and its width. For a lock that is its connection's
/// session ([`Rules::session_bound`]), a cut of the holder's link frees the lock on the server
/// the moment the server sees the close, and the holder learns of it when its own client sees
/// the same close: nothing orders the two, and the next holder's grant can return first.
///
/// An overlap is that race only if all of these hold: the earlier holder's link was cut (after
/// its grant, give or take a millisecond for a reply already on its way); the later lease's
/// grant — not a belief that starts again — returned after that cut; and the earlier holder's
/// belief ended within `CUT_NOTICE` of the moment this process could first see the cut: the
/// cut, or where the nemesis had a witness on the link ([`Op::CutSeen`]: a plain connection
/// cut with the holder's, after it, read by a thread of its own) when the witness saw it. On a loaded
/// machine the whole process learns of a cut late (a witness up to 112 ms, measured with
/// eight test lanes on two cores); `CUT_NOTICE` is what the driver may add to that, never the
/// machine's load. Anything else, an overlap between two clients neither of which was cut
/// included, is a violation.
///
/// Measured on PostgreSQL (`lock-postgres/tests/faults.rs`, 40 cuts with a waiter queued,
/// 2026-11-24): the holder was Lost at most 1.9 ms after the cut, and the waiter's grant
/// returned first by at most 1.6 ms. 10 ms is that notice with room for the two task wake-ups
/// that record each side on a loaded two-core machine, and no wider: a driver that notices a
/// closed connection only at its next renewal or poll misses it (the negative control
/// `Flaw::SessionLostByPolling` polls every sixth of a 200 ms TTL, the width this excuse had
/// before, and is caught).
pub const CUT_NOTICE: Duration = Duration::from_millis(10);

/// What the checker needs besides the history.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// The driver gives fencing tokens: (b) applies.
    pub fencing: bool,
    /// (d): every name must be granted again, and every client answered by its backend
    /// again, within this long after the last fault healed, or after the servers serve again
    /// where the history says when ([`Op::Serving`]).
    pub recovery: Duration,
    /// When the run stopped issuing operations (open beliefs end here).
    pub end: Instant,
    /// The driver's lock is its connection's session (`outlives_connection = false`): the
    /// cut race of [`CUT_NOTICE`] is counted (see [`cut_races`]), not reported. `false`: every
    /// overlap is a violation.
    pub session_bound: bool,
}

/// Every violation in `events` (time-ordered, as [`History::events`](super::History::events)
/// gives them).
pub fn check(events: &[Event], rules: &Rules) -> Vec<Violation> {
    analyse(events, rules).0
}

/// The overlaps [`CUT_NOTICE`] lets pass, each as long as it lasted: how far the next
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
    let cuts = cuts(events);
    // An overlap from `s` (the later lease's grant) to `re` (the end of the earlier lease
    // `b`'s belief) is the cut race if `b`'s own client was cut after `b`'s grant and before
    // `s`, and `b`'s belief ended within the notice of that cut.
    let raced = |b: &Belief, s: Instant, re: Instant| {
        rules.session_bound
            && cuts.get(&b.client).is_some_and(|at| {
                at.iter().any(|&(c, seen)| {
                    b.granted <= c + CUT_SETTLE && c <= s && re <= seen + CUT_NOTICE
                })
            })
    };
    for (&name, leases) in &by_name {
        overlaps(name, leases, &rel, &raced, &mut out, &mut races);
        if rules.fencing {
            token_order(name, leases, &rel, &mut out);
        }
    }
    store_order(events, &beliefs, &rel, &mut out);
    liveness(events, rules, &by_name, &rel, &mut out);
    observers(events, &rel, &mut out);
    out.sort_by_key(|v| (v.kind, v.at));
    (out, races)
}

/// Each client's cuts, each with the moment the notice counts from: its witness's
/// [`Op::CutSeen`] (the first after it, before the client's next cut), else the cut itself.
fn cuts(events: &[Event]) -> HashMap<usize, Vec<(Instant, Instant)>> {
    let mut cuts: HashMap<usize, Vec<(Instant, Instant)>> = HashMap::new();
    let mut witnessed: HashMap<usize, bool> = HashMap::new();
    for e in events {
        match e.op {
            Op::Cut => {
                cuts.entry(e.client).or_default().push((e.at, e.at));
                witnessed.insert(e.client, false);
            }
            Op::CutSeen if witnessed.get(&e.client) == Some(&false) => {
                if let Some(last) = cuts.get_mut(&e.client).and_then(|c| c.last_mut()) {
                    last.1 = last.1.max(e.at);
                }
                witnessed.insert(e.client, true);
            }
            _ => {}
        }
    }
    cuts
}

fn token_order(
    name: usize,
    leases: &[&Belief],
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    // A belief that starts again (a resurrected lease) after a newer grant of a mode that
    // excludes it holds an old token: its holder writes with a token the newer holder already
    // superseded. (Readers, or permits of one semaphore, hold beside newer grants: no rule.)
    let mut starts: Vec<(Instant, &Belief)> = leases
        .iter()
        .flat_map(|b| b.spans.iter().map(move |&(s, _)| (s, *b)))
        .collect();
    starts.sort_by_key(|s| s.0);
    // The newest token per mode so far, and its lease.
    let mut newest: Vec<(Mode, u64, LeaseId)> = Vec::new();
    for (s, b) in starts {
        let Some(t) = b.token else { continue };
        let superseded = (newest.iter())
            .filter(|(m, _, _)| !Mode::hold_together([*m, b.mode]))
            .map(|&(_, n, l)| (n, l))
            .max();
        match superseded {
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
        match newest.iter_mut().find(|(m, _, _)| *m == b.mode) {
            Some(slot) if t > slot.1 => *slot = (b.mode, t, b.lease),
            Some(_) => {}
            None => newest.push((b.mode, t, b.lease)),
        }
    }
    grant_order(name, leases, rel, out);
}

/// Tokens increase in the order the backend granted, as far as the history shows that order:
/// a lease granted after another returned, where the two modes exclude each other (the later
/// grant came after the earlier hold ended), or where the later one was asked for after the
/// earlier grant returned (readers and permits granted at nearly the same moment may return in
/// either order). And no two leases of a name share a token.
fn grant_order(
    name: usize,
    leases: &[&Belief],
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    // Grants that were believed at all, in the order they returned.
    let mut held: Vec<&Belief> = leases
        .iter()
        .copied()
        .filter(|b| !b.spans.is_empty())
        .collect();
    held.sort_by_key(|b| b.granted);
    // Running maxima: per mode, and over every grant before each point (by return time).
    let mut by_mode: Vec<(Mode, Option<u64>, &Belief)> = Vec::new();
    let mut prefix: Vec<(Instant, Option<u64>, &Belief)> = Vec::new();
    let mut seen: HashMap<u64, LeaseId> = HashMap::new();
    for &b in &held {
        // The newest token of a grant that must precede this one.
        let excluded = (by_mode.iter())
            .filter(|(m, _, _)| !Mode::hold_together([*m, b.mode]))
            .map(|&(_, t, a)| (t, a));
        let before_asked = prefix
            .partition_point(|(g, _, _)| *g < b.asked)
            .checked_sub(1)
            .map(|i| (prefix[i].1, prefix[i].2));
        let must_exceed = excluded
            .chain(before_asked)
            .max_by_key(|(t, _)| t.map_or(u64::MAX, |t| t));
        let clash = match (must_exceed, b.token) {
            (Some((Some(t), a)), Some(y)) if y <= t => Some(a),
            (Some((None, a)), _) | (Some((_, a)), None) => Some(a),
            _ => None,
        };
        if let Some(a) = clash {
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
        } else if let Some(twin) = b.token.and_then(|t| seen.get(&t)) {
            out.push(Violation {
                kind: Kind::Fencing,
                name,
                leases: vec![*twin, b.lease],
                at: b.granted,
                detail: format!(
                    "lease {} granted at {:?} has token {:?}, as lease {twin} has",
                    b.lease,
                    rel(b.granted),
                    b.token
                ),
            });
        }
        if let Some(t) = b.token {
            seen.entry(t).or_insert(b.lease);
        }
        match by_mode.iter_mut().find(|(m, _, _)| *m == b.mode) {
            Some(slot) if b.token > slot.1 => *slot = (b.mode, b.token, b),
            Some(_) => {}
            None => by_mode.push((b.mode, b.token, b)),
        }
        let top = match prefix.last() {
            Some(&(_, t, a)) if t >= b.token => (b.granted, t, a),
            _ => (b.granted, b.token, b),
        };
        prefix.push(top);
    }
}

/// What fencing is for, judged end to end: once the fenced store accepted a write of a lease,
/// it never accepts one of a lease granted earlier (in the history's real-time grant order,
/// which the store never sees: it sees only tokens). A repeated token, a token out of grant
/// order, or a token a lease did not get at its grant lets a superseded holder's write in.
fn store_order(
    events: &[Event],
    beliefs: &HashMap<LeaseId, Belief>,
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    // Per name, the accepted write whose lease was granted latest so far.
    let mut newest: HashMap<usize, (Instant, LeaseId, u64)> = HashMap::new();
    for e in events {
        let Op::Write {
            lease,
            token: Some(t),
            accepted: true,
        } = e.op
        else {
            continue;
        };
        let Some(b) = beliefs.get(&lease) else {
            out.push(Violation {
                kind: Kind::Fencing,
                name: e.name,
                leases: vec![lease],
                at: e.at,
                detail: format!(
                    "the store accepted token {t} at {:?} from lease {lease}, which was never \
                     granted",
                    rel(e.at)
                ),
            });
            continue;
        };
        match newest.get(&e.name) {
            Some(&(g, l, nt)) if b.granted < g => out.push(Violation {
                kind: Kind::Fencing,
                name: e.name,
                leases: vec![l, lease],
                at: e.at,
                detail: format!(
                    "the store accepted a write of lease {lease} (granted at {:?}, token {t}) at \
                     {:?}, after it had accepted one of lease {l} (granted later, at {:?}, \
                     token {nt}): the superseded holder's token did not fence it out",
                    rel(b.granted),
                    rel(e.at),
                    rel(g)
                ),
            }),
            Some(&(g, _, _)) if b.granted == g => {}
            _ => {
                newest.insert(e.name, (b.granted, lease, t));
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
    let since = if from > healed {
        format!(
            "the servers serving again at {:?}, {:?} after the last heal at {:?}",
            rel(from),
            from - healed,
            rel(healed)
        )
    } else if last_heal(events).is_some() {
        format!("the last heal at {:?}", rel(healed))
    } else {
        "the start of the run".to_string()
    };
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
                out.push(Violation::liveness(
                    name,
                    due,
                    format!("not granted within {:?} of {since}", rules.recovery),
                ));
            }
        }
        clients_recover(events, from, rules.end, &since, rel, out);
    }
    // Every acquisition finishes within its bounded wait and the workload's margin: a
    // client's Acquire is followed by its outcome, not by the workload giving up on it.
    let mut pending: HashMap<usize, &Event> = HashMap::new();
    for e in events {
        match e.op {
            Op::Acquire => {
                pending.insert(e.client, e);
            }
            Op::Unknown => {
                let begun = pending.remove(&e.client).map_or(e.at, |a| a.at);
                out.push(Violation::liveness(
                    e.name,
                    e.at,
                    format!(
                        "client {}'s acquisition begun at {:?} had not returned at {:?}, past its \
                         bounded wait and the workload's margin (four TTLs and twice the \
                         slack): the driver overstayed its deadline",
                        e.client,
                        rel(begun),
                        rel(e.at)
                    ),
                ));
            }
            Op::Granted { .. } | Op::Refused { .. } => {
                pending.remove(&e.client);
            }
            _ => {}
        }
    }
    for (client, e) in pending {
        out.push(Violation::liveness(
            e.name,
            e.at,
            format!(
                "client {client}'s acquisition begun at {:?} never finished",
                rel(e.at)
            ),
        ));
    }
}

/// (d) per client: after `from`, every client that asked for a lock again is answered by its
/// backend again before the run ends — a grant, a wait that ran out while others held the
/// name, or a release that succeeded. A client whose every attempt fails (it never
/// reconnected, say) is a violation however well the others do.
fn clients_recover(
    events: &[Event],
    from: Instant,
    end: Instant,
    since: &str,
    rel: &dyn Fn(Instant) -> Duration,
    out: &mut Vec<Violation>,
) {
    let mut seen: BTreeMap<usize, (bool, usize, Option<&Event>)> = BTreeMap::new();
    for e in events.iter().filter(|e| e.client != NOBODY) {
        let entry = seen.entry(e.client).or_insert((false, 0, None));
        if e.at <= from || e.at > end {
            continue;
        }
        match &e.op {
            Op::Granted { .. }
            | Op::Refused {
                timed_out: true, ..
            }
            | Op::Released { ok: true, .. } => entry.0 = true,
            Op::Acquire => entry.1 += 1,
            Op::Refused { .. } | Op::Unknown => entry.2 = Some(e),
            _ => {}
        }
    }
    for (client, (answered, attempts, last)) in seen {
        if answered || attempts == 0 {
            continue;
        }
        let how = match last {
            Some(Event {
                op: Op::Refused { error, .. },
                at,
                ..
            }) => format!("the last refused at {:?}: {error}", rel(*at)),
            Some(e) => format!("the last cancelled at {:?}", rel(e.at)),
            None => "none of them finished".to_string(),
        };
        out.push(Violation::liveness(
            NOBODY,
            end,
            format!(
                "client {client} was not answered by its backend from {} to the end of the run \
                 at {:?}: no grant, no wait that ran out, no release; {attempts} attempts, {how}",
                since,
                rel(end)
            ),
        ));
    }
}

/// (e) Each election observer's showings, per client and name: never a term below the highest
/// it showed, never again a term it saw end (nobody shown after it); no failure; and, when
/// the run stopped watching ([`Op::ObserversStopped`], every lease ended by then), nobody
/// shown.
fn observers(events: &[Event], rel: &dyn Fn(Instant) -> Duration, out: &mut Vec<Violation>) {
    // Per (client, name): the highest term shown, whether nobody was shown since, the last.
    type Shown = (Option<u64>, bool, Option<u64>);
    let mut seen: BTreeMap<(usize, usize), Shown> = BTreeMap::new();
    let observer = |e: &Event, detail: String| Violation {
        kind: Kind::Observer,
        name: e.name,
        leases: vec![],
        at: e.at,
        detail,
    };
    for e in events {
        match &e.op {
            Op::Observed { term, .. } => {
                let (top, ended, last) = seen.entry((e.client, e.name)).or_default();
                if let (Some(t), Some(high)) = (*term, *top) {
                    if t < high || (t == high && *ended) {
                        let why = if t < high {
                            "below"
                        } else {
                            "again, after its end:"
                        };
                        out.push(observer(
                            e,
                            format!(
                                "client {}'s observer showed term {t} at {:?}, {why} term                                  {high}, which it had shown before",
                                e.client,
                                rel(e.at)
                            ),
                        ));
                    }
                }
                match term {
                    Some(t) => {
                        *top = Some(top.map_or(*t, |h| h.max(*t)));
                        *ended = false;
                    }
                    None => *ended = top.is_some(),
                }
                *last = *term;
            }
            Op::ObserverFailed { error } => out.push(observer(
                e,
                format!(
                    "client {}'s observer failed at {:?}: {error}",
                    e.client,
                    rel(e.at)
                ),
            )),
            Op::ObserversStopped => {
                for ((client, name), (_, _, last)) in &seen {
                    if let Some(t) = last {
                        out.push(Violation {
                            kind: Kind::Observer,
                            name: *name,
                            leases: vec![],
                            at: e.at,
                            detail: format!(
                                "client {client}'s observer still showed a leader of term {t} \
                                 when the run stopped watching at {:?}; {}",
                                rel(e.at),
                                last_lease(events, *name, rel)
                            ),
                        });
                    }
                }
            }
            _ => {}
        }
    }
}

/// The evidence for a stale observer: the name's last grant, and how its lease ended.
fn last_lease(events: &[Event], name: usize, rel: &dyn Fn(Instant) -> Duration) -> String {
    let granted = events.iter().rev().find_map(|e| match e.op {
        Op::Granted { lease, token, .. } if e.name == name => Some((e, lease, token)),
        _ => None,
    });
    let Some((g, lease, token)) = granted else {
        return "the name was never granted".into();
    };
    let ended = events.iter().find(
        |e| matches!(e.op, Op::Released { lease: l, .. } | Op::LetGo { lease: l } if l == lease),
    );
    let how = match ended {
        Some(e) => format!("{:?} at {:?}", e.op, rel(e.at)),
        None => "never let go".into(),
    };
    format!(
        "its last grant: lease {lease} of client {} at {:?} (token {token:?}), {how}",
        g.client,
        rel(g.at)
    )
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
