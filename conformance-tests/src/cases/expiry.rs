//! Expiry: a vanished holder frees the lock after its TTL, never before its `valid_until`.

use std::time::Instant;

use lock_core::LeaseState;

use super::{client, held, opts, sleep, within};
use crate::{ensure, fresh_name, Failure, Harness};

/// A holder that vanishes (abandons its lease) blocks others until its `valid_until` and no
/// longer than TTL + slack; a waiter is granted in that window.
pub async fn abandoned_lease_frees_after_ttl(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let (a, b) = (client(h).await?, client(h).await?);
    let name = fresh_name("expire");
    let opts = opts(h);
    let t0 = Instant::now();
    let lease = held(a.try_acquire(&name, &opts).await?, "holder")?;
    let valid_until = lease.valid_until();
    let ttl = lease.ttl();
    lease.abandon();
    // Probe a few times before valid_until: nobody may get it early.
    let step = t.ttl / 8;
    while Instant::now() + step < valid_until {
        if let Some(l) = b.try_acquire(&name, &opts).await? {
            let early = valid_until.saturating_duration_since(Instant::now());
            l.release().await?;
            return Err(Failure(format!(
                "lock granted {early:?} before the holder's valid_until"
            )));
        }
        sleep(step).await;
    }
    let lease = within(
        ttl * 3,
        "waiting for an abandoned lock",
        b.acquire(&name, &opts.clone().wait_for(ttl * 2)),
    )
    .await??;
    let granted = Instant::now();
    ensure!(
        granted >= valid_until,
        "granted before the previous holder's valid_until"
    );
    let late = granted.saturating_duration_since(t0 + ttl);
    ensure!(
        late <= t.slack,
        "abandoned lock freed {late:?} after its TTL (slack {:?})",
        t.slack
    );
    lease.release().await?;
    Ok(())
}

/// `valid_until` lies within the granted TTL after the call returned, and the lease is Held.
pub async fn valid_until_is_within_ttl(h: &dyn Harness) -> Result<(), Failure> {
    let a = client(h).await?;
    let name = fresh_name("valid");
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let after = Instant::now();
    let vu = lease.valid_until();
    ensure!(
        lease.state() == LeaseState::Held,
        "fresh lease is {:?}",
        lease.state()
    );
    ensure!(
        vu > after,
        "fresh lease's valid_until is already in the past"
    );
    ensure!(
        vu <= after + lease.ttl(),
        "valid_until is beyond the granted TTL {:?}",
        lease.ttl()
    );
    lease.release().await?;
    Ok(())
}

/// A lease nobody renews turns Lost at its `valid_until` (not much before, not after), and its
/// lost signal resolves.
pub async fn unrenewed_lease_turns_lost_at_valid_until(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let a = client(h).await?;
    let name = fresh_name("unrenewed");
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let vu = lease.valid_until();
    let lost = lease.lost();
    ensure!(
        !lost.is_lost(),
        "lost signal resolved right after the grant"
    );
    within(
        t.ttl + t.slack,
        "lost signal of an unrenewed lease",
        lost.wait(),
    )
    .await?;
    let at = Instant::now();
    ensure!(
        at + t.ttl / 4 >= vu,
        "lost signal fired {:?} before valid_until",
        vu - at
    );
    ensure!(
        lease.state() == LeaseState::Lost,
        "state is {:?} after valid_until",
        lease.state()
    );
    let _ = lease.release().await;
    Ok(())
}
