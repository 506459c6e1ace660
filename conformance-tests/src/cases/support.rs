//! The toolbox the cases share: clients, options, bounded waits that fail naming the promise.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Lease, LeaseState, LockName, LockOptions};
use tokio::task::JoinHandle;

use crate::{ensure, Failure, Faulty, Harness, Timing};

pub(crate) async fn client(h: &dyn Harness) -> Result<Arc<dyn DistributedLock>, Failure> {
    h.client()
        .await
        .map_err(|e| Failure(format!("could not create a client: {e}")))
}

/// What most cases start from: the timings, two independent clients, and a fresh name.
pub(crate) struct Scene {
    pub(crate) t: Timing,
    pub(crate) a: Arc<dyn DistributedLock>,
    pub(crate) b: Arc<dyn DistributedLock>,
    pub(crate) name: LockName,
}

pub(crate) async fn scene(h: &dyn Harness, tag: &str) -> Result<Scene, Failure> {
    Ok(Scene {
        t: h.timing(),
        a: client(h).await?,
        b: client(h).await?,
        name: crate::fresh_name(tag),
    })
}

/// Fails with `broken` unless `client`'s `try_acquire` of `name` is refused: the lock is
/// still held by someone else (a grant made here is dropped, which releases it).
pub(crate) async fn still_held(
    client: &dyn DistributedLock,
    name: &LockName,
    opts: &LockOptions,
    broken: impl std::fmt::Display,
) -> Result<(), Failure> {
    ensure!(client.try_acquire(name, opts).await?.is_none(), "{broken}");
    Ok(())
}

/// A client behind a breakable link, delayed `delay` each way to begin with.
pub(crate) async fn faulty(h: &dyn Harness, delay: Duration) -> Result<Faulty, Failure> {
    match h.faulty_client(delay).await {
        Some(r) => r.map_err(|e| Failure(format!("could not create a faulty client: {e}"))),
        None => Err(Failure("the harness gave no faulty client".into())),
    }
}

/// For a case about a request on its way to the server: the delay each way (a fifth of the
/// TTL, 50 to 200 ms), a client behind a link with that delay, another client, and a name the
/// other client has held and released once (backends may keep per-name state, such as a
/// parent node, that changes which request is the one in flight).
pub(crate) async fn in_flight_scene(
    h: &dyn Harness,
    tag: &str,
) -> Result<(Duration, Faulty, Arc<dyn DistributedLock>, LockName), Failure> {
    let delay = (h.timing().ttl / 5).clamp(Duration::from_millis(50), Duration::from_millis(200));
    let slow = faulty(h, delay).await?;
    let other = client(h).await?;
    let name = crate::fresh_name(tag);
    held(other.try_acquire(&name, &opts(h)).await?, "warm-up")?
        .release()
        .await?;
    Ok((delay, slow, other, name))
}

/// Manual renewal, the suite's TTL, waiting forever.
pub(crate) fn opts(h: &dyn Harness) -> LockOptions {
    LockOptions::new(h.timing().ttl)
}

/// A TTL long enough that nothing expires during a case.
pub(crate) fn long_opts(h: &dyn Harness) -> LockOptions {
    LockOptions::new(h.timing().ttl * 40)
}

/// `Ok` if `lease` is in state `want`, else a failure naming the state it is in and `when`
/// (say, "after a refused renewal").
pub(crate) fn in_state(lease: &dyn Lease, want: LeaseState, when: &str) -> Result<(), Failure> {
    let state = lease.state();
    if state == want {
        Ok(())
    } else {
        Err(Failure(format!(
            "lease is {state:?} {when}, expected {want:?}"
        )))
    }
}

pub(crate) fn held(lease: Option<Box<dyn Lease>>, what: &str) -> Result<Box<dyn Lease>, Failure> {
    lease.ok_or_else(|| {
        Failure(format!(
            "{what}: expected the lock to be free, try_acquire returned None"
        ))
    })
}

/// Sleeps until `at` (no-op if it passed).
pub(crate) async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(at.into()).await
}

pub(crate) async fn sleep(d: Duration) {
    tokio::time::sleep(d).await
}

/// Waits for `fut` at most `limit`; a hang becomes a failure naming `what`.
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = T>,
) -> Result<T, Failure> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| Failure(format!("{what}: did not finish within {limit:?}")))
}

/// A waiting `acquire` bounded by `bound`, for cases about something else: a `Timeout` here
/// means the lock was not handed on although it was free to hand on, so the failure names
/// that promise (and the case that checks it alone) instead of surfacing as a hang.
pub(crate) async fn acquire_when_free(
    c: &dyn DistributedLock,
    name: &lock_core::LockName,
    opts: &LockOptions,
    bound: Duration,
    what: &str,
) -> Result<Box<dyn Lease>, Failure> {
    let start = Instant::now();
    match within(
        bound + Duration::from_secs(5),
        what,
        c.acquire(name, &opts.clone().wait_for(bound)),
    )
    .await?
    {
        Ok(l) => Ok(l),
        Err(lock_core::Error::Timeout { waited, .. }) => Err(Failure(format!(
            "{what}: not granted within {bound:?} (Timeout after {waited:?}, {:?} after the \
             call) although the lock was free to hand on by then — a missed wake-up or an \
             early Timeout (see waiting::waiter_wakes_promptly_after_release, \
             waiting::bounded_waiter_wakes_promptly_after_release, \
             waiting::wait_timeout_is_respected)",
            start.elapsed()
        ))),
        Err(e) => Err(Failure(format!("{what}: unexpected error {e} ({e:?})"))),
    }
}

/// Every state `lease` passes through (sampled every 5 ms), until it is Lost or `limit` has
/// passed: for a driver's own fault tests as much as for the suite's.
///
/// ```no_run
/// # async fn f(lease: Box<dyn lock_core::Lease>) {
/// use std::{sync::Arc, time::Duration};
/// let lease = Arc::new(lease);
/// let states = conformance_tests::record_states(lease.clone(), Duration::from_secs(5));
/// // ... a fault ...
/// let seen = states.await.unwrap();
/// assert!(seen.contains(&lock_core::LeaseState::AtRisk));
/// # }
/// ```
pub fn record_states(lease: Arc<Box<dyn Lease>>, limit: Duration) -> JoinHandle<Vec<LeaseState>> {
    tokio::spawn(async move {
        let end = Instant::now() + limit;
        let mut seen = vec![];
        while Instant::now() < end {
            let s = lease.state();
            if seen.last() != Some(&s) {
                seen.push(s);
            }
            if s == LeaseState::Lost {
                break;
            }
            sleep(Duration::from_millis(5)).await;
        }
        seen
    })
}

/// Spawns a task that records when `lease`'s lost signal resolves.
pub(crate) fn watch_lost(lease: &dyn Lease) -> tokio::task::JoinHandle<Instant> {
    let lost = lease.lost();
    tokio::spawn(async move {
        lost.wait().await;
        Instant::now()
    })
}

pub(crate) fn is_not_held(e: &lock_core::Error) -> bool {
    matches!(
        e,
        lock_core::Error::NotHeld { .. } | lock_core::Error::Lost { .. }
    )
}

/// A waiter that records when its `acquire` returned.
pub(crate) type Waiter = JoinHandle<(Instant, lock_core::Result<Box<dyn Lease>>)>;

/// Starts a waiting `acquire` of `name` on `client` in a task of its own.
pub(crate) fn spawn_waiter(
    client: Arc<dyn DistributedLock>,
    name: &LockName,
    opts: LockOptions,
) -> Waiter {
    let name = name.clone();
    tokio::spawn(async move {
        let l = client.acquire(&name, &opts).await;
        (Instant::now(), l)
    })
}

/// Releases `holder` and checks that `waiter` is granted within the slack of the release,
/// then releases the waiter's lease. `who` names the waiter, `why` what a late grant means.
pub(crate) async fn handed_on_promptly(
    h: &dyn Harness,
    holder: Box<dyn Lease>,
    waiter: Waiter,
    who: &str,
    why: &str,
) -> Result<(), Failure> {
    let slack = h.timing().slack;
    let limit = slack * 4;
    let released = Instant::now();
    holder.release().await?;
    let (granted, lease) = match tokio::time::timeout(limit, waiter).await {
        Ok(r) => r.map_err(|e| Failure(format!("{who} panicked: {e}")))?,
        Err(_) => {
            return Err(Failure(format!(
                "{who} was not granted within {limit:?} of the release (slack {slack:?}): {why}"
            )))
        }
    };
    let lease = lease.map_err(|e| Failure(format!("{who} failed after the release: {e:?}")))?;
    let delay = granted.saturating_duration_since(released);
    ensure!(
        delay <= slack,
        "{who} was granted {delay:?} after the release (slack {slack:?}): {why}"
    );
    lease.release().await?;
    Ok(())
}

/// `name`, just released, is free for `newcomer`'s `try_acquire` within the slack (a driver
/// may clean up in the background); else `left` says what stayed behind.
pub(crate) async fn free_for_a_newcomer(
    h: &dyn Harness,
    newcomer: &dyn DistributedLock,
    name: &LockName,
    left: &str,
) -> Result<(), Failure> {
    let t = h.timing();
    let deadline = Instant::now() + t.slack;
    loop {
        if let Some(l) = newcomer.try_acquire(name, &long_opts(h)).await? {
            l.release().await?;
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the lock was still busy {:?} after it should have been free: {left}",
            t.slack
        );
        sleep(t.slack / 10).await;
    }
}

/// Runs `fut` for `after`, then drops it (a caller's timeout, a cancelled task): its output if
/// it finished. A zero `after` polls it exactly once (a zero timeout may poll more: tokio's
/// timer has a 1 ms tick).
pub(crate) async fn cancel_after<T>(after: Duration, fut: impl Future<Output = T>) -> Option<T> {
    let mut fut = std::pin::pin!(fut);
    if after.is_zero() {
        match std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    } else {
        tokio::time::timeout(after, fut).await.ok()
    }
}

/// Polls `fut` once, leaves it alone for `idle` (a task busy elsewhere: whatever it sent may
/// be answered meanwhile, and a driver's own tasks run on), then drops it unpolled: its output
/// if the first poll finished it.
pub(crate) async fn drop_after_idle<T>(idle: Duration, fut: impl Future<Output = T>) -> Option<T> {
    let mut fut = std::pin::pin!(fut);
    // A fresh cooperative budget: a first poll whose budget is spent stops at its first await.
    tokio::task::yield_now().await;
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(out) = first {
        return Some(out);
    }
    tokio::time::sleep(idle).await;
    None
}

/// Backend requests served in a window of `window` (the counter reads themselves may count).
async fn requests_in(h: &dyn Harness, window: Duration) -> Result<u64, Failure> {
    let count = || async {
        h.backend_requests()
            .await
            .ok_or_else(|| Failure("request counter vanished".into()))
    };
    let before = count().await?;
    sleep(window).await;
    Ok(count().await?.saturating_sub(before))
}

/// Requests per `window` with nobody waiting: the lower of two windows, unless the first is
/// quiet already (a burst of foreign traffic in one must not make room for a poller).
pub(crate) async fn idle_baseline(h: &dyn Harness, window: Duration) -> Result<u64, Failure> {
    let alone = requests_in(h, window).await?;
    if alone > 6 {
        return Ok(alone.min(requests_in(h, window).await?));
    }
    Ok(alone)
}

/// Requests per `window` while something waits, in up to three windows until one costs at
/// most 6 more than `alone`: `Ok(windows)` if one did, else a failure that names `who`.
pub(crate) async fn stays_idle(
    h: &dyn Harness,
    window: Duration,
    alone: u64,
    who: &str,
) -> Result<Vec<u64>, Failure> {
    let mut windows = Vec::new();
    for _ in 0..3 {
        let used = requests_in(h, window).await?;
        windows.push(used);
        if used <= alone + 6 {
            return Ok(windows);
        }
    }
    Err(Failure(format!(
        "the backend served {windows:?} requests in three windows of {window:?} while {who}, \
         against {alone} without it: it polls instead of waiting for notifications"
    )))
}
