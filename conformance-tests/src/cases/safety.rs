//! Safety under faults: the history checker's short run (see [`crate::safety`]).

use std::time::Duration;

use crate::safety::{run, Workload};
use crate::{Failure, Harness};

/// Six clients over three names make 2,000 grants (or run for a minute) while the nemesis
/// breaks the links of the clients behind [`Harness::faulty_client`] and pauses holders; the
/// checker then finds no overlap, no fencing violation, no loss noticed after a re-grant, and
/// every name granted again after the last fault healed. The seed is in any failure; set
/// `DISTLOCK_SAFETY_SEED` to replay it.
pub async fn history_is_clean(h: &dyn Harness) -> Result<(), Failure> {
    let seed = std::env::var("DISTLOCK_SAFETY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let t = h.timing();
    let mut w = Workload::short(seed);
    // Within the runner's limit for one case (60 TTLs and 30 s).
    w.limit = w.limit.min(t.ttl * 50 + Duration::from_secs(20));
    w.hold = w.hold.min(t.ttl / 4);
    let report = run(h, &w).await?;
    eprintln!("safety: {}", report.summary());
    report.verdict()
}
