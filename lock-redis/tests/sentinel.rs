//! A Sentinel deployment (`scripts/services.sh`: `sentinel-redis1` to `3`, one master and two
//! replicas, watched by `sentinel1` to `3`, quorum 2): the conformance suite through the
//! sentinels (`sentinel::…`), then failovers (`failover::…`): the master killed while a lease
//! is held, and while a waiter waits. One binary, so that no failover happens during the
//! suite; its own lane in `scripts/run-tests.py`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use libtest_mimic::Failed;
use lock_core::{DistributedLock, LeaseState, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::{kill, sentinel_master, servers, services, ServicesSh};

mod failover;
mod harness;
use failover::{kill_until_replaced, FAILOVER};
use harness::{trial, At, Redis};

const UP: &str = "sentinel-redis1 sentinel-redis2 sentinel-redis3 sentinel1 sentinel2 sentinel3";

fn config() -> RedisConfig {
    RedisConfig::from_url(&servers::url(
        "redis+sentinel://{sentinel1},{sentinel2},{sentinel3}/distlock?prefix=sentinel:",
    ))
    .expect("Sentinel URL")
}

fn main() -> ExitCode {
    let mut trials = conformance_tests::trials_prefixed(
        Arc::new(Redis {
            config: config(),
            // The nemesis freezes nothing here: a freeze longer than the sentinels' 1 s
            // would fail the master over, which can lose grants by design (asynchronous
            // replication); `failover::safety::soak` below measures that.
            servers: None,
            secured: false,
            up: UP,
            at: At::Sentinels,
            ttl: harness::TTL,
        }),
        "sentinel",
    );
    // Under the history checker's nemesis, which freezes the master half the time (a freeze
    // over 1 s fails it over): how many grants a failover forgets, without and with
    // wait_replicas. Soaks only (ignored): `scripts/soak.sh sentinel sentinel-wait`.
    for (prefix, replicas) in [("failover", 0), ("failover-wait", 2)] {
        let members = ["sentinel-redis1", "sentinel-redis2", "sentinel-redis3"];
        let nemesis = ServicesSh::new(&members, false)
            .sentinel_master(members.iter().map(|m| servers::addr(m)));
        let soak = conformance_tests::trials_prefixed(
            Arc::new(Redis {
                config: config().with_wait_replicas(replicas),
                servers: Some(Arc::new(nemesis)),
                secured: false,
                up: UP,
                at: At::Sentinels,
                ttl: Duration::from_secs(2),
            }),
            prefix,
        );
        trials.extend(
            soak.into_iter()
                .filter(|t| t.name().ends_with("safety::soak")),
        );
    }
    trials.push(trial(
        "failover::a_held_lease_is_at_risk_then_confirmed_on_the_new_master",
        held_lease_follows,
    ));
    trials.push(trial(
        "failover::a_waiter_is_granted_after_a_failover",
        waiter_after_failover,
    ));
    trials.push(trial(
        "failover::a_renewal_in_flight_is_retried_on_the_new_master",
        renewal_in_flight,
    ));
    trials.push(trial(
        "failover::a_release_in_flight_reaches_the_new_master",
        release_in_flight,
    ));
    trials.push(trial(
        "replicas::a_grant_fewer_replicas_acknowledge_is_undone",
        grant_short_of_replicas,
    ));
    trials.push(trial(
        "replicas::a_renewal_fewer_replicas_acknowledge_leaves_the_lease_at_risk",
        renewal_short_of_replicas,
    ));
    // First: it counts the sentinel's connections, which no earlier case's clients should
    // still be closing.
    trials.insert(
        0,
        trial(
            "follower::it_lives_as_long_as_the_client_or_a_lease_and_no_longer",
            follower_lifetime,
        ),
    );
    conformance_tests::run_trials(trials)
}

fn waiting_for(n: u32) -> RedisConfig {
    harness::waiting_for(config(), n)
}

/// `wait_replicas=N`: a grant is handed out once N replicas acknowledged it. With two
/// replicas, `wait_replicas=2` is granted; `wait_replicas=3` fails with a retryable error and
/// leaves nothing behind (another client is granted the lock at once).
async fn grant_short_of_replicas() -> Result<(), Failed> {
    replicated().await?;
    let two = RedisLock::connect(waiting_for(2)).await?;
    let three = RedisLock::connect(waiting_for(3)).await?;
    let other = connect().await?;
    let opts = LockOptions::new(TTL);
    let name = fresh_name("replicas-two");
    two.try_acquire(&name, &opts)
        .await?
        .ok_or("wait_replicas=2 with two replicas: a free lock refused")?
        .release()
        .await?;
    let name = fresh_name("replicas-three");
    match three.try_acquire(&name, &opts).await {
        Err(e) if e.is_retryable() && e.to_string().contains("wait_replicas=3") => {}
        other => {
            return Err(format!(
                "wait_replicas=3 with two replicas gave {other:?}: expected Unavailable naming \
                 the replicas it waited for"
            )
            .into())
        }
    }
    other
        .try_acquire(&name, &opts)
        .await?
        .ok_or("the grant fewer replicas acknowledged was not undone: the lock is held")?
        .release()
        .await?;
    Ok(())
}

/// A renewal under `wait_replicas=2` while one replica is frozen fails (retryable) and leaves
/// the lease AtRisk; once the replica answers again, a renewal confirms it (Held).
async fn renewal_short_of_replicas() -> Result<(), Failed> {
    let master = replicated().await?;
    let two = RedisLock::connect(waiting_for(2)).await?;
    let name = fresh_name("replicas-renew");
    let lease = two
        .try_acquire(&name, &LockOptions::new(TTL))
        .await?
        .ok_or("a free lock refused")?;
    let replica = (1..=3)
        .map(|i| format!("sentinel-redis{i}"))
        .find(|n| servers::addr(n) != master)
        .ok_or("no replica")?;
    let pid = services(&["pid", &replica]);
    kill("STOP", &pid);
    let renewed = lease.renew().await;
    let state = lease.state();
    kill("CONT", &pid);
    if !matches!(&renewed, Err(e) if e.is_retryable()) {
        return Err(format!(
            "a renewal with one of two replicas frozen gave {renewed:?}: expected a retryable \
             error"
        )
        .into());
    }
    if state != LeaseState::AtRisk {
        return Err(format!("after that renewal the lease is {state:?}, not AtRisk").into());
    }
    lease.renew().await?;
    if lease.state() != LeaseState::Held {
        return Err(format!(
            "renewed with both replicas back, the lease is {:?}",
            lease.state()
        )
        .into());
    }
    lease.release().await?;
    Ok(())
}

async fn connect() -> Result<RedisLock, Failed> {
    RedisLock::connect(config())
        .await
        .map_err(|e| format!("{e}: start the deployment with scripts/services.sh up {UP}").into())
}

/// Waits until the master the sentinels name has both replicas acknowledging its writes, and
/// returns its address: a server killed by an earlier test comes back as a replica only once
/// the sentinels convert it, about 10 s after its restart.
async fn replicated() -> Result<String, Failed> {
    let named = || async {
        let master = sentinel_master()
            .await
            .ok_or("no sentinel names a master")?;
        Ok(format!("redis://{master}"))
    };
    let url = failover::replicated(named, "sentinel:replicated-probe", 2).await?;
    Ok(url.trim_start_matches("redis://").to_string())
}

/// Kills the master the sentinels name now (SIGKILL, by pid, after its replicas acknowledged
/// every write: this test is about following, not about what asynchronous replication loses)
/// and waits until they name another. Returns the killed server's services.sh name.
async fn kill_master() -> Result<String, Failed> {
    let (master, name) = master_name().await?;
    kill_until_replaced(&name, &master, sentinel_master).await?;
    Ok(name)
}

/// The master the sentinels name, once its replicas acknowledged every write so far, and its
/// services.sh name.
async fn master_name() -> Result<(String, String), Failed> {
    let master = replicated().await?;
    let name = (1..=3)
        .map(|i| format!("sentinel-redis{i}"))
        .find(|n| servers::addr(n) == master)
        .ok_or_else(|| format!("the master {master} is none of sentinel-redis1 to 3"))?;
    Ok((master, name))
}

/// The master is frozen with `op` on its way to it, then killed; returns `op`'s outcome, the
/// moment the sentinels named another master, and the killed server's services.sh name.
async fn killed_during<T: Send + 'static>(
    op: impl Future<Output = T> + Send + 'static,
) -> Result<(T, Instant, String), Failed> {
    // Every write so far (the grant too) is on both replicas: whichever is promoted has it.
    let (master, name) = master_name().await?;
    let op = failover::sent_to_frozen(&name, op).await;
    kill_until_replaced(&name, &master, sentinel_master).await?;
    let named = Instant::now();
    Ok((op.await?, named, name))
}

/// A renewal on its way to the master when the master dies fails as a retryable error (never
/// "not held"), the lease is renewed on the new master and stays Held, nobody else is granted
/// it meanwhile, and after its release another client is.
async fn renewal_in_flight() -> Result<(), Failed> {
    let (b, name, opts, lease, _) = holding("failover-renewing").await?;
    let ((lease, renewed), _, victim) = killed_during(async move {
        let renewed = lease.renew().await;
        (lease, renewed)
    })
    .await?;
    let result = async {
        failover::renewed_after_failover(lease.as_ref(), renewed).await?;
        refused_then_handed_on(&b, &name, &opts, lease).await
    }
    .await;
    bring_back(&victim);
    result
}

/// A release on its way to the master when the master dies is sent again until it reaches
/// the new master: another client is granted the lock within the failover, not when the
/// lease's 60 s TTL runs out.
async fn release_in_flight() -> Result<(), Failed> {
    let (b, name, _, lease, _) = holding("failover-releasing").await?;
    let (released, named, victim) = killed_during(lease.release()).await?;
    let result = failover::released_after_failover(named, released, &b, &name, TTL).await;
    bring_back(&victim);
    result
}

/// Starts the killed server again; the sentinels make it a replica of the new master.
fn bring_back(name: &str) {
    services(&["restart", name]);
}

/// With both replicas in step: a second client, and a fresh name that a first client holds
/// with automatic renewal (the lease, and when it was granted).
async fn holding(
    tag: &str,
) -> Result<
    (
        RedisLock,
        lock_core::LockName,
        LockOptions,
        Box<dyn lock_core::Lease>,
        Instant,
    ),
    Failed,
> {
    replicated().await?;
    let (a, b) = (connect().await?, connect().await?);
    let name = fresh_name(tag);
    let opts = LockOptions::new(TTL).auto_renew(None);
    let lease = a
        .try_acquire(&name, &opts)
        .await?
        .ok_or("a free lock refused")?;
    Ok((b, name, opts, lease, Instant::now()))
}

/// A lease held while its master is killed is renewed on the new master as soon as the node
/// has moved there (the switch puts it in doubt, `LeaseOps::doubts`: AtRisk until confirmed),
/// not at its next periodic renewal (a third of its 60 s TTL); meanwhile nobody else is granted
/// the lock, and after its release another client is: a failover never leaves a lock that
/// nobody can take.
async fn held_lease_follows() -> Result<(), Failed> {
    let (b, name, opts, lease, granted) = holding("failover-held").await?;
    let victim = kill_master().await?;
    let result = async {
        confirmed_after_switch(lease.as_ref(), granted).await?;
        refused_then_handed_on(&b, &name, &opts, lease).await
    }
    .await;
    bring_back(&victim);
    result
}

/// After a failover: `b` is refused `name` while `lease` holds it, and granted it once `lease`
/// is released (a failover never leaves a lock that nobody can take).
async fn refused_then_handed_on(
    b: &RedisLock,
    name: &lock_core::LockName,
    opts: &LockOptions,
    lease: Box<dyn lock_core::Lease>,
) -> Result<(), Failed> {
    if b.try_acquire(name, opts).await?.is_some() {
        return Err("another client was granted the lock during the failover".into());
    }
    lease.release().await?;
    let next = b.try_acquire(name, opts).await?;
    next.ok_or("after the release nobody can take the lock")?
        .release()
        .await?;
    Ok(())
}

/// Long enough that the watchdog's periodic renewal (at a third of it) comes after the
/// failover: a renewal seen before then is the one the switch caused.
const TTL: Duration = Duration::from_secs(60);

/// Waits (3 s at most, from the sentinels naming the new master) until `lease` was renewed
/// there and is Held.
async fn confirmed_after_switch(
    lease: &dyn lock_core::Lease,
    granted: Instant,
) -> Result<(), Failed> {
    let switched = Instant::now();
    loop {
        let (state, renewals) = (lease.state(), lease.renewals().unwrap_or(0));
        if state == LeaseState::Held && renewals > 0 {
            return Ok(());
        }
        if granted.elapsed() >= TTL / 3 {
            return Err(format!(
                "the failover took {:?} from the grant, past the periodic renewal at a third \
                 of the {TTL:?} TTL: this test cannot tell the renewals apart",
                granted.elapsed()
            )
            .into());
        }
        if switched.elapsed() > Duration::from_secs(3) {
            return Err(format!(
                "{:?} after the sentinels named a new master the lease is {state:?} with \
                 {renewals} renewals: it was not confirmed on the new master when the node \
                 moved there",
                switched.elapsed()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A waiter queued on the old master is woken on the new one: the holder releases after the
/// failover and the waiter is granted within a second.
async fn waiter_after_failover() -> Result<(), Failed> {
    let (b, name, opts, lease, granted) = holding("failover-wait").await?;
    let waiting = {
        let (b, name, o) = (b.clone(), name.clone(), opts.clone().wait_for(FAILOVER * 3));
        tokio::spawn(async move { b.acquire(&name, &o).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let victim = kill_master().await?;
    let result = async {
        confirmed_after_switch(lease.as_ref(), granted).await?;
        if waiting.is_finished() {
            return Err("the waiter returned before the holder released".into());
        }
        lease.release().await?;
        let granted = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .map_err(|_| {
                "the waiter was not granted within 1 s of the release on the new master"
            })??;
        granted?.release().await?;
        Ok::<(), Failed>(())
    }
    .await;
    bring_back(&victim);
    result
}

/// Client connections of `sentinel1` (`INFO clients`, the probe's own among them).
async fn sentinel_clients() -> Result<u64, Failed> {
    let url = servers::url("redis://{sentinel1}");
    Ok(test_support::redis_clients(&url)
        .await
        .ok_or("sentinel1 did not answer INFO clients")?)
}

/// Waits (2 s at most) until `sentinel1` has `want` client connections.
async fn sentinel_clients_reach(want: u64, when: &str) -> Result<(), Failed> {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let now = sentinel_clients().await?;
        if now == want {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(
                format!("{when}: sentinel1 has {now} client connections, not {want}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The follower (its subscription to `+switch-master` on the first sentinel) runs while the
/// client or one of its leases lives: dropping the client leaves it for the lease, and
/// releasing the lease ends it; nothing of the client stays connected to the sentinels.
async fn follower_lifetime() -> Result<(), Failed> {
    replicated().await?;
    let before = sentinel_clients().await?;
    let lock = connect().await?;
    sentinel_clients_reach(before + 1, "with a client, its follower subscribed").await?;
    let name = fresh_name("follower");
    let lease = lock
        .try_acquire(&name, &LockOptions::new(TTL))
        .await?
        .ok_or("a free lock refused")?;
    drop(lock);
    tokio::time::sleep(Duration::from_millis(300)).await;
    sentinel_clients_reach(before + 1, "the client dropped, its lease held").await?;
    lease.release().await?;
    sentinel_clients_reach(before, "the client and its lease gone").await?;
    Ok(())
}
