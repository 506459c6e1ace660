//! Confirming that a session still owns its lock node, and how long a confirmation vouches for
//! the lock.
//!
//! In an ensemble two things can make a plain read lie about a session:
//! - **A follower answers reads from its own state**, which can lag a commit the leader has
//!   already made — such as the `closeSession` of this very session, whose ephemeral node the
//!   follower still lists. Found by the safety run: after a leader froze for 2.15 s, it expired a
//!   waiter's session at the thaw; the waiter's follower, not yet applied, still listed its node
//!   first, and two clients held the lock for 20 ms.
//! - **The leader expires sessions on what its followers told it**: a follower relays its
//!   sessions' activity to the leader only with its replies to the leader's pings (every half
//!   tick). A leader that stalls (a freeze, a GC pause) and resumes can expire at once a session
//!   its followers kept alive.
//!
//! So in an ensemble the reads a lease stands on — the listing that grants it, the `exists`
//! that confirms it — are each sent together with a `sync` (the server answers a session's
//! requests in order, so the read waits for the sync): the follower catches up with its leader,
//! which must be running to answer, and a `closeSession` the leader proposed before comes
//! first. And it vouches for half the session timeout, not all of it: the leader's idea
//! of the session can be older than the confirmation by up to a confirmation interval and half
//! a tick. A standalone server keeps its sessions and answers its reads itself: there a
//! confirmation is a plain read and vouches for the session timeout.
//!
//! One race is left (RELIABILITY.md): a `sync` sent just before a stalled leader resumes, and
//! handled by it before its pass over the sessions it thinks expired.

use std::future::Future;
use std::time::{Duration, Instant};

use lock_core::driver::drift;
use zookeeper_client::Client;

/// How long a confirmation vouches for a session, and how fast it must be answered to vouch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    pub(crate) session_timeout: Duration,
    /// The servers form an ensemble (`/zookeeper/config` lists members), or we could not tell.
    pub(crate) ensemble: bool,
}

/// What a confirmation found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Confirmation {
    /// The node is this session's: the lock is held until this instant.
    Until(Instant),
    /// The answer came too late to vouch for the session.
    Late,
    /// The node is gone, or is not this session's.
    Gone,
}

impl Pace {
    /// How long after a confirmation's start the lock is vouched for, drift taken off.
    ///
    /// In an ensemble the leader expires a session at the earliest one session timeout after
    /// the last activity a follower relayed to it, and a follower relays its sessions' activity
    /// only in its replies to the leader's pings, every half tick. So the leader may know of
    /// nothing newer than a confirmation interval `I` plus half a tick before a confirmation.
    /// With `I = V / 3` (the watchdog's pace) and a tick of at most half the session timeout
    /// (ZooKeeper's shortest session is two ticks), `V = session / 2` keeps
    /// `V + I + tick / 2 ≤ 0.92 × session`.
    pub(crate) fn vouches_for(&self) -> Duration {
        let st = self.session_timeout;
        let vouched = if self.ensemble { st / 2 } else { st };
        vouched.saturating_sub(drift(st))
    }

    /// Whether an answer to a request sent at `asked` came back promptly enough (within a third
    /// of the session timeout) to vouch for the session. A slower one may have waited out a
    /// stalled member that answers from the state it had before. A stall long enough for the
    /// leader to expire the session at its end (over `session − I − tick / 2`, 0.58 × the
    /// session at the least) is longer than that.
    pub(crate) fn prompt(&self, asked: Instant) -> bool {
        asked.elapsed() <= self.session_timeout / 3
    }

    /// `read`, and when it was asked; in an ensemble after a `sync`, the two sent together
    /// (the server answers a session's requests in order, so the read waits for the sync and
    /// sees at least what the leader had committed when it handled it). `read` must send its
    /// request when called, as `zookeeper-client`'s requests do.
    pub(crate) async fn fresh<T, F, Fut>(
        &self,
        client: &Client,
        path: &str,
        read: F,
    ) -> Result<(T, Instant), zookeeper_client::Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, zookeeper_client::Error>>,
    {
        let asked = Instant::now();
        let synced = self.ensemble.then(|| client.sync(path));
        let read = read();
        let value = match synced {
            Some(synced) => {
                let (synced, value) = tokio::join!(synced, read);
                synced?;
                value?
            }
            None => read.await?,
        };
        Ok((value, asked))
    }

    /// The children of `parent`, [`fresh`](Self::fresh): every listing of contenders is one
    /// of these, so none can miss a change committed before it was asked.
    pub(crate) async fn children(
        &self,
        client: &Client,
        parent: &str,
    ) -> Result<(Vec<String>, Instant), zookeeper_client::Error> {
        self.fresh(client, parent, || client.list_children(parent))
            .await
    }

    /// What a fresh answer asked at `asked` vouches for: until `asked` plus
    /// [`vouches_for`](Self::vouches_for) if it came back promptly.
    pub(crate) fn vouched(&self, asked: Instant) -> Option<Instant> {
        self.prompt(asked).then(|| asked + self.vouches_for())
    }

    /// Confirms that session `session` still owns the node at `path` (a [`fresh`](Self::fresh)
    /// stat).
    pub(crate) async fn confirm(
        &self,
        client: &Client,
        path: &str,
        session: i64,
    ) -> Result<Confirmation, zookeeper_client::Error> {
        let (stat, asked) = self.fresh(client, path, || client.check_stat(path)).await?;
        Ok(match stat {
            Some(s) if s.ephemeral_owner == session => match self.vouched(asked) {
                Some(t) => Confirmation::Until(t),
                None => Confirmation::Late,
            },
            _ => Confirmation::Gone,
        })
    }
}

/// How many times a turn that came with a late answer is asked again once the deadline has
/// passed (each ask takes at least a third of the session: a late answer is that slow).
pub(crate) const LATE_ASKS: u32 = 3;

/// What a contender does with a listing that says its turn has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnTurn {
    /// Granted, valid until this instant.
    Granted(Instant),
    /// The answer was too late to vouch for the session: ask again.
    AskAgain,
    /// Asked again [`LATE_ASKS`] times past the deadline, every answer late: the servers
    /// are too slow to vouch for a lease now.
    TooSlow,
}

/// The turn has come, and `vouched` is what its listing vouches for ([`Pace::vouched`]). An
/// answer too late to vouch is asked again, also past the deadline (up to [`LATE_ASKS`]
/// times, counted in `late_asks`): the deadline bounds the wait for other holders, and a free
/// lock reported held (`Ok(None)`) because the servers were slow would be a lie — a
/// `try_acquire` refused a free name this way under a starved ensemble (clean run of
/// `1725f45`). Still late after that: a retryable error, never a refusal.
pub(crate) fn on_turn(
    vouched: Option<Instant>,
    deadline_passed: bool,
    late_asks: &mut u32,
) -> OnTurn {
    match vouched {
        Some(until) => OnTurn::Granted(until),
        None if !deadline_passed => OnTurn::AskAgain,
        None if *late_asks < LATE_ASKS => {
            *late_asks += 1;
            OnTurn::AskAgain
        }
        None => OnTurn::TooSlow,
    }
}

/// Whether the servers behind `client` form an ensemble: `/zookeeper/config` lists the members
/// of a quorum and is empty on a standalone server. If it cannot be read, the answer is yes:
/// the ensemble's rules are the safe ones.
pub(crate) async fn is_ensemble(client: &Client) -> bool {
    match client.get_config().await {
        Ok((data, _)) => String::from_utf8_lossy(&data).contains("server."),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ensemble_vouches_for_less_than_a_standalone_server() {
        let st = Duration::from_secs(2);
        let alone = Pace {
            session_timeout: st,
            ensemble: false,
        };
        let ensemble = Pace {
            session_timeout: st,
            ensemble: true,
        };
        assert_eq!(alone.vouches_for(), st - drift(st));
        assert_eq!(ensemble.vouches_for(), st / 2 - drift(st));
        // The worst case of the argument: a tick of half the session timeout.
        let v = ensemble.vouches_for();
        assert!(v + v / 3 + st / 4 <= st * 92 / 100, "{v:?}");
        // A stall the leader expires the session over outlasts the prompt window.
        assert!(st / 3 < st - v / 3 - st / 4, "{v:?}");
    }

    #[test]
    fn a_late_turn_is_asked_again_past_the_deadline_then_an_error_never_a_refusal() {
        let until = Instant::now() + Duration::from_secs(1);
        let mut asks = 0;
        assert_eq!(
            on_turn(Some(until), true, &mut asks),
            OnTurn::Granted(until)
        );
        // Before the deadline a late answer is asked again without counting.
        for _ in 0..10 {
            assert_eq!(on_turn(None, false, &mut asks), OnTurn::AskAgain);
        }
        assert_eq!(asks, 0);
        // Past it (a `try_acquire`'s deadline has passed at once), LATE_ASKS more asks ...
        for _ in 0..LATE_ASKS {
            assert_eq!(on_turn(None, true, &mut asks), OnTurn::AskAgain);
        }
        // ... a prompt answer among them still grants ...
        assert_eq!(
            on_turn(Some(until), true, &mut asks),
            OnTurn::Granted(until)
        );
        // ... and after them the servers are too slow: an error, not a refusal.
        assert_eq!(on_turn(None, true, &mut asks), OnTurn::TooSlow);
    }
}
