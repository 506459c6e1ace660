//! `inspect`: who holds a lock, read without acquiring it.

use std::time::{Duration, Instant};

use super::support::{client, held, long_opts, opts, scene, sleep_until, Scene};
use crate::{ensure, fresh_name, Failure, Harness};

/// `inspect` says free before and after, and while held reports the holder's fencing token
/// (where it reports one) and a remaining time no longer than the TTL; it never takes the
/// lock itself.
pub async fn inspect_reports_the_holder(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "inspect").await?;
    let opts = long_opts(h);
    ensure!(
        b.inspect(&name).await?.is_none(),
        "inspect reported a holder for a name never locked"
    );
    let probe = held(b.try_acquire(&name, &opts).await?, "after inspect")
        .map_err(|_| Failure("inspect left the lock taken".into()))?;
    probe.release().await?;
    let lease = held(a.try_acquire(&name, &opts).await?, "holder")?;
    // Grants of another name since: the holder's token is its own, not the newest handed out.
    let other = fresh_name("inspect-other");
    for _ in 0..3 {
        held(b.try_acquire(&other, &opts).await?, "another name")?
            .release()
            .await?;
    }
    let info = b
        .inspect(&name)
        .await?
        .ok_or_else(|| Failure("inspect said free while the lock is held".into()))?;
    if let (Some(seen), Some(mine)) = (info.fencing_token, lease.fencing_token()) {
        ensure!(
            seen == mine,
            "inspect reported token {seen:?}, the holder has {mine:?} (three grants of another \
             name came after the holder's: inspect must report the holder's own token)"
        );
    }
    if let Some(left) = info.remaining {
        ensure!(
            left <= opts.ttl + h.timing().slack,
            "inspect reported {left:?} remaining on a {:?} lease",
            opts.ttl
        );
    }
    lease.release().await?;
    ensure!(
        b.inspect(&name).await?.is_none(),
        "inspect reported a holder after the release"
    );
    Ok(())
}

/// After a holder expired, `inspect` says free; once another client took over, it reports
/// the new holder — its token, not the expired one's — with a remaining time that is within
/// the new lease's TTL and goes down as time passes.
pub async fn inspect_follows_expiry_and_takeover(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let (a, b, c) = (client(h).await?, client(h).await?, client(h).await?);
    let name = fresh_name("inspect-expiry");
    let t0 = Instant::now();
    let first = held(a.try_acquire(&name, &opts(h)).await?, "first holder")?;
    let (old_token, ttl) = (first.fencing_token(), first.ttl());
    first.abandon();
    // By TTL + slack the backend has freed it (expiry::abandoned_lease_frees_after_ttl).
    sleep_until(t0 + ttl + t.slack).await;
    if let Some(info) = c.inspect(&name).await? {
        return Err(Failure(format!(
            "inspect reports a holder ({info:?}) {:?} after a {ttl:?} lease was abandoned, \
             with nobody taking over: an expired holder is shown as holding",
            t0.elapsed()
        )));
    }
    let next = held(b.try_acquire(&name, &long_opts(h)).await?, "new holder")?;
    let first_look = Instant::now();
    let info = c.inspect(&name).await?.ok_or_else(|| {
        Failure("inspect said free while a new holder holds the lock after a takeover".into())
    })?;
    if let (Some(seen), Some(mine)) = (info.fencing_token, next.fencing_token()) {
        ensure!(
            seen == mine,
            "after a takeover inspect reports token {seen} (the expired holder had \
             {old_token:?}), the new holder has {mine}"
        );
    }
    if let Some(left) = info.remaining {
        ensure!(
            left <= next.ttl() + t.slack,
            "inspect reports {left:?} remaining on the new holder's {:?} lease",
            next.ttl()
        );
        let gap = (t.ttl / 4).max(c.capabilities().ttl_granularity + Duration::from_millis(50));
        sleep_until(first_look + gap).await;
        let later = c
            .inspect(&name)
            .await?
            .ok_or_else(|| Failure("inspect said free while the new holder holds it".into()))?;
        if let Some(later) = later.remaining {
            ensure!(
                later < left,
                "inspect's remaining time did not go down: {left:?}, then {later:?} {gap:?} \
                 later (is it the TTL rather than what is left of it?)"
            );
        }
    }
    next.release().await?;
    Ok(())
}

/// Where a driver says where a grant lives on the backend ([`Lease::backend_key`], which
/// `distlock run` exports as `DISTLOCK_KEY` for operators and foreign clients), each lock has
/// its own place: two names held at once (one extending the other) give two keys, and a
/// lease's key stays the same across a renewal. A driver that says nothing passes.
///
/// [`Lease::backend_key`]: lock_core::Lease::backend_key
pub async fn backend_key_is_the_locks_own(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, name, .. } = scene(h, "key").await?;
    let longer = lock_core::LockName::new(format!("{name}-2"))?;
    let first = held(a.try_acquire(&name, &long_opts(h)).await?, "first name")?;
    let second = held(a.try_acquire(&longer, &long_opts(h)).await?, "second name")?;
    let (k1, k2) = (first.backend_key(), second.backend_key());
    match (&k1, &k2) {
        (Some(k1), Some(k2)) => ensure!(
            k1 != k2,
            "{name} and {longer}, held at once, both say they live at {k1:?}"
        ),
        (None, None) => {}
        _ => {
            return Err(Failure(format!(
                "backend_key is given for one lease and not another: {k1:?}, {k2:?}"
            )))
        }
    }
    first.renew().await?;
    ensure!(
        first.backend_key() == k1,
        "a renewal moved the lease's backend_key from {k1:?} to {:?}",
        first.backend_key()
    );
    first.release().await?;
    second.release().await?;
    // Two names of the longest length, differing in their last character only, held at once:
    // the whole key, not a prefix of it.
    let pad = lock_core::MAX_NAME_LEN - name.as_str().len() - 1;
    let long = |last: char| lock_core::LockName::new(format!("{name}{}{last}", "k".repeat(pad)));
    let (n1, n2) = (long('a')?, long('b')?);
    let first = held(a.try_acquire(&n1, &long_opts(h)).await?, "a longest name")?;
    let second = held(
        a.try_acquire(&n2, &long_opts(h)).await?,
        "another longest name",
    )?;
    let (k1, k2) = (first.backend_key(), second.backend_key());
    if let (Some(k1), Some(k2)) = (&k1, &k2) {
        ensure!(
            k1 != k2,
            "two names of {} bytes differing in their last character, held at once, both say \
             they live at {k1:?}: a backend_key is the whole key",
            lock_core::MAX_NAME_LEN
        );
    }
    first.release().await?;
    second.release().await?;
    Ok(())
}

/// The key a held lease reports is on the server, as the server stores it: the whole key,
/// namespace or prefix included, so that an operator or a foreign client who looks it up
/// finds the lock. A driver that says nothing passes.
pub async fn backend_key_exists_on_the_server(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, name, .. } = scene(h, "key-exists").await?;
    let lease = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    let Some(key) = lease.backend_key() else {
        lease.release().await?;
        return Ok(());
    };
    let found = match h.key_exists(&key).await {
        Some(r) => r.map_err(|e| Failure(format!("could not look up {key:?}: {e}")))?,
        None => return Err(Failure("harness stopped supporting key_exists".into())),
    };
    lease.release().await?;
    ensure!(
        found,
        "a held lease of {name} says it lives at {key:?}, but the backend has no such key: \
         backend_key must be the whole key as the server stores it, namespace included"
    );
    Ok(())
}
