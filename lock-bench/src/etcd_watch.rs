//! `--watch-delay N`: how late an etcd member tells a new watch of a deletion, with and
//! without other writes while the watch is created. No lock and no driver: etcd-client alone,
//! as distlock's waiters use it (a watch on one key, no start revision).
//!
//! Each trial puts a key, creates a watch on it, reads the member's count of *unsynced*
//! watchers (`etcd_debugging_mvcc_slow_watcher_total`: this run's watch is the only one), waits
//! 0–39 ms, deletes the key and times the delete's event from the delete's send. "Busy" trials
//! run two tasks putting another key in a loop meanwhile. The table splits the delays by
//! whether the watch was unsynced when it was created (with two watches a trial, both on one
//! stream: whether both were): etcd 3.4 reads the store's revision,
//! then registers the watcher, and a write applied in between leaves the watcher behind, to be
//! caught up by a loop that runs every 100 ms (BENCHMARKS.md, "etcd: where the hand-off tail
//! goes").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::lock_etcd::etcd_client::{Client, EventType, WatchFilterType, WatchOptions};
use hdrhistogram::Histogram;

const KEY: &str = "lock-bench/watch-delay/key";
const NOISE: &str = "lock-bench/watch-delay/noise";

/// The delays of one condition, split by whether every watch of a trial began unsynced.
#[derive(Default)]
struct Split {
    synced: Vec<u64>,
    unsynced: Vec<u64>,
    /// Trials whose event did not come within 2 s.
    missing: usize,
}

/// Runs `trials` trials in each condition (quiet; busy; busy with two watches a trial) against
/// `endpoints`; the markdown table.
pub(crate) async fn watch_delay(endpoints: &[String], trials: usize) -> Result<String, String> {
    let client = Client::connect(endpoints, None)
        .await
        .map_err(|e| e.to_string())?;
    let quiet = run(&client, endpoints, trials, false, 1).await?;
    let busy = run(&client, endpoints, trials, true, 1).await?;
    let pair = run(&client, endpoints, trials, true, 2).await?;
    let mut md = String::from(
        "| writes meanwhile | watch created | trials | event after delete p50 µs | p99 µs | max µs | over 10 ms |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    for (label, split) in [
        ("none", &quiet),
        ("2 writers", &busy),
        ("2 writers, two watches a trial", &pair),
    ] {
        for (state, v) in [("synced", &split.synced), ("unsynced", &split.unsynced)] {
            md.push_str(&row(label, state, v));
        }
        if split.missing > 0 {
            md.push_str(&format!(
                "| {label} | no event within 2 s | {} | – | – | – | – |\n",
                split.missing
            ));
        }
    }
    Ok(md)
}

/// A watch of deletions only, as distlock's waiters ask it.
fn deletes() -> WatchOptions {
    WatchOptions::new().with_filters([WatchFilterType::NoPut])
}

fn row(label: &str, state: &str, v: &[u64]) -> String {
    if v.is_empty() {
        return format!("| {label} | {state} | 0 | – | – | – | – |\n");
    }
    let mut h = match Histogram::<u64>::new(3) {
        Ok(h) => h,
        Err(e) => return format!("| {label} | {state} | histogram: {e} |\n"),
    };
    for &us in v {
        let _ = h.record(us);
    }
    let over = v.iter().filter(|&&us| us > 10_000).count();
    format!(
        "| {label} | {state} | {} | {} | {} | {} | {over} |\n",
        v.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max()
    )
}

async fn run(
    client: &Client,
    endpoints: &[String],
    trials: usize,
    busy: bool,
    watches: u64,
) -> Result<Split, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..if busy { 2 } else { 0 })
        .map(|_| {
            let (mut c, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _ = c.put(NOISE, "x", None).await;
                }
            })
        })
        .collect();
    let result = trials_of(client, endpoints, trials, watches).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    result
}

async fn trials_of(
    client: &Client,
    endpoints: &[String],
    trials: usize,
    watches: u64,
) -> Result<Split, String> {
    let mut split = Split::default();
    let mut c = client.clone();
    for i in 0..trials {
        c.put(KEY, "x", None).await.map_err(|e| e.to_string())?;
        let mut stream = c
            .watch(KEY, Some(deletes()))
            .await
            .map_err(|e| e.to_string())?;
        for n in 0..watches {
            if n > 0 {
                // Another watch on the same stream, once the one before it is created.
                stream
                    .watch(KEY, Some(deletes()))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            match stream.message().await {
                Ok(Some(r)) if r.created() => {}
                other => return Err(format!("no created response: {other:?}")),
            }
        }
        // The member's only watches are this trial's: is every one of them slow?
        let unsynced = server_probes::etcd_slow_watchers(endpoints)
            .await
            .ok_or("no /metrics answer")?
            >= watches;
        tokio::time::sleep(Duration::from_millis((i as u64 * 7) % 40)).await;
        let sent = Instant::now();
        c.delete(KEY, None).await.map_err(|e| e.to_string())?;
        let event = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match stream.message().await {
                    Ok(Some(r))
                        if r.events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete) =>
                    {
                        return true
                    }
                    Ok(Some(_)) => {}
                    _ => return false,
                }
            }
        })
        .await;
        match event {
            Ok(true) => {
                let us = sent.elapsed().as_micros() as u64;
                if unsynced {
                    &mut split.unsynced
                } else {
                    &mut split.synced
                }
                .push(us);
            }
            _ => split.missing += 1,
        }
    }
    Ok(split)
}
