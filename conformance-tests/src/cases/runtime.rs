//! Runtime hygiene: no call of the driver, and no task it leaves running (a watchdog, a
//! connection's driver, a background release), keeps the thread of the runtime it runs on.
//!
//! The calls run on a current-thread runtime of the case's own, on a thread of its own, beside
//! a ticker task that wakes every millisecond: a poll that blocks the thread (a sleep, a
//! blocking socket or file call, a lock held across a wait) keeps the ticker from running, and
//! the gap it sees names what the driver was doing. A poll that only computes takes
//! microseconds; a blocking wait, as long as what it waits for.
//!
//! The time the thread spent waiting for a CPU is not the driver's: on a loaded machine (the
//! test lanes run eight binaries on two cores) the scheduler alone can leave a runnable thread
//! aside for 50 ms. Where Linux reports it (`/proc/thread-self/schedstat`, the run-queue delay),
//! a gap counts without that wait; what remains is time the thread ran or slept in a call.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::support::{client, faulty, held, opts, sleep, within};
use crate::{fresh_name, Failure, Fault, Harness};

/// A gap in the ticker longer than this is a blocked thread: far above a poll that computes
/// or a scheduler's time slice, below a blocking wait for a server, a file lock or a sleep.
const BLOCKED: Duration = Duration::from_millis(50);

/// Attempts before the case fails: a blocking driver blocks in every one, while a thread the
/// operating system set aside for a moment on a loaded machine does not do so three times.
const ATTEMPTS: usize = 3;

/// Connecting, `try_acquire`, `inspect`, `renew`, a waiting `acquire` woken by a `release`, a
/// dropped lease (released in the background), a lease its watchdog renews for a TTL, an
/// `abandon` and dropping the clients: none of them keeps the runtime's thread for 50 ms or
/// more. A driver that blocks there stalls every other task of an application on a
/// current-thread runtime (or one worker's of a multi-thread one), its other leases'
/// watchdogs among them. Blocking I/O and sleeps belong in `spawn_blocking` or in async calls.
pub async fn no_call_blocks_the_runtime(h: &dyn Harness) -> Result<(), Failure> {
    no_stall_in(h, Calls::Healthy)
}

/// The same promise where drivers have their other code paths: reconnecting after the
/// connection was cut (a renewal, a grant, a release), requests into a blackholed link that
/// end at the request timeout, a renewal and a waiting `acquire` over a slow link, and a
/// watchdog whose renewals fail. A driver that dials, resolves or waits blocking only when
/// things go wrong passes the healthy case and stalls its application exactly when the
/// backend is in trouble. Needs [`Harness::faulty_client`].
pub async fn no_call_blocks_the_runtime_under_faults(h: &dyn Harness) -> Result<(), Failure> {
    no_stall_in(h, Calls::UnderFaults)
}

/// Which calls an attempt makes.
#[derive(Clone, Copy)]
enum Calls {
    Healthy,
    UnderFaults,
}

impl Calls {
    /// The case that makes them, for the messages.
    fn case(self) -> &'static str {
        match self {
            Calls::Healthy => super::case_name!(runtime::no_call_blocks_the_runtime),
            Calls::UnderFaults => {
                super::case_name!(runtime::no_call_blocks_the_runtime_under_faults)
            }
        }
    }
}

/// Up to [`ATTEMPTS`] attempts of `calls`; fails if every one saw a stall.
fn no_stall_in(h: &dyn Harness, calls: Calls) -> Result<(), Failure> {
    let mut attempts = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let stalls = on_a_thread_of_its_own(h, calls)?;
        if stalls.is_empty() {
            if !attempts.is_empty() {
                // Passed, but say what the earlier attempts saw: a pattern here is a lead.
                eprintln!(
                    "{} passed on attempt {attempt} after: {}",
                    calls.case(),
                    attempts.join("; ")
                );
            }
            return Ok(());
        }
        attempts.push(format!("attempt {attempt}: {}", stalls.join(", ")));
    }
    Err(Failure(format!(
        "the driver kept the thread of a current-thread runtime for {BLOCKED:?} or more (no \
         tick of a task that wakes every millisecond) in each of {ATTEMPTS} attempts: a \
         blocking call in a poll or in a task it spawned ({})",
        attempts.join("; ")
    )))
}

/// Runs [`calls`] on a new current-thread runtime on a thread of its own (so a stall cannot
/// touch the runner's runtime, nor the runner's tasks pass for the driver's), beside the
/// ticker; the stalls it saw. This blocks the calling thread until then.
///
/// A driver that blocks that thread for good (it waits, blocking, for something only another
/// task on the same thread could bring) cannot be stopped from outside: after the case's time
/// limit the process exits with the failure, rather than hanging the run.
fn on_a_thread_of_its_own(h: &dyn Harness, calls: Calls) -> Result<Vec<String>, Failure> {
    let t = h.timing();
    let limit = t.ttl * 10 + Duration::from_secs(30);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        s.spawn(move || {
            let _ = tx.send(on_a_runtime_of_its_own(h, calls, limit));
        });
        match rx.recv_timeout(limit + Duration::from_secs(5)) {
            Ok(r) => r,
            Err(_) => {
                eprintln!(
                    "{}: the driver's calls on a current-thread \
                     runtime did not finish within {limit:?}, and the thread does not answer: it \
                     is blocked for good (a blocking wait for another task of the same runtime?). \
                     Exiting: it cannot be stopped from here.",
                    calls.case()
                );
                std::process::exit(101)
            }
        }
    })
}

/// Runs [`calls`] on a new current-thread runtime beside the ticker, for `limit` at most;
/// the stalls it saw.
fn on_a_runtime_of_its_own(
    h: &dyn Harness,
    calls: Calls,
    limit: Duration,
) -> Result<Vec<String>, Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("cannot start a tokio runtime: {e}")))?;
    rt.block_on(async {
        let ticker = Ticker::start().await;
        let run = async {
            match calls {
                Calls::Healthy => healthy(h, &ticker).await,
                Calls::UnderFaults => under_faults(h, &ticker).await,
            }
        };
        let done = within(limit, "the calls on a current-thread runtime", run).await;
        let stalls = ticker.stop().await;
        done?.map(|()| stalls)
    })
}

/// The calls on healthy servers, each announced to the ticker first.
async fn healthy(h: &dyn Harness, ticker: &Ticker) -> Result<(), Failure> {
    let t = h.timing();
    ticker.doing("connecting (Harness::client)");
    let (a, b) = (client(h).await?, client(h).await?);
    let name = fresh_name("no-block");
    ticker.doing("try_acquire");
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    if a.capabilities().inspect {
        ticker.doing("inspect");
        a.inspect(&name).await?;
    }
    ticker.doing("renew");
    lease.renew().await?;
    ticker.doing("a waiting acquire");
    let waiter = {
        let (b, name, o) = (b.clone(), name.clone(), opts(h).wait_for(t.ttl * 3));
        tokio::spawn(async move { b.acquire(&name, &o).await })
    };
    sleep(Duration::from_millis(50)).await;
    ticker.doing("release, with a waiter");
    lease.release().await?;
    ticker.doing("the waiter's grant");
    let next = within(t.ttl * 3 + t.slack, "the waiter after a release", waiter)
        .await?
        .map_err(|e| Failure(format!("the waiter's task failed: {e}")))??;
    ticker.doing("dropping a lease (released in the background)");
    drop(next);
    sleep(Duration::from_millis(50)).await;
    ticker.doing("a lease renewed by its watchdog for a TTL");
    let other = fresh_name("no-block-auto");
    let auto = held(
        a.try_acquire(&other, &opts(h).auto_renew(None)).await?,
        "auto-renewed holder",
    )?;
    sleep(t.ttl).await;
    ticker.doing("release of the auto-renewed lease");
    auto.release().await?;
    ticker.doing("abandon");
    let third = fresh_name("no-block-abandon");
    held(a.try_acquire(&third, &opts(h)).await?, "a lease to abandon")?.abandon();
    ticker.doing("dropping the clients");
    drop((a, b));
    sleep(Duration::from_millis(50)).await;
    Ok(())
}

/// The calls through a link the case breaks, each announced to the ticker first. Their
/// results are not judged (a renewal after a cut may be refused; a request into a blackhole
/// fails): only the thread is.
async fn under_faults(h: &dyn Harness, ticker: &Ticker) -> Result<(), Failure> {
    let t = h.timing();
    ticker.doing("connecting through a link (Harness::faulty_client)");
    let f = faulty(h, Duration::ZERO).await?;
    let name = fresh_name("no-block-faults");
    ticker.doing("try_acquire through the link");
    let lease = held(f.lock.try_acquire(&name, &opts(h)).await?, "holder")?;
    ticker.doing("renew after the connection was cut (a reconnect)");
    f.link.set(Fault::Cut);
    let _ = lease.renew().await;
    ticker.doing("try_acquire after a cut");
    f.link.set(Fault::Cut);
    let other = fresh_name("no-block-faults-2");
    if let Ok(Some(l)) = f.lock.try_acquire(&other, &opts(h)).await {
        ticker.doing("release after a cut");
        f.link.set(Fault::Cut);
        let _ = l.release().await;
    }
    // Up to the request timeout each, bounded here so a driver that hangs costs a TTL, not
    // the case (hanging is the `faults` cases' business).
    let bound = t.ttl + t.slack;
    ticker.doing("renew into a blackholed link");
    f.link.set(Fault::Blackhole);
    let _ = tokio::time::timeout(bound, lease.renew()).await;
    ticker.doing("try_acquire into a blackholed link");
    let third = fresh_name("no-block-faults-3");
    let _ = tokio::time::timeout(bound, f.lock.try_acquire(&third, &opts(h))).await;
    ticker.doing("a watchdog whose renewals fail (blackholed)");
    f.link.set(Fault::Healed);
    let fourth = fresh_name("no-block-faults-4");
    // Just healed from a blackhole: a client still reconnecting may refuse for a while.
    let mut auto = None;
    let until = Instant::now() + t.ttl * 2;
    while auto.is_none() && Instant::now() < until {
        match f.lock.try_acquire(&fourth, &opts(h).auto_renew(None)).await {
            Ok(Some(l)) => auto = Some(l),
            _ => sleep(Duration::from_millis(50)).await,
        }
    }
    let auto = auto.ok_or_else(|| {
        Failure(format!(
            "a free lock was not granted within {:?} of the link healing from a blackhole, so \
             the watchdog's step could not run",
            t.ttl * 2
        ))
    })?;
    f.link.set(Fault::Blackhole);
    sleep(t.ttl / 2).await;
    ticker.doing("healing the link under a watchdog");
    f.link.set(Fault::Healed);
    sleep(t.ttl / 4).await;
    ticker.doing("release after the watchdog's failures");
    let _ = auto.release().await;
    ticker.doing("a slow link (each chunk 60 ms late): renew, a waiting acquire, release");
    f.link.set(Fault::Delay(Duration::from_millis(60)));
    let _ = lease.renew().await;
    let waiter = {
        let (lock, name, o) = (f.lock.clone(), name.clone(), opts(h).wait_for(t.ttl));
        tokio::spawn(async move { lock.acquire(&name, &o).await })
    };
    sleep(Duration::from_millis(100)).await;
    let _ = lease.release().await;
    let _ = within(t.ttl * 2 + t.slack, "the waiter over a slow link", waiter).await;
    ticker.doing("dropping a faulty client and its link");
    f.link.set(Fault::Healed);
    drop(f);
    sleep(Duration::from_millis(50)).await;
    Ok(())
}

/// A task that wakes every millisecond and notes each gap of [`BLOCKED`] or more, not counting
/// the time its thread waited for a CPU, with what the calls were doing during it.
struct Ticker {
    /// When each of the calls' steps began, in order.
    steps: Arc<Mutex<Vec<(Instant, &'static str)>>>,
    stalls: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Ticker {
    /// Starts the ticker and returns once it ticks, so that a stall in the first call counts.
    async fn start() -> Self {
        let steps = Arc::new(Mutex::new(vec![(Instant::now(), "starting")]));
        let stalls = Arc::new(Mutex::new(Vec::new()));
        let (d, s) = (steps.clone(), stalls.clone());
        let (ticking, first) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            // Opened here: the ticker runs on the runtime's one thread, the thread it measures.
            let queue = RunQueue::of_this_thread();
            let _ = ticking.send(());
            let mut waited_before = queue.waited();
            loop {
                let before = Instant::now();
                tokio::time::sleep(Duration::from_millis(1)).await;
                let gap = before.elapsed();
                if gap < BLOCKED {
                    waited_before = queue.waited();
                    continue;
                }
                let waited_after = queue.waited();
                let waited = waited_after.saturating_sub(waited_before).min(gap);
                waited_before = waited_after;
                if gap - waited >= BLOCKED {
                    let during = during(&d.lock(), before, before + gap);
                    let at = before - started;
                    s.lock().push(format!(
                        "{gap:.0?} during {during} ({at:.0?} in; {waited:.0?} of it waiting for \
                         a CPU)"
                    ));
                }
            }
        });
        let _ = first.await;
        Ticker {
            steps,
            stalls,
            task,
        }
    }

    fn doing(&self, what: &'static str) {
        self.steps.lock().push((Instant::now(), what));
    }

    async fn stop(self) -> Vec<String> {
        self.task.abort();
        let _ = self.task.await;
        std::mem::take(&mut *self.stalls.lock())
    }
}

/// The time a thread has spent runnable but waiting for a CPU, read from
/// `/proc/thread-self/schedstat` (its second field, nanoseconds): zero where the system does
/// not report it, so that every gap counts whole there.
struct RunQueue(Option<std::fs::File>);

impl RunQueue {
    /// The calling thread's: the file names the thread that opens it.
    fn of_this_thread() -> Self {
        RunQueue(std::fs::File::open("/proc/thread-self/schedstat").ok())
    }

    /// The run-queue delay so far. Read again from offset 0: the kernel writes the figures
    /// afresh on each read. A quick read of a kernel counter, not a wait for a device.
    fn waited(&self) -> Duration {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.0 else {
            return Duration::ZERO;
        };
        let mut buf = [0u8; 96];
        let n = file.read_at(&mut buf, 0).unwrap_or(0);
        let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
        let ns = text.split_whitespace().nth(1).and_then(|f| f.parse().ok());
        Duration::from_nanos(ns.unwrap_or(0))
    }
}

/// The steps under way at some time in `from..to`: the one begun last before `from`, and
/// those begun in between.
fn during(steps: &[(Instant, &'static str)], from: Instant, to: Instant) -> String {
    let first = steps.iter().rposition(|(at, _)| *at <= from).unwrap_or(0);
    let names: Vec<&str> = (steps[first..].iter())
        .take_while(|(at, _)| *at < to)
        .map(|(_, what)| *what)
        .collect();
    names.join(" / ")
}

#[cfg(test)]
mod tests {
    use super::RunQueue;
    use std::time::{Duration, Instant};

    /// The exemption covers waiting for a CPU and nothing else: a thread asleep in a call
    /// (what a blocking driver does) gains no run-queue delay, so its gap counts whole.
    #[test]
    fn sleeping_in_a_call_is_not_waiting_for_a_cpu() {
        let queue = RunQueue::of_this_thread();
        let before = queue.waited();
        std::thread::sleep(Duration::from_millis(200));
        let waited = queue.waited() - before;
        assert!(
            waited < Duration::from_millis(50),
            "200 ms asleep were counted as {waited:?} of waiting for a CPU"
        );
    }

    /// Where Linux reports it, a thread among many more busy threads than cores waits for a
    /// CPU most of the time, and the reading says so (not its time on a CPU, the file's
    /// first field, which would be a small share): without it every gap on a loaded machine
    /// would count whole.
    #[cfg(target_os = "linux")]
    #[test]
    fn competing_for_a_cpu_is_seen() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let busy = cores * 7;
        let spin = |for_: Duration| {
            let until = Instant::now() + for_;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        };
        let queue = RunQueue::of_this_thread();
        let (before, began) = (queue.waited(), Instant::now());
        std::thread::scope(|s| {
            for _ in 0..busy {
                s.spawn(|| spin(Duration::from_millis(400)));
            }
            spin(Duration::from_millis(400));
        });
        let (waited, took) = (queue.waited() - before, began.elapsed());
        assert!(
            waited >= took / 2,
            "{took:?} among {busy} busy threads on {cores} cores (a share of about {:.0} %), \
             yet only {waited:?} waiting for a CPU reported: is /proc/thread-self/schedstat \
             missing, or its wrong field read?",
            100.0 * cores as f64 / (busy + 1) as f64
        );
    }
}
