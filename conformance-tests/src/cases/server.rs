//! What the backend's servers do to held locks, checked against what the driver declares:
//! a crash and restart ([`Capabilities::survives_restart`]) and a step of a server's time of
//! day ([`Capabilities::expires_by`]; tokens never follow it).
//!
//! [`Capabilities::survives_restart`]: lock_core::Capabilities::survives_restart
//! [`Capabilities::expires_by`]: lock_core::Capabilities::expires_by

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, FencingToken, LeaseState, LockOptions};

use super::support::{client, free_for_a_newcomer, held, in_state, opts, sleep, still_held};
use crate::{ensure, fresh_name, ClockStep, Failure, Harness};

/// The shortest span a lease must be vouched for to outlast a restart of the backend: for a
/// driver without TTLs of its own (its leases last a session), the harness's TTL must be at
/// least this long for [`a_held_lock_survives_a_backend_restart`] to run.
pub const RESTART_WINDOW: Duration = Duration::from_secs(8);

/// [`Facts::lease_window`](super::Facts): how long a lease asked for with a TTL that a restart
/// fits in is vouched for at its grant. `None` if no such lease is had within 5 s.
pub(crate) async fn lease_window(c: &dyn DistributedLock) -> Option<Duration> {
    let o = LockOptions::new(
        (RESTART_WINDOW * 3)
            .max(c.capabilities().min_ttl)
            .min(c.capabilities().max_ttl),
    );
    let probe = async {
        let asked = Instant::now();
        let lease = c
            .try_acquire(&fresh_name("probe-window"), &o)
            .await
            .ok()??;
        let window = lease.valid_until().saturating_duration_since(asked);
        let _ = lease.release().await;
        Some(window)
    };
    tokio::time::timeout(Duration::from_secs(5), probe)
        .await
        .ok()
        .flatten()
}

/// A TTL that a restart fits in many times over, within what the driver accepts (ignored by a
/// driver whose leases last a session).
fn outlasting_opts(h: &dyn Harness, caps: &lock_core::Capabilities) -> LockOptions {
    let ttl = (h.timing().ttl * 20)
        .max(RESTART_WINDOW * 3)
        .min(caps.max_ttl);
    LockOptions::new(ttl)
}

/// A client made once the backend serves again after a restart (connecting may fail until
/// then), by `deadline`.
async fn client_after_restart(
    h: &dyn Harness,
    deadline: Instant,
) -> Result<std::sync::Arc<dyn DistributedLock>, Failure> {
    loop {
        match client(h).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e.0, "backend not back yet");
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `survives_restart`: a lock held across a crash and restart of the backend that ends within
/// the lease's validity is still its holder's afterwards. The holder's renewal succeeds once
/// the backend serves again, another client is refused the lock, and the holder's release then
/// frees it (a restart that turned the lock into a record nobody owns would keep it busy).
pub async fn a_held_lock_survives_a_backend_restart(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let a = client(h).await?;
    let o = outlasting_opts(h, &a.capabilities());
    let name = fresh_name("restart-held");
    let asked = Instant::now();
    let lease = held(a.try_acquire(&name, &o).await?, "before the restart")?;
    let window = lease.valid_until().saturating_duration_since(asked);
    let started = Instant::now();
    h.restart_backend()
        .await
        .map_err(|e| Failure(format!("could not restart the backend: {e}")))?;
    let took = started.elapsed();
    let deadline = Instant::now() + t.ttl * 20 + Duration::from_secs(10);
    // Before the holder renews: a renewal could put back a lock the restart forgot.
    let b = client_after_restart(h, deadline).await?;
    let refused = loop {
        match b.try_acquire(&name, &opts(h)).await {
            Ok(granted) => break granted.is_none(),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tracing::debug!(error = %e, "backend not back yet");
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    ensure!(
        refused,
        "survives_restart is declared, yet right after a restart of the backend that took \
         {took:?} another client was granted a lock whose holder's lease was vouched for \
         {window:?} at its grant"
    );
    loop {
        match lease.renew().await {
            Ok(()) => break,
            Err(e) if lease.state() != LeaseState::Lost && Instant::now() < deadline => {
                tracing::debug!(error = %e, "renewal before the backend is back");
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                ensure!(
                    took + t.slack < window,
                    "cannot judge: the restart took {took:?}, and the lease was vouched for \
                     {window:?} only (give the harness a longer session or TTL); the renewal \
                     after it failed: {e}"
                );
                return Err(Failure(format!(
                    "survives_restart is declared, but the holder's renewal after a restart of \
                     the backend that took {took:?} failed ({e}); its lease is {:?}, vouched \
                     for {window:?} at its grant",
                    lease.state(),
                )));
            }
        }
    }
    in_state(
        lease.as_ref(),
        LeaseState::Held,
        "after its renewal was confirmed after the restart",
    )?;
    still_held(
        b.as_ref(),
        &name,
        &opts(h),
        "survives_restart is declared, yet after a restart of the backend another client was \
         granted a lock its holder still held and had renewed",
    )
    .await?;
    lease.release().await?;
    free_for_a_newcomer(
        h,
        b.as_ref(),
        &name,
        "the holder released it after the restart, and the lock stayed busy",
    )
    .await
}

/// `expires_by = Elapsed`: a step of the servers' time of day moves no lock's end. A step
/// ahead of ten TTLs does not end a held lock (another client is refused; the holder renews),
/// and, where locks have TTLs of their own, one behind does not keep a dead holder's lock past
/// its TTL. The clocks are put right at the end, whatever happened.
pub async fn a_step_of_the_servers_clock_does_not_move_expiry(
    h: &dyn Harness,
) -> Result<(), Failure> {
    let outcome = clock_steps_move_no_expiry(h).await;
    let reset = h.step_clock(ClockStep::Ahead(Duration::ZERO)).await;
    outcome?;
    reset.map_err(|e| Failure(format!("could not put the servers' clocks right: {e}")))
}

async fn clock_steps_move_no_expiry(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let (a, b) = (client(h).await?, client(h).await?);
    let name = fresh_name("clock-expiry");
    let o = LockOptions::new(t.ttl * 4);
    let step = ClockStep::Ahead(o.ttl * 10);
    let lease = held(a.try_acquire(&name, &o).await?, "holder")?;
    step_to(h, step).await?;
    let broken = |when: &str| {
        format!(
            "expires_by = Elapsed is declared, yet {when} a step of the server's time of day \
             ({step}) another client was granted a lock whose holder had {:?} of validity left",
            lease
                .valid_until()
                .saturating_duration_since(Instant::now())
        )
    };
    still_held(b.as_ref(), &name, &opts(h), broken("right after")).await?;
    lease.renew().await.map_err(|e| {
        Failure(format!(
            "expires_by = Elapsed is declared, yet after a step of the server's time of day \
             ({step}) the holder's renewal failed: {e}"
        ))
    })?;
    in_state(lease.as_ref(), LeaseState::Held, "after its renewal")?;
    still_held(b.as_ref(), &name, &opts(h), broken("after its renewal and")).await?;
    if !a.capabilities().per_lock_ttl {
        return lease.release().await.map_err(Failure::from);
    }
    // Behind: the lock of a holder that stops renewing frees by its TTL.
    let back = ClockStep::Behind(o.ttl * 10);
    step_to(h, back).await?;
    let valid_until = lease.valid_until();
    lease.abandon();
    let deadline = valid_until + t.slack;
    loop {
        if let Some(l) = b.try_acquire(&name, &opts(h)).await? {
            l.release().await?;
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "expires_by = Elapsed is declared, yet with the server's time of day stepped \
             ({back}) an abandoned lock was still held {:?} after its holder's valid_until \
             (it ends by the time of day, a TTL and the step later)",
            t.slack
        );
        sleep(t.slack / 10).await;
    }
}

async fn step_to(h: &dyn Harness, step: ClockStep) -> Result<(), Failure> {
    h.step_clock(step)
        .await
        .map_err(|e| Failure(format!("could not step the servers' clocks ({step}): {e}")))
}

/// Tokens never follow a server's time of day: after a step an hour behind, and again after
/// the step is undone, each grant's token is above every earlier one.
pub async fn tokens_do_not_follow_the_servers_clock(h: &dyn Harness) -> Result<(), Failure> {
    let outcome = tokens_across_steps(h).await;
    let reset = h.step_clock(ClockStep::Ahead(Duration::ZERO)).await;
    outcome?;
    reset.map_err(|e| Failure(format!("could not put the servers' clocks right: {e}")))
}

async fn tokens_across_steps(h: &dyn Harness) -> Result<(), Failure> {
    let a = client(h).await?;
    let name = fresh_name("clock-token");
    let grant = |when: &'static str| {
        let (a, name) = (a.clone(), name.clone());
        async move {
            let l = held(a.try_acquire(&name, &opts(h)).await?, when)?;
            let token = l.fencing_token().ok_or_else(|| {
                Failure("the driver declares fencing but the lease has no token".into())
            })?;
            l.release().await?;
            Ok::<FencingToken, Failure>(token)
        }
    };
    let before = grant("before the step").await?;
    let hour = Duration::from_secs(3600);
    step_to(h, ClockStep::Behind(hour)).await?;
    let behind = grant("with the clock an hour behind").await?;
    ensure!(
        behind > before,
        "token {behind} after the server's clock stepped an hour behind is not above {before} \
         before it: tokens follow the server's time of day"
    );
    step_to(h, ClockStep::Ahead(Duration::ZERO)).await?;
    let after = grant("with the clock put right").await?;
    ensure!(
        after > behind,
        "token {after} after the server's clock was put right is not above {behind}"
    );
    Ok(())
}
