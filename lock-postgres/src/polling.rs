//! A bounded set of waiting sessions (`wait_sessions=N`): at most N of a client's exclusive
//! waiters wait on the server, each on a session of its own that the server's lock queue
//! blocks (and that keeps the lock it is granted there until its release); the others poll
//! with tries on the shared sessions. A poller is woken at once by this client's own release
//! of its name; another client's release, or a holder's end, it sees at its next try. No
//! waiter ever waits for a slot (it polls instead, and takes one that came free between two
//! tries), so the bound cannot make a cycle of waits that the locks alone would not make.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::driver::{Acquisition, Backoff};
use lock_core::{Lease, Result};
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The first pause between a poller's tries, and the longest: another client's release is
/// seen within about the longest, and a thousand pollers send at most 2,000 tries a second.
const FIRST: Duration = Duration::from_millis(10);
const MOST: Duration = Duration::from_millis(500);

/// A client's waiting slots and its pollers' wake-ups.
pub(crate) struct Waiting {
    /// `None`: unbounded (every waiter waits on the server).
    slots: Option<Arc<Semaphore>>,
    /// Pollers of each advisory key, woken by a release of it here.
    wakers: Mutex<HashMap<i64, Arc<Notify>>>,
}

/// Where a waiter waits.
pub(crate) enum Place {
    /// On the server, holding this slot (`None`: waits are unbounded) while it waits and
    /// while it holds the lock granted there.
    Server(Option<OwnedSemaphorePermit>),
    /// Every slot is taken: it polls.
    Polls,
}

/// How polling ended.
pub(crate) enum Polled {
    /// A try was granted.
    Granted(Box<dyn Lease>),
    /// A slot came free: wait on the server with it.
    Slot(OwnedSemaphorePermit),
    /// The deadline passed.
    GaveUp,
}

impl Waiting {
    /// Waits bounded to `slots` sessions, or unbounded.
    pub(crate) fn new(slots: Option<usize>) -> Self {
        Waiting {
            slots: slots.map(|n| Arc::new(Semaphore::new(n))),
            wakers: Mutex::new(HashMap::new()),
        }
    }

    /// Where the next waiter waits: a free slot is taken at once, never waited for.
    pub(crate) fn place(&self) -> Place {
        match &self.slots {
            None => Place::Server(None),
            Some(s) => match s.clone().try_acquire_owned() {
                Ok(permit) => Place::Server(Some(permit)),
                Err(_) => Place::Polls,
            },
        }
    }

    /// This client let go of `key`: its pollers of it try again now.
    pub(crate) fn released(&self, key: i64) {
        if self.slots.is_none() {
            return;
        }
        if let Some(n) = self.wakers.lock().get(&key) {
            n.notify_waiters();
        }
    }

    /// Tries with `try_once` until granted, a slot comes free, or `req`'s deadline passes,
    /// pausing on a back-off between tries unless this client releases the name meanwhile.
    pub(crate) async fn poll<F, Fut>(
        &self,
        req: &Acquisition<'_>,
        key: i64,
        mut try_once: F,
    ) -> Result<Polled>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<Box<dyn Lease>>>>,
    {
        let woken = Woken::of(self, key);
        let mut pauses = Backoff::new(FIRST, MOST);
        req.queued();
        loop {
            // Enabled before the try: a release between the try and the pause wakes it.
            let released = woken.notify.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(lease) = try_once().await? {
                return Ok(Polled::Granted(lease));
            }
            if let Place::Server(Some(slot)) = self.place() {
                return Ok(Polled::Slot(slot));
            }
            let mut pause = pauses.pause();
            if let Some(at) = req.deadline().at() {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Polled::GaveUp);
                }
                pause = pause.min(left);
            }
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// A poller's hold on its key's wake-up; the entry goes with the last poller of the key.
struct Woken<'a> {
    of: &'a Waiting,
    key: i64,
    notify: Arc<Notify>,
}

impl<'a> Woken<'a> {
    fn of(waiting: &'a Waiting, key: i64) -> Self {
        let notify = waiting.wakers.lock().entry(key).or_default().clone();
        Woken {
            of: waiting,
            key,
            notify,
        }
    }
}

impl Drop for Woken<'_> {
    fn drop(&mut self) {
        let mut wakers = self.of.wakers.lock();
        // The map's and this one: nobody else polls the key.
        if Arc::strong_count(&self.notify) == 2 {
            wakers.remove(&self.key);
        }
    }
}
