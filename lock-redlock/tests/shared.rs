//! Readers by majority: a reader joins each master's group of readers (the Redis driver's
//! group in the lock's key) and holds when a majority took it, so a writer's majority and a
//! reader's always share a master that refuses one of them. Masters: `redlock1`..`redlock3`
//! of `scripts/services.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, LockOptions, Mode};
use lock_redlock::RedlockLock;
use test_support::servers;

fn redis_cli(master: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &servers::port(master).to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "redis-cli {args:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Two readers hold on every master; a master that loses the group (an operator's `DEL`, a
/// restart without persistence) leaves them a majority, and the writer is still refused; the
/// readers are listed from a quorum read; a writer, once in, keeps readers out.
#[tokio::test]
async fn readers_hold_by_majority_and_keep_a_writer_out() {
    let url = servers::url("redlock://{redlock1},{redlock2},{redlock3}");
    let (a, b) = (
        RedlockLock::from_url(&url).await.unwrap(),
        RedlockLock::from_url(&url).await.unwrap(),
    );
    let name = fresh_name("rl-shared");
    let write = LockOptions::new(Duration::from_secs(10));
    let read = write.clone().shared();
    let r1 = a.try_acquire(&name, &read).await.unwrap().unwrap();
    let r2 = b.try_acquire(&name, &read).await.unwrap().unwrap();
    let key = r1.backend_key().unwrap();
    assert!(
        redis_cli("redlock1", &["GET", &key]).starts_with("distlock-group:"),
        "the lock key of a reader's group on master 1"
    );
    redis_cli("redlock1", &["DEL", &key]);
    assert!(
        b.try_acquire(&name, &write).await.unwrap().is_none(),
        "a writer got in beside readers held on 2 of 3 masters"
    );
    let holders = a.holders(&name).await.unwrap();
    assert!(
        holders.len() == 2 && holders.iter().all(|h| h.mode == Mode::Shared),
        "{holders:?}"
    );
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = b.try_acquire(&name, &write).await.unwrap().unwrap();
    assert!(
        a.try_acquire(&name, &read).await.unwrap().is_none(),
        "a reader got in beside a writer"
    );
    let holders = a.holders(&name).await.unwrap();
    assert!(
        holders.len() == 1 && holders[0].mode == Mode::Exclusive,
        "{holders:?}"
    );
    w.release().await.unwrap();
    assert!(a.holders(&name).await.unwrap().is_empty());
    // A writer on 2 of 3 masters (another client's `SET NX` that reached a majority): the one
    // free master is not enough for a reader.
    for master in ["redlock2", "redlock3"] {
        redis_cli(
            master,
            &["SET", &key, "distlock-someone-else", "PX", "10000"],
        );
    }
    assert!(
        a.try_acquire(&name, &read).await.unwrap().is_none(),
        "a reader got in with 1 of 3 masters, beside a writer holding the other two"
    );
    for master in ["redlock2", "redlock3"] {
        redis_cli(master, &["DEL", &key]);
    }
    let r = a.try_acquire(&name, &read).await.unwrap().unwrap();
    r.release().await.unwrap();
}
