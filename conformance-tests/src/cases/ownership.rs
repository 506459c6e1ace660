//! Ownership: release and renew compare the owner; a stale lease never touches a successor.

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Lease, LeaseState, LockName, LockOptions};

use super::support::{
    acquire_when_free, client, held, in_state, is_not_held, long_opts, opts, scene, sleep,
    sleep_until, still_held, within, Scene,
};
use crate::{ensure, fresh_name, Failure, Harness};

/// Lets `lease` expire, then has `successor` acquire the lock with `successor_opts`: a long TTL
/// where the case later checks that the successor still holds it (with the suite's short TTL
/// the successor itself expired before that check on a loaded machine: the unbroken
/// wrapper's `dropped_stale_lease_keeps_successor`, 2026-11-30, beside three soaks).
async fn expire_and_take_over(
    h: &dyn Harness,
    lease: &dyn Lease,
    successor: &dyn DistributedLock,
    successor_opts: &LockOptions,
) -> Result<Box<dyn Lease>, Failure> {
    let t = h.timing();
    sleep_until(lease.valid_until()).await;
    let name = lease.name().clone();
    let wait = lease.ttl() + t.slack;
    let next = acquire_when_free(
        successor,
        &name,
        successor_opts,
        wait,
        "a successor taking over an expired lock (expiry::abandoned_lease_frees_after_ttl)",
    )
    .await?;
    Ok(next)
}

/// A release by a holder whose lease expired returns NotHeld and leaves the successor's lock
/// in place.
pub async fn stale_release_keeps_successor(h: &dyn Harness) -> Result<(), Failure> {
    let (a, b, c) = (client(h).await?, client(h).await?, client(h).await?);
    let name = fresh_name("stale-release");
    let stale = held(a.try_acquire(&name, &opts(h)).await?, "first holder")?;
    let successor = expire_and_take_over(h, stale.as_ref(), b.as_ref(), &long_opts(h)).await?;
    match stale.release().await {
        Err(e) if is_not_held(&e) => {}
        Ok(()) => return Err(Failure("release of an expired lease returned Ok".into())),
        Err(e) => {
            return Err(Failure(format!(
                "release of an expired lease: expected NotHeld, got {e:?}"
            )))
        }
    }
    still_held(
        &*c,
        &name,
        &opts(h),
        "a stale release freed the successor's lock",
    )
    .await?;
    successor.release().await?;
    Ok(())
}

/// A renew by a holder whose lease expired fails, and the successor still holds the lock.
pub async fn stale_renew_keeps_successor(h: &dyn Harness) -> Result<(), Failure> {
    let (a, b, c) = (client(h).await?, client(h).await?, client(h).await?);
    let name = fresh_name("stale-renew");
    let stale = held(a.try_acquire(&name, &opts(h)).await?, "first holder")?;
    let successor = expire_and_take_over(h, stale.as_ref(), b.as_ref(), &long_opts(h)).await?;
    ensure!(
        stale.renew().await.is_err(),
        "renew of an expired lease succeeded while another client holds the lock"
    );
    in_state(&*stale, LeaseState::Lost, "after it expired")?;
    still_held(
        &*c,
        &name,
        &opts(h),
        "a stale renew freed the successor's lock",
    )
    .await?;
    in_state(&*successor, LeaseState::Held, "(the successor)")?;
    successor.release().await?;
    drop(stale);
    Ok(())
}

/// Dropping an expired lease (which releases in the background) leaves the successor alone.
pub async fn dropped_stale_lease_keeps_successor(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let (a, b, c) = (client(h).await?, client(h).await?, client(h).await?);
    let name = fresh_name("stale-drop");
    let stale = held(a.try_acquire(&name, &opts(h)).await?, "first holder")?;
    let successor = expire_and_take_over(h, stale.as_ref(), b.as_ref(), &long_opts(h)).await?;
    drop(stale);
    sleep(t.slack).await; // room for a background release to run
    still_held(
        &*c,
        &name,
        &opts(h),
        "dropping an expired lease freed the successor's lock",
    )
    .await?;
    successor.release().await?;
    Ok(())
}

/// Ownership belongs to the lease, not the client: the same client's expired lease cannot
/// release the lease that client holds now.
pub async fn ownership_is_per_lease_not_per_client(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "per-lease").await?;
    let old = held(a.try_acquire(&name, &opts(h)).await?, "first lease")?;
    let new = expire_and_take_over(h, old.as_ref(), a.as_ref(), &long_opts(h)).await?;
    ensure!(
        old.release().await.is_err(),
        "the client's expired lease released its current lease"
    );
    still_held(
        &*b,
        &name,
        &opts(h),
        "the lock is free although the client's current lease holds it",
    )
    .await?;
    new.release().await?;
    Ok(())
}

/// A lock deleted behind the holder's back (by an operator) makes the holder's release
/// return NotHeld, and does not free a new holder.
pub async fn broken_lock_release_is_not_held(h: &dyn Harness) -> Result<(), Failure> {
    let (a, b, c) = (client(h).await?, client(h).await?, client(h).await?);
    let name = fresh_name("broken");
    let long = opts(h).ttl(h.timing().ttl * 40);
    let victim = held(a.try_acquire(&name, &long).await?, "holder")?;
    match h.break_lock(&name).await {
        Some(r) => r?,
        None => return Err(Failure("harness stopped supporting break_lock".into())),
    }
    let successor = within(
        Duration::from_secs(10),
        "acquire after break",
        b.acquire(&name, &long),
    )
    .await??;
    ensure!(
        victim.release().await.is_err(),
        "release of a broken lease succeeded"
    );
    still_held(
        &*c,
        &name,
        &long,
        "the broken lease's release freed the new holder's lock",
    )
    .await?;
    successor.release().await?;
    Ok(())
}

/// A client whose lease expired and who then acquired the lock again: renewing the old lease
/// fails and does not extend the new one, which still ends at its own `valid_until` (plus
/// the slack) when abandoned.
pub async fn stale_renew_does_not_extend_new_lease(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "stale-renew-own").await?;
    let old = held(a.try_acquire(&name, &opts(h)).await?, "first lease")?;
    let new = expire_and_take_over(h, old.as_ref(), a.as_ref(), &opts(h)).await?;
    let new_t0 = Instant::now();
    let new_ttl = new.ttl();
    // Renew late in the new lease's life, so an extension would outlast it by far more than
    // the slack.
    sleep_until(new_t0 + new_ttl * 3 / 4).await;
    let renewed = old.renew().await;
    ensure!(
        renewed.is_err(),
        "renew of the client's expired lease succeeded while the same client holds a new lease"
    );
    frees_by_its_own_ttl(
        h,
        new,
        new_t0,
        b.as_ref(),
        &name,
        "the expired lease's renew",
    )
    .await
}

/// Abandons `new` (granted at `t0`) and checks that `other` gets `name` within its TTL and the
/// slack: `who` (a stale lease's renew) did not extend it.
async fn frees_by_its_own_ttl(
    h: &dyn Harness,
    new: Box<dyn Lease>,
    t0: Instant,
    other: &dyn DistributedLock,
    name: &LockName,
    who: &str,
) -> Result<(), Failure> {
    let (vu, ttl) = (new.valid_until(), new.ttl());
    new.abandon();
    let limit = ttl + h.timing().slack;
    let next = within(
        limit * 3,
        "another client waiting for the abandoned new lease",
        other.acquire(name, &opts(h).wait_for(limit * 2)),
    )
    .await?
    .map_err(|e| {
        Failure(format!(
            "the new lease (TTL {ttl:?}) was not free {:?} after it was granted: {who} \
             extended it ({e})",
            t0.elapsed()
        ))
    })?;
    let freed = Instant::now();
    ensure!(
        freed <= t0 + limit,
        "the new lease (TTL {ttl:?}, valid until {:?} after its grant) freed only {:?} after \
         its grant: {who} extended it",
        vu.saturating_duration_since(t0),
        freed - t0
    );
    next.release().await?;
    Ok(())
}

/// Releasing a lease that expired while nobody took the lock over is `NotHeld` (or `Lost`),
/// not a success: the holder learns it had lost the lock.
pub async fn release_after_expiry_is_not_held(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let a = client(h).await?;
    let name = fresh_name("release-expired");
    let t0 = Instant::now();
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    sleep_until(t0 + lease.ttl() + t.slack).await;
    match lease.release().await {
        Err(e) if is_not_held(&e) => Ok(()),
        Ok(()) => Err(Failure(
            "release of a lease that had expired (nobody took over) returned Ok: it must say \
             NotHeld"
                .into(),
        )),
        Err(e) => Err(Failure(format!(
            "release of an expired lease: expected NotHeld, got {e:?}"
        ))),
    }
}

/// A lease whose lock an operator deleted, still valid by its own clock, must not renew the
/// lock its own client has taken again since: a renewal is checked against the lease, not the
/// client. (The expired lease of [`stale_renew_does_not_extend_new_lease`] is refused before
/// any request by a driver that looks at its own clock first; this one reaches the server.)
/// Where locks have no TTL of their own, the new lease's release must still free the lock.
pub async fn broken_lease_renew_does_not_extend_the_clients_new_lease(
    h: &dyn Harness,
) -> Result<(), Failure> {
    let t = h.timing();
    let (a, b) = (client(h).await?, client(h).await?);
    let name = fresh_name("broken-renew-own");
    // Forty TTLs: valid by its own clock throughout.
    let old = held(a.try_acquire(&name, &long_opts(h)).await?, "first lease")?;
    match h.break_lock(&name).await {
        Some(r) => r?,
        None => return Err(Failure("harness stopped supporting break_lock".into())),
    }
    let new = within(
        Duration::from_secs(10),
        "the same client's acquire after the break",
        a.acquire(&name, &opts(h).wait_for(t.ttl * 4)),
    )
    .await??;
    let new_t0 = Instant::now();
    ensure!(
        old.renew().await.is_err(),
        "renew of a lease whose lock was deleted behind its back succeeded while its client \
         holds a new lease of the name: a renewal must be checked against the lease, not the \
         client"
    );
    if !a.capabilities().per_lock_ttl {
        // Nothing to extend: the renewal must have set nothing up that outlives the release.
        new.release().await?;
        let next = b.acquire(&name, &opts(h).wait_for(t.slack)).await;
        let next = next.map_err(|e| {
            Failure(format!(
                "the lock was still held {:?} after the new lease's release: the broken \
                 lease's renew took it again ({e})",
                t.slack
            ))
        })?;
        next.release().await?;
        return Ok(());
    }
    let who = format!("the broken lease's renew (TTL {:?})", old.ttl());
    frees_by_its_own_ttl(h, new, new_t0, b.as_ref(), &name, &who).await
}
