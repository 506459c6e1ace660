//! The workload: independent clients, each a loop over a few names — acquire (bounded wait),
//! hold with auto-renewal while writing to the fenced store, then release (or abandon, or
//! drop) — recorded in a [`History`], under the [`Nemesis`](super::nemesis).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{
    DistributedLock, Fencing, LeaderValue, Lease, LeaseState, LockName, LockOptions, Mode,
};

use super::checker::{analyse, Rules};
use super::family::Family;
use super::history::{History, LeaseId, Op, NOBODY};
use super::nemesis::{Nemesis, Rng, FAULT_KINDS};
use super::observers::Observers;
use super::polled::Polled;
use super::report::{loss_to_signal, Report};
use super::sharing::sharing;
use super::store::FencedStore;
use crate::{fresh_name, Failure, Fault, Harness, Link, Timing};

/// How big a run is.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Independent clients (separate connections or sessions).
    pub clients: usize,
    /// Names they contend for.
    pub names: usize,
    /// Stop once this many grants were made (and the last fault is long healed)...
    pub grants: u64,
    /// ... or after this long, whichever comes first.
    pub limit: Duration,
    /// Seed of every random choice (names, hold times, faults).
    pub seed: u64,
    /// Run the nemesis.
    pub faults: bool,
    /// The longest a holder keeps a lock (each hold is random up to this).
    pub hold: Duration,
    /// Holds (per thousand) that end by abandoning the lease, as a crashed holder would: the
    /// lock stays until its TTL, and every client that picks the name meanwhile waits. Those
    /// waits dominate the run's rate: about `1000 / abandon_per_mille` grants per TTL.
    pub abandon_per_mille: u64,
    /// Holds (per thousand) that end by dropping the lease (freed in the background).
    pub drop_per_mille: u64,
    /// Holds (per thousand) that last one to three TTLs instead of up to `hold`: a long job,
    /// whose lease must be renewed, across the faults, for it to finish.
    pub long_per_mille: u64,
    /// Faults the nemesis injects at least (time allowing), however fast the grants come: a
    /// backend that makes its grants quickly still meets a few faults.
    pub min_faults: u64,
    /// Only these kinds of fault ([`FAULT_KINDS`]), for a run about one of them; `None`: every
    /// kind the harness allows. A name that is not a kind, or kinds of which the harness can
    /// make none, fail the run before it starts.
    pub fault_kinds: Option<&'static [&'static str]>,
    /// Whether the nemesis may also make two server faults at once (`double`), where there
    /// are two members or more: off in the short run (a conformance case, whose faults are
    /// one at a time), on in the soak; `fault_kinds` naming `double` turns it on.
    pub two_at_once: bool,
    /// The modes the clients take the names in ([`Family`]).
    pub family: Family,
    /// How many of the clients without a breakable link share one connection (`1`: none
    /// share). Each still records its own history, one operation at a time; what they share
    /// is the lock object, as tasks of one service do — several leases of one client at once,
    /// renewed by it together, and its waiters of one name queued together.
    pub sharers: usize,
}

impl Workload {
    /// The short run of the conformance suite: 8 clients, 6 names, 2,000 grants and at least
    /// six faults, at most a minute, holds of up to 40 ms, and 5 % long holds (one to three
    /// TTLs, renewed across the faults).
    pub fn short(seed: u64) -> Self {
        Workload {
            clients: 8,
            names: 6,
            grants: 2_000,
            limit: Duration::from_secs(60),
            seed,
            faults: true,
            hold: Duration::from_millis(40),
            abandon_per_mille: 10,
            drop_per_mille: 40,
            long_per_mille: 50,
            min_faults: 6,
            fault_kinds: None,
            two_at_once: false,
            family: Family::Mixed,
            sharers: 1,
        }
    }

    /// A soak: 16 clients over 8 names until `grants` grants (at most three hours), faults on,
    /// holds of up to 20 ms and 5 % long holds (one to three TTLs, renewed across the faults);
    /// 2 ‰ of holds abandoned, 20 ‰ dropped (fewer than the short run, whose abandons would
    /// hold a long run to about a hundred grants per TTL).
    pub fn soak(seed: u64, grants: u64) -> Self {
        Workload {
            clients: 16,
            names: 8,
            grants,
            limit: Duration::from_secs(3 * 3600),
            seed,
            faults: true,
            hold: Duration::from_millis(20),
            abandon_per_mille: 2,
            drop_per_mille: 20,
            long_per_mille: 50,
            min_faults: 0,
            fault_kinds: None,
            two_at_once: true,
            family: Family::Mixed,
            sharers: 1,
        }
    }
}

/// The seed of a run: `DISTLOCK_SAFETY_SEED`, else the clock (the report shows it, and setting
/// it replays the run's schedule).
///
/// ```
/// let seed = conformance_tests::safety::seed();
/// let w = conformance_tests::safety::Workload::short(seed);
/// assert_eq!(w.seed, seed);
/// ```
pub fn seed() -> u64 {
    std::env::var("DISTLOCK_SAFETY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// How long the run waits, after its last heal, for the servers to serve again: a ZooKeeper
/// ensemble's election can take tens of seconds (its members' ticks and limits, not the
/// lock's TTL, time it).
const SERVING_WITHIN: Duration = Duration::from_secs(60);

/// Shared by the clients of one run.
struct Shared {
    history: Arc<History>,
    store: FencedStore,
    names: Vec<LockName>,
    grants: AtomicU64,
    refused: AtomicU64,
    unknown: AtomicU64,
    stale: AtomicU64,
    next_lease: AtomicU64,
    stop: AtomicBool,
    timing: Timing,
    hold: Duration,
    abandon: u64,
    drop: u64,
    long: u64,
    family: Family,
}

/// Runs `w` against `h`'s driver and checks the history.
pub async fn run(h: &dyn Harness, w: &Workload) -> Result<Report, Failure> {
    // A misspelt kind is refused before any client is made.
    let kinds = w.fault_kinds.unwrap_or_default();
    if let Some(bad) = kinds.iter().find(|k| !FAULT_KINDS.contains(k)) {
        return Err(Failure(format!(
            "no fault kind is called {bad:?} (the kinds: {FAULT_KINDS:?})"
        )));
    }
    let timing = h.timing();
    let ttl = timing.ttl;
    let mut clients = Vec::new();
    let mut links = Vec::new();
    for i in 0..w.clients {
        // Every other client sits behind a breakable link, where the harness gives one.
        let faulty = if w.faults && i % 2 == 0 {
            h.faulty_client(Duration::ZERO).await
        } else {
            None
        };
        // Without a link (a cut of a shared link would strike clients it does not name), the
        // clients go in groups of `sharers` on the first one's connection.
        if let Some(first) = sharing(i, faulty.is_some(), w.sharers) {
            if let Some(lock) = clients.get(first).cloned() {
                clients.push(lock);
                continue;
            }
        }
        let lock = match faulty {
            Some(f) => {
                let f = f.map_err(|e| Failure(format!("could not create a faulty client: {e}")))?;
                f.link.set(crate::Fault::Healed);
                links.push((i, Arc::<dyn Link>::from(f.link)));
                f.lock
            }
            None => h
                .client()
                .await
                .map_err(|e| Failure(format!("could not create a client: {e}")))?,
        };
        clients.push(lock);
    }
    let observed = (0..w.names)
        .map(|i| fresh_name(&format!("safety-{i}")))
        .collect::<Vec<_>>();
    let fencing = clients
        .first()
        .is_some_and(|c| c.capabilities().fencing != Fencing::None);
    // A lock that is its connection's session: a cut frees it on the server at once.
    let session_bound = clients
        .first()
        .is_some_and(|c| !c.capabilities().outlives_connection);
    let shared = Arc::new(Shared {
        history: Arc::new(History::default()),
        store: FencedStore::default(),
        names: observed,
        grants: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        unknown: AtomicU64::new(0),
        stale: AtomicU64::new(0),
        next_lease: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        timing,
        hold: w.hold,
        abandon: w.abandon_per_mille,
        drop: w.drop_per_mille,
        long: w.long_per_mille,
        family: w.family,
    });
    let pauses: Vec<Arc<AtomicBool>> = (0..w.clients).map(|_| Arc::default()).collect();
    let holding: Arc<Vec<AtomicBool>> =
        Arc::new((0..w.clients).map(|_| AtomicBool::new(false)).collect());
    let own_links: Vec<Option<Arc<dyn Link>>> = (0..w.clients)
        .map(|i| links.iter().find(|(c, _)| *c == i).map(|(_, l)| l.clone()))
        .collect();
    // The recovery bound (d): a cut-off holder's lock expires within a TTL of the fault, a
    // waiter is woken within the slack; twice that for a loaded machine.
    let recovery = (ttl + timing.slack) * 4;
    let mut nemesis = Nemesis {
        links,
        pauses: pauses.clone(),
        holding: holding.clone(),
        history: shared.history.clone(),
        rng: Rng::new(w.seed),
        ttl,
        servers: if w.faults { h.servers() } else { None },
        only: w.fault_kinds,
        doubles: w.two_at_once || w.fault_kinds.is_some_and(|k| k.contains(&"double")),
        counts: [0; FAULT_KINDS.len()],
        errors: Vec::new(),
    };
    // A run limited to kinds the harness cannot make would quietly make no fault at all.
    if let (true, Some(only)) = (w.faults, w.fault_kinds) {
        if nemesis.kinds().is_empty() {
            return Err(Failure(format!(
                "this harness can make none of the fault kinds {only:?} (partitions need \
                 `Servers::can_partition`, server faults `Harness::servers`, link faults \
                 `Harness::faulty_client`)"
            )));
        }
    }
    let observers = Observers::spawn(&clients, &shared.names, &shared.history);
    let wall_clock = super::wall_clock::WallClockWatch::start();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, lock)| {
            let rng = Rng::new(w.seed ^ (i as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
            let me = Client {
                c: i,
                pause: pauses[i].clone(),
                holding: holding.clone(),
                link: own_links[i].clone(),
            };
            tokio::spawn(client_loop(me, lock, shared.clone(), rng))
        })
        .collect();

    let mut deadline = started + w.limit;
    if w.faults {
        // Faults while grants accumulate, none in the last stretch: (d) needs calm after them.
        let calm_from = deadline.checked_sub(recovery * 2).unwrap_or(started);
        // Three quarters, without overflow: a soak that runs out its time asks for u64::MAX.
        let target = w.grants - w.grants / 4;
        let grants = &shared.grants;
        nemesis
            .run_until(calm_from, w.min_faults, || {
                grants.load(Ordering::Relaxed) >= target
            })
            .await;
        // Liveness counts from when the servers serve again; the run is longer by the wait,
        // so that (d) is still judged.
        let healed = Instant::now();
        nemesis.await_serving(SERVING_WITHIN).await;
        deadline += healed.elapsed();
    }
    let calm_since = Instant::now();
    while Instant::now() < deadline
        && (shared.grants.load(Ordering::Relaxed) < w.grants
            || (w.faults && calm_since.elapsed() < recovery + ttl))
    {
        tokio::time::sleep(ttl / 10).await;
    }
    shared.stop.store(true, Ordering::Relaxed);
    let end = Instant::now();
    // Each acquisition is bounded; a client still busy well after that is stuck, and its open
    // acquisition is reported by the checker.
    let grace = ttl * 8 + timing.slack * 4;
    for t in tasks {
        let _ = tokio::time::timeout(grace, t).await;
    }
    // Every lease ended (released, dropped, or abandoned to its TTL): observers show nobody.
    observers.settle(&shared.history, recovery, ttl / 10).await;
    let clock_steps = wall_clock.stop();
    let events = shared.history.events();
    let (violations, cut_races) = analyse(
        &events,
        &Rules {
            fencing,
            recovery,
            end,
            session_bound,
        },
    );
    let mut faults = BTreeMap::new();
    for (k, n) in FAULT_KINDS.iter().zip(nemesis.counts) {
        faults.insert(*k, n);
    }
    Ok(Report {
        seed: w.seed,
        server_errors: nemesis.errors,
        recovery: super::report::recovery(&events),
        handoff: super::report::handoff(&events),
        grants: shared.grants.load(Ordering::Relaxed),
        refused: shared.refused.load(Ordering::Relaxed),
        unknown: shared.unknown.load(Ordering::Relaxed),
        stale_writes_refused: shared.stale.load(Ordering::Relaxed),
        faults,
        elapsed: started.elapsed(),
        loss_to_signal: loss_to_signal(&events),
        cut_races,
        clock_steps,
        violations,
        events,
    })
}

/// One client of the run: its number, its pause switch, its link if it has one.
struct Client {
    c: usize,
    pause: Arc<AtomicBool>,
    /// Every client's "holds a lease now" flag (this one's is `holding[c]`).
    holding: Arc<Vec<AtomicBool>>,
    link: Option<Arc<dyn Link>>,
}

impl Client {
    fn set_holding(&self, on: bool) {
        if let Some(h) = self.holding.get(self.c) {
            h.store(on, Ordering::Relaxed);
        }
    }

    /// A stopped process, if the nemesis asked for one: nothing of this client happens for
    /// longer than the TTL — its holder stops, and where it has a link, nothing reaches the
    /// backend, so its lease's renewals stop too, as a whole-process pause would stop them.
    async fn maybe_pause(&self, s: &Shared) -> bool {
        if !self.pause.swap(false, Ordering::Relaxed) {
            return false;
        }
        let what = format!("pause client {}", self.c);
        s.history
            .record(self.c, NOBODY, Op::Fault { what: what.clone() });
        if let Some(l) = &self.link {
            l.set(Fault::Blackhole);
        }
        tokio::time::sleep(super::nemesis::pause(s.timing.ttl)).await;
        if let Some(l) = &self.link {
            l.set(Fault::Healed);
        }
        s.history.record(self.c, NOBODY, Op::Heal { what });
        true
    }
}

/// One client: acquire a random name, hold it a while writing to the store, let it go.
async fn client_loop(me: Client, lock: Arc<dyn DistributedLock>, s: Arc<Shared>, mut rng: Rng) {
    let c = me.c;
    let ttl = s.timing.ttl;
    let hold_max = s.hold;
    // A bounded wait, and a limit of our own over it for a driver that overstays it.
    let wait = ttl * 3;
    let limit = wait + ttl * 4 + s.timing.slack * 2;
    let caps = lock.capabilities();
    while !s.stop.load(Ordering::Relaxed) {
        let n = rng.below(s.names.len() as u64) as usize;
        let mode = s.family.mode(n, &caps, &mut rng);
        let mut opts = LockOptions::new(ttl)
            .wait_for(wait)
            .auto_renew(None)
            .mode(mode);
        // Where the driver holds elections, a writer campaigns: its value goes with its grant.
        if let (true, Mode::Exclusive, Ok(v)) =
            (caps.election, mode, LeaderValue::new(format!("c{c}")))
        {
            opts = opts.value(v);
        }
        s.history.record(c, n, Op::Acquire);
        let mut acquiring = Polled::new(lock.acquire(&s.names[n], &opts));
        let lease = match tokio::time::timeout(limit, &mut acquiring).await {
            Err(_) => {
                s.history.record(c, n, Op::Unknown);
                s.unknown.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(Err(e)) => {
                s.history.record(
                    c,
                    n,
                    Op::Refused {
                        error: e.to_string(),
                        timed_out: matches!(e, lock_core::Error::Timeout { .. }),
                    },
                );
                s.refused.fetch_add(1, Ordering::Relaxed);
                // Not a hot loop against a backend that refuses at once.
                tokio::time::sleep(ttl / 20).await;
                continue;
            }
            Ok(Ok(l)) => l,
        };
        let returned = Instant::now();
        let id = s.next_lease.fetch_add(1, Ordering::Relaxed);
        let token = lease.fencing_token().map(|t| t.get());
        s.history.record_at(
            returned,
            c,
            n,
            Op::Granted {
                lease: id,
                token,
                valid_until: lease.valid_until(),
            },
        );
        if mode != Mode::Exclusive {
            s.history
                .record_at(returned, c, n, Op::Mode { lease: id, mode });
        }
        let schedule = acquiring.schedule();
        drop(acquiring);
        s.history.record_at(
            returned,
            c,
            n,
            Op::Polled {
                lease: id,
                woken: schedule.woken,
                polled: schedule.polled,
            },
        );
        s.grants.fetch_add(1, Ordering::Relaxed);
        let lost = lease.lost();
        let history = s.history.clone();
        tokio::spawn(async move {
            lost.wait().await;
            history.record(c, n, Op::LostSignal { lease: id });
        });
        me.set_holding(true);
        // Drawn only where there are long holds: a seed's schedule stays what it was without.
        let span = if s.long > 0 && rng.below(1000) < s.long {
            (ttl, ttl * 3)
        } else {
            (Duration::ZERO, hold_max)
        };
        // Readers and permit holders read: only a writer's token goes to the fenced store.
        let writes = (mode == Mode::Exclusive).then_some(token);
        hold(c, n, id, writes, lease.as_ref(), &s, &me, &mut rng, span).await;
        me.set_holding(false);
        // Now and then a holder crashes (abandon: the lock stays until its TTL) or forgets its
        // lease (drop: freed in the background); most release.
        let ending = rng.below(1000);
        match ending {
            e if e < s.abandon => {
                s.history.record(c, n, Op::LetGo { lease: id });
                lease.abandon();
            }
            e if e < s.abandon + s.drop => {
                s.history.record(c, n, Op::LetGo { lease: id });
                drop(lease);
            }
            _ => {
                s.history.record(c, n, Op::Release { lease: id });
                let ok = tokio::time::timeout(limit, lease.release())
                    .await
                    .is_ok_and(|r| r.is_ok());
                s.history.record(c, n, Op::Released { lease: id, ok });
            }
        }
    }
}

/// Looks at lease `id` (recorded): whether its holder believes it still holds it.
fn look(c: usize, n: usize, id: LeaseId, lease: &dyn Lease, s: &Shared) -> bool {
    let valid_until = lease.valid_until();
    let lost = lease.state() == LeaseState::Lost;
    s.history.record(
        c,
        n,
        Op::Looked {
            lease: id,
            valid_until,
            lost,
        },
    );
    !lost && Instant::now() < valid_until
}

/// Holds lease `id` for a time drawn from `span`: a few writes with `token` (reads where it is
/// `None`: a reader or a permit holder), each after a look at the lease, only while its holder
/// believes it holds. A paused holder stops between its look and its write
/// for longer than the TTL, as a GC pause would, then writes with its old token: the store must
/// refuse it if a newer holder wrote meanwhile.
#[allow(clippy::too_many_arguments)]
async fn hold(
    c: usize,
    n: usize,
    id: LeaseId,
    writes_with: Option<Option<u64>>,
    lease: &dyn Lease,
    s: &Shared,
    me: &Client,
    rng: &mut Rng,
    span: (Duration, Duration),
) {
    let mut writes = 1 + rng.below(3);
    let mut each = rng.duration(span.0, span.1) / writes as u32;
    if !span.0.is_zero() {
        // A long job looks at its lease every quarter TTL, as a careful holder does between
        // steps: a belief kept up by renewals is then on record, whatever they were worth.
        let whole = each * writes as u32;
        writes = (whole.as_millis() / (s.timing.ttl / 4).as_millis().max(1)).max(1) as u64;
        each = whole / writes as u32;
    }
    for _ in 0..writes {
        // Now and then a manual renewal on top of the watchdog's, as a careful user does
        // before a long step; a failed one is the lease telling its holder it is gone.
        if rng.chance(10) {
            let _ = lease.renew().await;
        }
        // One more chance after a look that says it is over, as many holders give it: a
        // renewal that succeeds means the lock is still (or again) theirs — if the driver
        // says so, it had better be true.
        if !look(c, n, id, lease, s) && (lease.renew().await.is_err() || !look(c, n, id, lease, s))
        {
            return;
        }
        if me.maybe_pause(s).await {
            // Back from the pause, a careful holder renews before it goes on; the write
            // below still uses the token it had (the store judges it), as a holder that
            // checked before the pause would.
            let _ = lease.renew().await;
        }
        if let Some(token) = writes_with {
            let accepted = s.store.write(n, token);
            if !accepted {
                s.stale.fetch_add(1, Ordering::Relaxed);
            }
            s.history.record(
                c,
                n,
                Op::Write {
                    lease: id,
                    token,
                    accepted,
                },
            );
        }
        if !each.is_zero() {
            tokio::time::sleep(each).await;
        }
    }
}
