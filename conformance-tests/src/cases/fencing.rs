//! Fencing tokens: strictly increasing with every grant, in real-time order.

use parking_lot::Mutex;
use std::sync::Arc;

use lock_core::{Fencing, FencingToken, Lease};

use super::support::{
    acquire_when_free, client, held, long_opts, opts, scene, sleep, sleep_until, Scene,
};
use std::time::{Duration, Instant};

use crate::{ensure, fresh_name, Failure, Harness};

fn token(lease: &dyn Lease) -> Result<FencingToken, Failure> {
    lease
        .fencing_token()
        .ok_or_else(|| Failure("the driver declares fencing but the lease has no token".into()))
}

/// Tokens are given exactly when the capabilities promise them.
pub async fn tokens_present_iff_declared(h: &dyn Harness) -> Result<(), Failure> {
    let a = client(h).await?;
    let name = fresh_name("token-decl");
    let lease = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let declared = a.capabilities().fencing;
    match (declared, lease.fencing_token()) {
        (Fencing::None, Some(t)) => {
            return Err(Failure(format!(
                "fencing = None but the lease carries token {t}"
            )))
        }
        (Fencing::None, None) => {}
        (_, None) => {
            return Err(Failure(format!(
                "fencing = {declared:?} but the lease has no token"
            )))
        }
        (_, Some(_)) => {}
    }
    lease.release().await?;
    Ok(())
}

/// One client re-acquires a name it has just released, with nobody in between, again and
/// again (by `try_acquire` and by a waiting `acquire` of the free name): every grant is a new
/// one, with a token greater than the last. A fast path that hands a client back the grant it
/// released, token and all, would let a write of the old grant through a fenced store after
/// the new one's.
pub async fn tokens_increase_on_a_same_client_regrant(h: &dyn Harness) -> Result<(), Failure> {
    let a = client(h).await?;
    let name = fresh_name("token-regrant");
    let mut last: Option<FencingToken> = None;
    for i in 0..6 {
        let lease = if i % 2 == 0 {
            held(a.try_acquire(&name, &long_opts(h)).await?, "a regrant")?
        } else {
            a.acquire(&name, &long_opts(h).wait_for(h.timing().slack))
                .await?
        };
        let t = token(lease.as_ref())?;
        if let Some(prev) = last {
            ensure!(
                t > prev,
                "re-acquisition {i} by the client that had just released the name got token {t}, \
                 not greater than its previous {prev}"
            );
        }
        last = Some(t);
        lease.release().await?;
    }
    Ok(())
}

/// Two clients take turns six times: each grant's token is greater than the previous one.
pub async fn tokens_increase_across_holders(h: &dyn Harness) -> Result<(), Failure> {
    let clients = [client(h).await?, client(h).await?];
    let name = fresh_name("token-seq");
    let mut last: Option<FencingToken> = None;
    for i in 0..6 {
        let lease = acquire_when_free(
            clients[i % 2].as_ref(),
            &name,
            &long_opts(h),
            h.timing().slack * 4,
            &format!("grant {i} of a lock released just before"),
        )
        .await?;
        let t = token(lease.as_ref())?;
        if let Some(prev) = last {
            ensure!(
                t > prev,
                "grant {i} got token {t}, not greater than the previous {prev}"
            );
        }
        last = Some(t);
        lease.release().await?;
    }
    Ok(())
}

/// Four clients contend three times each; the tokens, recorded inside the lock in grant order,
/// strictly increase.
pub async fn tokens_follow_grant_order_under_contention(h: &dyn Harness) -> Result<(), Failure> {
    let name = fresh_name("token-race");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Twelve grants in all, each held for an instant: every waiter is served well within this.
    let bound = h.timing().slack * 24;
    for _ in 0..4 {
        let c = client(h).await?;
        let (name, opts, seen) = (name.clone(), long_opts(h), seen.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let lease = acquire_when_free(
                    c.as_ref(),
                    &name,
                    &opts,
                    bound,
                    "a contender among four taking turns",
                )
                .await?;
                let t = lease.fencing_token();
                seen.lock().push(t);
                lease.release().await?;
            }
            Ok::<_, Failure>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failure(format!("worker panicked: {e}")))??;
    }
    let seen = seen.lock().clone();
    let tokens: Vec<FencingToken> = seen
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| Failure("a lease had no token".into()))?;
    for w in tokens.windows(2) {
        ensure!(
            w[1] > w[0],
            "tokens in grant order are not strictly increasing: {tokens:?}"
        );
    }
    Ok(())
}

/// A grant after the previous holder expired (without releasing) still gets a greater token.
pub async fn token_increases_after_expiry(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "token-expiry").await?;
    let first = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let t1 = token(first.as_ref())?;
    let vu = first.valid_until();
    let ttl = first.ttl();
    first.abandon();
    sleep_until(vu).await;
    let second = acquire_when_free(
        b.as_ref(),
        &name,
        &opts(h),
        ttl + t.slack,
        "acquire after the holder expired",
    )
    .await?;
    let t2 = token(second.as_ref())?;
    ensure!(
        t2 > t1,
        "token after expiry {t2} is not greater than the expired holder's {t1}"
    );
    second.release().await?;
    Ok(())
}

/// The counter behind the tokens outlives an idle spell: a name released and left alone for
/// three TTLs (and the slack) still gets a greater token on its next grant. Catches a counter
/// that expires with the lock, or per-name state dropped once nobody holds or waits.
pub async fn token_survives_idle_name(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "token-idle").await?;
    let first = held(a.try_acquire(&name, &opts(h)).await?, "first holder")?;
    let t1 = token(first.as_ref())?;
    let ttl = first.ttl();
    first.release().await?;
    let idle = ttl * 3 + t.slack;
    sleep(idle).await;
    let second = held(
        b.try_acquire(&name, &opts(h)).await?,
        "after the idle spell",
    )?;
    let t2 = token(second.as_ref())?;
    second.release().await?;
    ensure!(
        t2 > t1,
        "token {t2} after the name sat idle for {idle:?} is not greater than the previous \
         grant's {t1}: the fencing counter did not outlive the lock"
    );
    Ok(())
}

/// `Fencing::Strict` tokens survive a restart of the backend: the first grant after a crash
/// and restart ([`Harness::restart_backend`]) gets a token greater than every grant before it.
pub async fn strict_tokens_survive_backend_restart(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let a = client(h).await?;
    let name = fresh_name("token-restart");
    let mut last = None;
    for _ in 0..3 {
        let l = held(a.try_acquire(&name, &opts(h)).await?, "before the restart")?;
        last = Some(token(l.as_ref())?);
        l.release().await?;
    }
    let before = last.ok_or_else(|| Failure("no grant before the restart".into()))?;
    drop(a);
    // Bounded below the case's own limit, so that a restart or a client that never comes
    // back is named as such, not as a bare timeout of the case.
    // With the wait for a grant below, within the runner's limit (60 TTLs and 30 s).
    let restart_limit = t.ttl * 30 + Duration::from_secs(10);
    let restarting = tokio::time::timeout(restart_limit, h.restart_backend());
    match restarting.await {
        Ok(r) => r.map_err(|e| Failure(format!("could not restart the backend: {e}")))?,
        Err(_) => {
            return Err(Failure(format!(
                "the backend's restart did not return within {restart_limit:?} (its servers \
                 were killed and started again on their data, and not all served again)"
            )))
        }
    }
    // The server is back; a new client may still need a moment to connect.
    let deadline = Instant::now() + t.ttl * 20 + Duration::from_secs(10);
    let after = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = tokio::time::timeout(left.max(Duration::from_millis(1)), async {
            let b = client(h).await?;
            let l = held(b.try_acquire(&name, &opts(h)).await?, "after the restart")?;
            let tk = token(l.as_ref())?;
            l.release().await?;
            Ok::<_, Failure>(tk)
        });
        let attempt = match attempt.await {
            Ok(r) => r,
            Err(_) => Err(Failure(
                "a connect and try_acquire after the restart did not return".into(),
            )),
        };
        match attempt {
            Ok(tk) => break tk,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "backend not back yet");
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                return Err(Failure(format!(
                    "no grant within {:?} after the backend restarted: {e}",
                    t.ttl * 20 + Duration::from_secs(10)
                )))
            }
        }
    };
    ensure!(
        after > before,
        "after a backend restart the first token is {after}, not greater than {before} before \
         it: fencing is declared Strict but the counter did not survive the restart"
    );
    Ok(())
}

/// A token belongs to the grant, not to a renewal: a lease keeps its token across manual
/// renewals and three TTLs of automatic ones (a holder whose token rose as it renewed would
/// shut out, at the storage, the writes it had already tagged), and `inspect`, where it
/// reports tokens, shows that same one.
pub async fn token_is_the_grants_for_its_life(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "token-life").await?;
    let manual = held(a.try_acquire(&name, &opts(h)).await?, "holder")?;
    let granted = token(manual.as_ref())?;
    for n in 1..=2 {
        manual.renew().await?;
        let now = token(manual.as_ref())?;
        ensure!(
            now == granted,
            "renewal {n} changed the lease's token from {granted} to {now}"
        );
    }
    manual.release().await?;
    let auto = held(
        a.try_acquire(&name, &opts(h).auto_renew(None)).await?,
        "auto-renewed holder",
    )?;
    let granted = token(auto.as_ref())?;
    sleep(t.ttl * 3).await;
    let now = token(auto.as_ref())?;
    ensure!(
        now == granted,
        "three TTLs of automatic renewal changed the lease's token from {granted} to {now}"
    );
    if let Ok(Some(info)) = b.inspect(&name).await {
        if let Some(seen) = info.fencing_token {
            ensure!(
                seen == granted,
                "after renewals inspect reports token {seen}, the holder has {granted}"
            );
        }
    }
    auto.release().await?;
    Ok(())
}
