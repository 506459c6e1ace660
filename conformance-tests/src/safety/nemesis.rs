//! The nemesis: faults on a schedule drawn from a seed, each healed later. It breaks the links
//! of the run's faulty clients (blackhole, delay, cut), pauses holders (a GC pause or a
//! stopped VM between a holder's check and its write), and, where the harness gives its
//! [`Servers`], freezes a server (SIGSTOP, then SIGCONT), crashes and restarts one, or, where
//! the members can be partitioned ([`Servers::partition`]), cuts one off from the others, cuts
//! two off from each other, or refuses the connections dialed to one, or steps one's clock
//! ([`Servers::step_clock`]) — half the time the leader, where there is one — or makes two of
//! these server faults at once, on two members.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::history::{History, Op, NOBODY};
use crate::{BoxError, ClockStep, Fault, Link, Partition, Servers};

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
pub const FAULT_KINDS: [&str; 11] = [
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
    "double",
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
/// Two of the server faults above at once, on two members.
const DOUBLE: usize = 10;

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
    /// Whether two server faults at once may be drawn ([`Workload::two_at_once`]).
    ///
    /// [`Workload::two_at_once`]: super::Workload::two_at_once
    pub(super) doubles: bool,
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
                if n > 1 && self.doubles {
                    kinds.push(DOUBLE);
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
            DOUBLE => self.two_server_faults().await,
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
            let mut witness = link.witness();
            if let Some(w) = witness.as_mut() {
                if !w.armed().await {
                    witness = None;
                }
            }
            self.history.record(c, NOBODY, Op::Cut);
            link.set(fault);
            if let Some(seen) = witness {
                if let Some(at) = seen.seen().await {
                    self.history.record_at(at, c, NOBODY, Op::CutSeen);
                }
            }
        } else {
            link.set(fault);
        }
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
        let leader = servers.leader().await;
        let i = self.aim(leader, members.len());
        let strike = self.plan(kind, i, leader == Some(i), &members, "");
        if let Err(e) = strike.run(&*servers, &self.history, Duration::ZERO).await {
            self.errors.push(e);
        }
    }

    /// Two server faults on two members at once: a second one struck while the first is in
    /// force (a partition during a freeze, two members muted, a restart while another is
    /// frozen), each healed when its own time is up, in whichever order that makes. The first
    /// strikes the leader half the time; each is counted under its own kind too.
    async fn two_server_faults(&mut self) {
        let Some(servers) = self.servers.clone() else {
            return;
        };
        let members = servers.members();
        let n = members.len() as u64;
        if n < 2 {
            return; // `kinds` offers this only with two members or more
        }
        let leader = servers.leader().await;
        let i = self.aim(leader, members.len());
        let j = (i + 1 + self.rng.below(n - 1) as usize) % n as usize;
        let lasting = self.lasting_kinds(&*servers);
        let mut second = lasting.clone();
        if servers.restart_keeps_locks() {
            second.push(RESTART);
        }
        let first_kind = lasting[self.rng.below(lasting.len() as u64) as usize];
        let second_kind = second[self.rng.below(second.len() as u64) as usize];
        let first = self.plan(
            first_kind,
            i,
            leader == Some(i),
            &members,
            " (1 of 2 at once)",
        );
        let second = self.plan(
            second_kind,
            j,
            leader == Some(j),
            &members,
            " (2 of 2 at once)",
        );
        // Struck while the first is in force: within its first half.
        let after = self
            .rng
            .duration(Duration::ZERO, first.lasts.unwrap_or(self.ttl) / 2);
        self.counts[DOUBLE] += 1;
        let history = &self.history;
        let (a, b) = tokio::join!(
            first.run(&*servers, history, Duration::ZERO),
            second.run(&*servers, history, after)
        );
        self.errors.extend([a.err(), b.err()].into_iter().flatten());
    }

    /// The member to strike of `n`: the `leader` half the time, where there is one; any
    /// member otherwise. (The leader is asked every time, so that a history says "(leader)"
    /// whenever the struck member led, drawn or not.)
    fn aim(&mut self, leader: Option<usize>, n: usize) -> usize {
        match leader.filter(|_| self.rng.chance(50)) {
            Some(l) => l,
            None => self.rng.below(n as u64) as usize,
        }
    }

    /// The server faults that last a while (freeze, and partitions and clock steps where the
    /// servers can make them), for two at once. Bridges are left out: they strike two members
    /// themselves.
    fn lasting_kinds(&self, servers: &dyn Servers) -> Vec<usize> {
        let mut kinds = vec![FREEZE];
        if servers.can_partition() {
            kinds.extend([PARTITION, ONE_WAY]);
        }
        if servers.can_step_clock() {
            kinds.push(CLOCK);
        }
        kinds
    }

    /// Draws one server fault of `kind` on member `i` (`leader`: it leads), and counts it;
    /// `note` ends its description.
    fn plan(
        &mut self,
        kind: usize,
        i: usize,
        leader: bool,
        members: &[String],
        note: &str,
    ) -> Strike {
        let member = members.get(i).map_or("?", String::as_str);
        let role = if leader { " (leader)" } else { "" };
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
        self.counts[kind] += 1;
        Strike {
            i,
            partition,
            clock,
            lasts,
            what: format!("{what}{note}"),
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
                // A double's parts are counted under their own kinds: not twice here.
                let made = self.counts.iter().sum::<u64>() - self.counts[DOUBLE];
                if enough() && made >= at_least {
                    return;
                }
                tokio::time::sleep((self.ttl / 4).min(strike_at - Instant::now())).await;
            }
            self.strike().await;
        }
    }

    /// After the last heal: waits up to `limit` for the servers to serve their clients again
    /// ([`Servers::serving`]) and records when they first do ([`Op::Serving`]). Records
    /// nothing without servers to ask, or if they do not serve by then (liveness then counts
    /// from the heal, and fails).
    pub(super) async fn await_serving(&mut self, limit: Duration) {
        let Some(servers) = self.servers.clone() else {
            return;
        };
        let until = Instant::now() + limit;
        let poll = (self.ttl / 10).max(Duration::from_millis(20));
        loop {
            if servers.serving().await {
                self.history.record(NOBODY, NOBODY, Op::Serving);
                return;
            }
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep(poll).await;
        }
    }
}

/// One server fault, drawn ([`Nemesis::plan`]) and not yet made.
struct Strike {
    /// The struck member.
    i: usize,
    partition: Option<Partition>,
    clock: Option<ClockStep>,
    /// How long it lasts; `None`: a crash and restart, over once the server is back.
    lasts: Option<Duration>,
    /// Its description in the history (the heal's too, which pairs them).
    what: String,
}

impl Strike {
    /// Makes it `after` from now, records it, and heals it when its time is up. Not cut
    /// short: a server left frozen or cut off would outlive the run.
    async fn run(
        &self,
        servers: &dyn Servers,
        history: &History,
        after: Duration,
    ) -> Result<(), String> {
        tokio::time::sleep(after).await;
        history.record(
            NOBODY,
            NOBODY,
            Op::Fault {
                what: self.what.clone(),
            },
        );
        let done = match self.lasts {
            Some(lasts) => match self.set(servers, true).await {
                Ok(()) => {
                    tokio::time::sleep(lasts).await;
                    self.set(servers, false).await
                }
                Err(e) => Err(e),
            },
            None => servers.restart(&[self.i]).await,
        };
        history.record(
            NOBODY,
            NOBODY,
            Op::Heal {
                what: self.what.clone(),
            },
        );
        done.map_err(|e| format!("{}: {e}", self.what))
    }

    /// Strikes (`on`) or heals a fault that lasts: a freeze, a partition or a clock step.
    async fn set(&self, servers: &dyn Servers, on: bool) -> Result<(), BoxError> {
        match (self.partition, self.clock, on) {
            (Some(p), _, on) => servers.partition(p, on).await,
            (None, Some(step), true) => servers.step_clock(self.i, step).await,
            (None, Some(_), false) => {
                servers
                    .step_clock(self.i, ClockStep::Ahead(Duration::ZERO))
                    .await
            }
            (None, None, true) => servers.freeze(self.i).await,
            (None, None, false) => servers.thaw(self.i).await,
        }
    }
}
