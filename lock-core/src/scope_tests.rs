//! Tests of scoped use: the work runs only while its lease holds, is stopped at the loss (or
//! at AtRisk, by option), and the lock is released at the end on every path.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::*;
use crate::driver::{Grant, LeaseOps, ManagedLease};
use crate::memory::MemoryLock;
use crate::{async_trait, Renewal};

type Outcome = std::result::Result<(), String>;

fn name(s: &str) -> std::result::Result<LockName, String> {
    LockName::new(s).map_err(|e| e.to_string())
}

/// Sets its flag when dropped: tells whether the work was dropped (stopped), not leaked.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Work that takes a step every 5 ms for `steps` steps, recording each step's instant.
async fn steps(steps: u32, log: Arc<Mutex<Vec<Instant>>>, dropped: Arc<AtomicBool>) -> u32 {
    let _flag = DropFlag(dropped);
    for _ in 0..steps {
        log.lock().push(Instant::now());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    steps
}

/// The lock is free on `locks` within a second (a background release included).
async fn freed(locks: &MemoryLock, n: &LockName, what: &str) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(1);
    while locks.inspect(n).await.map_err(|e| e.to_string())?.is_some() {
        if Instant::now() > deadline {
            return Err(format!("{what}: the lock is still held 1 s later"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[tokio::test]
async fn finished_work_returns_its_output_and_releases() -> Outcome {
    let locks = MemoryLock::new();
    let n = name("scope-finished")?;
    let opts = LockOptions::new(Duration::from_secs(5)).auto_renew(None);
    let out = locks
        .with_lock(&n, &opts, StopOn::Lost, |scope| async move {
            (scope.name().clone(), scope.fencing_token(), scope.state())
        })
        .await
        .map_err(|e| format!("with_lock failed: {e}"))?;
    if out.0 != n || out.1.is_none() || out.2 != LeaseState::Held {
        return Err(format!(
            "the work saw {out:?}: not its lock, token and Held"
        ));
    }
    // Released by the call itself, not by a background drop: free on return.
    if locks
        .inspect(&n)
        .await
        .map_err(|e| e.to_string())?
        .is_some()
    {
        return Err("with_lock returned and the lock is still held".into());
    }
    Ok(())
}

/// A lease that expires unrenewed (manual renewal, never renewed) stops the work at its
/// `valid_until`: no step of the work runs from then on, the work is dropped, the call says
/// Lost at once.
#[tokio::test]
async fn work_is_stopped_when_the_lease_expires() -> Outcome {
    let locks = MemoryLock::new();
    let n = name("scope-expires")?;
    let lease = locks
        .acquire(&n, &LockOptions::new(Duration::from_millis(200)))
        .await
        .map_err(|e| e.to_string())?;
    let valid_until = lease.valid_until();
    let (log, dropped) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(AtomicBool::new(false)),
    );
    let r = while_held(
        lease,
        StopOn::Lost,
        steps(400, log.clone(), dropped.clone()),
    )
    .await;
    let returned = Instant::now();
    if !matches!(&r, Err(Error::Lost { name, .. }) if *name == n) {
        return Err(format!(
            "work outliving its lease gave {r:?}, expected Lost for {n}"
        ));
    }
    if !dropped.load(Ordering::SeqCst) {
        return Err("the call returned Lost and the work was not dropped".into());
    }
    let last = log.lock().last().copied().ok_or("the work never ran")?;
    if last >= valid_until {
        return Err(format!(
            "a step of the work ran {:?} after the lease's valid_until",
            last - valid_until
        ));
    }
    let late = returned.saturating_duration_since(valid_until);
    if late > Duration::from_millis(100) {
        return Err(format!("Lost returned {late:?} after valid_until"));
    }
    // Work that is ready at once, under a lease that has already expired, has no output to
    // give: it did not run while the lock was held.
    let lease = locks
        .acquire(&n, &LockOptions::new(Duration::from_millis(50)))
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_millis(80)).await;
    match while_held(lease, StopOn::Lost, async { 1 }).await {
        Err(Error::Lost { .. }) => Ok(()),
        other => Err(format!("ready work under an expired lease gave {other:?}")),
    }
}

/// A lease the backend takes away (an operator's break; the watchdog's renewal is refused)
/// stops the work, and the token handed out for spawned work is cancelled.
#[tokio::test]
async fn work_is_stopped_when_the_backend_takes_the_lock() -> Outcome {
    let locks = Arc::new(MemoryLock::new());
    let n = name("scope-broken")?;
    let opts = LockOptions::new(Duration::from_millis(300)).auto_renew(None);
    let (log, dropped) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(AtomicBool::new(false)),
    );
    let tokens = Arc::new(Mutex::new(None));
    let breaker = {
        let (locks, n) = (locks.clone(), n.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            locks.break_lock(&n)
        })
    };
    let r = locks
        .with_lock(&n, &opts, StopOn::Lost, {
            let (log, dropped, tokens) = (log.clone(), dropped.clone(), tokens.clone());
            move |scope| async move {
                *tokens.lock() = Some(scope.cancellation_token(StopOn::Lost));
                steps(1000, log, dropped).await
            }
        })
        .await;
    if !breaker.await.map_err(|e| e.to_string())? {
        return Err("the break found the lock free: the work never held it".into());
    }
    if !matches!(r, Err(Error::Lost { .. })) || !dropped.load(Ordering::SeqCst) {
        return Err(format!(
            "work under a broken lock gave {r:?} (dropped: {dropped:?})"
        ));
    }
    let token = tokens
        .lock()
        .take()
        .ok_or("the work never asked for a token")?;
    let token = token.map_err(|e| format!("cancellation_token in a runtime failed: {e}"))?;
    tokio::time::timeout(Duration::from_secs(1), token.cancelled())
        .await
        .map_err(|_| "the lease was lost and its cancellation token not cancelled 1 s later")?;
    Ok(())
}

/// Ops whose renewals fail as an unreachable server's do (the lease turns AtRisk) and whose
/// releases are counted.
#[derive(Debug, Default)]
struct Unreachable {
    releases: Arc<AtomicU32>,
}

#[async_trait]
impl LeaseOps for Unreachable {
    fn backend(&self) -> &'static str {
        "test"
    }

    async fn renew(&self) -> crate::Result<Instant> {
        Err(Error::unavailable("test", "connection refused"))
    }
    async fn release(&self, _valid_until: Instant) -> crate::Result<()> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn at_risk_soon(ttl: Duration) -> std::result::Result<(Box<dyn Lease>, Arc<AtomicU32>), String> {
    let releases = Arc::new(AtomicU32::new(0));
    let ops = Unreachable {
        releases: releases.clone(),
    };
    let grant = Grant {
        token: None,
        ttl,
        valid_until: Instant::now() + ttl,
    };
    let renewal = Renewal::Auto { max_hold: None };
    let lease = ManagedLease::new(name("scope-at-risk")?, grant, renewal, ops);
    Ok((Box::new(lease), releases))
}

/// With `StopOn::AtRisk` the first failed renewal stops the work (long before the lease could
/// be lost) and the lock is released; with `StopOn::Lost` work that finishes while AtRisk
/// keeps its output.
#[tokio::test]
async fn at_risk_stops_the_work_only_when_asked() -> Outcome {
    let ttl = Duration::from_secs(3);
    let (lease, releases) = at_risk_soon(ttl)?;
    let valid_until = lease.valid_until();
    let (log, dropped) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(AtomicBool::new(false)),
    );
    let r = while_held(lease, StopOn::AtRisk, steps(1000, log, dropped.clone())).await;
    if !matches!(&r, Err(Error::Lost { reason, .. }) if reason.contains("AtRisk")) {
        return Err(format!("a failed renewal under StopOn::AtRisk gave {r:?}"));
    }
    if Instant::now() + ttl / 3 > valid_until || !dropped.load(Ordering::SeqCst) {
        return Err("StopOn::AtRisk stopped the work late, or did not drop it".into());
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while releases.load(Ordering::SeqCst) == 0 {
        if Instant::now() > deadline {
            return Err("stopped at AtRisk and the lock not released 1 s later".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let (lease, _) = at_risk_soon(ttl)?;
    let out = while_held(lease, StopOn::Lost, async {
        // Past the first renewal (at a third of the TTL), which fails: AtRisk, not Lost.
        tokio::time::sleep(ttl / 2).await;
        7
    })
    .await;
    match out {
        Ok(7) => Ok(()),
        other => Err(format!(
            "work finished while AtRisk under StopOn::Lost gave {other:?}"
        )),
    }
}

/// A busy lock is the acquisition's error, and the work never runs.
#[tokio::test]
async fn a_busy_lock_runs_no_work() -> Outcome {
    let locks = MemoryLock::new();
    let n = name("scope-busy")?;
    let held = locks
        .acquire(&n, &LockOptions::new(Duration::from_secs(5)))
        .await
        .map_err(|e| e.to_string())?;
    let ran = Arc::new(AtomicBool::new(false));
    let opts = LockOptions::new(Duration::from_secs(5)).wait_for(Duration::from_millis(20));
    let r = locks
        .with_lock(&n, &opts, StopOn::Lost, {
            let ran = ran.clone();
            move |_| async move { ran.store(true, Ordering::SeqCst) }
        })
        .await;
    if !matches!(r, Err(Error::Timeout { .. })) || ran.load(Ordering::SeqCst) {
        return Err(format!("a held lock gave {r:?} (work ran: {ran:?})"));
    }
    held.release().await.map_err(|e| e.to_string())
}

/// Dropping the call part-way drops the work and frees the lock (in the background).
#[tokio::test]
async fn a_dropped_call_frees_the_lock() -> Outcome {
    let locks = MemoryLock::new();
    let n = name("scope-dropped")?;
    let opts = LockOptions::new(Duration::from_secs(30)).auto_renew(None);
    let (log, dropped) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(AtomicBool::new(false)),
    );
    let call = locks.with_lock(&n, &opts, StopOn::Lost, {
        let dropped = dropped.clone();
        move |_| steps(1000, log, dropped)
    });
    if tokio::time::timeout(Duration::from_millis(50), call)
        .await
        .is_ok()
    {
        return Err("1000 steps of 5 ms finished within 50 ms".into());
    }
    if !dropped.load(Ordering::SeqCst) {
        return Err("the call was dropped and its work was not".into());
    }
    freed(&locks, &n, "a dropped with_lock").await
}

/// The token: not cancelled while the lease holds, cancelled at once for a lease already
/// gone, refused outside a runtime, and its watching task ends with the lease.
#[test]
fn cancellation_token_follows_the_lease() -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let locks = MemoryLock::new();
    let n = name("scope-token")?;
    let lease = rt
        .block_on(locks.acquire(&n, &LockOptions::new(Duration::from_secs(5))))
        .map_err(|e| e.to_string())?;
    let signal = lease.lost();
    if !matches!(
        signal.cancellation_token(StopOn::Lost),
        Err(Error::Config { .. })
    ) {
        return Err("a cancellation token outside a runtime was not a Config error".into());
    }
    rt.block_on(async {
        let before = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        let token = signal
            .cancellation_token(StopOn::Lost)
            .map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if token.is_cancelled() {
            return Err("the token was cancelled while the lease held".to_string());
        }
        lease.release().await.map_err(|e| e.to_string())?;
        tokio::time::timeout(Duration::from_secs(1), token.cancelled())
            .await
            .map_err(|_| "released, and the token not cancelled 1 s later")?;
        let late = signal
            .cancellation_token(StopOn::Lost)
            .map_err(|e| e.to_string())?;
        if !late.is_cancelled() {
            return Err("a token asked of a released lease was not cancelled at once".into());
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
            > before
        {
            if Instant::now() > deadline {
                return Err("the token's watching task outlived the lease by 1 s".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    })
}
