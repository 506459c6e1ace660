//! Safety under faults: the history checker's short run (see [`crate::safety`]).

use std::time::Duration;

use crate::safety::{run, seed, Family, Report, Workload};
use crate::{Failure, Harness};

/// Eight clients over six names make 2,000 grants and meet at least six faults (or run for a
/// minute) while the nemesis breaks the links of the clients behind
/// [`Harness::faulty_client`], pauses holders, and freezes and restarts the
/// [`Harness::servers`]; the checker then finds no overlap, no fencing violation, no loss noticed after a re-grant, and
/// every name granted again after the last fault healed. The seed is in any failure; set
/// `DISTLOCK_SAFETY_SEED` to replay it.
pub async fn history_is_clean(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let mut w = Workload::short(seed());
    // Within the runner's limit for one case (60 TTLs and 30 s).
    w.limit = w.limit.min(t.ttl * 50 + Duration::from_secs(20));
    w.hold = w.hold.min(t.ttl / 4);
    let report = run(h, &w).await?;
    eprintln!("safety: {}", report.summary());
    report.verdict()
}

/// The soak (not a case: [`trials`](crate::trials) lists it as `safety::soak`, ignored unless
/// asked for): [`Workload::soak`] with `DISTLOCK_SOAK_GRANTS` grants (default 100,000), the
/// seed of `DISTLOCK_SAFETY_SEED`, the family of `DISTLOCK_SOAK_FAMILY` ([`Family::named`];
/// default mixed) and `DISTLOCK_SOAK_SHARERS` clients on each shared connection
/// ([`Workload::sharers`]; default 1, none shared). Prints the report's summary and, where `DISTLOCK_SOAK_OUT`
/// names a path prefix, writes `<prefix>.svg` (the timeline) and `<prefix>.md` (a table row
/// for RELIABILITY.md, labelled `DISTLOCK_SOAK_LABEL`, else `label`).
pub async fn soak(h: &dyn Harness, label: &str) -> Result<(), Failure> {
    let label = std::env::var("DISTLOCK_SOAK_LABEL").unwrap_or_else(|_| label.to_string());
    let label = label.as_str();
    let grants = std::env::var("DISTLOCK_SOAK_GRANTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let t = h.timing();
    let mut w = Workload::soak(seed(), grants);
    w.hold = w.hold.min(t.ttl / 4);
    if let Ok(name) = std::env::var("DISTLOCK_SOAK_FAMILY") {
        w.family = Family::named(&name).ok_or_else(|| {
            Failure(format!(
                "DISTLOCK_SOAK_FAMILY={name:?}: mixed, exclusive, read-write or permits"
            ))
        })?;
    }
    if let Ok(n) = std::env::var("DISTLOCK_SOAK_SHARERS") {
        w.sharers =
            n.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                Failure(format!("DISTLOCK_SOAK_SHARERS={n:?}: a number, 1 or more"))
            })?;
    }
    let report = run(h, &w).await?;
    eprintln!("soak: {}", report.summary());
    if let Ok(prefix) = std::env::var("DISTLOCK_SOAK_OUT") {
        let md = format!("{prefix}.md");
        std::fs::write(&md, format!("{}\n", table_row(label, &report)))
            .map_err(|e| Failure(format!("cannot write {md}: {e}")))?;
        let svg = format!("{prefix}.svg");
        crate::safety::draw(&report, label, w.names, w.clients, t.ttl, svg.as_ref())
            .map_err(|e| Failure(format!("cannot draw {svg}: {e}")))?;
    }
    report.verdict()
}

/// `| label | grants | time | blackhole | delay | cut | pause | freeze | restart | partition |
/// bridge | one-way | clock | double | a/b/c/d/e | stale writes refused | lost signal p50 / p99 (n) | heal to grant p50 / p99 (n) |
/// hand-off p50 / p99 |`
pub fn table_row(label: &str, r: &Report) -> String {
    let faults: Vec<String> = crate::safety::FAULT_KINDS
        .iter()
        .map(|k| r.faults.get(k).copied().unwrap_or(0).to_string())
        .collect();
    let [a, b, c, d, e] = r.violations_by_kind();
    let q = |v: Option<Duration>| v.map_or("–".to_string(), ms);
    format!(
        "| {label} | {} | {:.0} s | {} | {a} / {b} / {c} / {d} / {e} | {} | {} / {} (n = {}) | {} / {} (n = {}) | {} / {} |",
        r.grants,
        r.elapsed.as_secs_f64(),
        faults.join(" | "),
        r.stale_writes_refused,
        q(r.loss_to_signal_quantile(0.5)),
        q(r.loss_to_signal_quantile(0.99)),
        r.loss_to_signal.len(),
        q(r.recovery_quantile(0.5)),
        q(r.recovery_quantile(0.99)),
        r.recovery.len(),
        q(r.handoff_quantile(0.5)),
        q(r.handoff_quantile(0.99)),
    )
}

/// `d` in milliseconds: one decimal below 10 ms, none above.
fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}
