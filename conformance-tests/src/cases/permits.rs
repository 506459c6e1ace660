//! Permits ([`lock_core::Mode::Permits`]): a semaphore of K permits on a lock
//! name, each permit a lease of its own. Needs `Capabilities::permits`.

use std::time::Instant;

use lock_core::{DistributedLock, Error, Lease, LockOptions, Mode};

use super::shared::expect_not_held;
use super::support::{
    acquire_when_free, cancel_after, client, handed_on_promptly, held, long_opts, opts, scene,
    sleep, sleep_until, spawn_waiter, still_held, Scene,
};
use crate::{ensure, fresh_name, Failure, Harness};

/// The permits of the cases' semaphores.
const K: u32 = 3;

fn permit(h: &dyn Harness, k: u32) -> LockOptions {
    long_opts(h).permits(k)
}

/// K clients hold one permit each at once; the next is refused (`try_acquire`), and where the
/// driver inspects, [`holders`](DistributedLock::holders) lists K permits of K.
pub async fn at_most_k_holders(h: &dyn Harness) -> Result<(), Failure> {
    let name = fresh_name("permits-k");
    let mut leases = Vec::new();
    for i in 0..K {
        let c = client(h).await?;
        let lease = c.try_acquire(&name, &permit(h, K)).await?;
        leases.push(held(
            lease,
            &format!("permit {} of {K} while {i} were held", i + 1),
        )?);
    }
    let c = client(h).await?;
    still_held(
        &*c,
        &name,
        &permit(h, K),
        format!("a permit beyond the {K} of the semaphore was granted"),
    )
    .await?;
    if c.capabilities().inspect {
        let holders = c.holders(&name).await?;
        ensure!(
            holders.len() == K as usize && holders.iter().all(|x| x.mode == Mode::Permits(K)),
            "holders of a semaphore whose {K} permits are held: {holders:?}"
        );
    }
    for l in leases {
        l.release().await?;
    }
    Ok(())
}

/// With every permit held, a waiting request is granted within the slack of one release.
pub async fn released_permit_goes_to_a_waiter(h: &dyn Harness) -> Result<(), Failure> {
    let name = fresh_name("permits-handoff");
    let mut leases = Vec::new();
    for _ in 0..2 {
        let c = client(h).await?;
        leases.push(held(
            c.try_acquire(&name, &permit(h, 2)).await?,
            "a permit of 2",
        )?);
    }
    let waiter = spawn_waiter(client(h).await?, &name, permit(h, 2));
    sleep(h.timing().slack / 2).await;
    ensure!(
        !waiter.is_finished(),
        "a waiting request returned while both permits were held"
    );
    let first = leases.remove(0);
    handed_on_promptly(
        h,
        first,
        waiter,
        "the waiter for a permit",
        "one permit was released",
    )
    .await?;
    for l in leases {
        l.release().await?;
    }
    Ok(())
}

/// A crashed holder's permit comes back at its TTL, never leaks: with both permits held and
/// one abandoned, a waiter is granted once that lease's `valid_until` has passed, within
/// the TTL and the slack.
pub async fn abandoned_permit_comes_back(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "permits-abandon").await?;
    let kept = held(a.try_acquire(&name, &permit(h, 2)).await?, "a permit")?;
    let crashed = held(
        b.try_acquire(&name, &opts(h).permits(2)).await?,
        "the other permit",
    )?;
    let valid_until = crashed.valid_until();
    crashed.abandon();
    let c = client(h).await?;
    let next = acquire_when_free(
        &*c,
        &name,
        &permit(h, 2),
        t.ttl * 2 + t.slack,
        "a waiter for the permit of an abandoned lease",
    )
    .await?;
    ensure!(
        Instant::now() >= valid_until,
        "the abandoned permit was granted again before its lease's valid_until"
    );
    next.release().await?;
    kept.release().await?;
    Ok(())
}

/// A stale release frees nobody else's permit: a holder whose lease expired gets `NotHeld`,
/// and the two permits held after it (one from before, one granted after the expiry) stay
/// held — a third request is still refused.
pub async fn stale_release_keeps_the_successors_permit(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "permits-stale").await?;
    let (c, d) = (client(h).await?, client(h).await?);
    let stale = held(a.try_acquire(&name, &opts(h).permits(2)).await?, "permit 1")?;
    let kept = held(b.try_acquire(&name, &permit(h, 2)).await?, "permit 2")?;
    sleep_until(stale.valid_until()).await;
    let successor = acquire_when_free(
        &*c,
        &name,
        &permit(h, 2),
        stale.ttl() + t.slack,
        "a successor to an expired permit (permits::abandoned_permit_comes_back)",
    )
    .await?;
    expect_not_held(stale.release().await, "release of an expired permit")?;
    still_held(
        &*d,
        &name,
        &permit(h, 2),
        "a stale release freed another holder's permit: a third holder of 2 permits was granted",
    )
    .await?;
    successor.release().await?;
    kept.release().await?;
    Ok(())
}

/// Holders of one name agree on K: a request with another count, while a permit is held, is
/// `PermitsMismatch` (naming both counts) from `try_acquire` and at once from a waiting
/// `acquire` — never a silently different limit, and without side effects: the holders' last
/// permit is still there to take, and once all is released the other count is accepted.
pub async fn permit_count_mismatch_is_refused(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "permits-mismatch").await?;
    let first = held(a.try_acquire(&name, &permit(h, 2)).await?, "a permit of 2")?;
    let mismatch = |r: lock_core::Result<_>, how: &str| match r {
        Err(Error::PermitsMismatch {
            held: 2, asked: 3, ..
        }) => Ok(()),
        Err(e) => Err(Failure(format!(
            "{how} with 3 permits while a holder uses 2: expected PermitsMismatch {{ held: 2, \
             asked: 3 }}, got {e:?}"
        ))),
        Ok(_) => Err(Failure(format!(
            "{how} with 3 permits while a holder uses 2 was granted: a silently different limit"
        ))),
    };
    mismatch(
        b.try_acquire(&name, &permit(h, 3)).await.map(|_| ()),
        "try_acquire",
    )?;
    let waited = cancel_after(t.slack * 2, b.acquire(&name, &permit(h, 3))).await;
    match waited {
        Some(r) => mismatch(r.map(|_| ()), "a waiting acquire")?,
        None => {
            return Err(Failure(
                "a waiting acquire with 3 permits while a holder uses 2 waited instead of \
                 answering PermitsMismatch"
                    .into(),
            ))
        }
    }
    let second = held(
        b.try_acquire(&name, &permit(h, 2)).await?,
        "the second permit of 2, after refused requests with 3",
    )?;
    first.release().await?;
    second.release().await?;
    let three = acquire_when_free(
        &*a,
        &name,
        &permit(h, 3),
        t.slack,
        "a request with 3 permits once the holders of 2 released",
    )
    .await?;
    three.release().await?;
    Ok(())
}

/// Where the driver queues (`fifo`), the waiters count too: with an exclusive holder and a
/// request for a permit of 2 waiting behind it, a request with 3 permits is `PermitsMismatch`
/// naming 2 — it could never share the queue's semaphore — not a busy refusal that waits. The
/// waiter of 2 is then granted once the holder releases.
pub async fn permit_count_mismatch_with_a_waiter(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "permits-mismatch-waiter").await?;
    let c = client(h).await?;
    let holder = held(
        a.try_acquire(&name, &long_opts(h)).await?,
        "the exclusive holder",
    )?;
    let waiter = spawn_waiter(b, &name, permit(h, 2));
    sleep(super::shared::settle(h)).await;
    match c.try_acquire(&name, &permit(h, 3)).await {
        Err(Error::PermitsMismatch {
            held: 2, asked: 3, ..
        }) => {}
        other => {
            return Err(Failure(format!(
                "a try_acquire with 3 permits behind a waiter that asks with 2: expected \
                 PermitsMismatch {{ held: 2, asked: 3 }}, got {:?}",
                other.map(|l| l.is_some())
            )))
        }
    }
    handed_on_promptly(
        h,
        holder,
        waiter,
        "the waiter for a permit of 2",
        "the exclusive holder released",
    )
    .await
}

/// Tokens increase in grant order across permits: three holders at once, then a fourth after
/// one released.
pub async fn tokens_increase_across_permits(h: &dyn Harness) -> Result<(), Failure> {
    let name = fresh_name("permits-tokens");
    let mut leases: Vec<Box<dyn Lease>> = Vec::new();
    let mut tokens = Vec::new();
    for i in 0..4 {
        if i == 3 {
            leases.remove(0).release().await?;
        }
        let c = client(h).await?;
        let l = held(c.try_acquire(&name, &permit(h, K)).await?, "a permit")?;
        tokens.push(l.fencing_token().ok_or_else(|| {
            Failure("a permit's lease has no token, though the driver fences".into())
        })?);
        leases.push(l);
    }
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens of permits in grant order: {tokens:?}"
    );
    for l in leases {
        l.release().await?;
    }
    Ok(())
}

/// A request for a permit cancelled while every permit is held leaves no permit behind: once
/// one is released, another client gets it at once.
pub async fn cancelled_permit_waiter_leaves_nothing(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "permits-cancel").await?;
    let only = held(a.try_acquire(&name, &permit(h, 1)).await?, "the one permit")?;
    let waited = cancel_after(t.slack, b.acquire(&name, &permit(h, 1))).await;
    ensure!(
        waited.is_none(),
        "a request for a permit returned while the only one was held"
    );
    only.release().await?;
    let c = client(h).await?;
    let next = acquire_when_free(
        &*c,
        &name,
        &permit(h, 1),
        t.slack,
        "a newcomer after a cancelled permit waiter (it left a permit or a queue entry)",
    )
    .await?;
    next.release().await?;
    Ok(())
}

/// A semaphore and the lock of the same name exclude each other: beside a permit holder,
/// exclusive and shared requests are refused; beside an exclusive holder, a permit request.
pub async fn permits_and_other_modes_exclude(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "permits-modes").await?;
    let p = held(a.try_acquire(&name, &permit(h, K)).await?, "a permit")?;
    still_held(
        &*b,
        &name,
        &long_opts(h),
        "an exclusive request was granted beside a permit holder",
    )
    .await?;
    if b.capabilities().shared {
        still_held(
            &*b,
            &name,
            &long_opts(h).shared(),
            "a shared request was granted beside a permit holder",
        )
        .await?;
    }
    p.release().await?;
    let w = held(
        b.try_acquire(&name, &long_opts(h)).await?,
        "an exclusive request after the permit was released",
    )?;
    still_held(
        &*a,
        &name,
        &permit(h, K),
        "a permit was granted beside an exclusive holder",
    )
    .await?;
    w.release().await?;
    Ok(())
}

/// Waiting for a permit never polls (as `waiting::waiting_is_idle`).
pub async fn permit_waiting_is_idle(h: &dyn Harness) -> Result<(), Failure> {
    super::waiting::idle_while_waiting(h, "permits-idle", permit(h, 1), permit(h, 1)).await
}
