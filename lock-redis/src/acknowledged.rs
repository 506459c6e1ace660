//! `Acknowledged`: a connection whose writes count only once replicas acknowledged them
//! (`wait_replicas`, `WAIT`) and the master and replicas fsynced them (`wait_aof`, `WAITAOF`).

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::conn::Conn;
use crate::RedisConfig;

/// A connection that sends each command with `WAIT n ms` (`wait_replicas`) and
/// `WAITAOF 1 m ms` (`wait_aof`) behind it, in one pipeline to one server: the counts are of
/// replicas (and fsyncs) that have the command's own write. A separate `WAIT` on a cluster
/// would be routed by the client's slot map as it is when sent, which a failover may change
/// after the command was answered: it would then count another master's replicas. The
/// cluster client routes the pipeline by the command's keys and, where the server redirects
/// it (`MOVED`, `ASK`, `TRYAGAIN`: the slot moved or is moving), sends the whole pipeline
/// again where it was sent. Waiting for nothing, it is the connection itself.
pub(crate) struct Acknowledged {
    conn: Conn,
    /// Replicas `WAIT` must count (0: no `WAIT`).
    replicas: u32,
    /// Replicas `WAITAOF` must count besides the master's own fsync (`None`: no `WAITAOF`).
    aof: Option<u32>,
    ms: u64,
    /// Whether the waits after the last command counted enough.
    counted: bool,
}

impl Acknowledged {
    /// Each command on `conn` waits for `replicas` replicas and, with `aof`, for the master's
    /// and `aof` replicas' fsyncs; `ms` at most each.
    pub(crate) fn new(conn: Conn, replicas: u32, aof: Option<u32>, ms: u64) -> Self {
        Acknowledged {
            conn,
            replicas,
            aof,
            ms,
            counted: false,
        }
    }

    fn waits(&self) -> bool {
        self.replicas > 0 || self.aof.is_some()
    }

    /// Enough replicas (and fsyncs) acknowledged the last command's write (always, waiting
    /// for nothing).
    pub(crate) fn replicated(&self) -> bool {
        !self.waits() || self.counted
    }

    /// `cmd` and its waits.
    async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.counted = false;
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone());
        if self.replicas > 0 {
            pipe.cmd("WAIT").arg(self.replicas).arg(self.ms);
        }
        if let Some(aof) = self.aof {
            pipe.cmd("WAITAOF").arg(1).arg(aof).arg(self.ms);
        }
        let n = 1 + usize::from(self.replicas > 0) + usize::from(self.aof.is_some());
        let mut replies = self
            .conn
            .req_packed_commands(&pipe, 0, n)
            .await?
            .into_iter();
        let reply = replies.next().ok_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Parse, "a pipeline without replies"))
        })?;
        let reply = reply.extract_error()?;
        let mut counted = true;
        if self.replicas > 0 {
            let acks: i64 = redis::from_redis_value(next(&mut replies)?.extract_error()?)?;
            counted &= acks >= i64::from(self.replicas);
        }
        if let Some(aof) = self.aof {
            // `[fsynced locally (0 or 1), replicas that fsynced]`.
            let (local, replicas): (i64, i64) =
                redis::from_redis_value(next(&mut replies)?.extract_error()?)?;
            counted &= local >= 1 && replicas >= i64::from(aof);
        }
        self.counted = counted;
        Ok(reply)
    }
}

/// What an [`Acknowledged`] write fell short of, as the start of a sentence: "fewer than
/// wait_replicas=2 replicas acknowledged", "… or the master and wait_aof=1 replicas fsynced".
pub(crate) fn short_of(cfg: &RedisConfig) -> String {
    let mut wanted = Vec::new();
    if cfg.wait_replicas() > 0 {
        wanted.push(format!(
            "fewer than wait_replicas={} replicas acknowledged",
            cfg.wait_replicas()
        ));
    }
    if let Some(n) = cfg.wait_aof() {
        wanted.push(format!(
            "not both the master and wait_aof={n} replicas fsynced"
        ));
    }
    wanted.join(", or ")
}

/// The next reply of a pipeline.
fn next(replies: &mut impl Iterator<Item = Value>) -> RedisResult<Value> {
    replies.next().ok_or_else(|| {
        redis::RedisError::from((redis::ErrorKind::Parse, "a wait without its reply"))
    })
}

impl ConnectionLike for Acknowledged {
    fn req_packed_command<'b>(&'b mut self, cmd: &'b Cmd) -> RedisFuture<'b, Value> {
        if !self.waits() {
            return self.conn.req_packed_command(cmd);
        }
        Box::pin(self.send(cmd))
    }

    fn req_packed_commands<'b>(
        &'b mut self,
        pipeline: &'b Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'b, Vec<Value>> {
        // Nothing sends a pipeline through it (each script is one command): unacknowledged.
        self.counted = false;
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}
