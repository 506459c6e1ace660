//! Baselines for the PostgreSQL driver, on the same server in the same run: the raw advisory
//! lock cycle (the floor), and sqlx's `PgAdvisoryLock` (what a Rust user would pick today).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgAdvisoryLock, PgPool, PgPoolOptions};
use sqlx::Postgres;
use tokio_postgres::{Client, Statement};

use crate::subject::{Guard, Subject};

/// `pg_try_advisory_lock` + `pg_advisory_unlock`, prepared, on a connection of its own per
/// concurrent holder (reused: the uncontended cycle runs on one). No fencing, no session
/// bound, no pooler check, no lease state: the least a correct advisory-lock cycle costs with
/// the driver's client crate. It cannot wait, so it sits out the handoff scenario.
pub(crate) struct PgFloor {
    url: String,
    idle: Arc<Mutex<Vec<FloorConn>>>,
    /// `pg_try_advisory_lock_shared` + `pg_advisory_unlock_shared` instead: the floor of a
    /// shared holder.
    shared: bool,
}

struct FloorConn {
    client: Client,
    lock: Statement,
    unlock: Statement,
}

impl PgFloor {
    pub(crate) async fn connect(url: &str) -> Result<Self, String> {
        Self::connect_as(url, false).await
    }

    /// The floor of a shared holder (`shared`) or of the exclusive lock.
    pub(crate) async fn connect_as(url: &str, shared: bool) -> Result<Self, String> {
        let floor = PgFloor {
            url: url.to_string(),
            idle: Arc::new(Mutex::new(Vec::new())),
            shared,
        };
        let first = floor.open().await?;
        floor.put(first);
        Ok(floor)
    }

    async fn open(&self) -> Result<FloorConn, String> {
        let client = server_probes::pg_client(&self.url)
            .await
            .map_err(|e| e.to_string())?;
        let suffix = if self.shared { "_shared" } else { "" };
        let lock = client
            .prepare(&format!("SELECT pg_try_advisory_lock{suffix}($1)"))
            .await
            .map_err(|e| e.to_string())?;
        let unlock = client
            .prepare(&format!("SELECT pg_advisory_unlock{suffix}($1)"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(FloorConn {
            client,
            lock,
            unlock,
        })
    }

    fn put(&self, c: FloorConn) {
        put_back(&self.idle, c);
    }
}

/// Keeps at most as many idle connections as the driver does (16); closes the others.
fn put_back(idle: &Mutex<Vec<FloorConn>>, c: FloorConn) {
    if let Ok(mut idle) = idle.lock() {
        if idle.len() < 16 {
            idle.push(c);
        }
    }
}

/// A 64-bit key of a name (any stable hash will do for the floor).
fn key(name: &str) -> i64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish() as i64
}

struct FloorGuard {
    conn: Option<FloorConn>,
    key: i64,
    idle: Arc<Mutex<Vec<FloorConn>>>,
}

#[async_trait]
impl Guard for FloorGuard {
    async fn unlock(mut self: Box<Self>) -> Result<(), String> {
        let c = self.conn.take().ok_or("floor: no connection")?;
        let row = c
            .client
            .query_one(&c.unlock, &[&self.key])
            .await
            .map_err(|e| e.to_string())?;
        if !row.get::<_, bool>(0) {
            return Err("floor: the lock was not held at unlock".into());
        }
        put_back(&self.idle, c);
        Ok(())
    }
}

#[async_trait]
impl Subject for PgFloor {
    fn label(&self) -> String {
        if self.shared {
            "floor: pg_try_advisory_lock_shared + pg_advisory_unlock_shared".into()
        } else {
            "floor: pg_try_advisory_lock + pg_advisory_unlock".into()
        }
    }
    fn waits(&self) -> bool {
        false
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let taken = self.idle.lock().ok().and_then(|mut i| i.pop());
        let c = match taken {
            Some(c) => c,
            None => self.open().await?,
        };
        let k = key(name);
        let row = c
            .client
            .query_one(&c.lock, &[&k])
            .await
            .map_err(|e| e.to_string())?;
        if !row.get::<_, bool>(0) {
            self.put(c);
            return Err(format!("floor: {name} is busy"));
        }
        Ok(Box::new(FloorGuard {
            conn: Some(c),
            key: k,
            idle: self.idle.clone(),
        }))
    }
}

/// sqlx's `PgAdvisoryLock`: a connection from a `PgPool`, `acquire` (the blocking
/// `pg_advisory_lock`), then `pg_advisory_unlock` and the connection back to the pool. No
/// fencing, no session bound, no lost signal.
pub(crate) struct SqlxLock {
    pool: PgPool,
}

impl SqlxLock {
    pub(crate) async fn connect(url: &str) -> Result<Self, String> {
        // Enough for every task of the throughput and handoff scenarios; idle ones close soon,
        // so that the three subjects together stay under the server's max_connections.
        let pool = PgPoolOptions::new()
            .max_connections(72)
            .min_connections(0)
            .idle_timeout(std::time::Duration::from_secs(1))
            .connect(url)
            .await
            .map_err(|e| e.to_string())?;
        Ok(SqlxLock { pool })
    }
}

struct SqlxGuard {
    lock: PgAdvisoryLock,
    conn: PoolConnection<Postgres>,
}

#[async_trait]
impl Guard for SqlxGuard {
    async fn unlock(self: Box<Self>) -> Result<(), String> {
        let SqlxGuard { lock, conn } = *self;
        let (_conn, released) = lock.force_release(conn).await.map_err(|e| e.to_string())?;
        if released {
            Ok(())
        } else {
            Err("sqlx: the lock was not held at unlock".into())
        }
    }
}

#[async_trait]
impl Subject for SqlxLock {
    fn label(&self) -> String {
        "baseline: sqlx PgAdvisoryLock".into()
    }
    async fn lock(&self, name: &str) -> Result<Box<dyn Guard>, String> {
        let lock = PgAdvisoryLock::new(name);
        let conn = self.pool.acquire().await.map_err(|e| e.to_string())?;
        // The guard borrows the lock; leak it and release by key instead (the same unlock).
        let conn = lock.acquire(conn).await.map_err(|e| e.to_string())?.leak();
        Ok(Box::new(SqlxGuard { lock, conn }))
    }
}
