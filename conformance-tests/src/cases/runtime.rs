//! Runtime hygiene: no call of the driver, and no task it leaves running (a watchdog, a
//! connection's driver, a background release), keeps the thread of the runtime it runs on.
//!
//! The calls run on a current-thread runtime of the case's own, on a thread of its own, beside
//! a ticker task that wakes every millisecond: a poll that blocks the thread (a sleep, a
//! blocking socket or file call, a lock held across a wait) keeps the ticker from running, and
//! the gap it sees names what the driver was doing. A poll that only computes takes
//! microseconds; a blocking wait, as long as what it waits for.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::support::{client, held, opts, sleep, within};
use crate::{fresh_name, Failure, Harness};

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
    let mut attempts = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let stalls = on_a_thread_of_its_own(h)?;
        if stalls.is_empty() {
            if !attempts.is_empty() {
                // Passed, but say what the earlier attempts saw: a pattern here is a lead.
                eprintln!(
                    "runtime::no_call_blocks_the_runtime passed on attempt {attempt} after: {}",
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
fn on_a_thread_of_its_own(h: &dyn Harness) -> Result<Vec<String>, Failure> {
    let t = h.timing();
    let limit = t.ttl * 10 + Duration::from_secs(30);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        s.spawn(move || {
            let _ = tx.send(on_a_runtime_of_its_own(h, limit));
        });
        match rx.recv_timeout(limit + Duration::from_secs(5)) {
            Ok(r) => r,
            Err(_) => {
                eprintln!(
                    "runtime::no_call_blocks_the_runtime: the driver's calls on a current-thread \
                     runtime did not finish within {limit:?}, and the thread does not answer: it \
                     is blocked for good (a blocking wait for another task of the same runtime?). \
                     Exiting: it cannot be stopped from here."
                );
                std::process::exit(101)
            }
        }
    })
}

/// Runs [`calls`] on a new current-thread runtime beside the ticker, for `limit` at most;
/// the stalls it saw.
fn on_a_runtime_of_its_own(h: &dyn Harness, limit: Duration) -> Result<Vec<String>, Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("cannot start a tokio runtime: {e}")))?;
    rt.block_on(async {
        let ticker = Ticker::start().await;
        let done = within(
            limit,
            "the calls on a current-thread runtime",
            calls(h, &ticker),
        )
        .await;
        let stalls = ticker.stop().await;
        done?.map(|()| stalls)
    })
}

/// The calls, each announced to the ticker first.
async fn calls(h: &dyn Harness, ticker: &Ticker) -> Result<(), Failure> {
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

/// A task that wakes every millisecond and notes each gap of [`BLOCKED`] or more, with what
/// the calls were doing during it.
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
            let _ = ticking.send(());
            loop {
                let before = Instant::now();
                tokio::time::sleep(Duration::from_millis(1)).await;
                let gap = before.elapsed();
                if gap >= BLOCKED {
                    let during = during(&lock(&d), before, before + gap);
                    let at = before - started;
                    lock(&s).push(format!("{gap:.0?} during {during} ({at:.0?} in)"));
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
        lock(&self.steps).push((Instant::now(), what));
    }

    async fn stop(self) -> Vec<String> {
        self.task.abort();
        let _ = self.task.await;
        std::mem::take(&mut *lock(&self.stalls))
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

/// The mutex's value, also after a panic elsewhere (the ticker only reads and appends).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
