//! The lost-lease signal: fires on expiry and on refused renewal, before anyone else holds the
//! lock; resolves on release so no task waits forever.

use std::time::{Duration, Instant};

use lock_core::LeaseState;

use super::support::{
    acquire_when_free, client, held, in_state, long_opts, opts, scene, watch_lost, within, Scene,
};
use crate::{ensure, fresh_name, Failure, Harness};

/// An unrenewed holder's `valid_until` is not after the moment a waiter is granted the lock,
/// its state is Lost by then, and its lost signal has resolved (within scheduling noise).
pub async fn lost_fires_before_successor_is_granted(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "lost-first").await?;
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let ttl = lease.ttl();
    let lost = lease.lost();
    let watcher = tokio::spawn(async move {
        lost.wait().await;
        Instant::now()
    });
    let next = within(
        ttl * 4,
        "waiter",
        b.acquire(&name, &opts(h).wait_for(ttl * 2 + t.slack)),
    )
    .await??;
    let granted = Instant::now();
    ensure!(
        lease.valid_until() <= granted,
        "the old holder's valid_until is after the successor's grant"
    );
    in_state(
        &*lease,
        LeaseState::Lost,
        "(the old holder) while another client holds the lock",
    )?;
    let fired = within(t.slack, "the old holder's lost signal", watcher)
        .await?
        .map_err(|e| Failure(format!("watcher panicked: {e}")))?;
    ensure!(
        fired <= granted + Duration::from_millis(50),
        "lost signal fired {:?} after the successor was granted",
        fired - granted
    );
    next.release().await?;
    drop(lease);
    Ok(())
}

/// At `max_hold` the watchdog gives the lock up, and the holder's lost signal has resolved
/// before a waiting client is granted it — also where the lock does not lapse on its own (a
/// session or a file), and the watchdog must delete it.
pub async fn lost_fires_before_max_hold_successor(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "lost-max-hold").await?;
    let max_hold = t.ttl * 2;
    let t0 = Instant::now();
    let lease = held(
        a.try_acquire(&name, &opts(h).auto_renew(Some(max_hold)))
            .await?,
        "holder",
    )?;
    let window = lease.valid_until().saturating_duration_since(t0);
    let lost = lease.lost();
    let watcher = tokio::spawn(async move {
        lost.wait().await;
        Instant::now()
    });
    let wait = max_hold + window.max(lease.ttl()) * 2 + t.slack;
    let next =
        acquire_when_free(&*b, &name, &opts(h), wait, "waiter behind a max_hold lease").await?;
    let granted = Instant::now();
    let resolved = lease.lost().is_lost();
    let state = lease.state();
    let fired = within(t.slack, "the old holder's lost signal", watcher)
        .await?
        .map_err(|e| Failure(format!("watcher panicked: {e}")))?;
    ensure!(
        resolved,
        "successor granted {:?} after the holder's grant (max_hold {max_hold:?}) while the \
         holder's lost signal had not resolved; it resolved {:?} after that grant",
        granted - t0,
        fired.saturating_duration_since(granted)
    );
    ensure!(
        state == LeaseState::Lost,
        "old holder reports {state:?} while another client holds the lock"
    );
    ensure!(
        granted >= t0 + max_hold,
        "lock granted {:?} after the holder's grant, before max_hold {max_hold:?}",
        granted - t0
    );
    next.release().await?;
    drop(lease);
    Ok(())
}

/// When the backend refuses a renewal (the lock was deleted behind the holder's back), an
/// auto-renewed lease turns Lost and its signal fires well before its `valid_until`.
pub async fn lost_fires_when_renewal_refused(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let a = client(h).await?;
    let name = fresh_name("lost-refused");
    let long = opts(h).ttl(t.ttl * 4).auto_renew(None);
    let lease = held(a.try_acquire(&name, &long).await?, "holder")?;
    match h.break_lock(&name).await {
        Some(r) => r?,
        None => return Err(Failure("harness stopped supporting break_lock".into())),
    }
    let broken_at = Instant::now();
    let vu = lease.valid_until();
    // The watchdog renews at about TTL/3 and must learn of the refusal then.
    within(
        lease.ttl() / 2 + t.slack,
        "lost signal after a refused renewal",
        lease.lost().wait(),
    )
    .await?;
    ensure!(
        Instant::now() < vu,
        "lost signal only fired at valid_until, not on the refused renewal"
    );
    in_state(&*lease, LeaseState::Lost, "after a refused renewal")?;
    ensure!(
        lease.renew().await.is_err(),
        "manual renew succeeded after the lock was deleted"
    );
    let _ = broken_at;
    let _ = lease.release().await;
    Ok(())
}

/// Release resolves the lost signal, so a task that waits on it ends with the lease.
pub async fn lost_signal_resolves_on_release(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let a = client(h).await?;
    let name = fresh_name("lost-release");
    let lease = held(
        a.try_acquire(&name, &opts(h).ttl(t.ttl * 10)).await?,
        "holder",
    )?;
    let lost = lease.lost();
    ensure!(!lost.is_lost(), "lost signal resolved on a fresh lease");
    lease.release().await?;
    within(t.slack, "lost signal after release", lost.wait()).await?;
    Ok(())
}

/// Dropping a lease (without `release`) inside a Tokio runtime frees the lock promptly — in
/// the background, within the slack — and resolves its lost signal; nobody has to wait for
/// its TTL.
pub async fn dropped_lease_frees_promptly(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "drop-frees").await?;
    let lease = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    let lost = watch_lost(lease.as_ref());
    let dropped = Instant::now();
    drop(lease);
    let next = b
        .acquire(&name, &long_opts(h).wait_for(t.slack))
        .await
        .map_err(|e| {
            Failure(format!(
                "the lock was still held {:?} after its lease was dropped (slack {:?}): a \
                 dropped lease must free the lock in the background ({e})",
                dropped.elapsed(),
                t.slack
            ))
        })?;
    let fired = within(t.slack, "the dropped lease's lost signal", lost)
        .await
        .map_err(|_| Failure("a dropped lease's lost signal did not resolve".into()))?
        .map_err(|e| Failure(format!("watcher panicked: {e}")))?;
    ensure!(
        fired.saturating_duration_since(dropped) <= t.slack,
        "a dropped lease's lost signal resolved {:?} after the drop",
        fired - dropped
    );
    next.release().await?;
    Ok(())
}

/// `abandon` resolves the lease's lost signal too (no task waits forever on a lease that is
/// gone), while the lock itself stays held until the backend frees it.
pub async fn lost_signal_resolves_on_abandon(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let a = client(h).await?;
    let name = fresh_name("abandon-lost");
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let lost = lease.lost();
    ensure!(!lost.is_lost(), "lost signal resolved on a fresh lease");
    lease.abandon();
    within(t.slack, "lost signal after abandon", lost.wait())
        .await
        .map_err(|_| {
            Failure(format!(
                "an abandoned lease's lost signal did not resolve within {:?}",
                t.slack
            ))
        })?;
    Ok(())
}
