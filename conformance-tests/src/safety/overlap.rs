//! Rule (a) of the checker, with (c) where it shows: the holders of one name at each instant,
//! judged by the lock family's rule ([`Mode::hold_together`]).

use std::time::{Duration, Instant};

use lock_core::Mode;

use super::belief::Belief;
use super::history::LeaseId;
use super::violation::{Kind, Violation};

/// Judges every overlap of belief spans of one name (every pair, not only each span against
/// the one reaching furthest: an excused race must not hide two other clients' overlap), by
/// the lock family's rule ([`Mode::hold_together`]): two holders whose modes exclude each
/// other, or more holders at once than their mode allows (K + 1 permits), is an overlap.
pub(super) fn overlaps(
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
    // The spans not yet over at the current start.
    let mut open: Vec<(Instant, Instant, &Belief)> = Vec::new();
    for span in spans {
        let (s, e, b) = span;
        open.retain(|&(_, re, _)| re > s);
        // Earlier holders this one may hold beside (readers, permits of one semaphore).
        let mut beside = Vec::new();
        for &(rs, re, rb) in &open {
            if rb.lease == b.lease {
                continue;
            }
            if Mode::hold_together([rb.mode, b.mode]) {
                beside.push((rs, re, rb));
                continue;
            }
            if b.granted == s && raced(rb, s, re) {
                races.push(re.min(e) - s);
                continue;
            }
            out.push(Violation {
                kind: Kind::Overlap,
                name,
                leases: vec![rb.lease, b.lease],
                at: s,
                detail: format!(
                    "client {} (lease {}{}, believing {:?}..{:?}) and client {} (lease {}{}, \
                     believing from {:?}) both believed they held it for {:?}",
                    rb.client,
                    rb.lease,
                    mode_note(rb.mode),
                    rel(rs),
                    rel(re),
                    b.client,
                    b.lease,
                    mode_note(b.mode),
                    rel(s),
                    re.min(e) - s
                ),
            });
            // The earlier holder had lost the lock (it had not let go, and its release, if
            // any, failed) yet did not know when the successor's grant returned.
            if lost_unseen(rb, b, s) {
                out.push(loss_not_seen(name, rb, b, s, re, rel));
            }
        }
        if let Some(limit) = b
            .mode
            .limit()
            .filter(|&l| beside.len() as u64 >= u64::from(l))
        {
            // One holder too many: the cut holders' own races are excused, no one else's.
            let (excused, kept): (Vec<_>, Vec<_>) = beside
                .into_iter()
                .partition(|&(_, re, rb)| b.granted == s && raced(rb, s, re));
            races.extend(excused.iter().map(|&(_, re, _)| re.min(e) - s));
            if kept.len() as u64 >= u64::from(limit) {
                let others: Vec<String> = (kept.iter())
                    .map(|(_, re, rb)| {
                        format!(
                            "lease {} of client {} (to {:?})",
                            rb.lease,
                            rb.client,
                            rel(*re)
                        )
                    })
                    .collect();
                let mut ids: Vec<LeaseId> = kept.iter().map(|(_, _, rb)| rb.lease).collect();
                ids.push(b.lease);
                out.push(Violation {
                    kind: Kind::Overlap,
                    name,
                    leases: ids,
                    at: s,
                    detail: format!(
                        "{} holders at once of a name that allows {limit} ({}): client {} \
                         (lease {}) believed it held from {:?} beside {}",
                        kept.len() + 1,
                        b.mode,
                        b.client,
                        b.lease,
                        rel(s),
                        others.join(", ")
                    ),
                });
                // One of them must have lost its permit, and none of them knew.
                if kept.iter().all(|(_, _, rb)| lost_unseen(rb, b, s)) {
                    let (_, re, rb) = kept[0];
                    out.push(loss_not_seen(name, rb, b, s, re, rel));
                }
            }
        }
        open.push(span);
    }
}

/// ", shared" or ", permit of K" after a lease's number; nothing for an exclusive one.
fn mode_note(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => String::new(),
        m => format!(", {m}"),
    }
}

/// `rb` had not let go, nor released successfully, by `b`'s grant at `s`: if it lost the lock,
/// it had not seen it.
fn lost_unseen(rb: &Belief, b: &Belief, s: Instant) -> bool {
    rb.let_go.map_or(true, |g| g > s) && !rb.released_ok && b.granted == s
}

/// Violation (c): `rb`, believing until `re`, still believed it held at `b`'s grant at `s`.
fn loss_not_seen(
    name: usize,
    rb: &Belief,
    b: &Belief,
    s: Instant,
    re: Instant,
    rel: &dyn Fn(Instant) -> Duration,
) -> Violation {
    Violation {
        kind: Kind::LossNotSeen,
        name,
        leases: vec![rb.lease, b.lease],
        at: s,
        detail: format!(
            "lease {} of client {} had not released and still believed it held (lost signal \
             {}, valid until {:?}) when lease {} of client {} was granted at {:?}",
            rb.lease,
            rb.client,
            rb.lost_signal
                .map_or("never".to_string(), |t| format!("at {:?}", rel(t))),
            rel(re),
            b.lease,
            b.client,
            rel(s)
        ),
    }
}
