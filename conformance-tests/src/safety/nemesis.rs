//! The nemesis: faults on a schedule drawn from a seed, each healed later. It breaks the links
//! of the run's faulty clients (blackhole, delay, cut), pauses holders (a GC pause or a
//! stopped VM between a holder's check and its write), and, where the harness gives its
//! [`Servers`], freezes a server (SIGSTOP, then SIGCONT), crashes and restarts one, or, where
//! the members can be partitioned ([`Servers::partition`]), cuts one off from the others, cuts
//! two off from each other, or refuses the connections dialed to one — half the time the
//! leader, where there is one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::history::{History, Op, NOBODY};
use crate::{ClockStep, Fault, Link, Partition, Servers};

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
pub const FAULT_KINDS: [&str; 10] = [
    "blackhole",
    "delay",
    "cut",
    "pause",
    "freeze",
    "restart",
    "partition",
    "bridge",
    "one-way",
    "clock",
];

const PAUSE: usize = 3;
const FREEZE: usize = 4;
const RESTART: usize = 5;
/// One member cut off from the others ([`Partition::Isolate`]).
const PARTITION: usize = 6;
/// Two members cut off from each other ([`Partition::Between`]).
const BRIDGE: usize = 7;
/// Connections dialed to one member refused ([`Partition::Mute`]).
const ONE_WAY: usize = 8;
/// One member's time of day stepped ([`Servers::step_clock`]).
const CLOCK: usize = 9;

/// The nemesis's hold on the run: the clients' links and their pause switches.
pub(super) struct Nemesis {
    pub(super) links: Vec<(usize, Arc<dyn Link>)>,
    pub(super) pauses: Vec<Arc<AtomicBool>>,
    /// Per client: whether it holds a lease right now.
    pub(super) holding: Arc<Vec<AtomicBool>>,
    pub(super) history: Arc<History>,
    pub(super) rng: Rng,
    pub(super) ttl: Duration,
    /// The backend's servers, if the harness gives them.
    pub(super) servers: Option<Arc<dyn Servers>>,
    /// Only these kinds ([`FAULT_KINDS`]); `None`: all the run can inject.
    pub(super) only: Option<&'static [&'static str]>,
    /// Faults injected per kind, in [`FAULT_KINDS`] order.
    pub(super) counts: [u64; FAULT_KINDS.len()],
    /// Server faults that could not be injected or healed (the run is then not what it
    /// claims: the report says so).
    pub(super) errors: Vec<String>,
}

impl Nemesis {
    /// The kinds this run can inject (of those `only` allows): link faults where clients have
    /// links, pauses always, server faults where the harness gives its servers (restarts only where
    /// they keep locks; partitions only where members can be cut off from each other, bridges
    /// only where a third member can hear both sides).
    pub(super) fn kinds(&self) -> Vec<usize> {
        let mut kinds = Vec::new();
        if !self.links.is_empty() {
            kinds.extend([0, 1, 2]);
        }
        kinds.push(PAUSE);
        if let Some(s) = &self.servers {
            if !s.members().is_empty() {
                kinds.push(FREEZE);
                if s.restart_keeps_locks() {
                    kinds.push(RESTART);
                }
                let n = s.members().len();
                if s.can_partition() && n > 1 {
                    kinds.push(PARTITION);
                    if n > 2 {
                        kinds.push(BRIDGE);
                    }
                    kinds.push(ONE_WAY);
                }
                if s.can_step_clock() {
                    kinds.push(CLOCK);
                }
            }
        }
        if let Some(only) = self.only {
            kinds.retain(|k| only.contains(&FAULT_KINDS[*k]));
        }
        kinds
    }

    /// Injects one fault and heals it (except a pause, which the client serves itself).
    pub(super) async fn strike(&mut self) {
        let kinds = self.kinds();
        let Some(&kind) = kinds.get(self.rng.below(kinds.len() as u64) as usize) else {
            return; // none allowed: `fault_kinds` names none this harness can inject
        };
        match kind {
            PAUSE => self.pause(),
            FREEZE | RESTART | PARTITION | BRIDGE | ONE_WAY | CLOCK => {
                self.server_fault(kind).await
            }
            k => self.link_fault(k).await,
        }
    }

    /// Asks a client to stop itself at its next step inside a hold (see the workload), so that
    /// the pause lands where it matters: between a look and a write. A client with a link is
    /// preferred: its renewals stop with it.
    fn pause(&mut self) {
        let linked: Vec<usize> = self.links.iter().map(|(c, _)| *c).collect();
        let c = match self.pick(&linked) {
            Some(c) => c,
            None => self.rng.below(self.pauses.len() as u64) as usize,
        };
        if let Some(p) = self.pauses.get(c) {
            p.store(true, Ordering::Relaxed);
            self.counts[PAUSE] += 1;
        }
    }

    /// Breaks one holding client's link for a while (a cut is healed at once by nature).
    async fn link_fault(&mut self, k: usize) {
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
        // Recorded before it is made: a cut acts at once (a session-bound lock is freed the
        // moment its link drops, and a waiter may be granted it microseconds later), so a
        // record made after it could land after what it caused.
        if fault == Fault::Cut {
            self.history.record(c, NOBODY, Op::Cut);
        }
        link.set(fault);
        self.history.record(
            c,
            NOBODY,
            Op::Fault {
                what: format!("{what} client {c} ({fault:?}) for {lasts:?}"),
            },
        );
        self.counts[k] += 1;
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

    /// Freezes a server for a while, partitions it for a while, steps its clock for a while,
    /// or crashes and restarts it: the leader half the time, where there is one.
    async fn server_fault(&mut self, kind: usize) {
        let Some(servers) = self.servers.clone() else {
            return;
        };
        let members = servers.members();
        let leader = if self.rng.chance(50) {
            servers.leader().await
        } else {
            None
        };
        let i = leader.unwrap_or_else(|| self.rng.below(members.len() as u64) as usize);
        let Some(member) = members.get(i) else {
            return;
        };
        let role = if leader.is_some() { " (leader)" } else { "" };
        let partition = match kind {
            PARTITION => Some(Partition::Isolate(i)),
            BRIDGE => {
                // Any other member: `kinds` offers bridges only with three or more.
                let n = members.len().max(2) as u64;
                Some(Partition::Between(
                    i,
                    (i + 1 + self.rng.below(n - 1) as usize) % n as usize,
                ))
            }
            ONE_WAY => Some(Partition::Mute(i)),
            _ => None,
        };
        // A clock step of 1 TTL to a minute, ahead or behind: far past any lock's end, and
        // back again when it heals (a second step).
        let clock = (kind == CLOCK).then(|| {
            let by = self
                .rng
                .duration(self.ttl, Duration::from_secs(60).max(self.ttl * 2));
            if self.rng.chance(50) {
                ClockStep::Ahead(by)
            } else {
                ClockStep::Behind(by)
            }
        });
        // A partition lasts 1–3 TTLs, mostly long enough for the other side to expire the
        // leases of the struck side's holders; a freeze or a clock step ½–2.
        let lasts = match kind {
            RESTART => None,
            _ if partition.is_some() => Some(self.rng.duration(self.ttl, self.ttl * 3)),
            _ => Some(self.rng.duration(self.ttl / 2, self.ttl * 2)),
        };
        let what = match (lasts, partition) {
            (None, _) => format!("restart server {member}{role}"),
            (Some(lasts), Some(Partition::Between(_, j))) => {
                let other = members.get(j).map_or("?", String::as_str);
                format!(
                    "bridge: servers {member}{role} and {other} cut off from each other for \
                     {lasts:?}"
                )
            }
            (Some(lasts), _) if clock.is_some() => {
                let step = clock.map(|c| c.to_string()).unwrap_or_default();
                format!("clock of server {member}{role} stepped {step} for {lasts:?}")
            }
            (Some(lasts), _) => {
                format!("{} server {member}{role} for {lasts:?}", FAULT_KINDS[kind])
            }
        };
        self.history
            .record(NOBODY, NOBODY, Op::Fault { what: what.clone() });
        self.counts[kind] += 1;
        // Strikes (`true`) or heals a fault that lasts: a freeze or a partition.
        let set = |on: bool| {
            let servers = servers.clone();
            async move {
                match (partition, clock, on) {
                    (Some(p), _, on) => servers.partition(p, on).await,
                    (None, Some(step), true) => servers.step_clock(i, step).await,
                    (None, Some(_), false) => {
                        servers
                            .step_clock(i, ClockStep::Ahead(Duration::ZERO))
                            .await
                    }
                    (None, None, true) => servers.freeze(i).await,
                    (None, None, false) => servers.thaw(i).await,
                }
            }
        };
        let done = match lasts {
            Some(lasts) => match set(true).await {
                Ok(()) => {
                    tokio::time::sleep(lasts).await;
                    set(false).await
                }
                Err(e) => Err(e),
            },
            None => servers.restart(&[i]).await,
        };
        if let Err(e) = done {
            self.errors.push(format!("{what}: {e}"));
        }
        self.history.record(NOBODY, NOBODY, Op::Heal { what });
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

    /// Faults with random gaps until `until`, or until `enough()` says so once at least `at_least`
    /// faults were injected; every fault is healed when this returns. Only the gaps look at the
    /// clock and at `enough`: a strike is never cut short (a server left frozen would outlive the
    /// run), so do not cancel this future either.
    pub(super) async fn run_until(
        &mut self,
        until: Instant,
        at_least: u64,
        enough: impl Fn() -> bool,
    ) {
        loop {
            let gap = self.rng.duration(self.ttl, self.ttl * 3);
            let strike_at = Instant::now() + gap;
            if strike_at >= until {
                return;
            }
            while Instant::now() < strike_at {
                if enough() && self.counts.iter().sum::<u64>() >= at_least {
                    return;
                }
                tokio::time::sleep((self.ttl / 4).min(strike_at - Instant::now())).await;
            }
            self.strike().await;
        }
    }
}
