//! The nemesis: faults on a schedule drawn from a seed, each healed later. It breaks the links
//! of the run's faulty clients (blackhole, delay, cut) and pauses holders (a GC pause or a
//! stopped VM between a holder's check and its write).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::history::{History, Op, NOBODY};
use crate::{Fault, Link};

/// A small deterministic generator (SplitMix64): the same seed gives the same schedule.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// Uniform in `lo..hi`.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_micros().min(u128::from(u64::MAX)) as u64;
        lo + Duration::from_micros(self.below(span.max(1)))
    }

    /// `true` with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// How long a paused client stays stopped: longer than its lease's TTL.
pub(super) fn pause(ttl: Duration) -> Duration {
    ttl + ttl / 2
}

/// Kinds of fault the nemesis injects, for the report.
pub const FAULT_KINDS: [&str; 4] = ["blackhole", "delay", "cut", "pause"];

/// The nemesis's hold on the run: the clients' links and their pause switches.
pub(super) struct Nemesis {
    pub(super) links: Vec<(usize, Arc<dyn Link>)>,
    pub(super) pauses: Vec<Arc<AtomicBool>>,
    /// Per client: whether it holds a lease right now.
    pub(super) holding: Arc<Vec<AtomicBool>>,
    pub(super) history: Arc<History>,
    pub(super) rng: Rng,
    pub(super) ttl: Duration,
    /// Faults injected per kind, in [`FAULT_KINDS`] order.
    pub(super) counts: [u64; 4],
}

impl Nemesis {
    /// Injects one fault and heals it (except a pause, which the client serves itself).
    pub(super) async fn strike(&mut self) {
        // Only pauses when there are no links to break; otherwise any of the four.
        let kind = if self.links.is_empty() {
            3
        } else {
            self.rng.below(4)
        };
        match kind {
            3 => {
                // The client stops itself at its next step inside a hold (see the workload),
                // so that the pause lands where it matters: between a look and a write. A
                // client with a link is preferred: its renewals stop with it.
                let linked: Vec<usize> = self.links.iter().map(|(c, _)| *c).collect();
                let c = match self.pick(&linked) {
                    Some(c) => c,
                    None => self.rng.below(self.pauses.len() as u64) as usize,
                };
                if let Some(p) = self.pauses.get(c) {
                    p.store(true, Ordering::Relaxed);
                    self.counts[3] += 1;
                }
            }
            k => {
                let linked: Vec<usize> = self.links.iter().map(|(c, _)| *c).collect();
                let Some(target) = self.pick(&linked) else {
                    return;
                };
                let Some((c, link)) = self.links.iter().find(|(c, _)| *c == target) else {
                    return;
                };
                let (fault, what, lasts) = match k {
                    0 => (
                        Fault::Blackhole,
                        "blackhole",
                        self.rng.duration(self.ttl / 2, self.ttl * 2),
                    ),
                    1 => {
                        let d = self.rng.duration(
                            Duration::from_millis(2),
                            (self.ttl / 10).max(Duration::from_millis(3)),
                        );
                        (
                            Fault::Delay(d),
                            "delay",
                            self.rng.duration(self.ttl / 2, self.ttl * 2),
                        )
                    }
                    _ => (Fault::Cut, "cut", Duration::ZERO),
                };
                let c = *c;
                link.set(fault);
                self.history.record(
                    c,
                    NOBODY,
                    Op::Fault {
                        what: format!("{what} client {c} ({fault:?}) for {lasts:?}"),
                    },
                );
                self.counts[k as usize] += 1;
                tokio::time::sleep(lasts).await;
                if fault != Fault::Cut {
                    link.set(Fault::Healed);
                }
                self.history.record(
                    c,
                    NOBODY,
                    Op::Heal {
                        what: format!("{what} client {c}"),
                    },
                );
            }
        }
    }

    /// One of `clients`, preferring those that hold a lease right now: a fault that lands
    /// between a client's holds tests little.
    fn pick(&mut self, clients: &[usize]) -> Option<usize> {
        let holding: Vec<usize> = clients
            .iter()
            .copied()
            .filter(|c| {
                self.holding
                    .get(*c)
                    .is_some_and(|h| h.load(Ordering::Relaxed))
            })
            .collect();
        let from = if holding.is_empty() {
            clients
        } else {
            &holding
        };
        from.get(self.rng.below(from.len() as u64) as usize)
            .copied()
    }

    /// Faults with random gaps until `until`; every fault is healed when this returns.
    pub(super) async fn run_until(&mut self, until: Instant) {
        loop {
            let gap = self.rng.duration(self.ttl, self.ttl * 3);
            if Instant::now() + gap >= until {
                return;
            }
            tokio::time::sleep(gap).await;
            self.strike().await;
        }
    }
}
