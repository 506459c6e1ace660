//! `--scale N1,N2,…`: what holding many locks costs. One fresh client of the backend takes N
//! locks (distinct names, each renewed by its watchdog) and holds them for a window; the row
//! says how many server connections (or sessions) that client added, its memory (RSS) per held
//! lock, the renewals the backend confirmed per second per held lock (`Lease::renewals`), the
//! requests its servers counted per second per held lock while the client only held (the
//! window's first half), and the latency of acquire + release on one more name while the N are
//! held (its second half), and how many of the
//! N were no longer Held at the end (renewals that did not keep up). A backend that
//! cannot hold N (PostgreSQL: one session per lock, and the server allows 100) gives a row
//! with the error instead.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lock_core::{DistributedLock, Lease, LockName, LockOptions};
use serde::Serialize;

use crate::catalog::{connect, value_name, Backend, Endpoints};

/// One backend holding `held` locks.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct ScaleRow {
    pub(crate) backend: String,
    pub(crate) held: usize,
    /// The locks' TTL (renewed every third of it).
    ttl_ms: u128,
    /// Server connections (sessions) the holding client added, where the server counts them.
    pub(crate) connections: Option<i64>,
    /// The client's resident memory growth per held lock.
    pub(crate) rss_kib_per_lock: Option<f64>,
    /// Renewals the backend confirmed per second per held lock, over the window.
    pub(crate) renewals_per_sec_per_lock: Option<f64>,
    /// Requests the servers counted per second per held lock while the client only held (the
    /// window's first half; Redis and Redlock: scripts run): what holding costs, renewals
    /// batched or not.
    pub(crate) requests_per_sec_per_lock: Option<f64>,
    /// Leases not Held at the end of the window (AtRisk or Lost): renewals that did not keep
    /// up.
    lost: usize,
    /// Acquire + release of one more name while the `held` are held.
    cycle_p50_us: Option<f64>,
    pub(crate) cycle_p99_us: Option<f64>,
    /// Why the row has no figures.
    pub(crate) error: Option<String>,
}

/// How the locks are held and for how long.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(crate) ttl: Duration,
    pub(crate) window: Duration,
}

/// Acquisitions (and releases) in flight at once while taking or giving back the N.
const AT_ONCE: usize = 32;

/// The scale row of `backend` holding `n` locks.
pub(crate) async fn scale(backend: Backend, ep: &Endpoints, n: usize, plan: Plan) -> ScaleRow {
    let mut row = ScaleRow {
        backend: value_name(&backend),
        held: n,
        ttl_ms: 0,
        lost: 0,
        connections: None,
        rss_kib_per_lock: None,
        renewals_per_sec_per_lock: None,
        requests_per_sec_per_lock: None,
        cycle_p50_us: None,
        cycle_p99_us: None,
        error: None,
    };
    if let Err(e) = measure(backend, ep, n, plan, &mut row).await {
        row.error = Some(e);
    }
    row
}

async fn measure(
    backend: Backend,
    ep: &Endpoints,
    n: usize,
    plan: Plan,
    row: &mut ScaleRow,
) -> Result<(), String> {
    let conns_before = ep.server_connections(backend).await;
    let locks = connect(backend, ep).await?;
    // The TTL asked for, or the backend's least (a session's timeout) if that is more.
    let ttl = plan.ttl.max(locks.capabilities().min_ttl);
    row.ttl_ms = ttl.as_millis();
    let run = format!("scale-{}-{n}", std::process::id());
    let opts = LockOptions::new(ttl)
        .auto_renew(None)
        .wait_for(Duration::from_secs(30));
    let probe = LockName::new(format!("{run}-probe")).map_err(|e| e.to_string())?;
    // One cycle first, so that the client's connection and buffers are not counted per lock.
    let warm = locks
        .acquire(&probe, &opts)
        .await
        .map_err(|e| e.to_string())?;
    warm.release().await.map_err(|e| e.to_string())?;
    let rss_before = rss_kib();
    let (leases, failed) = take(&locks, &run, n, &opts).await;
    if let Some(e) = failed {
        let held = leases.len();
        give_back(leases).await;
        return Err(format!("held {held} of {n}, then: {e}"));
    }
    row.connections = match (conns_before, ep.server_connections(backend).await) {
        (Some(b), Some(a)) => {
            Some(i64::try_from(a).unwrap_or(i64::MAX) - i64::try_from(b).unwrap_or(0))
        }
        _ => None,
    };
    row.rss_kib_per_lock = match (rss_before, rss_kib()) {
        (Some(b), Some(a)) if n > 0 => Some(a.saturating_sub(b) as f64 / n as f64),
        _ => None,
    };
    let renewed = |leases: &[Box<dyn Lease>]| -> Option<u64> {
        leases.iter().map(|l| l.renewals()).sum::<Option<u64>>()
    };
    let (start, renewals_before) = (Instant::now(), renewed(&leases));
    // The first half only holds: the requests the servers count then are the renewals' (and,
    // but for Redis's scripts, the count's own reading: one request).
    let asked_before = ep.client_requests(backend).await;
    tokio::time::sleep(plan.window / 2).await;
    if let (Some(b), Some(a)) = (asked_before, ep.client_requests(backend).await) {
        let scripts = matches!(
            backend,
            Backend::Redis | Backend::RedisPlain | Backend::Redlock
        );
        let asked = a.saturating_sub(b).saturating_sub(u64::from(!scripts));
        row.requests_per_sec_per_lock =
            Some(asked as f64 / start.elapsed().as_secs_f64() / n.max(1) as f64);
    }
    let mut cycles = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    while start.elapsed() < plan.window {
        let t = Instant::now();
        let lease = locks
            .acquire(&probe, &opts)
            .await
            .map_err(|e| e.to_string())?;
        lease.release().await.map_err(|e| e.to_string())?;
        let _ = cycles.record(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    row.lost = leases
        .iter()
        .filter(|l| l.state() != lock_core::LeaseState::Held)
        .count();
    if let (Some(b), Some(a)) = (renewals_before, renewed(&leases)) {
        row.renewals_per_sec_per_lock =
            Some(a.saturating_sub(b) as f64 / elapsed / n.max(1) as f64);
    }
    if !cycles.is_empty() {
        row.cycle_p50_us = Some(cycles.value_at_quantile(0.5) as f64);
        row.cycle_p99_us = Some(cycles.value_at_quantile(0.99) as f64);
    }
    give_back(leases).await;
    Ok(())
}

/// Takes `n` locks named `run-i`, [`AT_ONCE`] at a time; stops at the first error.
async fn take(
    locks: &Arc<dyn DistributedLock>,
    run: &str,
    n: usize,
    opts: &LockOptions,
) -> (Vec<Box<dyn Lease>>, Option<String>) {
    let mut leases = Vec::with_capacity(n);
    let mut next = 0;
    while next < n {
        let mut batch = tokio::task::JoinSet::new();
        for i in next..(next + AT_ONCE).min(n) {
            let (locks, opts) = (locks.clone(), opts.clone());
            let name = format!("{run}-{i}");
            batch.spawn(async move {
                let name = LockName::new(name).map_err(|e| e.to_string())?;
                locks.acquire(&name, &opts).await.map_err(|e| e.to_string())
            });
        }
        next = (next + AT_ONCE).min(n);
        let mut failed = None;
        while let Some(r) = batch.join_next().await {
            match r {
                Ok(Ok(l)) => leases.push(l),
                Ok(Err(e)) => failed = Some(e),
                Err(e) => failed = Some(e.to_string()),
            }
        }
        if failed.is_some() {
            return (leases, failed);
        }
    }
    (leases, None)
}

/// Releases every lease, [`AT_ONCE`] at a time.
async fn give_back(mut leases: Vec<Box<dyn Lease>>) {
    while !leases.is_empty() {
        let mut batch = tokio::task::JoinSet::new();
        for l in leases.drain(..AT_ONCE.min(leases.len())) {
            batch.spawn(async move { l.release().await });
        }
        while batch.join_next().await.is_some() {}
    }
}

/// This process's resident memory, KiB (Linux `/proc/self/statm`, 4 KiB pages).
fn rss_kib() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4)
}

/// The markdown table of the scale rows.
pub(crate) fn table(rows: &[ScaleRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| backend | held locks | TTL | not Held at the end | server connections added | RSS KiB per lock | renewals/s per lock | server requests/s per lock | cycle p50 µs | cycle p99 µs |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let f = |x: Option<f64>, d: usize| x.map_or("–".to_string(), |v| format!("{v:.d$}"));
    for r in rows {
        if let Some(e) = &r.error {
            let _ = writeln!(out, "| {} | {} | | | {e} | | | | | |", r.backend, r.held);
            continue;
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} ms | {} | {} | {} | {} | {} | {} | {} |",
            r.backend,
            r.held,
            r.ttl_ms,
            r.lost,
            r.connections.map_or("–".to_string(), |c| c.to_string()),
            f(r.rss_kib_per_lock, 1),
            f(r.renewals_per_sec_per_lock, 2),
            f(r.requests_per_sec_per_lock, 3),
            f(r.cycle_p50_us, 0),
            f(r.cycle_p99_us, 0),
        );
    }
    out
}
