//! A Redis Cluster (`scripts/services.sh`: `cluster1` to `3` masters, `4` to `6` their
//! replicas): the conformance suite through `redis+cluster://`, each lock's keys on the master
//! of their slot (`cluster::…`), then failovers of one shard (`failover::…`): the master of a
//! held lock's slot killed, its replica promoted by the cluster. One binary, so that no
//! failover happens during the suite; its own lane (`scripts/run-tests.py`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use libtest_mimic::Failed;
use lock_core::{DistributedLock, LeaseState, LockName, LockOptions};
use lock_redis::raw::scripts::LockKeys;
use lock_redis::{RedisConfig, RedisLock};
use test_support::{kill, redis_cluster_owner, servers, services, ServicesSh};

mod failover;
mod harness;
use failover::{kill_until_replaced, FAILOVER};
use harness::{trial, At, Redis};

const UP: &str = "cluster1 cluster2 cluster3 cluster4 cluster5 cluster6";

/// The failover tests' lease: renewed (a third of it) during the failover, and long enough
/// that the failover cannot outlast it.
const TTL: Duration = Duration::from_secs(6);

fn config() -> RedisConfig {
    // Two of the six nodes are enough to find the rest.
    RedisConfig::from_url(&servers::url(
        "redis+cluster://{cluster1},{cluster2}?prefix=cluster:",
    ))
    .expect("Cluster URL")
}

fn main() -> ExitCode {
    // The nemesis freezes nothing: a freeze over the cluster's 1 s node timeout fails a
    // shard over, which can lose grants by design (asynchronous replication).
    let mut trials = conformance_tests::trials_prefixed(
        Arc::new(Redis {
            config: config(),
            servers: None,
            secured: false,
            up: UP,
            at: At::Cluster,
            ttl: harness::TTL,
        }),
        "cluster",
    );
    // Plain keys (`keys=plain`): the layout redis-py's `Lock` and the redis.io recipe use, one
    // key per lock, so one slot per lock as well.
    let plain = RedisConfig::from_url(&servers::url(
        "redis+cluster://{cluster1}?keys=plain&prefix=cluster-plain:",
    ))
    .expect("plain-key Cluster URL");
    trials.extend(conformance_tests::trials_prefixed(
        Arc::new(Redis {
            config: plain,
            servers: None,
            secured: false,
            up: UP,
            at: At::Cluster,
            ttl: harness::TTL,
        }),
        "plain",
    ));
    // Under the history checker's nemesis, which freezes one of the six nodes half the
    // time (a master frozen over the 1 s node timeout is failed over): how many grants a
    // shard's failover forgets. Soak only (ignored): `scripts/soak.sh cluster`.
    let nodes = [
        "cluster1", "cluster2", "cluster3", "cluster4", "cluster5", "cluster6",
    ];
    // Without and with wait_replicas=1 (each master has one replica).
    for (prefix, replicas) in [("failover", 0), ("failover-wait", 1)] {
        let soak = conformance_tests::trials_prefixed(
            Arc::new(Redis {
                config: config().with_wait_replicas(replicas),
                servers: Some(Arc::new(
                    ServicesSh::new(&nodes, false)
                        .cluster_masters(nodes.iter().map(|n| servers::addr(n))),
                )),
                secured: false,
                up: UP,
                at: At::Cluster,
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
        "failover::a_held_lease_is_kept_through_its_shards_failover",
        held_lease_kept,
    ));
    trials.push(trial(
        "failover::a_waiter_is_granted_after_its_shards_failover",
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
        "failover::a_deposed_master_thawed_leaves_no_client_stuck",
        thawed_master,
    ));
    trials.push(trial(
        "migration::a_held_lease_follows_its_slot_to_another_master",
        || slot_migrated(0),
    ));
    // With wait_replicas, each renewal and its WAIT go in one pipeline: the driver follows the
    // pipeline's ASK and MOVED itself.
    trials.push(trial(
        "migration::a_held_lease_follows_its_slot_with_wait_replicas",
        || slot_migrated(1),
    ));
    trials.push(trial(
        "pubsub::a_waiter_listens_on_its_slots_master_by_shard",
        waiter_on_its_shard,
    ));
    trials.push(trial(
        "migration::a_waiter_follows_its_slot_to_another_master",
        waiter_follows_its_slot,
    ));
    trials.push(trial(
        "failover::a_shard_down_holds_up_no_grant_on_another",
        other_shard_grants,
    ));
    trials.push(trial(
        "replicas::a_grant_its_shards_replica_does_not_acknowledge_is_undone",
        grant_short_of_replicas,
    ));
    conformance_tests::run_trials(trials)
}

async fn connect() -> Result<RedisLock, Failed> {
    RedisLock::connect(config())
        .await
        .map_err(|e| format!("{e}: start the cluster with scripts/services.sh up {UP}").into())
}

/// The services.sh name of the node at `url` (`redis://host:port`).
fn node_name(url: &str) -> Result<String, Failed> {
    (1..=6)
        .map(|i| format!("cluster{i}"))
        .find(|n| url.ends_with(&servers::addr(n)))
        .ok_or_else(|| format!("{url} is none of cluster1 to 6").into())
}

/// Waits until the master of `key`'s slot has its replica acknowledging its writes;
/// returns the master's URL.
async fn replicated(key: &str) -> Result<String, Failed> {
    // A key of the same slot as `key` (its hash tag), on its master.
    let probe = format!("{key}:replicated-probe");
    let owner = || async { Ok(redis_cluster_owner(key).await?) };
    failover::replicated(owner, &probe, 1).await
}

/// Kills (SIGKILL, by pid) the master of `key`'s slot and waits until the cluster names
/// another; returns the killed node's services.sh name.
async fn kill_master(key: &str) -> Result<String, Failed> {
    let master = replicated(key).await?;
    let name = node_name(&master)?;
    kill_until_replaced(&name, &master, || async {
        redis_cluster_owner(key).await.ok()
    })
    .await?;
    Ok(name)
}

/// The master of `key`'s slot (once its replica has every write so far, the grant too) is
/// frozen with `op` on its way to it, then killed; returns `op`'s outcome, the moment the
/// cluster named another master, and the killed node's services.sh name.
async fn killed_during<T: Send + 'static>(
    key: &str,
    op: impl Future<Output = T> + Send + 'static,
) -> Result<(T, Instant, String), Failed> {
    let master = replicated(key).await?;
    let name = node_name(&master)?;
    let op = failover::sent_to_frozen(&name, op).await;
    kill_until_replaced(&name, &master, || async {
        redis_cluster_owner(key).await.ok()
    })
    .await?;
    let named = Instant::now();
    Ok((op.await?, named, name))
}

/// Long enough that a lease outlives its shard's failover whatever its renewals meet.
const LONG_TTL: Duration = Duration::from_secs(60);

/// A renewal on its way to the master of the lease's slot when that master dies fails as a
/// retryable error (never "not held"), the lease is renewed on the promoted replica and stays
/// Held, nobody else is granted it, and after its release another client is.
async fn renewal_in_flight() -> Result<(), Failed> {
    let (a, b) = (connect().await?, connect().await?);
    let (name, key, lease) = holding_for(&a, "failover-renewing", LONG_TTL).await?;
    let ((lease, renewed), _, victim) = killed_during(&key, async move {
        let renewed = lease.renew().await;
        (lease, renewed)
    })
    .await?;
    let result = async {
        failover::renewed_after_failover(lease.as_ref(), renewed).await?;
        still_held_then_handed_on(lease, &b, &name, "failover").await
    }
    .await;
    bring_back(&victim).await?;
    result
}

/// A release on its way to the master of the lease's slot when that master dies reaches the
/// promoted replica: another client is granted the lock within the failover, not when the
/// lease's 60 s TTL runs out.
async fn release_in_flight() -> Result<(), Failed> {
    let (a, b) = (connect().await?, connect().await?);
    let (name, key, lease) = holding_for(&a, "failover-releasing", LONG_TTL).await?;
    let (released, named, victim) = killed_during(&key, lease.release()).await?;
    let result = failover::released_after_failover(named, released, &b, &name, LONG_TTL).await;
    bring_back(&victim).await?;
    result
}

/// Starts the killed node again on its nodes.conf: it rejoins as a replica of the new master.
async fn bring_back(name: &str) -> Result<(), Failed> {
    services(&["restart", name]);
    let back = Instant::now();
    while test_support::redis_role(&servers::addr(name))
        .await
        .as_deref()
        != Some("slave")
    {
        if back.elapsed() > FAILOVER {
            return Err(format!("{name} did not rejoin as a replica {FAILOVER:?} on").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A fresh name, its lock key, and a lease on it with automatic renewal.
async fn holding(
    lock: &RedisLock,
    tag: &str,
) -> Result<(LockName, String, Box<dyn lock_core::Lease>), Failed> {
    holding_for(lock, tag, TTL).await
}

/// [`holding`] with a TTL of `ttl`.
async fn holding_for(
    lock: &RedisLock,
    tag: &str,
    ttl: Duration,
) -> Result<(LockName, String, Box<dyn lock_core::Lease>), Failed> {
    let name = fresh_name(tag);
    let key = LockKeys::new(lock.config().prefix(), &name).lock.clone();
    let lease = lock
        .try_acquire(&name, &LockOptions::new(ttl).auto_renew(None))
        .await?
        .ok_or("a free lock refused")?;
    Ok((name, key, lease))
}

/// A lease whose slot's master is killed is renewed on the promoted replica (the client
/// follows the cluster's new topology) and stays Held; meanwhile nobody else is granted the
/// lock; after its release another client is: a failover never leaves a lock nobody can take.
async fn held_lease_kept() -> Result<(), Failed> {
    let (a, b) = (connect().await?, connect().await?);
    let (name, key, lease) = holding(&a, "failover-held").await?;
    let renewals = lease.renewals().unwrap_or(0);
    let victim = kill_master(&key).await?;
    let result = async {
        // Two renewals after the failover: on the new master.
        let until = Instant::now() + TTL;
        while lease.renewals().unwrap_or(0) < renewals + 2 {
            if Instant::now() > until {
                return Err(format!(
                    "{TTL:?} after the failover the lease is {:?} with {} renewals since: not \
                     renewed on the new master",
                    lease.state(),
                    lease.renewals().unwrap_or(0) - renewals
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        still_held_then_handed_on(lease, &b, &name, "failover").await
    }
    .await;
    bring_back(&victim).await?;
    result
}

/// A waiter (subscribed to the lock's release announcements) when the slot's master dies is
/// granted within a second of the holder's release on the new master.
async fn waiter_after_failover() -> Result<(), Failed> {
    let (a, b) = (connect().await?, connect().await?);
    let (name, key, lease) = holding(&a, "failover-wait").await?;
    let waiting = {
        let (name, opts) = (name.clone(), LockOptions::new(TTL).wait_for(FAILOVER * 3));
        tokio::spawn(async move { b.acquire(&name, &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let victim = kill_master(&key).await?;
    let result = async {
        // The holder renewed on the new master before it lets go.
        let renewals = lease.renewals().unwrap_or(0);
        let until = Instant::now() + TTL;
        while lease.renewals().unwrap_or(0) == renewals {
            if Instant::now() > until {
                return Err("the lease was not renewed on the new master".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
    bring_back(&victim).await?;
    result
}

/// `wait_replicas=N` on a cluster waits on the master of the lock's slot. With one replica per
/// shard, `wait_replicas=2` fails with a retryable error naming it and leaves nothing behind.
/// With one shard's replica frozen, `wait_replicas=1` fails the same way on that shard's names
/// and is granted on another shard's: a WAIT sent to another master, or to every master,
/// would not tell these apart.
async fn grant_short_of_replicas() -> Result<(), Failed> {
    // Every node forgets the scripts, as a restarted or promoted master has: the first grant
    // is answered NOSCRIPT after its WAIT, then sent again with the script (its WAIT too);
    // both must fit in the request timeout (with a WAIT of half of it each, the grant timed
    // out instead of saying what it was short of, in a clean run after the failover tests).
    for i in 1..=6 {
        let mut c = node_conn(&servers::url(&format!("redis://{{cluster{i}}}"))).await?;
        redis::cmd("SCRIPT").arg("FLUSH").exec_async(&mut c).await?;
    }
    let one = RedisLock::connect(harness::waiting_for(config(), 1)).await?;
    let two = RedisLock::connect(harness::waiting_for(config(), 2)).await?;
    let other = connect().await?;
    let opts = LockOptions::new(TTL);
    let refused = |lock: &RedisLock, name: LockName, n: u32| {
        let (lock, opts) = (lock.clone(), opts.clone());
        async move {
            let asked = Instant::now();
            match lock.try_acquire(&name, &opts).await {
                Err(e)
                    if e.is_retryable()
                        && e.to_string().contains(&format!("wait_replicas={n}")) => {}
                got => {
                    return Err(format!(
                        "wait_replicas={n} short of replicas gave {got:?} after {:?}: expected \
                         Unavailable naming the replicas it waited for",
                        asked.elapsed()
                    )
                    .into())
                }
            }
            connect()
                .await?
                .try_acquire(&name, &opts)
                .await?
                .ok_or("the grant too few replicas acknowledged was not undone: the lock is held")?
                .release()
                .await?;
            Ok::<(), Failed>(())
        }
    };
    refused(&two, fresh_name("replicas-two"), 2).await?;
    // Three names on one shard, whose replica is frozen, and four on the others: a WAIT sent
    // to a master at random would pass all seven one time in about 150.
    let probe = LockKeys::new(one.config().prefix(), &fresh_name("replicas-probe"));
    let a_master = replicated(&probe.lock).await?;
    let (mut on_a, mut elsewhere) = (Vec::new(), Vec::new());
    while on_a.len() < 3 || elsewhere.len() < 4 {
        let name = fresh_name("replicas-frozen");
        let key = LockKeys::new(one.config().prefix(), &name).lock.clone();
        if replicated(&key).await? == a_master {
            on_a.push(name);
        } else {
            elsewhere.push(name);
        }
    }
    let replica = node_name(&replica_of(&a_master).await?)?;
    let pid = services(&["pid", &replica]);
    kill("STOP", &pid);
    let frozen = async {
        for a in &on_a {
            refused(&one, a.clone(), 1).await?;
        }
        for b in &elsewhere {
            one.try_acquire(b, &opts)
                .await?
                .ok_or("wait_replicas=1, the replica of another shard frozen: a free lock refused")?
                .release()
                .await?;
        }
        Ok::<(), Failed>(())
    }
    .await;
    kill("CONT", &pid);
    frozen?;
    for a in &on_a {
        other
            .try_acquire(a, &opts)
            .await?
            .ok_or("after the thaw the lock is held")?
            .release()
            .await?;
    }
    Ok(())
}

/// The URL of the (one) replica of the master at `url`, from its `INFO replication`.
async fn replica_of(url: &str) -> Result<String, Failed> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await?;
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("slave0:"))
        .ok_or_else(|| format!("{url} has no replica"))?;
    let field = |k: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(k))
            .map(str::to_string)
    };
    match (field("ip="), field("port=")) {
        (Some(ip), Some(port)) => Ok(format!("redis://{ip}:{port}")),
        _ => Err(format!("{url}'s replica line {line:?}").into()),
    }
}

/// Two fresh names whose slots have different masters now.
async fn on_two_shards(lock: &RedisLock, tag: &str) -> Result<[(LockName, String); 2], Failed> {
    let named = |i: usize| {
        let name = fresh_name(&format!("{tag}-{i}"));
        let key = LockKeys::new(lock.config().prefix(), &name).lock.clone();
        (name, key)
    };
    let a = named(0);
    let a_master = redis_cluster_owner(&a.1).await?;
    for i in 1..64 {
        let b = named(i);
        if redis_cluster_owner(&b.1).await? != a_master {
            return Ok([a, b]);
        }
    }
    Err("64 names all on one master".into())
}

/// A shard's master killed: until the cluster promotes its replica, that shard's names are
/// unavailable, but the client (whose connection to the dead master dropped, so that it
/// checks a server before its next grant) is granted names of another shard at once: the
/// check asks the master it grants on, not every master.
async fn other_shard_grants() -> Result<(), Failed> {
    let lock = connect().await?;
    let [(_, a_key), (b, _)] = on_two_shards(&lock, "other-shard").await?;
    let master = replicated(&a_key).await?;
    let victim = node_name(&master)?;
    let opts = LockOptions::new(TTL);
    kill("KILL", services(&["pid", &victim]));
    let died = Instant::now();
    // Tries on the other shard, each bounded (the first after the drop waits for the client's
    // new map of the cluster), until one is granted.
    let mut tries = Vec::new();
    let granted = loop {
        let r = tokio::time::timeout(Duration::from_secs(2), lock.try_acquire(&b, &opts)).await;
        let still_down = redis_cluster_owner(&a_key).await.ok().as_deref() == Some(master.as_str());
        tries.push(format!("{:?}: {r:?}", died.elapsed()));
        if let Ok(Ok(Some(lease))) = r {
            lease.release().await?;
            break still_down;
        }
        if died.elapsed() > FAILOVER {
            break false;
        }
    };
    // The cluster fails the shard over; the node rejoins as a replica.
    while redis_cluster_owner(&a_key).await.ok().as_deref() == Some(master.as_str()) {
        if died.elapsed() > FAILOVER {
            return Err(
                format!("the cluster still names {master} {FAILOVER:?} after its death").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bring_back(&victim).await?;
    if !granted {
        return Err(format!(
            "no name of another shard was granted while {victim} was down (before the cluster \
             failed its shard over): {tries:?}"
        )
        .into());
    }
    Ok(())
}

/// A shard's master frozen past its failover, then thawed (it rejoins as a replica of the
/// one promoted in its place), while the clients are idle, so that their map of the slots
/// still names it; then their connections to another master are cut (as a restart or a
/// network reset would), so that each checks the server before its next grant. Each is
/// granted that shard's names again within seconds. Found by the failover soak: such a
/// client asked the deposed master for `INFO`, read `role:slave`, and refused every later
/// grant as misconfigured (`Error::Config`), to the end of the run.
async fn thawed_master() -> Result<(), Failed> {
    let clients = [connect().await?, connect().await?, connect().await?];
    let [(a, a_key), (b, b_key)] = on_two_shards(&clients[0], "thawed").await?;
    let opts = LockOptions::new(Duration::from_secs(2));
    let use_all = |what: &'static str| {
        let (clients, opts, a, b) = (clients.clone(), opts.clone(), a.clone(), b.clone());
        async move {
            for c in &clients {
                for name in [&a, &b] {
                    let got = c.try_acquire(name, &opts).await;
                    if let Some(l) = got.map_err(|e| format!("{what}: {e}"))? {
                        l.release().await?;
                    }
                }
            }
            Ok::<(), Failed>(())
        }
    };
    use_all("before").await?;
    let master = replicated(&a_key).await?;
    let victim = node_name(&master)?;
    let pid = services(&["pid", &victim]);
    kill("STOP", &pid);
    let frozen = Instant::now();
    while redis_cluster_owner(&a_key).await.ok().as_deref() == Some(master.as_str()) {
        if frozen.elapsed() > FAILOVER {
            kill("CONT", &pid);
            return Err(
                format!("the cluster still names {master} {FAILOVER:?} into its freeze").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill("CONT", &pid);
    let thawed = Instant::now();
    while test_support::redis_role(&servers::addr(&victim))
        .await
        .as_deref()
        != Some("slave")
    {
        if thawed.elapsed() > FAILOVER {
            return Err(format!(
                "{victim} did not rejoin as a replica {FAILOVER:?} after its thaw"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut admin = redis::Client::open(redis_cluster_owner(&b_key).await?)?
        .get_multiplexed_async_connection()
        .await?;
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .exec_async(&mut admin)
        .await?;
    // Every client is granted both names within 10 s of the rejoin.
    let rejoined = Instant::now();
    let mut last;
    for (i, c) in clients.iter().enumerate() {
        loop {
            match c.try_acquire(&a, &opts).await {
                Ok(Some(l)) => {
                    l.release().await?;
                    break;
                }
                Ok(None) => last = "busy".into(),
                Err(e) => last = e.to_string(),
            }
            if rejoined.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "client {i} was not granted a name of the failed-over shard within 10 s of \
                     the deposed master's rejoin: {last}"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    use_all("after").await
}

/// A plain connection to the node at `url`, patient (a migration moves keys).
async fn node_conn(url: &str) -> Result<redis::aio::MultiplexedConnection, Failed> {
    let patient = redis::AsyncConnectionConfig::new().set_response_timeout(Some(FAILOVER));
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&patient)
        .await?)
}

/// The slot of a held lease moved to another master (`CLUSTER SETSLOT … IMPORTING/MIGRATING`,
/// `MIGRATE` of its keys, `SETSLOT … NODE`), as an operator resharding does: the lease is
/// renewed throughout (through `ASK`, then `MOVED`) and stays Held; nobody else is granted
/// it; after its release another client is, on the new master. Both clients with
/// `wait_replicas=replicas`.
async fn slot_migrated(replicas: u32) -> Result<(), Failed> {
    let connect = || RedisLock::connect(config().with_wait_replicas(replicas));
    let (a, b) = (connect().await?, connect().await?);
    let [(name, key), (_, other_key)] = on_two_shards(&a, "migrated").await?;
    let lease = a
        .try_acquire(&name, &LockOptions::new(TTL).auto_renew(None))
        .await?
        .ok_or("a free lock refused")?;
    let to = redis_cluster_owner(&other_key).await?;
    let renewals = lease.renewals().unwrap_or(0);
    // Half moved for a third of the TTL: a renewal then meets ASK for keys already moved.
    let slot = migrate_slot(&key, &to, TTL / 3).await?;
    let moved = Instant::now();
    // Two renewals since the migration began, the last on the new master.
    while lease.renewals().unwrap_or(0) < renewals + 2 {
        if moved.elapsed() > TTL {
            return Err(format!(
                "the lease is {:?} with {} renewals since its slot began to move",
                lease.state(),
                lease.renewals().unwrap_or(0) - renewals
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if redis_cluster_owner(&key).await? != to {
        return Err(format!("the slot {slot} is not on {to} after the migration").into());
    }
    still_held_then_handed_on(lease, &b, &name, "migration").await
}

/// Moves the slot of `key` from its master to the master at `to` (`CLUSTER SETSLOT …
/// IMPORTING/MIGRATING`, `MIGRATE` of its keys, `SETSLOT … NODE`), half moved (importing and
/// migrating, no key moved yet) for `halfway`. The slot.
async fn migrate_slot(key: &str, to: &str, halfway: Duration) -> Result<u16, Failed> {
    let from = redis_cluster_owner(key).await?;
    let (mut src, mut dst) = (node_conn(&from).await?, node_conn(to).await?);
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(&mut src)
        .await?;
    let id = |c: &mut redis::aio::MultiplexedConnection| {
        let mut c = c.clone();
        async move {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query_async::<String>(&mut c)
                .await
        }
    };
    let (src_id, dst_id) = (id(&mut src).await?, id(&mut dst).await?);
    let setslot = |state: &'static str, node: String| {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(slot).arg(state).arg(node);
        c
    };
    setslot("IMPORTING", src_id.clone())
        .exec_async(&mut dst)
        .await?;
    setslot("MIGRATING", dst_id.clone())
        .exec_async(&mut src)
        .await?;
    tokio::time::sleep(halfway).await;
    let (host, port) = to
        .trim_start_matches("redis://")
        .rsplit_once(':')
        .ok_or("no port")?;
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query_async(&mut src)
            .await?;
        if keys.is_empty() {
            break;
        }
        redis::cmd("MIGRATE")
            .arg(host)
            .arg(port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .exec_async(&mut src)
            .await?;
    }
    for c in [&mut dst, &mut src] {
        setslot("NODE", dst_id.clone()).exec_async(c).await?;
    }
    Ok(slot)
}

/// `PUBSUB SHARDNUMSUB` (`sharded`) or `PUBSUB NUMSUB` of `channel` on the node at `url`.
async fn subscribers(url: &str, channel: &str, sharded: bool) -> Result<u64, Failed> {
    let verb = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
    let (_, n): (String, u64) = redis::cmd("PUBSUB")
        .arg(verb)
        .arg(channel)
        .query_async::<Vec<(String, u64)>>(&mut node_conn(url).await?)
        .await?
        .pop()
        .ok_or("PUBSUB answered no channel")?;
    Ok(n)
}

/// Waits (up to 2 s) until `url` has `channel`'s sharded subscriber.
async fn sharded_subscriber_on(url: &str, channel: &str, what: &str) -> Result<(), Failed> {
    let until = Instant::now() + Duration::from_secs(2);
    while subscribers(url, channel, true).await? != 1 {
        if Instant::now() > until {
            return Err(format!(
                "{what}: no sharded subscriber of {channel} on {url} within 2 s (the waiter \
                 listens elsewhere, or by classic pub/sub)"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A waiter from `b` on `name`, which a lease renewed automatically holds: only the release's
/// announcement wakes the waiter before about a TTL.
fn waiter(
    b: RedisLock,
    name: &LockName,
) -> tokio::task::JoinHandle<lock_core::Result<Box<dyn lock_core::Lease>>> {
    let (name, opts) = (name.clone(), LockOptions::new(TTL).wait_for(TTL * 4));
    tokio::spawn(async move { b.acquire(&name, &opts).await })
}

/// Releases `lease`; `waiting` must be granted within a second (the holder renewed itself, so
/// without the announcement the waiter would sleep about a TTL).
async fn woken_by_the_release(
    lease: Box<dyn lock_core::Lease>,
    waiting: tokio::task::JoinHandle<lock_core::Result<Box<dyn lock_core::Lease>>>,
    what: &str,
) -> Result<(), Failed> {
    if waiting.is_finished() {
        return Err(format!("{what}: the waiter returned before the holder released").into());
    }
    lease.release().await?;
    let granted = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .map_err(|_| format!("{what}: the waiter was not granted within 1 s of the release"))??;
    granted?.release().await?;
    Ok(())
}

/// On a cluster of servers with sharded pub/sub (Redis 7.0 and later), a waiter listens by
/// `SSUBSCRIBE` on the master of its lock's slot, and nowhere by classic `SUBSCRIBE` (whose
/// messages every node of the cluster would carry); the release's `SPUBLISH` wakes it at once.
async fn waiter_on_its_shard() -> Result<(), Failed> {
    let (a, b) = (connect().await?, connect().await?);
    let (name, key, lease) = holding(&a, "sharded").await?;
    let channel = LockKeys::new(a.config().prefix(), &name).channel;
    let owner = redis_cluster_owner(&key).await?;
    let waiting = waiter(b, &name);
    sharded_subscriber_on(&owner, &channel, "waiting").await?;
    for port in servers::numbered::<6>("cluster") {
        let url = format!("redis://127.0.0.1:{port}");
        let n = subscribers(&url, &channel, false).await?;
        if n != 0 {
            return Err(format!("{n} classic subscribers of {channel} on {url}").into());
        }
    }
    woken_by_the_release(lease, waiting, "by shard").await
}

/// A waiter whose lock's slot moves to another master (which drops the sharded
/// subscriptions of the slot it gives up) subscribes again there, and the release on the new
/// master wakes it at once.
async fn waiter_follows_its_slot() -> Result<(), Failed> {
    let (a, b) = (connect().await?, connect().await?);
    let [(name, key), (_, other_key)] = on_two_shards(&a, "sharded-moved").await?;
    let lease = a
        .try_acquire(&name, &LockOptions::new(TTL).auto_renew(None))
        .await?
        .ok_or("a free lock refused")?;
    let channel = LockKeys::new(a.config().prefix(), &name).channel;
    let (from, to) = (
        redis_cluster_owner(&key).await?,
        redis_cluster_owner(&other_key).await?,
    );
    let waiting = waiter(b, &name);
    sharded_subscriber_on(&from, &channel, "before the migration").await?;
    migrate_slot(&key, &to, Duration::ZERO).await?;
    sharded_subscriber_on(&to, &channel, "after the migration").await?;
    woken_by_the_release(lease, waiting, "after the migration").await
}

/// After `what`: `lease` is Held, `b` is refused the lock, and once `lease` is released `b`
/// is granted it (a failover or a migration never leaves a lock nobody can take).
async fn still_held_then_handed_on(
    lease: Box<dyn lock_core::Lease>,
    b: &RedisLock,
    name: &LockName,
    what: &str,
) -> Result<(), Failed> {
    if lease.state() != LeaseState::Held {
        return Err(format!("after the {what} the lease is {:?}", lease.state()).into());
    }
    let opts = LockOptions::new(TTL);
    if b.try_acquire(name, &opts).await?.is_some() {
        return Err(format!("another client was granted the lock after the {what}").into());
    }
    lease.release().await?;
    b.try_acquire(name, &opts)
        .await?
        .ok_or("after the release nobody can take the lock")?
        .release()
        .await?;
    Ok(())
}
