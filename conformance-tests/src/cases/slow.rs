//! A slow link: a reason to fail, never a reason to say that someone holds the lock.

use std::time::{Duration, Instant};

use lock_core::{Lease, LeaseState};

use super::support::{acquire_when_free, client, faulty, opts, within};
use crate::{ensure, fresh_name, Failure, Fault, Harness};

/// The round trips tried, as fractions of the TTL: from a quarter of it (a grant still has
/// most of its validity left) to the whole of it (none). Dense around a third, where a driver
/// that distrusts a slow answer draws its line (ZooKeeper: an answer slower than a third of
/// the session cannot vouch for it).
const ROUND_TRIPS: [(u32, u32); 6] = [(1, 4), (3, 10), (7, 20), (2, 5), (1, 2), (1, 1)];

/// How long one attempt through a slow link may take to answer: a driver answers within its
/// request timeout (as in `faults::unreachable_backend_is_an_error`).
const ANSWER: Duration = Duration::from_secs(20);

/// `Ok(None)` from `try_acquire` says that another client holds the lock (or, on FIFO
/// backends, waits for it): a slow link is no reason to say so. Through links whose round trip
/// is a quarter of the TTL up to the whole TTL (one client per link, all at once, each trying
/// a name nobody holds), `try_acquire` is granted — a lease Held with its `valid_until` ahead —
/// or fails with a retryable error: a driver whose answer came too late to vouch for a grant
/// says so with an error, never with a refusal. Whatever each answered, a client on a plain
/// link gets each name within a TTL and the slack after: nothing of a slow attempt stays.
pub async fn a_slow_link_is_never_busy(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let o = opts(h);
    let mut links = Vec::new();
    for (num, den) in ROUND_TRIPS {
        // Connected through a short delay (a client may probe its server at creation), then
        // slowed.
        let slow = faulty(h, Duration::from_millis(20)).await?;
        let round_trip = t.ttl * num / den;
        slow.link.set(Fault::Delay(round_trip / 2));
        links.push((round_trip, slow, fresh_name("slow-busy")));
    }
    let mut tries = tokio::task::JoinSet::new();
    for (round_trip, slow, name) in &links {
        let (lock, o) = (slow.lock.clone(), o.clone());
        let through = format!(
            "try_acquire of {name}, which nobody holds, through a link with a round trip of \
             {round_trip:?} (TTL {:?})",
            o.ttl
        );
        let name = name.clone();
        tries.spawn(async move {
            let sent = Instant::now();
            let got = tokio::time::timeout(ANSWER, lock.try_acquire(&name, &o)).await;
            judge(&through, sent.elapsed(), got).await
        });
    }
    let mut failures = Vec::new();
    while let Some(joined) = tries.join_next().await {
        if let Some(broken) = joined.map_err(|e| Failure(format!("a try panicked: {e}")))? {
            failures.push(broken);
        }
    }
    for (_, slow, _) in &links {
        slow.link.set(Fault::Healed);
    }
    let direct = client(h).await?;
    for (_, _, name) in &links {
        let next = acquire_when_free(
            direct.as_ref(),
            name,
            &o,
            t.ttl + t.slack,
            &format!("{name} after a try through a slow link answered"),
        )
        .await?;
        next.release().await?;
    }
    drop(links);
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}

/// What breaks the promise in one try's answer, if anything, judged the moment it came; a
/// lease it got is released.
async fn judge(
    through: &str,
    took: Duration,
    got: Result<lock_core::Result<Option<Box<dyn Lease>>>, tokio::time::error::Elapsed>,
) -> Option<String> {
    match got {
        Err(_) => Some(format!("{through} gave no answer within {ANSWER:?}")),
        Ok(Ok(None)) => Some(format!(
            "{through} answered Ok(None) after {took:?}: that says another client holds the \
             lock; an answer too slow to vouch for a grant must be an error"
        )),
        Ok(Ok(Some(lease))) => {
            let (state, vu, now) = (lease.state(), lease.valid_until(), Instant::now());
            let _ = within(ANSWER, "release", lease.release()).await;
            (state != LeaseState::Held || vu <= now).then(|| {
                format!(
                    "{through} returned after {took:?} a lease that was {state:?} with its \
                     valid_until {:?} behind",
                    now.saturating_duration_since(vu)
                )
            })
        }
        Ok(Err(e)) => (!e.is_retryable()).then(|| {
            format!(
                "{through} failed after {took:?} with {e:?}, which is not retryable: a slow \
                 link is a transient failure"
            )
        }),
    }
}
