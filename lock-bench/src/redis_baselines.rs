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

/// An expiring semaphore of `k` permits in one Lua script per step, as Redisson's
/// `RPermitExpirableSemaphore` keeps one (a sorted set of permit ids scored by expiry): drop
/// the expired, count, `ZADD` the new id; release is `ZREM`. No fencing, no notification, no
/// lease state, no exclusion of the same name's lock: the least an expiring semaphore costs
/// with the same client crate. It cannot wait, so it sits out the handoff scenario.
pub(crate) struct RawSemaphore {
    conn: MultiplexedConnection,
    acquire: Arc<Script>,
    permits: u32,
}

const SEMAPHORE_ACQUIRE: &str = "local t = redis.call('TIME') \
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) \
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end \
redis.call('ZADD', KEYS[1], now + 10000, ARGV[1]) \
redis.call('PEXPIRE', KEYS[1], 10000) \
return 1";

impl RawSemaphore {
    pub(crate) async fn connect(url: &str, permits: u32) -> Result<Self, String> {
        let floor = RawFloor::connect(url).await?;
        Ok(RawSemaphore {
            conn: floor.conn,
            acquire: Arc::new(Script::new(SEMAPHORE_ACQUIRE)),
            permits,
        })
    }
}

struct PermitGuard {
    conn: MultiplexedConnection,
    key: String,
    id: String,
}

#[async_trait]
impl Guard for PermitGuard {
    async fn unlock(mut self: Box<Self>) -> Result<(), String> {
        let n: i64 = redis::cmd("ZREM")
            .arg(&self.key)
            .arg(&self.id)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| e.to_string())?;
        if n == 1 {
            Ok(())
        } else {
            Err("raw semaphore: the permit was gone at release".into())
        }
    }
}

#[async_trait]
impl Subject for RawSemaphore {
    fn label(&self) -> String {
        format!(
            "baseline: expiring semaphore of {} (Redisson's sorted-set algorithm, raw)",
            self.permits
        )
    }
    fn waits(&self) -> bool {
        false
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let key = format!("bench-sem:{name}");
        let id = uuid::Uuid::new_v4().simple().to_string();
        let mut conn = self.conn.clone();
        let ok: i64 = self
            .acquire
            .key(&key)
            .arg(&id)
            .arg(self.permits)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if ok != 1 {
            return Err("raw semaphore: every permit is taken (it never waits)".into());
        }
        Ok(Box::new(PermitGuard { conn, key, id }))
    }
}
