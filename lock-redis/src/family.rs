//! Shared holders and permits on Redis: a *group* of holders of one mode in the lock's own key.
//!
//! A group takes the lock key itself (`<prefix>{<name>}`), with the value
//! `distlock-group:<mode>` (`s`, or `p<K>`) and an expiry that is never shorter than its
//! longest-lived member's, so an exclusive `SET … NX` — distlock's, or any other client's on the
//! same key — is refused while a group holds, without a change to the mutex's script. The
//! members are `<fence>:<token>` in the sorted set `<prefix>{<name>}:holders`, each scored by
//! its expiry in the server's milliseconds (`TIME`, the clock the key's `PX` uses); a member
//! whose score has passed is gone, and the scripts drop such members before they count.
//! Every grant takes the next value of the fence counter, so tokens increase across modes.
//!
//! Redis does not queue waiters: a request takes the lock when it is free at its attempt, so a
//! stream of readers can keep a writer waiting (`Capabilities::fifo` is false).

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::Mode;
use redis::aio::ConnectionLike;

use crate::scripts::{field, ms, run, Acquired, Announcing, LockKeys, Lua, TOKEN_TAG};

/// What a group's lock value starts with (it starts with [`TOKEN_TAG`] too: a waiter then knows
/// a release message will come).
pub const GROUP_TAG: &str = "distlock-group:";

/// The lock value of a group of `mode` ([`Mode::code`]); `None` for the exclusive mode, which
/// is no group.
pub fn group_value(mode: Mode) -> Option<String> {
    (mode != Mode::Exclusive).then(|| format!("{GROUP_TAG}{}", mode.code()))
}

/// The mode of a group's lock value; `None` for any other value.
pub fn group_mode(value: &str) -> Option<Mode> {
    Mode::from_code(value.strip_prefix(GROUP_TAG)?).filter(|m| *m != Mode::Exclusive)
}

/// A member of the holders' set: `<fence>:<token>`.
pub fn member(fence: u64, token: &str) -> String {
    format!("{fence}:{token}")
}

/// The fence of a member (`None` for anything else).
pub fn member_fence(member: &str) -> Option<u64> {
    let (fence, token) = member.split_once(':')?;
    token.starts_with(TOKEN_TAG).then_some(())?;
    fence.parse().ok()
}

/// The server's time in ms, and the drop of expired members, as every script starts; and
/// `extend`, which keeps the lock key and the set alive at least as long as a member.
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local function extend(ttl)
  for _, key in ipairs({KEYS[1], KEYS[3]}) do
    if redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, ttl)
    end
  end
end
";

/// Keys: lock, fence, holders. Args: token, ttl ms, group value, K (0: shared).
/// → `{1, fence}` granted; `{0, ms, value}` busy (the time until a member or the holder may
/// go); `{2, K held}` the group uses another number of permits.
const ACQUIRE_LUA: &str = r"
local ttl, k = tonumber(ARGV[2]), tonumber(ARGV[4])
local held = redis.call('GET', KEYS[1])
local n = redis.call('ZCARD', KEYS[3])
if not held then
  -- Members without the key: it was deleted under them. They are not holders any more.
  if n > 0 then
    redis.call('DEL', KEYS[3])
    n = 0
  end
elseif string.sub(held, 1, string.len(ARGV[5])) ~= ARGV[5] or n > 0 and held ~= ARGV[3] then
  local permits = ARGV[5] .. 'p'
  if k > 0 and n > 0 and string.sub(held, 1, string.len(permits)) == permits then
    return {2, tonumber(string.sub(held, string.len(permits) + 1))}
  end
  return {0, redis.call('PTTL', KEYS[1]), held}
elseif k > 0 and n >= k then
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  return {0, math.max(tonumber(first[2]) - now, 1), held}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[3], now + ttl, fence .. ':' .. ARGV[1])
if n == 0 then
  -- A new group: the key and the set live exactly as long as their only member.
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
else
  extend(ttl)
end
return {1, fence}
";

/// Keys: lock, fence (unused), holders. Args: member (or `:<token>` to find it by its token),
/// channel, group value. Removes the member, ends the group with its last member, and announces
/// the release. → 1 released; 0 not a holder.
const RELEASE_LUA: &str = r"
local m = ARGV[1]
if string.sub(m, 1, 1) == ':' then
  m = nil
  for _, v in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    if string.sub(v, -string.len(ARGV[1])) == ARGV[1] then m = v end
  end
  if not m then return 0 end
end
if redis.call('GET', KEYS[1]) ~= ARGV[3] or redis.call('ZREM', KEYS[3], m) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[3])
end
redis.call('PUBLISH', ARGV[2], m)
return 1
";

/// Keys: lock, fence, holders. → `{pttl, value or false, fence or false, member, ms left, …}`:
/// the lock key and, for a group, its members that have not expired, oldest grant first.
const LIST_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1]), false}
if #KEYS < 3 then return out end
out[3] = redis.call('GET', KEYS[2])
local all = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local left = tonumber(all[i + 1]) - now
  if left > 0 then
    table.insert(out, all[i])
    table.insert(out, left)
  end
end
return out
";

static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(format!("{PRELUDE}{ACQUIRE_LUA}")));
pub(crate) static RELEASE: LazyLock<Announcing> =
    LazyLock::new(|| Announcing::new(format!("{PRELUDE}{RELEASE_LUA}")));
static LIST: LazyLock<Lua> = LazyLock::new(|| Lua::new(LIST_LUA));

fn keys3(keys: &LockKeys) -> [&str; 3] {
    [&keys.lock, &keys.fence, &keys.holders]
}

/// Joins (or starts) the group of `mode` (shared or permits).
pub async fn acquire<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
    mode: Mode,
) -> redis::RedisResult<Acquired> {
    let group = group_value(mode).unwrap_or_default();
    let k = mode.limit().unwrap_or(0).to_string();
    let ttl = ms(ttl).to_string();
    let reply: Vec<redis::Value> = run(
        conn,
        &ACQUIRE,
        &keys3(keys),
        &[token, &ttl, &group, &k, GROUP_TAG],
    )
    .await?;
    let held = field::<String>(&reply, 2);
    Ok(match (field::<i64>(&reply, 0), field::<i64>(&reply, 1)) {
        (Some(1), Some(fence)) => Acquired::Granted {
            fence: u64::try_from(fence).unwrap_or(0),
        },
        (Some(2), Some(theirs)) => Acquired::Mismatch {
            held: u32::try_from(theirs).unwrap_or(u32::MAX),
        },
        (_, pttl) => crate::scripts::busy(pttl.unwrap_or(-2), held),
    })
}

/// Releases `member` (or, for `Undo`, the member of `token` whatever its fence) of the group of
/// `mode`; `true` when it held.
pub async fn release<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    held: &Held<'_>,
    mode: Mode,
) -> redis::RedisResult<bool> {
    let group = group_value(mode).unwrap_or_default();
    let m = match held {
        Held::Member(m) => (*m).to_string(),
        Held::Token(t) => format!(":{t}"),
    };
    let n: i64 = run(
        conn,
        RELEASE.for_keys(keys),
        &keys3(keys),
        &[&m, &keys.channel, &group],
    )
    .await?;
    Ok(n == 1)
}

/// What holds a lock now, read in one script: the lock key's value and remaining time, the
/// fence counter, and a group's live members.
#[derive(Debug, Default)]
pub struct Listing {
    /// The lock key's remaining time: -2 no key, -1 no expiry.
    pub pttl: i64,
    /// The lock key's value.
    pub value: Option<String>,
    /// The fence counter (the last token handed out).
    pub fence: Option<u64>,
    /// A group's members that have not expired, with their time left, oldest grant first.
    pub members: Vec<(String, Duration)>,
}

/// Reads what holds the lock of `keys`.
pub async fn list<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
) -> redis::RedisResult<Listing> {
    // Plain keys have neither counter nor group: their lock key alone (on a cluster the
    // others' names, without a hash tag, would be in other slots).
    let all = keys3(keys);
    let ks = if keys.fenced { &all[..] } else { &all[..1] };
    let reply: Vec<redis::Value> = run::<_, _, &str>(conn, &LIST, ks, &[]).await?;
    let text = |i: usize| field::<String>(&reply, i);
    let int = |i: usize| field::<i64>(&reply, i);
    let mut members: Vec<(String, Duration)> = (3..reply.len())
        .step_by(2)
        .filter_map(|i| {
            let left = u64::try_from(int(i + 1)?).ok()?;
            Some((text(i)?, Duration::from_millis(left)))
        })
        .collect();
    members.sort_by_key(|(m, _)| member_fence(m));
    Ok(Listing {
        pttl: int(0).unwrap_or(-2),
        value: text(1),
        fence: int(2).and_then(|f| u64::try_from(f).ok()),
        members,
    })
}

/// Which member a release names.
pub enum Held<'a> {
    /// The member a grant made (`<fence>:<token>`).
    Member(&'a str),
    /// The member of this token, whose grant's reply never came.
    Token(&'a str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_values_round_trip() {
        for mode in [Mode::Shared, Mode::Permits(1), Mode::Permits(40)] {
            let v = group_value(mode).unwrap_or_default();
            assert!(v.starts_with(TOKEN_TAG));
            assert_eq!(group_mode(&v), Some(mode));
        }
        assert_eq!(group_value(Mode::Exclusive), None);
        for other in [
            "distlock-abc",
            "distlock-group:",
            "distlock-group:px",
            "distlock-group:x",
            "x",
        ] {
            assert_eq!(group_mode(other), None, "{other}");
        }
    }

    #[test]
    fn members_carry_their_fence() {
        let m = member(17, "distlock-abc");
        assert_eq!(member_fence(&m), Some(17));
        assert_eq!(member_fence("17:someone-else"), None);
        assert_eq!(member_fence("x:distlock-abc"), None);
    }
}
