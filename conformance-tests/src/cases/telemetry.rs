//! `telemetry`: what a driver reports through `tracing` and `metrics` is what happened, under
//! the names of the convention (`lock_core::telemetry`, docs/observability.md).
//!
//! Each case watches its own fresh name in the process's capture
//! ([`crate::telemetry::capture`]) and reads only reports of the client's own backend, so cases
//! running at once, and a wrapper's inner driver, do not count.

use std::time::Instant;

use lock_core::telemetry::{label, metric, span};
use lock_core::{Error, LockName};

use super::support::{client, faulty, held, opts, spawn_waiter, within};
use crate::telemetry::{capture, Capture, SpanRecord};
use crate::Fault;
use crate::{ensure, fresh_name, Failure, Harness};

/// The capture, or a failure that says why there is none.
fn the_capture() -> Result<&'static Capture, Failure> {
    capture().ok_or_else(|| {
        Failure(
            "another tracing subscriber or metrics recorder was installed in this process: \
             the telemetry cases need their own"
                .into(),
        )
    })
}

/// `span` spans of `name` reported by `backend`, in order.
fn spans_of(cap: &Capture, name: &LockName, span: &str, backend: &str) -> Vec<SpanRecord> {
    cap.spans(name, span)
        .into_iter()
        .filter(|s| s.field(label::BACKEND) == Some(backend))
        .collect()
}

/// A grant, a busy try, a wait that times out, a manual renewal and a release each give one
/// closed span with its outcome (the grant's with its fencing token), and move the counters,
/// histograms and gauges by exactly that: 3 acquisitions (granted, busy, timeout), 3 durations,
/// 1 renewal (also in the lease's own count, where it keeps one), 1 hold ended by its
/// release, nothing held or waiting after, nothing lost. The durations are the times: the
/// timed-out wait's at least its bound, the hold's at least what the case held it.
pub async fn acquisitions_renewals_and_releases_are_reported(
    h: &dyn Harness,
) -> Result<(), Failure> {
    let cap = the_capture()?;
    let (a, b) = (client(h).await?, client(h).await?);
    let backend = a.backend();
    let name = fresh_name("telemetry");
    cap.watch(&name);
    let o = opts(h).manual_renewal();
    let lease = held(a.try_acquire(&name, &o).await?, "holder")?;
    let granted = Instant::now();
    let token = lease.fencing_token();
    ensure!(
        b.try_acquire(&name, &o).await?.is_none(),
        "a second client was granted a held lock"
    );
    let bound = h.timing().ttl / 10;
    match b.acquire(&name, &o.clone().wait_for(bound)).await {
        Err(Error::Timeout { .. }) => {}
        Err(e) => return Err(Failure(format!("a wait for a held lock gave {e:?}"))),
        Ok(_) => return Err(Failure("a wait for a held lock was granted".into())),
    }
    let before = lease.renewals();
    lease.renew().await?;
    let after = lease.renewals();
    ensure!(
        before.is_none() == after.is_none()
            && after.map_or(true, |n| Some(n) == before.map(|b| b + 1)),
        "Lease::renewals gave {before:?} before a manual renewal and {after:?} after it (one more \
         expected, or None both times where the driver does not count)"
    );
    let held_for = granted.elapsed();
    lease.release().await?;

    let acquired = spans_of(cap, &name, span::ACQUIRE, backend);
    let seen = |key: &str| -> Vec<Option<String>> {
        acquired
            .iter()
            .map(|s| s.field(key).map(str::to_owned))
            .collect()
    };
    let want = |v: [&str; 3]| v.map(|s| Some(s.to_owned())).to_vec();
    ensure!(
        acquired.len() == 3 && acquired.iter().all(|s| s.closed),
        "3 closed {} spans expected (grant, busy try, timeout), saw {acquired:?}",
        span::ACQUIRE
    );
    ensure!(
        seen(label::OUTCOME) == want(["granted", "busy", "timeout"]),
        "acquisition outcomes {:?}, expected granted, busy, timeout",
        seen(label::OUTCOME)
    );
    ensure!(
        seen(label::ATTEMPT) == want(["try", "try", "wait"])
            && seen(label::MODE) == want(["exclusive", "exclusive", "exclusive"]),
        "acquisition spans' attempt and mode fields wrong: {acquired:?}"
    );
    ensure!(
        acquired[0].field("lock.fencing_token") == token.map(|t| t.get().to_string()).as_deref(),
        "the grant's span says fencing token {:?}, the lease has {token:?}",
        acquired[0].field("lock.fencing_token")
    );
    let renewed = spans_of(cap, &name, span::RENEW, backend);
    ensure!(
        renewed.len() == 1
            && renewed[0].field(label::RENEWAL) == Some("manual")
            && renewed[0].field(label::OUTCOME) == Some("renewed"),
        "one manual renewal span with outcome renewed expected, saw {renewed:?}"
    );
    let released = spans_of(cap, &name, span::RELEASE, backend);
    ensure!(
        released.len() == 1
            && released[0].closed
            && released[0].field(label::OUTCOME) == Some("released"),
        "one closed release span with outcome released expected, saw {released:?}"
    );

    let b = (label::BACKEND, backend);
    for (outcome, n) in [("granted", 1), ("busy", 1), ("timeout", 1), ("error", 0)] {
        let got = cap.counter(&name, metric::ACQUISITIONS, &[b, (label::OUTCOME, outcome)]);
        ensure!(
            got == n,
            "{} with outcome {outcome} counted {got}, expected {n}",
            metric::ACQUISITIONS
        );
    }
    let durations = cap.histogram(&name, metric::ACQUIRE_DURATION, &[b]);
    ensure!(
        durations.len() == 3,
        "{} recorded {} values for 3 acquisitions",
        metric::ACQUIRE_DURATION,
        durations.len()
    );
    // The values are the times: the wait that timed out took its whole bound at least.
    let waited = cap.histogram(
        &name,
        metric::ACQUIRE_DURATION,
        &[b, (label::OUTCOME, "timeout")],
    );
    ensure!(
        waited.len() == 1 && waited[0] >= bound.as_secs_f64(),
        "{} of the wait that timed out after {bound:?}: {waited:?} s",
        metric::ACQUIRE_DURATION
    );
    let renewals = cap.counter(&name, metric::RENEWALS, &[b, (label::OUTCOME, "renewed")]);
    ensure!(
        renewals == 1,
        "{} counted {renewals} renewed, expected 1",
        metric::RENEWALS
    );
    let holds = cap.histogram(&name, metric::HOLD_DURATION, &[b, (label::END, "released")]);
    ensure!(
        holds.len() == 1 && holds[0] >= held_for.as_secs_f64(),
        "{} (end released) recorded {holds:?} s for one lease held {held_for:?} before its \
         release",
        metric::HOLD_DURATION,
    );
    for gauge in [metric::HELD, metric::WAITING] {
        let left = cap.gauge(&name, gauge, &[b]);
        ensure!(
            left == 0.0,
            "{gauge} is {left} after every lease was released and every wait ended"
        );
    }
    let lost = cap.counter(&name, metric::LOST, &[b]);
    ensure!(
        lost == 0,
        "{} counted {lost} losses; none happened",
        metric::LOST
    );
    let handoffs = cap.counter(&name, metric::HANDOFFS, &[b]);
    ensure!(
        handoffs == 0,
        "{} counted {handoffs}: nobody was granted after waiting (the waiter timed out)",
        metric::HANDOFFS
    );
    Ok(())
}

/// A waiter granted when its holder releases is a hand-off: `lock.handoffs` counts it once
/// (with its mode), its acquisition span says `lock.queued = true`; the holder's uncontended
/// grant says `false` and counts none.
pub async fn a_handoff_is_reported(h: &dyn Harness) -> Result<(), Failure> {
    let cap = the_capture()?;
    let t = h.timing();
    let (a, b) = (client(h).await?, client(h).await?);
    let backend = a.backend();
    let name = fresh_name("telemetry-handoff");
    cap.watch(&name);
    let o = opts(h).ttl(t.ttl * 4);
    let lease = held(a.try_acquire(&name, &o).await?, "holder")?;
    let waiter = spawn_waiter(b.clone(), &name, o.clone().wait_for(t.ttl * 8 + t.slack));
    // Waiting once its call has started (the gauge), and a slack later surely past its first
    // attempt, which found the lock held.
    let bl = (label::BACKEND, backend);
    let start = Instant::now();
    while cap.gauge(&name, metric::WAITING, &[bl]) < 1.0 {
        ensure!(
            start.elapsed() < t.slack * 4,
            "{} never showed the waiter waiting",
            metric::WAITING
        );
        tokio::time::sleep(t.slack / 20).await;
    }
    tokio::time::sleep(t.slack).await;
    // A holder that expired on a loaded machine hands off all the same.
    match lease.release().await {
        Ok(()) | Err(Error::NotHeld { .. } | Error::Lost { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let (_, next) = within(
        t.ttl * 4 + t.slack * 4,
        "the waiter after the release",
        waiter,
    )
    .await?
    .map_err(|e| Failure(format!("the waiter panicked: {e}")))?;
    next?.release().await?;

    let handoffs = cap.counter(&name, metric::HANDOFFS, &[bl, (label::MODE, "exclusive")]);
    ensure!(
        handoffs == 1,
        "{} counted {handoffs} for one waiter granted on its holder's release (expected 1)",
        metric::HANDOFFS
    );
    let acquired = spans_of(cap, &name, span::ACQUIRE, backend);
    let queued: Vec<Option<&str>> = acquired.iter().map(|s| s.field("lock.queued")).collect();
    ensure!(
        queued == [Some("false"), Some("true")],
        "the holder's and the waiter's acquisition spans say lock.queued {queued:?}, expected \
         false then true"
    );
    Ok(())
}

/// A lease lost because its lock was deleted behind its back is reported once, before or as
/// its lost signal fires: a `lock.lost` count and a warning event with `lock.state = lost` and
/// the same reason (`refused`, or `connection_closed` where the lock is its connection's
/// session), its hold ended as `lost`, nothing left held — and the release that follows
/// changes none of it.
pub async fn a_loss_is_reported_with_its_reason(h: &dyn Harness) -> Result<(), Failure> {
    let cap = the_capture()?;
    let t = h.timing();
    let a = client(h).await?;
    let backend = a.backend();
    let name = fresh_name("telemetry-lost");
    cap.watch(&name);
    let long = opts(h).ttl(t.ttl * 4).auto_renew(None);
    let lease = held(a.try_acquire(&name, &long).await?, "holder")?;
    match h.break_lock(&name).await {
        Some(r) => r?,
        None => return Err(Failure("harness stopped supporting break_lock".into())),
    }
    within(
        lease.ttl() / 2 + t.slack,
        "lost signal after a refused renewal",
        lease.lost().wait(),
    )
    .await?;
    // Reported by the time the signal fires, give or take the slack of a task switch.
    let b = (label::BACKEND, backend);
    let reason = loss_reason(cap, &name, backend, t.slack).await;
    let Some(reason) = reason.filter(|r| ["refused", "connection_closed"].contains(r)) else {
        return Err(Failure(format!(
            "the lease turned Lost (its lock deleted) and {} counted no loss with reason \
             refused or connection_closed within {:?} (counted: {reason:?})",
            metric::LOST,
            t.slack,
        )));
    };
    let _ = lease.release().await;
    let lost = cap.counter(&name, metric::LOST, &[b]);
    ensure!(
        lost == 1,
        "{} counted {lost} losses of one lease",
        metric::LOST
    );
    let events: Vec<_> = cap
        .events(&name)
        .into_iter()
        .filter(|e| {
            e.field("lock.state") == Some("lost") && e.field(label::BACKEND) == Some(backend)
        })
        .collect();
    ensure!(
        events.len() == 1
            && events[0].level == tracing::Level::WARN
            && events[0].field(label::LOSS_REASON) == Some(reason),
        "one warning event with lock.state = lost and reason {reason} expected, saw {events:?}"
    );
    // The loss's end is recorded just after its count, on the thread that saw the loss: it
    // too gets the slack of a task switch (a loaded machine once read the count between them).
    let by = Instant::now() + t.slack;
    let (ends, as_lost) = loop {
        let ends = cap.histogram(&name, metric::HOLD_DURATION, &[b]);
        let as_lost = cap.histogram(&name, metric::HOLD_DURATION, &[b, (label::END, "lost")]);
        if (ends.len() == 1 && as_lost.len() == 1) || Instant::now() >= by {
            break (ends, as_lost);
        }
        tokio::time::sleep(t.slack / 10).await;
    };
    ensure!(
        ends.len() == 1 && as_lost.len() == 1,
        "{} recorded {} ends ({} as lost) for one lost lease released after",
        metric::HOLD_DURATION,
        ends.len(),
        as_lost.len()
    );
    let held_now = cap.gauge(&name, metric::HELD, &[b]);
    ensure!(
        held_now == 0.0,
        "{} is {held_now} after the only lease was lost and released",
        metric::HELD
    );
    Ok(())
}

/// Waits up to the slack for `name`'s loss to be counted, and returns its reason.
async fn loss_reason(
    cap: &Capture,
    name: &LockName,
    backend: &str,
    slack: std::time::Duration,
) -> Option<&'static str> {
    let by = Instant::now() + slack;
    let b = (label::BACKEND, backend);
    loop {
        let reason = ["refused", "expired", "connection_closed", "max_hold"]
            .into_iter()
            .find(|r| cap.counter(name, metric::LOST, &[b, (label::LOSS_REASON, r)]) > 0);
        if reason.is_some() || Instant::now() >= by {
            return reason;
        }
        tokio::time::sleep(slack / 10).await;
    }
}

/// A client behind a healed fault proxy, holding a fresh watched name `tag` with automatic
/// renewal: the start of the two cases below.
async fn watched_holder(
    h: &dyn Harness,
    cap: &Capture,
    tag: &str,
) -> Result<(crate::Faulty, LockName, Box<dyn lock_core::Lease>), Failure> {
    let holder = faulty(h, std::time::Duration::ZERO).await?;
    holder.link.set(Fault::Healed);
    let name = fresh_name(tag);
    cap.watch(&name);
    let lease = holder
        .lock
        .acquire(&name, &opts(h).auto_renew(None))
        .await?;
    Ok((holder, name, lease))
}

/// A holder cut off from the backend (its link blackholed: nothing answers, nothing is
/// refused) is reported AtRisk (a warning event, `lock.state = at_risk`) and then Lost, as
/// `expired` — or as `connection_closed` where the lock is its connection's session and the
/// driver saw that connection end — once, with one warning event.
pub async fn a_partitioned_lease_is_reported_at_risk_then_lost(
    h: &dyn Harness,
) -> Result<(), Failure> {
    let cap = the_capture()?;
    let t = h.timing();
    let (holder, name, lease) = watched_holder(h, cap, "telemetry-partition").await?;
    let backend = holder.lock.backend();
    holder.link.set(Fault::Blackhole);
    let limit = lease
        .valid_until()
        .saturating_duration_since(Instant::now())
        + t.slack;
    let fired = within(
        limit,
        "lost signal of a partitioned holder",
        lease.lost().wait(),
    )
    .await;
    holder.link.set(Fault::Healed);
    fired?;
    let reason = loss_reason(cap, &name, backend, t.slack).await;
    let events: Vec<_> = cap
        .events(&name)
        .into_iter()
        .filter(|e| e.field(label::BACKEND) == Some(backend))
        .collect();
    let states: Vec<_> = events
        .iter()
        .filter_map(|e| e.field("lock.state"))
        .collect();
    let _ = lease.release().await;
    match reason {
        Some("expired") => ensure!(
            states == ["at_risk", "lost"],
            "a partitioned lease lost as expired must be reported at_risk, then lost (one event \
             each), saw the events {events:?}"
        ),
        Some("connection_closed") => ensure!(
            states.last() == Some(&"lost") && states.iter().filter(|s| **s == "lost").count() == 1,
            "one lost event expected, saw {events:?}"
        ),
        other => {
            return Err(Failure(format!(
                "a partitioned lease turned Lost and {} said the reason {other:?} (expected \
                 expired, or connection_closed for a session-bound lock); events {events:?}",
                metric::LOST
            )))
        }
    }
    let lost = cap.counter(&name, metric::LOST, &[(label::BACKEND, backend)]);
    ensure!(
        lost == 1,
        "{} counted {lost} losses of one lease",
        metric::LOST
    );
    Ok(())
}

/// Where the lock is its connection's session, a holder whose connection was cut is reported
/// Lost as `connection_closed`, within the notice a session-bound lease promises
/// ([`crate::Timing::dropped_connection_notice`]) plus the slack.
pub async fn a_cut_session_is_reported_lost_as_connection_closed(
    h: &dyn Harness,
) -> Result<(), Failure> {
    let cap = the_capture()?;
    let t = h.timing();
    let (holder, name, lease) = watched_holder(h, cap, "telemetry-cut").await?;
    let backend = holder.lock.backend();
    holder.link.set(Fault::Cut);
    within(
        t.dropped_connection_notice() + t.slack,
        "lost signal of a holder whose session was cut",
        lease.lost().wait(),
    )
    .await?;
    let reason = loss_reason(cap, &name, backend, t.slack).await;
    let _ = lease.release().await;
    ensure!(
        reason == Some("connection_closed"),
        "a lease whose session was cut was reported lost as {reason:?}, expected \
         connection_closed"
    );
    Ok(())
}
