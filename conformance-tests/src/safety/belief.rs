//! What each holder believed: from its grant's return until the earliest of its release (or
//! let-go), its lost signal and its `valid_until` — the spans the checker compares, and the
//! picture draws.

use std::collections::HashMap;
use std::time::Instant;

use lock_core::Mode;

use super::history::{Event, LeaseId, Op};

/// One lease's belief: the spans during which its holder believed it held the lock.
#[derive(Debug)]
pub(super) struct Belief {
    pub(super) lease: LeaseId,
    pub(super) client: usize,
    pub(super) name: usize,
    pub(super) granted: Instant,
    /// When its client asked for it (its last `Acquire` before the grant).
    pub(super) asked: Instant,
    pub(super) token: Option<u64>,
    /// How it held: exclusive unless an [`Op::Mode`] says otherwise.
    pub(super) mode: Mode,
    pub(super) spans: Vec<(Instant, Instant)>,
    /// Release or let-go, if the holder ended it itself.
    pub(super) let_go: Option<Instant>,
    /// Its release returned `Ok`: it really held until then.
    pub(super) released_ok: bool,
    pub(super) lost_signal: Option<Instant>,
}

/// One span of belief, for pictures: `(client, name, from, to)`.
pub(super) type Span = (usize, usize, Instant, Instant);

/// Every belief span in `events` (see [`beliefs`]), in no order.
pub(super) fn belief_spans(events: &[Event], end: Instant) -> Vec<Span> {
    beliefs(events, end)
        .values()
        .flat_map(|b| b.spans.iter().map(|&(s, e)| (b.client, b.name, s, e)))
        .collect()
}

/// Each lease's belief spans: from the grant's return until the earliest of its release (or
/// let-go), its lost signal and its `valid_until`; a look that finds the lease valid again
/// after that (a resurrection) opens a new span.
pub(super) fn beliefs(events: &[Event], end: Instant) -> HashMap<LeaseId, Belief> {
    let mut out: HashMap<LeaseId, Belief> = HashMap::new();
    // Per lease: the open span's start and its current end (valid_until).
    let mut open: HashMap<LeaseId, (Instant, Instant)> = HashMap::new();
    let close = |b: &mut Belief, open: &mut HashMap<LeaseId, (Instant, Instant)>, at: Instant| {
        if let Some((s, until)) = open.remove(&b.lease) {
            let e = at.min(until);
            if e > s {
                b.spans.push((s, e));
            }
        }
    };
    let mut asked: HashMap<usize, Instant> = HashMap::new();
    for e in events {
        match &e.op {
            Op::Acquire => {
                asked.insert(e.client, e.at);
            }
            Op::Granted {
                lease,
                token,
                valid_until,
            } => {
                out.insert(
                    *lease,
                    Belief {
                        lease: *lease,
                        client: e.client,
                        name: e.name,
                        granted: e.at,
                        asked: asked.get(&e.client).copied().unwrap_or(e.at),
                        token: *token,
                        mode: Mode::Exclusive,
                        spans: Vec::new(),
                        let_go: None,
                        released_ok: false,
                        lost_signal: None,
                    },
                );
                open.insert(*lease, (e.at, *valid_until));
            }
            Op::Looked {
                lease,
                valid_until,
                lost,
            } => {
                let Some(b) = out.get_mut(lease) else {
                    continue;
                };
                if b.let_go.is_some() {
                    continue;
                }
                match open.get_mut(lease) {
                    Some((_, until)) if e.at < *until => {
                        if *lost {
                            close(b, &mut open, e.at);
                        } else {
                            *until = (*until).max(*valid_until);
                        }
                    }
                    Some(_) => {
                        // Its own valid_until passed before this look: that span is over.
                        close(b, &mut open, e.at);
                        if !lost && *valid_until > e.at {
                            open.insert(*lease, (e.at, *valid_until));
                        }
                    }
                    None if !lost && *valid_until > e.at => {
                        open.insert(*lease, (e.at, *valid_until));
                    }
                    None => {}
                }
            }
            Op::Mode { lease, mode } => {
                if let Some(b) = out.get_mut(lease) {
                    b.mode = *mode;
                }
            }
            Op::LostSignal { lease } => {
                if let Some(b) = out.get_mut(lease) {
                    b.lost_signal.get_or_insert(e.at);
                    close(b, &mut open, e.at);
                }
            }
            Op::Released { lease, ok: true } => {
                if let Some(b) = out.get_mut(lease) {
                    b.released_ok = true;
                }
            }
            Op::Release { lease } | Op::LetGo { lease } => {
                if let Some(b) = out.get_mut(lease) {
                    b.let_go.get_or_insert(e.at);
                    close(b, &mut open, e.at);
                }
            }
            _ => {}
        }
    }
    for b in out.values_mut() {
        close(b, &mut open, end);
    }
    out
}
