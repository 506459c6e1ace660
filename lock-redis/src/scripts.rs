//! The mutex's Lua scripts and the key layout, shared with `lock-redlock` (renewals: the
//! crate's `renewals` module; shared holders and permits: its `family` module).
//!
//! Keys of one lock share a hash tag, so they live in one Redis Cluster slot:
//! `<prefix>{<name>}` holds the owner token with a PX expiry, `<prefix>{<name>}:fence` the
//! fencing counter (no expiry: a token must never repeat). Releases are announced on the
//! channel `<prefix>{<name>}:released`. Shared holders and permits keep their members in
//! `<prefix>{<name>}:holders` (see the crate's `family` module). In plain-key mode the lock is `<prefix><name>`, the
//! layout of redis-py, redsync and the redis.io recipe, and there is no counter.
//!
//! Owner tokens start with [`TOKEN_TAG`], so that a holder whose value lacks it is known to be
//! another client: one that announces no release.

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::LockName;
use redis::aio::ConnectionLike;

/// `SET lock token NX PX ttl`, then `INCR fence` (when there is a fence key) → `{1, token}`
/// (`{1, 0}` without); busy → `{0, pttl, holder's value}`. With a value key (an election's
/// candidate), the value `ARGV[3]` is set beside the lock with the same expiry, stamped with
/// the owner token (`<token> <value>`), and the change announced on `ARGV[4]`.
const ACQUIRE_LUA: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = 0
  if KEYS[2] then
    fence = redis.call('INCR', KEYS[2])
  end
  if KEYS[3] then
    redis.call('SET', KEYS[3], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2])
    redis.call('PUBLISH', ARGV[4], ARGV[1])
  end
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}
";

/// What every owner token distlock writes starts with.
pub const TOKEN_TAG: &str = "distlock-";

/// A fresh owner token: [`TOKEN_TAG`] and a random UUID.
pub fn new_token() -> String {
    // Written, not formatted: `format!` was a tenth of a cycle's client instructions.
    let mut uuid = uuid::Uuid::encode_buffer();
    joined(&[
        TOKEN_TAG,
        uuid::Uuid::new_v4().simple().encode_lower(&mut uuid),
    ])
}

/// `parts` end to end, in one allocation (what `format!` does for strings, at a tenth of its
/// instructions: the key names are made at every acquisition).
fn joined(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

/// Compare token, `DEL` (the value key too, if given: one `DEL` of both, a command less per
/// release than two), `PUBLISH` the token → 1; not the owner → 0. The token as payload lets a
/// client that hears one release from several masters (Redlock) count it once; the token is
/// worthless once its key is deleted.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', unpack(KEYS))
  redis.call('PUBLISH', ARGV[2], ARGV[1])
  return 1
end
return 0
";

/// Compare token, set the value key to `<token> <value>` with the lock's remaining expiry,
/// announce the change → 1; not the owner → 0.
const PROCLAIM_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then
    redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2], 'PX', left)
  else
    redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
  end
  redis.call('PUBLISH', ARGV[3], ARGV[1])
  return 1
end
return 0
";

/// The lock key's value and PTTL, the fence counter and the value key, in one atomic read.
const LEADER_LUA: &str = r"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]), redis.call('GET', KEYS[3])}
";

/// The Redis names of one lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockKeys {
    /// Holds the owner token.
    pub lock: String,
    /// The fencing counter.
    pub fence: String,
    /// Release announcements.
    pub channel: String,
    /// The members of a group of shared holders or permits.
    pub holders: String,
    /// An election's leader value, `<owner token> <value>`, beside the lock key.
    pub value: String,
    /// Announcements of a leader's grant and proclaimed values (releases go on `channel`).
    pub changed: String,
    /// Whether there is a fencing counter (not in plain-key mode).
    pub fenced: bool,
    /// Whether announcements go by sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`) rather than
    /// `PUBLISH`: on a Redis Cluster, where they then stay on the lock's shard. Its channels
    /// must share the lock key's slot: set it only where the lock key carries the hash tag.
    pub sharded: bool,
    name: LockName,
}

impl LockKeys {
    /// Keys for `name` under `prefix`.
    ///
    /// ```
    /// let k = lock_redis::raw::scripts::LockKeys::new("distlock:", &"jobs".parse()?);
    /// assert_eq!(k.lock, "distlock:{jobs}");
    /// assert_eq!(k.fence, "distlock:{jobs}:fence");
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn new(prefix: &str, name: &LockName) -> Self {
        Self::around(joined(&[prefix, "{", name.as_str(), "}"]), true, name)
    }

    /// Plain-key mode: the lock is `<prefix><name>`, without a fencing counter.
    ///
    /// ```
    /// let k = lock_redis::raw::scripts::LockKeys::plain("", &"jobs".parse()?);
    /// assert_eq!(k.lock, "jobs");
    /// assert_eq!(k.name().as_str(), "jobs");
    /// assert!(!k.fenced);
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn plain(prefix: &str, name: &LockName) -> Self {
        Self::around(joined(&[prefix, name.as_str()]), false, name)
    }

    /// The names derived from the lock key.
    fn around(lock: String, fenced: bool, name: &LockName) -> Self {
        LockKeys {
            fence: joined(&[&lock, ":fence"]),
            channel: joined(&[&lock, ":released"]),
            holders: joined(&[&lock, ":holders"]),
            value: joined(&[&lock, ":value"]),
            changed: joined(&[&lock, ":changed"]),
            lock,
            fenced,
            sharded: false,
            name: name.clone(),
        }
    }

    /// The same, announcing by sharded pub/sub if `sharded`.
    ///
    /// ```
    /// let k = lock_redis::raw::scripts::LockKeys::new("", &"jobs".parse()?).announced_by_shard(true);
    /// assert!(k.sharded);
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn announced_by_shard(self, sharded: bool) -> Self {
        LockKeys { sharded, ..self }
    }

    /// The lock's name (for errors).
    ///
    /// ```
    /// let k = lock_redis::raw::scripts::LockKeys::new("distlock:", &"jobs".parse()?);
    /// assert_eq!(k.name().as_str(), "jobs");
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn name(&self) -> LockName {
        self.name.clone()
    }
}

/// What the acquire script answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Granted, with the new value of the fencing counter.
    Granted {
        /// The fencing counter after `INCR`.
        fence: u64,
    },
    /// Held by someone else for about this long (`None`: no expiry reported).
    Busy {
        /// The holder's remaining PTTL.
        remaining: Option<Duration>,
        /// Whether the holder is another client than distlock (its value lacks
        /// [`TOKEN_TAG`]): no release message will come.
        foreign: bool,
        /// The holder's value (`None`: gone by the time it was read). Redlock needs it to tell a
        /// majority held by one owner from a split among several.
        holder: Option<String>,
    },
    /// The name's permit holders use another number of permits.
    Mismatch {
        /// Their number of permits.
        held: u32,
    },
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A Lua script and its SHA1 digest.
pub(crate) struct Lua {
    code: String,
    sha: String,
}

impl Lua {
    pub(crate) fn new(code: impl Into<String>) -> Self {
        let code = code.into();
        Lua {
            sha: redis::Script::new(&code).get_hash().to_string(),
            code,
        }
    }
}

/// A script that announces (a release, an election's change) in both forms: by `PUBLISH`,
/// and by `SPUBLISH` for keys whose announcements go by shard ([`LockKeys::sharded`]).
pub(crate) struct Announcing {
    classic: Lua,
    sharded: Lua,
}

impl Announcing {
    pub(crate) fn new(code: impl Into<String>) -> Self {
        let code = code.into();
        Announcing {
            sharded: Lua::new(code.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")),
            classic: Lua::new(code),
        }
    }

    /// The form for `keys`.
    pub(crate) fn for_keys(&self, keys: &LockKeys) -> &Lua {
        match keys.sharded {
            true => &self.sharded,
            false => &self.classic,
        }
    }
}

static ACQUIRE: LazyLock<Announcing> = LazyLock::new(|| Announcing::new(ACQUIRE_LUA));
static RELEASE: LazyLock<Announcing> = LazyLock::new(|| Announcing::new(RELEASE_LUA));
static PROCLAIM: LazyLock<Announcing> = LazyLock::new(|| Announcing::new(PROCLAIM_LUA));
static LEADER: LazyLock<Lua> = LazyLock::new(|| Lua::new(LEADER_LUA));

/// `EVALSHA`, and on `NOSCRIPT` (a server restarted, failed over, or `SCRIPT FLUSH`ed) the
/// script itself by `EVAL`, which also caches it: one extra round trip for the first call
/// after the cache was emptied, never the two of `SCRIPT LOAD` + `EVALSHA` — on a slow link
/// those made every Redlock master miss its per-node timeout. Not `EVAL` every time: the server
/// would hash the body on every call, which cost 16 % of the single-node throughput.
pub(crate) async fn run<T: redis::FromRedisValue, C: ConnectionLike + Send, A>(
    conn: &mut C,
    lua: &Lua,
    keys: &[&str],
    args: &[A],
) -> redis::RedisResult<T>
where
    A: redis::ToRedisArgs + Sync,
{
    let cmd = |verb: &str, body: &str| {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    };
    match cmd("EVALSHA", &lua.sha).query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            cmd("EVAL", &lua.code).query_async(conn).await
        }
        r => r,
    }
}

/// Runs the acquire script; with `value` (fenced keys only: an election needs a term), the
/// holder's value is set beside the lock.
pub async fn acquire<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
    value: Option<&[u8]>,
) -> redis::RedisResult<Acquired> {
    let ttl = ms(ttl).to_string();
    let all = [keys.lock.as_str(), keys.fence.as_str(), keys.value.as_str()];
    let n = match (keys.fenced, value) {
        (true, Some(_)) => 3,
        (true, None) => 2,
        (false, _) => 1,
    };
    let mut cmd_args: Vec<&[u8]> = vec![token.as_bytes(), ttl.as_bytes()];
    if let (3, Some(v)) = (n, value) {
        cmd_args.extend([v, keys.changed.as_bytes()]);
    }
    let reply: Vec<redis::Value> = run(conn, ACQUIRE.for_keys(keys), &all[..n], &cmd_args).await?;
    let holder = field::<String>(&reply, 2);
    Ok(match (field::<i64>(&reply, 0), field::<i64>(&reply, 1)) {
        (Some(1), fence) => Acquired::Granted {
            fence: fence.and_then(|f| u64::try_from(f).ok()).unwrap_or(0),
        },
        (_, pttl) => busy(pttl.unwrap_or(-2), holder),
    })
}

/// Field `i` of a script's reply, if it is there and reads as a `T`.
pub(crate) fn field<T: redis::FromRedisValue>(reply: &[redis::Value], i: usize) -> Option<T> {
    reply
        .get(i)
        .and_then(|v| redis::from_redis_value_ref::<T>(v).ok())
}

/// A refusal: the holder's PTTL (-1: no expiry; -2: gone) and value.
pub(crate) fn busy(pttl: i64, holder: Option<String>) -> Acquired {
    // Read after the refusal, so the key may have expired in between: then nobody holds it.
    let holder = holder.filter(|_| pttl != -2);
    Acquired::Busy {
        remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        foreign: holder.as_ref().is_some_and(|h| !h.starts_with(TOKEN_TAG)),
        holder,
    }
}

/// Like [`acquire`] without the fencing counter: `Granted { fence: 0 }` when granted.
///
/// Plain `SET lock token NX PX ttl` pipelined with `GET lock` and `PTTL lock` (one round
/// trip, no script): the cheapest grant Redis offers, which matters when every lock touches N
/// masters (Redlock). The `GET` and `PTTL` only inform a loser who holds the key and how long a
/// waiter sleeps at most, so they need not be atomic with the `SET`. (`SET … NX GET` would
/// need Redis 7.)
pub async fn acquire_unfenced<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
) -> redis::RedisResult<Acquired> {
    let (set, holder, pttl): (Option<String>, Option<String>, i64) = redis::pipe()
        .cmd("SET")
        .arg(&keys.lock)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ms(ttl))
        .cmd("GET")
        .arg(&keys.lock)
        .cmd("PTTL")
        .arg(&keys.lock)
        .query_async(conn)
        .await?;
    Ok(if set.is_some() {
        Acquired::Granted { fence: 0 }
    } else {
        busy(pttl, holder)
    })
}

/// Runs the release script; `true` when this token held the lock and it is now deleted (with
/// its value key, where the keys are fenced: a leader's value goes with its lock).
pub async fn release<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    token: &str,
) -> redis::RedisResult<bool> {
    let both = [keys.lock.as_str(), keys.value.as_str()];
    let ks = if keys.fenced { &both[..] } else { &both[..1] };
    let n: i64 = run(conn, RELEASE.for_keys(keys), ks, &[token, &keys.channel]).await?;
    Ok(n == 1)
}

/// Runs the proclaim script; `true` when this token still held the lock and its value is set.
pub async fn proclaim<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    token: &str,
    value: &[u8],
) -> redis::RedisResult<bool> {
    let ks = [keys.lock.as_str(), keys.value.as_str()];
    let args: [&[u8]; 3] = [token.as_bytes(), value, keys.changed.as_bytes()];
    let n: i64 = run(conn, PROCLAIM.for_keys(keys), &ks, &args).await?;
    Ok(n == 1)
}

/// What the leader read found: the lock key's value and PTTL, the fence counter, the value key.
pub(crate) type LeaderRead = (Option<String>, i64, Option<u64>, Option<Vec<u8>>);

/// Runs the leader read.
pub(crate) async fn read_leader<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
) -> redis::RedisResult<LeaderRead> {
    let ks = [keys.lock.as_str(), keys.fence.as_str(), keys.value.as_str()];
    let reply: Vec<redis::Value> = run::<_, _, &str>(conn, &LEADER, &ks, &[]).await?;
    Ok((
        field::<String>(&reply, 0),
        field::<i64>(&reply, 1).unwrap_or(-2),
        field::<u64>(&reply, 2),
        field::<Vec<u8>>(&reply, 3),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each announcing script's sharded form announces by `SPUBLISH` only and its classic form
    /// by `PUBLISH` only, and the keys pick the form they say.
    #[test]
    fn announcing_scripts_have_a_sharded_form() {
        let family = &*crate::family::RELEASE;
        for (what, a) in [
            ("acquire", &*ACQUIRE),
            ("release", &*RELEASE),
            ("proclaim", &*PROCLAIM),
            ("family release", family),
        ] {
            assert!(a.classic.code.contains("redis.call('PUBLISH'"), "{what}");
            assert!(!a.classic.code.contains("SPUBLISH"), "{what}");
            assert!(a.sharded.code.contains("redis.call('SPUBLISH'"), "{what}");
            assert!(!a.sharded.code.contains("'PUBLISH'"), "{what}");
            assert_ne!(a.classic.sha, a.sharded.sha, "{what}");
        }
        let name: LockName = "jobs".parse().unwrap_or_else(|e| panic!("{e}"));
        let keys = LockKeys::new("", &name);
        assert!(std::ptr::eq(RELEASE.for_keys(&keys), &RELEASE.classic));
        let keys = keys.announced_by_shard(true);
        assert!(std::ptr::eq(RELEASE.for_keys(&keys), &RELEASE.sharded));
    }

    /// The keys and tokens are written piece by piece: every one is still exactly what the
    /// format of the key layout (docs, interop with redis-py and the CLI) says.
    #[test]
    fn keys_and_tokens_keep_their_layout() {
        let name: LockName = "tenant-42:jobs@x+y=z"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        let k = LockKeys::new("app:", &name);
        let lock = format!("app:{{{name}}}");
        assert_eq!(k.lock, lock);
        for (got, suffix) in [
            (&k.fence, "fence"),
            (&k.channel, "released"),
            (&k.holders, "holders"),
            (&k.value, "value"),
            (&k.changed, "changed"),
        ] {
            assert_eq!(*got, format!("{lock}:{suffix}"));
        }
        let plain = LockKeys::plain("app:", &name);
        assert_eq!(plain.lock, format!("app:{name}"));
        assert_eq!(plain.channel, format!("app:{name}:released"));
        let token = new_token();
        assert!(token.starts_with(TOKEN_TAG), "{token}");
        let hex = &token[TOKEN_TAG.len()..];
        assert!(
            hex.len() == 32
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{token}"
        );
        assert_ne!(new_token(), token);
    }
}
