//! Baselines for the Redis driver, on the same server in the same run.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::Script;

use crate::subject::{Guard, Subject};

const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The physical floor of a correct Redis lock cycle with the same client crate: `SET NX PX`,
/// then a compare-and-delete script by `EVALSHA`. No fencing, no notification, no lease state.
/// As a floor it cannot wait, so it sits out the handoff scenario; [`RawFloor::redis_py`] is
/// the same cycle waiting the way redis-py's `Lock` waits, polling every 100 ms.
pub(crate) struct RawFloor {
    conn: MultiplexedConnection,
    release: Arc<Script>,
    /// Keys are `<prefix><name>`.
    prefix: String,
    /// Pause between attempts while the lock is busy; `None`: do not wait.
    poll: Option<Duration>,
}

impl RawFloor {
    pub(crate) async fn connect(url: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        Ok(RawFloor {
            conn,
            release: Arc::new(Script::new(COMPARE_AND_DELETE)),
            prefix: "bench-raw:".into(),
            poll: None,
        })
    }

    /// redis-py's `Lock` (the redis.io recipe): the key `<prefix><name>`, and while it is
    /// busy, another `SET NX PX` every 100 ms (redis-py's default `sleep=0.1`).
    pub(crate) async fn redis_py(url: &str, prefix: &str) -> Result<Self, String> {
        Ok(RawFloor {
            prefix: prefix.into(),
            poll: Some(Duration::from_millis(100)),
            ..RawFloor::connect(url).await?
        })
    }
}

struct RawGuard {
    conn: MultiplexedConnection,
    key: String,
    token: String,
    release: Arc<Script>,
}

#[async_trait]
impl Guard for RawGuard {
    async fn unlock(mut self: Box<Self>) -> Result<(), String> {
        let n: i64 = self
            .release
            .key(&self.key)
            .arg(&self.token)
            .invoke_async(&mut self.conn)
            .await
            .map_err(|e| e.to_string())?;
        if n == 1 {
            Ok(())
        } else {
            Err("raw floor: lock was not ours at release".into())
        }
    }
}

#[async_trait]
impl Subject for RawFloor {
    fn label(&self) -> String {
        match self.poll {
            None => "baseline: raw SET NX PX + EVALSHA del".into(),
            Some(_) => "baseline: redis-py's Lock algorithm (SET NX PX, 100 ms polls)".into(),
        }
    }
    fn waits(&self) -> bool {
        self.poll.is_some()
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let key = format!("{}{name}", self.prefix);
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut conn = self.conn.clone();
        loop {
            let ok: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            match (ok, self.poll) {
                (Some(_), _) => break,
                (None, Some(pause)) => tokio::time::sleep(pause).await,
                (None, None) => return Err("raw floor: lock busy (it never waits)".into()),
            }
        }
        Ok(Box::new(RawGuard {
            conn,
            key,
            token,
            release: self.release.clone(),
        }))
    }
}

/// The `rslock` crate (Redlock over the given nodes): `lock` tries 3 times with a random
/// 0–200 ms pause; `acquire` loops on `lock` until it succeeds — waiting by polling.
pub(crate) struct Rslock {
    manager: Arc<rslock::LockManager>,
    nodes: usize,
}

impl Rslock {
    pub(crate) fn new(urls: Vec<String>) -> Self {
        Rslock {
            nodes: urls.len(),
            manager: Arc::new(rslock::LockManager::new(urls)),
        }
    }
}

struct RslockGuard {
    manager: Arc<rslock::LockManager>,
    lock: rslock::Lock,
}

#[async_trait]
impl Guard for RslockGuard {
    async fn unlock(self: Box<Self>) -> Result<(), String> {
        self.manager.unlock(&self.lock).await;
        Ok(())
    }
}

#[async_trait]
impl Subject for Rslock {
    fn label(&self) -> String {
        if self.nodes == 1 {
            "baseline: rslock 0.10 (1 node)".into()
        } else {
            format!("baseline: rslock 0.10 ({} masters)", self.nodes)
        }
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let key = format!("bench-rslock:{name}");
        let lock = self
            .manager
            .acquire_no_guard(key.as_bytes(), Duration::from_secs(10))
            .await
            .map_err(|e| format!("rslock: {e:?}"))?;
        Ok(Box::new(RslockGuard {
            manager: self.manager.clone(),
            lock,
        }))
    }
}
