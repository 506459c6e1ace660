//! Shared mode ([`lock_core::Mode::Shared`]): readers beside readers, never
//! beside a writer, on the same name as the exclusive lock. Needs `Capabilities::shared`.

use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Lease, LockOptions, Mode};

use super::support::{
    acquire_when_free, cancel_after, client, free_for_a_newcomer, handed_on_promptly, held,
    is_not_held, long_opts, opts, scene, sleep, sleep_until, spawn_waiter, still_held, within,
    Scene,
};
use crate::{ensure, fresh_name, Failure, Harness};

/// Long enough for a waiter's request to reach the backend and settle in its queue.
pub(crate) fn settle(h: &dyn Harness) -> Duration {
    h.timing().slack / 2
}

fn shared(h: &dyn Harness) -> LockOptions {
    long_opts(h).shared()
}

/// Three clients take one name shared at once, without waiting: all three are granted, and
/// where the driver inspects, [`holders`](DistributedLock::holders) lists the three, each
/// shared, each token it shows a different reader's own. Once they release, the name is free
/// for an exclusive holder.
pub async fn shared_holders_overlap(h: &dyn Harness) -> Result<(), Failure> {
    let name = fresh_name("shared-overlap");
    let mut leases = Vec::new();
    for i in 0..3 {
        let c = client(h).await?;
        let lease = c.try_acquire(&name, &shared(h)).await?;
        leases.push(held(
            lease,
            &format!("a shared request while {i} shared holder(s) held the name"),
        )?);
    }
    let c = client(h).await?;
    if c.capabilities().inspect {
        let holders = c.holders(&name).await?;
        ensure!(
            holders.len() == 3 && holders.iter().all(|x| x.mode == Mode::Shared),
            "holders of a name three clients hold shared: {holders:?}"
        );
        // A reader's token, where the driver reports it (a file lock keeps only the newest),
        // is that reader's own: never one twice, never one no reader holds.
        let shown: Vec<_> = holders.iter().filter_map(|x| x.fencing_token).collect();
        let own: Vec<_> = leases.iter().filter_map(|l| l.fencing_token()).collect();
        let mut distinct = shown.clone();
        distinct.sort();
        distinct.dedup();
        ensure!(
            distinct.len() == shown.len() && shown.iter().all(|t| own.contains(t)),
            "three shared holders with the tokens {own:?}, but holders shows the tokens {shown:?}"
        );
    }
    for l in leases {
        l.release().await?;
    }
    free_for_a_newcomer(
        h,
        &*c,
        &name,
        "the three shared holders released, yet an exclusive request was refused",
    )
    .await
}

/// An exclusive holder keeps shared requests out: a shared `try_acquire` is refused, and a
/// waiting shared request is granted within the slack of the exclusive release.
pub async fn exclusive_excludes_shared(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "excl-shared").await?;
    let writer = held(a.try_acquire(&name, &long_opts(h)).await?, "the writer")?;
    still_held(
        &*b,
        &name,
        &shared(h),
        "a shared request was granted beside an exclusive holder",
    )
    .await?;
    let reader = spawn_waiter(b, &name, shared(h));
    sleep(settle(h)).await;
    ensure!(
        !reader.is_finished(),
        "a waiting shared request returned while an exclusive holder held the name"
    );
    handed_on_promptly(
        h,
        writer,
        reader,
        "the waiting reader",
        "a reader waiting for a writer must be woken by its release",
    )
    .await
}

/// Shared holders keep an exclusive request out until the last of them releases: refused
/// beside two readers, still refused beside the one left, and a waiting exclusive request is
/// granted within the slack of the last release.
pub async fn shared_excludes_exclusive(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "shared-excl").await?;
    let c = client(h).await?;
    let r1 = held(a.try_acquire(&name, &shared(h)).await?, "reader 1")?;
    let r2 = held(b.try_acquire(&name, &shared(h)).await?, "reader 2")?;
    let refused = "an exclusive request was granted beside a shared holder";
    still_held(&*c, &name, &long_opts(h), refused).await?;
    r1.release().await?;
    still_held(
        &*c,
        &name,
        &long_opts(h),
        format!("{refused} (one of two released)"),
    )
    .await?;
    let writer = spawn_waiter(c, &name, long_opts(h));
    sleep(settle(h)).await;
    ensure!(
        !writer.is_finished(),
        "a waiting exclusive request returned while a reader held the name"
    );
    handed_on_promptly(
        h,
        r2,
        writer,
        "the waiting writer",
        "a writer waiting for readers must be woken by the last release",
    )
    .await
}

/// Where the driver queues (`fifo`), a writer is not starved by readers: with a reader holding
/// and a writer waiting, a newer shared `try_acquire` is refused, and a newer waiting reader
/// is granted only after the writer has had its turn.
pub async fn waiting_writer_is_not_starved(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "no-starve").await?;
    let (c, d) = (client(h).await?, client(h).await?);
    let r1 = held(a.try_acquire(&name, &shared(h)).await?, "the first reader")?;
    let writer = spawn_waiter(b, &name, long_opts(h));
    sleep(settle(h)).await;
    still_held(
        &*c,
        &name,
        &shared(h),
        "a reader's try_acquire jumped a waiting writer (readers can starve writers)",
    )
    .await?;
    let r2 = spawn_waiter(d, &name, shared(h));
    sleep(settle(h)).await;
    ensure!(
        !r2.is_finished(),
        "a reader that came after a waiting writer was granted before it"
    );
    r1.release().await?;
    let limit = h.timing().slack * 4;
    let (_, w) = within(limit, "the writer after the first reader released", writer)
        .await?
        .map_err(|e| Failure(format!("the writer panicked: {e}")))?;
    let w = w.map_err(|e| Failure(format!("the waiting writer failed: {e:?}")))?;
    sleep(settle(h)).await;
    ensure!(
        !r2.is_finished(),
        "the second reader was granted while the writer held the name"
    );
    handed_on_promptly(
        h,
        w,
        r2,
        "the reader behind the writer",
        "it waited behind the writer, which released",
    )
    .await
}

/// A crashed reader's hold ends at its TTL: a writer waiting behind an abandoned shared lease
/// is granted once that lease's `valid_until` has passed, within the TTL and the slack.
pub async fn abandoned_shared_lease_frees_after_ttl(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "shared-abandon").await?;
    let reader = held(a.try_acquire(&name, &opts(h).shared()).await?, "the reader")?;
    let valid_until = reader.valid_until();
    reader.abandon();
    let writer = acquire_when_free(
        &*b,
        &name,
        &long_opts(h),
        t.ttl * 2 + t.slack,
        "a writer behind an abandoned shared lease",
    )
    .await?;
    ensure!(
        Instant::now() >= valid_until,
        "a writer was granted before the abandoned reader's valid_until"
    );
    writer.release().await?;
    Ok(())
}

/// A stale shared release frees nobody else: a reader whose lease expired gets `NotHeld`, and
/// the reader granted after it keeps the name (a writer is still refused).
pub async fn stale_shared_release_keeps_the_others(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "shared-stale").await?;
    let c = client(h).await?;
    let stale = held(a.try_acquire(&name, &opts(h).shared()).await?, "the reader")?;
    sleep_until(stale.valid_until() + t.slack).await;
    let next = held(
        b.try_acquire(&name, &shared(h)).await?,
        "a reader after the first reader's lease expired",
    )?;
    expect_not_held(stale.release().await, "release of an expired shared lease")?;
    still_held(
        &*c,
        &name,
        &long_opts(h),
        "a stale shared release freed the name under another reader",
    )
    .await?;
    next.release().await?;
    Ok(())
}

/// A shared request cancelled while it waits for a writer leaves nothing behind: once the
/// writer releases, another client's exclusive `try_acquire` succeeds at once.
pub async fn cancelled_shared_waiter_leaves_nothing(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "shared-cancel").await?;
    let c = client(h).await?;
    let writer = held(a.try_acquire(&name, &long_opts(h)).await?, "the writer")?;
    let waited = cancel_after(t.slack, b.acquire(&name, &shared(h))).await;
    ensure!(
        waited.is_none(),
        "a shared request returned ({:?}) while a writer held the name",
        waited.map(|r| r.map(|_| "a lease"))
    );
    writer.release().await?;
    free_for_a_newcomer(
        h,
        &*c,
        &name,
        "a cancelled shared waiter left a holder or a queue entry",
    )
    .await
}

/// Tokens increase in grant order across modes: a writer's, two readers', a writer's.
pub async fn tokens_increase_across_modes(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "shared-tokens").await?;
    let token = |l: &dyn Lease, who: &str| {
        l.fencing_token()
            .ok_or_else(|| Failure(format!("{who}'s lease has no token, though fenced")))
    };
    let w1 = held(a.try_acquire(&name, &long_opts(h)).await?, "writer 1")?;
    let t1 = token(&*w1, "writer 1")?;
    w1.release().await?;
    let r1 = held(b.try_acquire(&name, &shared(h)).await?, "reader 1")?;
    let r2 = held(a.try_acquire(&name, &shared(h)).await?, "reader 2")?;
    let (t2, t3) = (token(&*r1, "reader 1")?, token(&*r2, "reader 2")?);
    r1.release().await?;
    r2.release().await?;
    let w2 = held(b.try_acquire(&name, &long_opts(h)).await?, "writer 2")?;
    let t4 = token(&*w2, "writer 2")?;
    w2.release().await?;
    let tokens = [t1, t2, t3, t4];
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens in grant order (writer, reader, reader, writer): {tokens:?}"
    );
    Ok(())
}

/// Waiting in shared mode behind a writer never polls: the backend serves no more requests
/// while a reader waits than with the writer alone (as `waiting::waiting_is_idle`).
pub async fn shared_waiting_is_idle(h: &dyn Harness) -> Result<(), Failure> {
    super::waiting::idle_while_waiting(h, "shared-idle", long_opts(h), shared(h)).await
}

/// `Ok` if `r` is `NotHeld` (or `Lost`), else a failure naming `what`.
pub(crate) fn expect_not_held(r: lock_core::Result<()>, what: &str) -> Result<(), Failure> {
    match r {
        Err(e) if is_not_held(&e) => Ok(()),
        Ok(()) => Err(Failure(format!("{what} returned Ok"))),
        Err(e) => Err(Failure(format!("{what}: expected NotHeld, got {e:?}"))),
    }
}
