//! The shared conformance suite against a real redis-server.
//!
//! Server: `REDIS_URL` (default `redis://{redis}`, started by `scripts/services.sh up`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::ExitCode;
use std::sync::Arc;

use lock_redis::RedisConfig;
use test_support::servers;
use test_support::ServicesSh;

mod harness;
use harness::{At, Redis};

fn main() -> ExitCode {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| servers::url("redis://{redis}"));
    let config = RedisConfig::from_url(&url).expect("REDIS_URL");
    // Without persistence a restart forgets every lock: the nemesis only freezes it.
    let mut trials = conformance_tests::trials(Arc::new(Redis {
        config,
        servers: Some(Arc::new(ServicesSh::new(&["redis"], false))),
        secured: true,
        up: "redis",
        at: At::Server,
        ttl: harness::TTL,
    }));
    // The server that fsyncs every write (appendfsync always): fencing is Strict, and the suite
    // crashes and restarts it to prove it.
    let aof = RedisConfig::from_url(&servers::url("redis://{redis-aof}")).expect("redis-aof URL");
    trials.extend(conformance_tests::trials_prefixed(
        Arc::new(Redis {
            config: aof,
            servers: Some(Arc::new(ServicesSh::new(&["redis-aof"], true))),
            secured: false,
            up: "redis-aof",
            at: At::Server,
            ttl: harness::TTL,
        }),
        "aof",
    ));
    // Plain keys (the layout redis-py and redsync share): the whole contract holds there too,
    // without fencing.
    let sep = if url.contains('?') { '&' } else { '?' };
    let plain = RedisConfig::from_url(&format!("{url}{sep}keys=plain&prefix=plain-keys:"))
        .expect("plain-key URL");
    trials.extend(conformance_tests::trials_prefixed(
        Arc::new(Redis {
            config: plain,
            servers: Some(Arc::new(ServicesSh::new(&["redis"], false))),
            secured: false,
            up: "redis",
            at: At::Server,
            ttl: harness::TTL,
        }),
        "plain",
    ));
    conformance_tests::run_trials(trials)
}
