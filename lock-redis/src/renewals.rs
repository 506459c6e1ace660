//! Renewals shared by a client's leases on one server (standalone, or the master behind
//! sentinels): a lease whose watchdog renews sends one script that renews it and, in the same
//! request, every other lease of the client that a watchdog renews, has used at least half of
//! its renewal period (a sixth of its TTL) and has a third of its TTL left; each owner-checked,
//! as its own renewal would be. Their watchdogs find that confirmation when their turn comes
//! ([`LeaseOps::renew_due`](lock_core::driver::LeaseOps::renew_due)) and send nothing, so N
//! leases of one TTL cost about two requests per renewal period (a third of the TTL), not N.
//!
//! Never renewed on another's behalf: a lease renewed by hand (`Renewal::Manual`), one past its
//! `max_hold`, one whose release has begun, and one the server refused; each of those ends as it
//! would alone. On a Redis Cluster, whose scripts take the keys of one slot only, each lease
//! renews alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use lock_core::Mode;
use parking_lot::Mutex;
use redis::aio::ConnectionLike;

use crate::family::group_value;
use crate::scripts::{ms, run, LockKeys, Lua};

/// Renews one lease or many in one request (`renew`), each as its own renewal would: per
/// lease in `ARGV`, its kind (`x` exclusive, `v` exclusive with an election's value key, `g` a
/// group's member), its token or member, its TTL in ms and its group's value (`''` but for
/// `g`); in `KEYS`, its lock key, then the value key (`v`) or the holders' set (`g`). An
/// exclusive holder: compare token, `PEXPIRE` (the value key too). A group's member: drop the
/// expired members, check the group and the member, re-score the member, keep the key and the
/// set alive at least as long (the `family` scripts' `extend`). → per lease 1 renewed; 0 not
/// the owner (expired, released, deleted: never recreated).
const RENEW_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out, k = {}, 1
for a = 1, #ARGV, 4 do
  local kind, tok, ttl = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local lock, second, r = KEYS[k], KEYS[k + 1], 0
  if kind == 'x' then k = k + 1 else k = k + 2 end
  if kind == 'g' then
    redis.call('ZREMRANGEBYSCORE', second, '-inf', now)
    if redis.call('GET', lock) == ARGV[a + 3] and redis.call('ZSCORE', second, tok) then
      redis.call('ZADD', second, 'XX', now + ttl, tok)
      for _, key in ipairs({lock, second}) do
        if redis.call('PTTL', key) < ttl then
          redis.call('PEXPIRE', key, ttl)
        end
      end
      r = 1
    end
  elseif redis.call('GET', lock) == tok then
    if kind == 'v' then
      redis.call('PEXPIRE', second, ttl)
    end
    r = redis.call('PEXPIRE', lock, ttl)
  end
  out[#out + 1] = r
end
return out
";

static RENEW: LazyLock<Lua> = LazyLock::new(|| Lua::new(RENEW_LUA));

/// One lease to [`renew`]: its keys, its owner token (exclusive) or group member
/// (`<fence>:<token>`), its mode, its TTL, and whether an election's value key is renewed with
/// the lock.
#[derive(Clone, Copy, Debug)]
pub struct Renewing<'a> {
    /// The lock's keys.
    pub keys: &'a LockKeys,
    /// The owner token, or the group member.
    pub token: &'a str,
    /// The lease's mode.
    pub mode: Mode,
    /// The TTL the renewal sets.
    pub ttl: Duration,
    /// Granted with an election's value: the value key is renewed with the lock.
    pub valued: bool,
}

/// Runs the renew script for `leases` (one request, all on one server: on a Redis Cluster,
/// leases of one slot only); per lease, `true` when it was still held and its TTL is reset.
///
/// ```no_run
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
/// use std::time::Duration;
/// use lock_redis::lock_core::Mode;
/// use lock_redis::raw::{renewals::{renew, Renewing}, scripts::LockKeys};
///
/// let (a, b) = (LockKeys::new("distlock:", &"a".parse().unwrap()), LockKeys::new("distlock:", &"b".parse().unwrap()));
/// let ttl = Duration::from_secs(30);
/// let leases = [
///     Renewing { keys: &a, token: "distlock-…", mode: Mode::Exclusive, ttl, valued: false },
///     Renewing { keys: &b, token: "7:distlock-…", mode: Mode::Shared, ttl, valued: false },
/// ];
/// let held: Vec<bool> = renew(conn, &leases).await?;
/// # Ok(()) }
/// ```
pub async fn renew<C: ConnectionLike + Send>(
    conn: &mut C,
    leases: &[Renewing<'_>],
) -> redis::RedisResult<Vec<bool>> {
    let mut keys = Vec::with_capacity(leases.len() * 2);
    let mut args = Vec::with_capacity(leases.len() * 4);
    for l in leases {
        keys.push(l.keys.lock.as_str());
        let (kind, group) = match (l.mode, l.valued) {
            (Mode::Exclusive, false) => ("x", String::new()),
            (Mode::Exclusive, true) => {
                keys.push(l.keys.value.as_str());
                ("v", String::new())
            }
            (mode, _) => {
                keys.push(l.keys.holders.as_str());
                ("g", group_value(mode).unwrap_or_default())
            }
        };
        args.extend([
            kind.to_owned(),
            l.token.to_owned(),
            ms(l.ttl).to_string(),
            group,
        ]);
    }
    let n: Vec<i64> = run(conn, &RENEW, &keys, &args).await?;
    if n.len() != leases.len() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "the renew script answered for another number of leases",
        )));
    }
    Ok(n.into_iter().map(|r| r == 1).collect())
}

/// The most leases one request renews: the script runs on the server's only thread, so a
/// batch stays well under a millisecond there (the overdue first when there are more).
pub(crate) const MAX_BATCH: usize = 256;

/// The leases of one node that renew together.
#[derive(Default)]
pub(crate) struct Renewals {
    book: Mutex<HashMap<u64, Entry>>,
    ids: AtomicU64,
    /// One request at a time: a lease that asks while one is under way waits for it, and then
    /// finds whether it was in it.
    pub(crate) sending: tokio::sync::Mutex<()>,
}

/// What a lease renews: its keys, token (or member), mode, TTL and value key.
#[derive(Clone)]
pub(crate) struct Renewable {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) token: Arc<str>,
    pub(crate) mode: Mode,
    pub(crate) ttl: Duration,
    pub(crate) valued: bool,
}

impl Renewable {
    pub(crate) fn renewing(&self) -> Renewing<'_> {
        Renewing {
            keys: &self.keys,
            token: &self.token,
            mode: self.mode,
            ttl: self.ttl,
            valued: self.valued,
        }
    }
}

/// A lease in the book.
struct Entry {
    what: Renewable,
    /// Renewed on others' behalf while `now` is before this (`None`: no end); renewed by hand:
    /// not at all.
    ahead: Option<Option<Instant>>,
    /// When the latest request that renewed it was sent, and the node's switches then.
    confirmed: (Instant, u64),
    /// The server said it is not the owner any more.
    refused: bool,
}

impl Entry {
    /// Whether a request sent at `now` renews it on another lease's behalf.
    fn due_ahead(&self, now: Instant) -> bool {
        let Some(until) = self.ahead else {
            return false;
        };
        let age = now.saturating_duration_since(self.confirmed.0);
        !self.refused
            && until.map_or(true, |u| now < u)
            && age >= self.what.ttl / 6
            && age + self.what.ttl / 3 < self.what.ttl
    }
}

/// What a lease found in the book before asking the server.
pub(crate) enum Found {
    /// Confirmed at this instant (sent then) on the same server, recently enough.
    Confirmed(Instant),
    /// Refused by the server.
    Refused,
    /// Nothing to use: ask.
    Ask,
}

/// A lease's place in the book; leaves it when dropped.
pub(crate) struct Enrolled {
    id: u64,
    renewals: Arc<Renewals>,
}

impl Renewals {
    /// Enrols a lease granted by a request sent at `sent` (the node's switches then). `ahead`:
    /// renewed by a watchdog, until `stop_at` (`max_hold`) if any.
    pub(crate) fn enrol(
        self: &Arc<Self>,
        what: Renewable,
        ahead: Option<Option<Instant>>,
        sent: (Instant, u64),
    ) -> Enrolled {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            what,
            ahead,
            confirmed: sent,
            refused: false,
        };
        self.book.lock().insert(id, entry);
        Enrolled {
            id,
            renewals: self.clone(),
        }
    }
}

impl Enrolled {
    /// What the book says of this lease for a watchdog's renewal (`due`) or one by hand, with
    /// the node at `switches`: for the watchdog, a confirmation sent within the last quarter of
    /// the TTL on the same server (one on its behalf came at least half a renewal period after
    /// the one it knows; a quarter leaves room for a late timer); by hand, always ask.
    pub(crate) fn found(&self, due: bool, switches: u64) -> Found {
        let book = self.renewals.book.lock();
        let Some(e) = book.get(&self.id) else {
            return Found::Ask;
        };
        if e.refused {
            return Found::Refused;
        }
        let (sent, at) = e.confirmed;
        if due && at == switches && sent.elapsed() < e.what.ttl / 4 {
            return Found::Confirmed(sent);
        }
        Found::Ask
    }

    /// This lease (`me`) first, then those a request sent at `now` renews on its behalf, the
    /// most overdue first, [`MAX_BATCH`] at most: ids and what to renew.
    pub(crate) fn batch(&self, me: &Renewable, now: Instant) -> Vec<(u64, Renewable)> {
        let book = self.renewals.book.lock();
        let mut others: Vec<(&u64, &Entry)> = book
            .iter()
            .filter(|(id, e)| **id != self.id && e.due_ahead(now))
            .collect();
        others.sort_by_key(|(_, e)| e.confirmed.0);
        std::iter::once((self.id, me.clone()))
            .chain(
                others
                    .into_iter()
                    .take(MAX_BATCH - 1)
                    .map(|(id, e)| (*id, e.what.clone())),
            )
            .collect()
    }

    /// Records the answers of the server a request was sent to at `sent` (switches then):
    /// renewed, or refused. `acknowledged`: with the replicas' acknowledgements asked for
    /// (`wait_replicas`); otherwise only the refusals count.
    pub(crate) fn record(
        &self,
        ids: &[u64],
        renewed: &[bool],
        sent: (Instant, u64),
        acknowledged: bool,
    ) {
        let mut book = self.renewals.book.lock();
        for (id, ok) in ids.iter().zip(renewed) {
            if let Some(e) = book.get_mut(id) {
                if !ok {
                    e.refused = true;
                } else if acknowledged && e.confirmed.0 < sent.0 {
                    e.confirmed = sent;
                }
            }
        }
    }

    /// The lease's release begins: it is renewed on nobody's behalf from here.
    pub(crate) fn leave(&self) {
        self.renewals.book.lock().remove(&self.id);
    }

    /// The book this lease is in.
    pub(crate) fn renewals(&self) -> &Renewals {
        &self.renewals
    }
}

impl Drop for Enrolled {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what(ttl_ms: u64) -> Renewable {
        Renewable {
            keys: Arc::new(LockKeys::new("t:", &"n".parse().unwrap())),
            token: "distlock-x".into(),
            mode: Mode::Exclusive,
            ttl: Duration::from_millis(ttl_ms),
            valued: false,
        }
    }

    fn ids(b: &[(u64, Renewable)]) -> Vec<u64> {
        b.iter().map(|(id, _)| *id).collect()
    }

    #[test]
    fn a_batch_takes_the_asker_and_the_leases_past_half_their_period_with_a_third_left() {
        let r = Arc::new(Renewals::default());
        let now = Instant::now();
        let at = |ms: u64| (now - Duration::from_millis(ms), 0);
        let me = r.enrol(what(600), Some(None), at(0));
        let young = r.enrol(what(600), Some(None), at(50)); // under a sixth: not yet
        let half = r.enrol(what(600), Some(None), at(150)); // past a sixth
        let old = r.enrol(what(600), Some(None), at(450)); // past two thirds: left to itself
        let by_hand = r.enrol(what(600), None, at(200));
        let stopped = r.enrol(what(600), Some(Some(now)), at(200)); // past max_hold
        let running = r.enrol(what(600), Some(Some(now + Duration::from_secs(1))), at(250));
        let b = me.batch(&what(600), now);
        assert_eq!(ids(&b), vec![me.id, running.id, half.id]);
        // Refused and released leases are renewed on nobody's behalf.
        half.record(&[half.id], &[false], at(0), true);
        running.leave();
        assert_eq!(ids(&me.batch(&what(600), now)), vec![me.id]);
        assert!(matches!(half.found(true, 0), Found::Refused));
        drop((young, old, by_hand, stopped));
        assert_eq!(r.book.lock().len(), 2);
    }

    #[test]
    fn a_confirmation_counts_for_the_watchdog_only_when_recent_and_on_the_same_server() {
        let r = Arc::new(Renewals::default());
        let now = Instant::now();
        let e = r.enrol(what(600), Some(None), (now - Duration::from_millis(300), 0));
        assert!(matches!(e.found(true, 0), Found::Ask));
        let sent = Instant::now();
        e.record(&[e.id], &[true], (sent, 0), true);
        assert!(matches!(e.found(true, 0), Found::Confirmed(s) if s == sent));
        assert!(
            matches!(e.found(false, 0), Found::Ask),
            "by hand: always asks"
        );
        assert!(
            matches!(e.found(true, 1), Found::Ask),
            "after a failover: asks"
        );
        // An answer short of its replicas' acknowledgements confirms nothing; an older one
        // never replaces a newer.
        e.record(
            &[e.id],
            &[true],
            (sent + Duration::from_millis(1), 0),
            false,
        );
        e.record(&[e.id], &[true], (sent - Duration::from_millis(1), 0), true);
        assert!(matches!(e.found(true, 0), Found::Confirmed(s) if s == sent));
    }

    #[test]
    fn a_batch_is_bounded_and_takes_the_most_overdue() {
        let r = Arc::new(Renewals::default());
        let now = Instant::now();
        let me = r.enrol(what(6000), Some(None), (now, 0));
        let many: Vec<_> = (0..MAX_BATCH as u64 + 10)
            .map(|i| {
                r.enrol(
                    what(6000),
                    Some(None),
                    (now - Duration::from_millis(1000 + i), 0),
                )
            })
            .collect();
        let b = me.batch(&what(6000), now);
        assert_eq!(b.len(), MAX_BATCH);
        assert_eq!(b[1].0, many.last().map(|e| e.id).unwrap_or_default());
    }
}
