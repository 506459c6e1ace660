//! A contender node made by another client (kazoo's `<id>__lock__<seq>`, ZooKeeper's WriteLock
//! recipe `x-<session>-<seq>`) is a contender for distlock too: it holds the lock when it is
//! first, in waiting and in `inspect`. Server: the single ZooKeeper of `scripts/services.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::{Duration, Instant};

use conformance_tests::fresh_name;
use lock_core::{DistributedLock, LockName, LockOptions};
use lock_zookeeper::zookeeper_client::{Acls, Client, CreateMode};
use lock_zookeeper::{ZkConfig, ZkLock};
use test_support::servers;

/// The `zk` server, as `host:port`.
fn hosts() -> String {
    servers::addr("zk")
}

async fn distlock() -> ZkLock {
    ZkLock::connect(ZkConfig::new(hosts()).with_session_timeout(Duration::from_secs(4)))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{}",
                servers::url("ZooKeeper at {zk} (scripts/services.sh up zk)",)
            )
        })
}

/// A foreign client's session with its contender node under `name`'s lock node.
async fn foreign_holder(lock: &ZkLock, name: &LockName, prefix: &str) -> (Client, String) {
    let client = Client::connect(&hosts()).await.unwrap();
    let parent = lock.config().lock_path(name);
    let _ = client
        .create(
            &parent,
            b"",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await;
    let (_, seq) = client
        .create(
            &format!("{parent}/{prefix}"),
            b"",
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    (client, format!("{parent}/{prefix}{seq}"))
}

async fn foreign_node_holds_the_lock(prefix: &str) {
    let lock = distlock().await;
    let name = fresh_name("foreign");
    let (foreign, node) = foreign_holder(&lock, &name, prefix).await;
    let opts = LockOptions::new(Duration::from_secs(4));
    if let Some(l) = lock.try_acquire(&name, &opts).await.unwrap() {
        panic!(
            "granted {:?} while a foreign contender ({node}) was first: both hold the lock",
            l.fencing_token()
        );
    }
    let czxid = foreign.check_stat(&node).await.unwrap().unwrap().czxid;
    let info = lock.inspect(&name).await.unwrap();
    let token = info.and_then(|h| h.fencing_token).map(|t| t.get());
    assert_eq!(
        token,
        Some(czxid as u64),
        "inspect must report the foreign holder (its czxid)"
    );
    let waiter = {
        let (lock, name, opts) = (lock.clone(), name.clone(), opts.clone());
        tokio::spawn(async move {
            lock.acquire(&name, &opts.wait_for(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "a waiter was granted behind a foreign holder"
    );
    let released = Instant::now();
    foreign.delete(&node, None).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap_or_else(|_| panic!("waiter not woken within 2 s of the foreign release"))
        .unwrap()
        .unwrap();
    eprintln!("woken {:?} after the foreign release", released.elapsed());
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_kazoo_lock_node_is_a_contender() {
    foreign_node_holds_the_lock("3f2a9c0d5e6b4a7f8e9d0c1b2a3f4e5d__lock__").await;
}

#[tokio::test]
async fn a_writelock_recipe_node_is_a_contender() {
    foreign_node_holds_the_lock("x-72057594037927936-").await;
}

/// The other way round: a foreign contender that arrives after distlock's holder is behind it.
#[tokio::test]
async fn a_later_foreign_node_queues_behind_the_holder() {
    let lock = distlock().await;
    let name = fresh_name("foreign-later");
    let opts = LockOptions::new(Duration::from_secs(4));
    let lease = lock.try_acquire(&name, &opts).await.unwrap().unwrap();
    let (_foreign, _node) = foreign_holder(&lock, &name, "abc__lock__").await;
    let held = lock
        .inspect(&name)
        .await
        .unwrap()
        .and_then(|h| h.fencing_token);
    assert_eq!(
        held,
        lease.fencing_token(),
        "inspect must still report distlock's holder"
    );
    lease.release().await.unwrap();
    assert!(
        lock.try_acquire(&name, &opts).await.unwrap().is_none(),
        "after the release the foreign contender is first"
    );
}

/// With `base=/` lock `name` is the node `/name`, where Curator and kazoo put the lock path
/// `/name`. With `parents=persistent` that node stays after the release. (Whether a default
/// node is a container cannot be read back: the server reports a container's ephemeral owner
/// as 0, and reaps it only after `znode.container.checkIntervalMs`, a minute by default.)
#[tokio::test]
async fn base_root_and_persistent_parents() {
    for persistent in [false, true] {
        let url = format!(
            "zk://{}?base=/&session_timeout_ms=4000{}",
            hosts(),
            if persistent {
                "&parents=persistent"
            } else {
                ""
            }
        );
        let locks = ZkLock::connect(ZkConfig::from_url(&url).unwrap())
            .await
            .unwrap();
        assert_eq!(locks.config().persistent_parents(), persistent);
        let name = fresh_name("root-base");
        let path = locks.config().lock_path(&name);
        assert_eq!(path, format!("/{name}"));
        let lease = locks
            .try_acquire(&name, &LockOptions::new(Duration::from_secs(4)))
            .await
            .unwrap()
            .unwrap();
        let admin = Client::connect(&hosts()).await.unwrap();
        let children = admin.list_children(&path).await.unwrap();
        assert_eq!(children.len(), 1, "{url}: the holder's node under {path}");
        lease.release().await.unwrap();
        if persistent {
            assert!(
                admin.check_stat(&path).await.unwrap().is_some(),
                "{url}: the persistent lock node went with the release"
            );
            admin.delete(&path, None).await.unwrap(); // nobody else reaps it
        }
    }
}

/// With `base=/` and no chroot, lock `zookeeper` would be `/zookeeper`, the tree the server
/// reserves for itself: an invalid name there (as a chroot or base inside it is a Config
/// error at connect), for `acquire` and `inspect` alike, and no node is made in it. Below a
/// chroot the same name is an ordinary lock, and a chroot that does not exist yet is made at
/// connect with `base=/` as with any other base (it was not: the first acquisition failed
/// with "can not create root node").
#[tokio::test]
async fn the_reserved_tree_is_no_lock_at_the_root() {
    let at_root = ZkLock::connect(
        ZkConfig::from_url(&format!("zk://{}?base=/&session_timeout_ms=4000", hosts())).unwrap(),
    )
    .await
    .unwrap();
    let name = LockName::new("zookeeper").unwrap();
    let admin = Client::connect(&hosts()).await.unwrap();
    let before = admin.list_children("/zookeeper").await.unwrap();
    let got = at_root
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(4)))
        .await;
    assert!(
        matches!(got, Err(lock_core::Error::InvalidName { .. })),
        "lock /zookeeper: {got:?}"
    );
    let seen = at_root.inspect(&name).await;
    assert!(
        matches!(seen, Err(lock_core::Error::InvalidName { .. })),
        "inspect /zookeeper: {seen:?}"
    );
    assert_eq!(admin.list_children("/zookeeper").await.unwrap(), before);
    let chroot = fresh_name("reserved-chroot");
    let chrooted = format!("zk://{}/{chroot}?base=/&session_timeout_ms=4000", hosts());
    let below = ZkLock::connect(ZkConfig::from_url(&chrooted).unwrap())
        .await
        .unwrap();
    below
        .try_acquire(&name, &LockOptions::new(Duration::from_secs(4)))
        .await
        .unwrap()
        .expect("lock zookeeper below a new chroot")
        .release()
        .await
        .unwrap();
}
