//! Mutual exclusion: at most one holder per name.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::support::{
    cancel_after, client, free_for_a_newcomer, held, long_opts, opts, scene, still_held, Scene,
};
use crate::{ensure, fresh_name, Failure, Harness};

/// Eight independent clients race `try_acquire` on one free name: exactly one wins — not two,
/// and not none (`None` means someone holds it).
pub async fn single_winner_among_racers(h: &dyn Harness) -> Result<(), Failure> {
    const N: usize = 8;
    let name = fresh_name("race");
    let opts = long_opts(h);
    let barrier = Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::new();
    for _ in 0..N {
        let c = client(h).await?;
        let (name, opts, barrier) = (name.clone(), opts.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.try_acquire(&name, &opts).await
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let r = t
            .await
            .map_err(|e| Failure(format!("racer panicked: {e}")))?;
        if let Some(lease) = r? {
            winners.push(lease);
        }
    }
    ensure!(
        !winners.is_empty(),
        "none of {N} racers acquired a free lock: try_acquire said no although nobody held it \
         (racers that split the vote must retry until one wins)"
    );
    ensure!(
        winners.len() == 1,
        "{} of {N} racers acquired the same lock",
        winners.len()
    );
    for w in winners {
        w.release().await?;
    }
    Ok(())
}

/// While held, other clients and the holder's own client get `None`; `acquire` without
/// waiting gets `Timeout`. After release the lock is free.
pub async fn held_lock_refuses_others(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "held").await?;
    let opts = long_opts(h);
    let lease = held(a.try_acquire(&name, &opts).await?, "first try_acquire")?;
    still_held(&*b, &name, &opts, "another client acquired a held lock").await?;
    still_held(
        &*a,
        &name,
        &opts,
        "the holder's own client acquired its held lock a second time (locks are not reentrant)",
    )
    .await?;
    match b.acquire(&name, &opts.clone().no_wait()).await {
        Err(lock_core::Error::Timeout { .. }) => {}
        Ok(_) => return Err(Failure("acquire(no_wait) got a held lock".into())),
        Err(e) => {
            return Err(Failure(format!(
                "acquire(no_wait) on a held lock: expected Timeout, got {e:?}"
            )))
        }
    }
    lease.release().await?;
    let again = held(
        b.try_acquire(&name, &opts).await?,
        "try_acquire after release",
    )?;
    again.release().await?;
    Ok(())
}

/// Four clients each increment a shared counter five times under the lock with a
/// read-sleep-write sequence: no update is lost and no two holders overlap.
pub async fn counter_loses_no_update(h: &dyn Harness) -> Result<(), Failure> {
    const CLIENTS: u64 = 4;
    const ROUNDS: u64 = 5;
    let name = fresh_name("counter");
    let opts = long_opts(h);
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let c = client(h).await?;
        let (name, opts) = (name.clone(), opts.clone());
        let (counter, inside, overlaps) = (counter.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lease = c.acquire(&name, &opts).await?;
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let v = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                lease.release().await?;
            }
            Ok::<_, lock_core::Error>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failure(format!("worker panicked: {e}")))??;
    }
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(
        overlaps == 0,
        "{overlaps} times a holder entered while another was inside"
    );
    let total = counter.load(Ordering::SeqCst);
    ensure!(
        total == CLIENTS * ROUNDS,
        "counter is {total}, expected {} (lost updates)",
        CLIENTS * ROUNDS
    );
    Ok(())
}

/// Holding one name does not block another, including one that differs only in case.
pub async fn names_are_independent(h: &dyn Harness) -> Result<(), Failure> {
    let (a, b) = (client(h).await?, client(h).await?);
    let x = fresh_name("indep-x");
    let y = fresh_name("indep-y");
    let upper = lock_core::LockName::new(x.as_str().to_uppercase())?;
    let opts = long_opts(h);
    let lx = held(a.try_acquire(&x, &opts).await?, "first name")?;
    let ly = held(
        b.try_acquire(&y, &opts).await?,
        "a second, unrelated name while the first is held",
    )?;
    let lu = held(
        b.try_acquire(&upper, &opts).await?,
        "the first name in upper case (names are case-sensitive)",
    )?;
    for l in [lx, ly, lu] {
        l.release().await?;
    }
    Ok(())
}

/// Releasing a lock frees that lock only. Names that extend its name (`n-2`, `n:2`, `n.lock`:
/// a prefix match on the backend's keys, or a cleanup by pattern, would take them too) stay
/// held, by the same client and by another.
pub async fn release_frees_only_its_own_name(h: &dyn Harness) -> Result<(), Failure> {
    let (a, b) = (client(h).await?, client(h).await?);
    let n = fresh_name("own");
    let opts = long_opts(h);
    let longer = |suffix: &str| lock_core::LockName::new(format!("{n}{suffix}"));
    let (on_a, on_b) = (longer("-2")?, [longer(":2")?, longer(".lock")?]);
    let released = held(a.try_acquire(&n, &opts).await?, "the shorter name")?;
    let mut kept = vec![(
        held(a.try_acquire(&on_a, &opts).await?, "a longer name")?,
        &b,
    )];
    for name in &on_b {
        kept.push((
            held(b.try_acquire(name, &opts).await?, "a longer name")?,
            &a,
        ));
    }
    released.release().await?;
    for (lease, prober) in &kept {
        if let Some(l) = prober.try_acquire(lease.name(), &opts).await? {
            l.release().await?;
            return Err(Failure(format!(
                "releasing {n} freed {} too (held by {} client): a release must touch its own \
                 name only",
                lease.name(),
                if std::ptr::eq(*prober, &b) {
                    "the same"
                } else {
                    "another"
                }
            )));
        }
    }
    for (lease, _) in kept {
        lease.release().await?;
    }
    Ok(())
}

/// A `release` whose future is dropped part-way (a caller's timeout, a cancelled task) still
/// frees the lock promptly: the request it sent lands, or the dropped lease frees it as a
/// dropped lease does. Cancelled after its first poll and after 1 and 5 ms; the TTL is long,
/// so expiry cannot pass for it.
pub async fn cancelled_release_still_frees(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "cancel-release").await?;
    for after in [0, 1, 5].map(Duration::from_millis) {
        let lease = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
        if let Some(r) = cancel_after(after, lease.release()).await {
            r?;
        }
        let left = format!(
            "a release cancelled after {after:?} neither finished nor left the lock to the \
             dropped lease's release"
        );
        free_for_a_newcomer(h, b.as_ref(), &name, &left).await?;
    }
    Ok(())
}

/// Release frees the lock at once for another client.
pub async fn release_frees_at_once(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "free").await?;
    let opts = opts(h);
    for _ in 0..3 {
        let l = held(a.try_acquire(&name, &opts).await?, "holder")?;
        l.release().await?;
        let l = held(
            b.try_acquire(&name, &opts).await?,
            "another client right after release",
        )?;
        l.release().await?;
    }
    Ok(())
}
