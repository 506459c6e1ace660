//! Shared mode is `pg_advisory_lock_shared` on the name's key: another program's
//! `pg_advisory_lock_shared(key)` / `pg_advisory_lock(key)` and distlock's shared and exclusive
//! modes are one lock, both ways. Against the `pg` server of `scripts/services.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, LockOptions, Mode};
use lock_postgres::{advisory_key, PgLock};
use test_support::servers;

async fn sql() -> tokio_postgres::Client {
    test_support::pg_locker().await
}

/// `SELECT f($1)` for an advisory-lock function `f` returning a boolean.
async fn call(c: &tokio_postgres::Client, f: &str, key: i64) -> bool {
    let row = c
        .query_one(&format!("SELECT {f}($1)"), &[&key])
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test]
async fn pg_advisory_lock_shared_and_distlocks_shared_mode_are_one_lock() {
    let url = servers::url("postgres://locker@{pg}/postgres?sslmode=disable");
    let locks = PgLock::from_url(&url).await.unwrap();
    let name = fresh_name("pg-shared-interop");
    let key = advisory_key(&name);
    let opts = LockOptions::new(Duration::from_secs(10));
    let shared = opts.clone().shared();
    let other = sql().await;

    // distlock reads: another session's shared try joins, its exclusive try is refused.
    let reader = locks.try_acquire(&name, &shared).await.unwrap().unwrap();
    assert!(call(&other, "pg_try_advisory_lock_shared", key).await);
    assert!(!call(&other, "pg_try_advisory_lock", key).await);
    let holders = locks.holders(&name).await.unwrap();
    assert!(
        holders.len() == 2 && holders.iter().all(|h| h.mode == Mode::Shared),
        "{holders:?}"
    );
    // The newest grant (distlock's) shows its token.
    assert_eq!(
        holders.last().and_then(|h| h.fencing_token),
        reader.fencing_token()
    );
    reader.release().await.unwrap();
    // The other session still reads: distlock's writer is refused, its reader joins.
    assert!(locks.try_acquire(&name, &opts).await.unwrap().is_none());
    let reader = locks.try_acquire(&name, &shared).await.unwrap().unwrap();
    reader.release().await.unwrap();
    assert!(call(&other, "pg_advisory_unlock_shared", key).await);

    // The other session writes: distlock's reader is refused, and waits for it.
    assert!(call(&other, "pg_try_advisory_lock", key).await);
    assert!(locks.try_acquire(&name, &shared).await.unwrap().is_none());
    let waiting = {
        let (locks, name) = (locks.clone(), name.clone());
        let o = shared.clone().wait_for(Duration::from_secs(10));
        tokio::spawn(async move { locks.acquire(&name, &o).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a reader was granted beside a writer"
    );
    assert!(call(&other, "pg_advisory_unlock", key).await);
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    let lease = match granted {
        Ok(Ok(Ok(lease))) => lease,
        other => panic!("the waiting reader was not granted after the unlock: {other:?}"),
    };
    // distlock's reader holds: the other session's exclusive try is refused.
    assert!(!call(&other, "pg_try_advisory_lock", key).await);
    lease.release().await.unwrap();
}

/// Permits: each holder's session holds the name's key shared (another program's exclusive
/// `pg_advisory_lock(key)` and distlock's permits exclude each other, both ways) and one slot
/// key; `holders` lists the holders with their count, not the request waiting at the gate. An
/// operator's `pg_terminate_backend` of a holder frees its slot with its session: the waiting
/// request is granted, within the gate's pause (2 s) when it waited on another slot.
#[tokio::test]
async fn permits_hold_the_key_shared_and_a_slot_each() {
    let url = servers::url("postgres://locker@{pg}/postgres?sslmode=disable");
    let locks = PgLock::from_url(&url).await.unwrap();
    let name = fresh_name("pg-permits");
    let key = advisory_key(&name);
    let two = LockOptions::new(Duration::from_secs(10)).permits(2);
    let other = sql().await;

    assert!(call(&other, "pg_try_advisory_lock", key).await);
    assert!(
        locks.try_acquire(&name, &two).await.unwrap().is_none(),
        "a permit beside another program's exclusive lock"
    );
    assert!(call(&other, "pg_advisory_unlock", key).await);
    let a = locks.try_acquire(&name, &two).await.unwrap().unwrap();
    let b = locks.try_acquire(&name, &two).await.unwrap().unwrap();
    assert!(locks.try_acquire(&name, &two).await.unwrap().is_none());
    assert!(
        !call(&other, "pg_try_advisory_lock", key).await,
        "a writer beside permits"
    );
    let waiting = {
        let (locks, name, two) = (locks.clone(), name.clone(), two.clone());
        tokio::spawn(async move {
            locks
                .acquire(&name, &two.wait_for(Duration::from_secs(20)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a third permit of two");
    let holders = locks.holders(&name).await.unwrap();
    assert!(
        holders.len() == 2 && holders.iter().all(|h| h.mode == Mode::Permits(2)),
        "{holders:?}"
    );
    // The newest grant's session (the fencing table names it) is `b`'s, which holds slot 1:
    // `a` took slot 0 first, and the waiter waits on slot 0 first. Ending `b`'s session (a
    // crash, as far as the server knows) frees a slot the waiter does not wait on: only its
    // rescan after the pause finds it.
    let b_pid: i32 = other
        .query_one(
            "SELECT holder_pid FROM distlock_fencing WHERE name = $1",
            &[&name.as_str()],
        )
        .await
        .unwrap()
        .get(0);
    let (a_lost, b_lost) = (a.lost(), b.lost());
    let started = std::time::Instant::now();
    other
        .query("SELECT pg_terminate_backend($1)", &[&b_pid])
        .await
        .unwrap();
    let c = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting permit was not granted within 5 s of another slot's holder's end")
        .unwrap()
        .unwrap();
    eprintln!("granted {:?} after the terminate", started.elapsed());
    tokio::time::timeout(Duration::from_secs(5), b_lost.wait())
        .await
        .expect("the terminated holder's lease did not turn Lost");
    assert!(!a_lost.is_lost(), "the other holder lost its permit");
    let holders = locks.holders(&name).await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    a.release().await.unwrap();
    c.release().await.unwrap();
}
