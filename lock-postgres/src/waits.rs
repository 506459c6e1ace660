//! Turns to wait (`shared_waits`): a client sends at most one waiting request per name to the
//! server, so its waiters cost one session per name waited on, not one each. The others of
//! that name queue here, in the order they came (`tokio::sync::Mutex` is fair), and each goes
//! to the server once the one before it was granted or gave up.

use std::collections::HashMap;
use std::sync::Arc;

use lock_core::driver::Acquisition;
use lock_core::Deadline;
use parking_lot::Mutex;
use tokio::sync::OwnedMutexGuard;

use crate::keys::advisory_key;

type Gate = Arc<tokio::sync::Mutex<()>>;

/// The gate of each name some waiter of this client is waiting on, by advisory key; a gate
/// nobody holds or waits for is removed.
#[derive(Default)]
pub(crate) struct Turns {
    gates: Arc<Mutex<HashMap<i64, Gate>>>,
    on: bool,
}

/// A waiter's place for one name: held while it waits on the server, given up (dropped) once
/// it was granted, gave up or failed. Empty where nobody takes turns. The guard drops before
/// the ticket (a tuple drops in order), so the ticket sees whether anyone else has the gate.
pub(crate) struct Turn {
    _held: Option<(OwnedMutexGuard<()>, Ticket)>,
}

impl Turns {
    /// Turns taken only if `on` (`shared_waits`).
    pub(crate) fn new(on: bool) -> Self {
        Turns {
            on,
            ..Turns::default()
        }
    }

    /// The turn `req` needs before it may wait on the server: an empty one where turns are off
    /// or `req` does not wait; `None` if its deadline passed in the queue.
    pub(crate) async fn wait(&self, req: &Acquisition<'_>) -> Option<Turn> {
        let deadline = req.deadline();
        if !self.on || matches!(deadline, Deadline::Now) || deadline.passed() {
            return Some(Turn { _held: None });
        }
        match self.take(advisory_key(req.name())) {
            Ok(turn) => Some(turn),
            Err(queued) => {
                // Another waiter of this client is ahead: waiting, as far as the caller goes.
                req.queued();
                match deadline.at() {
                    Some(at) => tokio::time::timeout_at(at.into(), queued.turn()).await.ok(),
                    None => Some(queued.turn().await),
                }
            }
        }
    }

    /// The turn to wait for `key`: at once if no other waiter of this client has it (`Ok`),
    /// else a place in the queue (`Err`), to be awaited with [`Queued::turn`].
    pub(crate) fn take(&self, key: i64) -> Result<Turn, Queued> {
        let ticket = Ticket::new(self.gates.clone(), key);
        match ticket.gate().try_lock_owned() {
            Ok(guard) => Ok(Turn {
                _held: Some((guard, ticket)),
            }),
            Err(_) => Err(Queued(ticket)),
        }
    }

    /// How many names have a gate now (tests: none left behind).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.gates.lock().len()
    }
}

/// A place in a name's queue. Dropping it (the waiter's deadline passed, or its future was
/// dropped) leaves the queue.
pub(crate) struct Queued(Ticket);

impl Queued {
    /// Waits for the turn of every waiter ahead to end. Cancel-safe.
    pub(crate) async fn turn(self) -> Turn {
        let guard = self.0.gate().lock_owned().await;
        Turn {
            _held: Some((guard, self.0)),
        }
    }
}

/// One waiter's hold on a name's gate, which it removes on the way out when nobody else has it.
struct Ticket {
    map: Arc<Mutex<HashMap<i64, Gate>>>,
    key: i64,
    gate: Option<Gate>,
}

impl Ticket {
    fn new(map: Arc<Mutex<HashMap<i64, Gate>>>, key: i64) -> Self {
        let gate = map.lock().entry(key).or_default().clone();
        Ticket {
            map,
            key,
            gate: Some(gate),
        }
    }

    fn gate(&self) -> Gate {
        // Always `Some` until dropped.
        self.gate.clone().unwrap_or_default()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        drop(self.gate.take());
        let mut map = self.map.lock();
        // Only the map's own reference left: nobody holds or awaits this gate, and nobody can
        // take one without the map's lock.
        if map
            .get(&self.key)
            .is_some_and(|g| Arc::strong_count(g) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn waiters_of_one_name_go_one_at_a_time_in_order_and_leave_nothing_behind() {
        let turns = Turns::default();
        let first = turns.take(7).ok().expect("nobody ahead");
        // Another name is independent.
        let other = turns.take(8).ok().expect("another name has its own gate");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for i in 0..3 {
            let queued = turns.take(7).err().expect("the first waiter has the turn");
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                let turn = queued.turn().await;
                tx.send(i).ok();
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(turn);
            }));
            // Queued in this order.
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            rx.try_recv().is_err(),
            "a waiter went while the first had the turn"
        );
        drop(first);
        for t in tasks {
            t.await.ok();
        }
        let order: Vec<i32> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(order, [0, 1, 2], "turns out of arrival order");
        drop(other);
        assert_eq!(turns.len(), 0, "a gate outlived its waiters");
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_the_queue_and_nothing_behind() {
        let turns = Turns::default();
        let first = turns.take(7).ok().expect("nobody ahead");
        let queued = turns.take(7).err().expect("queued");
        let gave_up = tokio::time::timeout(Duration::from_millis(10), queued.turn()).await;
        assert!(gave_up.is_err(), "got the turn while the first had it");
        let next = turns.take(7).err().expect("queued behind the first still");
        drop(first);
        drop(next.turn().await);
        assert_eq!(turns.len(), 0, "a gate outlived its waiters");
    }
}
