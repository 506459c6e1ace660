//! Renewal: renew extends, never resurrects; the watchdog stops on release, drop and max_hold.

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Lease, LeaseState, LockName};

use super::support::{
    acquire_when_free, cancel_after, held, in_state, long_opts, opts, scene, sleep, sleep_until,
    still_held, within, Scene,
};
use crate::{ensure, Failure, Harness};

/// A manual renew before expiry moves `valid_until` forward (by no more than a TTL from the
/// call's end) and keeps the lease Held, its lost signal quiet and others out past the original
/// expiry.
pub async fn manual_renew_extends(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "renew").await?;
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let lost = lease.lost();
    let first = lease.valid_until();
    sleep(t.ttl / 2).await;
    lease.renew().await?;
    let renewed = Instant::now();
    let second = lease.valid_until();
    ensure!(second > first, "renew did not move valid_until forward");
    ensure!(
        second <= renewed + lease.ttl(),
        "a renewal claims validity {:?} past the renew call's end + TTL {:?}",
        second - (renewed + lease.ttl()),
        lease.ttl()
    );
    // Past the original expiry, before the renewed one.
    sleep_until(first + (second - first) / 2).await;
    ensure!(
        Instant::now() < second,
        "test too slow to check the renewed window"
    );
    in_state(
        &*lease,
        LeaseState::Held,
        "after a renewal, past its original expiry",
    )?;
    ensure!(
        !lost.is_lost(),
        "the lost signal fired at the original expiry of a lease renewed before it: a \
         renewal must move the lost signal's deadline too"
    );
    still_held(
        &*b,
        &name,
        &opts(h),
        "lock granted to another client after its holder renewed it",
    )
    .await?;
    lease.release().await?;
    Ok(())
}

/// A manual `renew` whose future is dropped part-way (a caller's timeout) leaves the lease as
/// it was, or renewed: Held, its `valid_until` not moved back, renewable and releasable, and
/// the lock still out of others' reach. Cancelled after its first poll and after 1 and 5 ms.
pub async fn cancelled_renew_leaves_the_lease_held(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "cancel-renew").await?;
    let lease = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    for after in [0, 1, 5].map(Duration::from_millis) {
        let before = lease.valid_until();
        let _ = cancel_after(after, lease.renew()).await;
        let when = format!("after a renewal cancelled after {after:?}");
        in_state(&*lease, LeaseState::Held, &when)?;
        ensure!(
            lease.valid_until() >= before,
            "{when}, valid_until moved back by {:?}",
            before - lease.valid_until()
        );
        still_held(
            &*b,
            &name,
            &long_opts(h),
            format!("{when}, another client got the lock"),
        )
        .await?;
    }
    lease
        .renew()
        .await
        .map_err(|e| Failure(format!("a renewal after cancelled ones failed: {e}")))?;
    lease.release().await?;
    held(
        b.try_acquire(&name, &long_opts(h)).await?,
        "another client after the release that followed cancelled renewals",
    )?
    .release()
    .await?;
    Ok(())
}

/// Lost is final: a renewal asked at `valid_until` fails, though the server keeps the lock a
/// drift allowance longer and the request still finds it there; the lease stays Lost, and the
/// lock is not extended: another client is granted it once the TTL (from before the grant)
/// has run out. A driver that renews whatever it told its holder would hand the lock back to a
/// holder that has already given up its work.
pub async fn renew_at_valid_until_fails_though_the_server_still_has_the_lock(
    h: &dyn Harness,
) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "lost-final").await?;
    let asked = Instant::now();
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let until = lease.valid_until();
    sleep_until(until).await;
    let r = lease.renew().await;
    ensure!(
        r.is_err(),
        "a renewal asked {:?} after valid_until succeeded (the server keeps the lock a drift \
         allowance longer): the lease had been Lost, and Lost is final",
        until.elapsed()
    );
    in_state(
        &*lease,
        LeaseState::Lost,
        "after a renewal asked at its valid_until",
    )?;
    let by = asked + lease.ttl() + t.slack;
    let other = b
        .acquire(
            &name,
            &opts(h).wait_for(by.saturating_duration_since(Instant::now())),
        )
        .await
        .map_err(|e| {
            Failure(format!(
                "another client was not granted the lock within the TTL and the slack of the \
                 first grant ({e}): the refused renewal extended it"
            ))
        })?;
    other.release().await?;
    Ok(())
}

/// Renew after the lease expired fails, and does not recreate the lock: another client can
/// take it.
pub async fn renew_after_expiry_fails_and_does_not_recreate(
    h: &dyn Harness,
) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "no-resurrect").await?;
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    // Past the server-side expiry too, not only the conservative valid_until.
    sleep_until(Instant::now() + lease.ttl() + t.slack).await;
    ensure!(
        lease.renew().await.is_err(),
        "renew of an expired lease succeeded"
    );
    in_state(&*lease, LeaseState::Lost, "after it expired")?;
    let other = held(
        b.try_acquire(&name, &opts(h)).await?,
        "another client after a refused renew (was the lock recreated?)",
    )?;
    other.release().await?;
    Ok(())
}

/// With automatic renewal a lease outlives several TTLs, stays Held, and its lost signal does
/// not fire; after release the lock is free.
pub async fn auto_renew_keeps_lock(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "auto").await?;
    let lease = held(
        a.try_acquire(&name, &opts(h).auto_renew(None)).await?,
        "holder",
    )?;
    held_for_three_ttls(h, lease, b.as_ref(), &name, "an auto-renewed lease").await
}

/// `lease`, auto-renewed, on `name`: for three TTLs its lost signal stays quiet, it stays Held
/// with `valid_until` ahead, and `other` is kept out; then it releases, and `other` gets the
/// lock. `what` names the lease in messages.
async fn held_for_three_ttls(
    h: &dyn Harness,
    lease: Box<dyn Lease>,
    other: &dyn DistributedLock,
    name: &LockName,
    what: &str,
) -> Result<(), Failure> {
    let lost = lease.lost();
    sleep(h.timing().ttl * 3).await;
    ensure!(!lost.is_lost(), "lost signal fired on {what}");
    in_state(&*lease, LeaseState::Held, &format!("after 3 TTLs ({what})"))?;
    ensure!(
        lease.valid_until() > Instant::now(),
        "the valid_until of {what} passed"
    );
    still_held(
        other,
        name,
        &opts(h),
        format!("the lock of {what} was granted to another client after 3 TTLs"),
    )
    .await?;
    lease
        .release()
        .await
        .map_err(|e| Failure(format!("release of {what} failed: {e}")))?;
    held(
        other.try_acquire(name, &opts(h)).await?,
        &format!("after release of {what}"),
    )?
    .release()
    .await?;
    Ok(())
}

/// The watchdog renews at about a third of the validity window, as [`Renewal::Auto`]
/// promises (the window is the TTL, or less where a driver vouches for less, as ZooKeeper
/// ensembles do). Sampled every twentieth of the TTL for three TTLs, an auto-renewed lease
/// typically has at least a quarter of the window left when it is renewed (a watchdog that
/// renews near the end leaves the lock one late wake-up from expiry, every cycle), and its
/// `valid_until` moves at most twice as often as a third of the window explains (a watchdog
/// that renews in a loop floods the backend). The window is the most validity seen left at a
/// sample; "typically" is the median over the renewals, so one late wake-up on a loaded
/// machine does not decide it. Where the lease counts its renewals ([`Lease::renewals`]), the
/// count is at least the moves seen and within the same bound.
///
/// [`Renewal::Auto`]: lock_core::Renewal::Auto
/// [`Lease::renewals`]: lock_core::Lease::renewals
pub async fn watchdog_renews_at_about_a_third_of_the_ttl(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, name, .. } = scene(h, "cadence").await?;
    let lease = held(
        a.try_acquire(&name, &opts(h).auto_renew(None)).await?,
        "holder",
    )?;
    let ttl = lease.ttl();
    let start = Instant::now();
    let mut window = lease.valid_until().saturating_duration_since(start);
    // The validity left at the last sample before each move of valid_until.
    let mut left_at_renewal = Vec::new();
    let (mut until, mut left, mut samples) = (lease.valid_until(), window, 0u32);
    while start.elapsed() < ttl * 3 {
        sleep(ttl / 20).await;
        let now = Instant::now();
        samples += 1;
        if lease.valid_until() != until {
            left_at_renewal.push(left);
            until = lease.valid_until();
        }
        left = until.saturating_duration_since(now);
        window = window.max(left);
    }
    in_state(&*lease, LeaseState::Held, "after three TTLs auto-renewed")?;
    let counted = lease.renewals();
    lease.release().await?;
    let elapsed = start.elapsed();
    let moves = left_at_renewal.len();
    // Each move of valid_until was a renewal the backend confirmed (two between samples look
    // like one): the lease's own count is at least the moves seen, and as bounded as they are.
    let allowed = 6 * elapsed.as_micros() / window.as_micros().max(1);
    if let Some(n) = counted {
        ensure!(
            n >= moves as u64 && u128::from(n) <= allowed,
            "the lease counts {n} renewals (Lease::renewals) where valid_until moved {moves} \
             times in {elapsed:?} (at most {allowed} renewals allowed): the count is not the \
             confirmed renewals'"
        );
    }
    left_at_renewal.sort();
    let Some(&typical) = left_at_renewal.get(moves / 2) else {
        return Err(Failure(format!(
            "valid_until never moved in {elapsed:?} of auto-renewal"
        )));
    };
    ensure!(
        typical >= window / 4,
        "the auto-renewed lease typically had {typical:?} of validity left when renewed \
         (median of {moves} renewals; least {:?}), under a quarter of its window {window:?} \
         (TTL {ttl:?}): the watchdog renews too late (the promise is about every third of the \
         window)",
        left_at_renewal[0]
    );
    // Twice one renewal per third of the window.
    ensure!(
        moves as u128 <= allowed,
        "valid_until moved {moves} times in {elapsed:?} ({samples} samples, one every TTL/20), \
         more than twice the {} renewals of one every third of the window {window:?}: the \
         watchdog renews far more often than promised",
        allowed / 2
    );
    Ok(())
}

/// A lease does not depend on the client handle that made it: with every handle of that
/// client dropped, an auto-renewed lease stays Held for three TTLs, keeps others out, and
/// releases. (`fn take(url) -> Box<dyn Lease>`, which connects, locks and returns the lease
/// alone, is a natural thing to write.)
pub async fn lease_outlives_its_client_handle(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "orphan").await?;
    let lease = held(
        a.try_acquire(&name, &opts(h).auto_renew(None)).await?,
        "holder",
    )?;
    drop(a);
    held_for_three_ttls(
        h,
        lease,
        b.as_ref(),
        &name,
        "a lease whose client handle was dropped (a lease must keep what it needs of its client)",
    )
    .await
}

/// After release the watchdog never renews again: probed every quarter TTL for one and a half
/// TTLs, the lock is always free (a watchdog that kept ticking would recreate or extend it).
pub async fn watchdog_stops_after_release(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "wd-release").await?;
    // Release at different points of the renewal cycle.
    for phase in 0..3u32 {
        let lease = held(
            a.try_acquire(&name, &opts(h).auto_renew(None)).await?,
            "holder",
        )?;
        sleep(t.ttl * phase / 4).await;
        lease.release().await?;
    }
    for probe in 0..6u32 {
        sleep(t.ttl / 4).await;
        let what = format!(
            "probe {probe} ({:?} after release of auto-renewed leases)",
            t.ttl * (probe + 1) / 4
        );
        let l = held(b.try_acquire(&name, &opts(h)).await?, &what)?;
        l.release().await?;
    }
    Ok(())
}

/// A dropped auto-renewed lease stops renewing: another client gets the lock within TTL + slack.
pub async fn watchdog_stops_on_drop(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "wd-drop").await?;
    let lease = held(
        a.try_acquire(&name, &opts(h).auto_renew(None)).await?,
        "holder",
    )?;
    let ttl = lease.ttl();
    let dropped = Instant::now();
    drop(lease);
    let l = within(
        ttl * 3,
        "acquire after drop",
        b.acquire(&name, &opts(h).wait_for(ttl + t.slack)),
    )
    .await?
    .map_err(|e| match e {
        e @ lock_core::Error::Timeout { .. } => Failure(format!(
            "the lock of a dropped auto-renewed lease was not free {:?} after the drop (TTL \
             {ttl:?} + slack {:?}): its watchdog kept renewing ({e})",
            dropped.elapsed(),
            t.slack
        )),
        e => Failure::from(e),
    })?;
    l.release().await?;
    Ok(())
}

/// `max_hold` ends automatic renewal: the lease lives past max_hold, then is lost and granted to
/// a waiter within one TTL (+ slack) after max_hold.
pub async fn max_hold_ends_lease(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "max-hold").await?;
    let t0 = Instant::now();
    let lease = held(
        a.try_acquire(&name, &opts(h).auto_renew(Some(t.ttl * 2)))
            .await?,
        "holder",
    )?;
    let max_hold = t.ttl * 2;
    let ttl = lease.ttl();
    let lost = lease.lost();
    let wait = max_hold + ttl * 2 + t.slack;
    let next = match acquire_when_free(&*b, &name, &opts(h), wait, "waiter behind a max_hold lease")
        .await
    {
        Ok(next) => next,
        // Name the broken promise, not the waiter that suffered it.
        Err(e) if !lost.is_lost() => {
            return Err(Failure(format!(
                "renewal went on past max_hold {max_hold:?}: {:?} after the grant the lease is \
                 {:?} and its lost signal has not fired ({e})",
                t0.elapsed(),
                lease.state()
            )))
        }
        Err(e) => return Err(e),
    };
    let granted = Instant::now();
    ensure!(
        granted >= t0 + max_hold,
        "lock granted {:?} after the grant, before max_hold {max_hold:?}: renewal stopped early",
        granted - t0
    );
    ensure!(
        granted <= t0 + max_hold + ttl + t.slack,
        "lock granted only {:?} after the grant: renewal went on past max_hold {max_hold:?}",
        granted - t0
    );
    ensure!(
        lost.is_lost(),
        "lost signal had not fired when the lock went to another client"
    );
    in_state(&*lease, LeaseState::Lost, "past max_hold")?;
    next.release().await?;
    drop(lease);
    Ok(())
}
