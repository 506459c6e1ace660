//! A bounded set of waiting sessions (`wait_sessions=N`): at most N of a client's waiters (in
//! any mode) wait on the server, each on a session of its own that the server's lock queue
//! blocks (and that keeps the lock it is granted there until its release); the others poll
//! with tries on the shared sessions. A poller is woken at once by this client's own release
//! of its name, and by another client's that announces it (clients with `wait_sessions`
//! unlock, in every mode, with a `pg_notify` on the key's channel, which this client's one listening
//! connection `LISTEN`s to while the key has pollers); any other release, or a holder's end,
//! it sees at its next try. No waiter ever waits for a slot (it polls instead, and takes one
//! that came free between two tries), so the bound cannot make a cycle of waits that the
//! locks alone would not make.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::driver::{Acquisition, Backoff, Waker};
use lock_core::{Lease, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::client::{Opened, Opener};
use crate::keys::{channel, key_of_channel};

/// The first pause between a poller's tries, and the longest: another client's release is
/// seen within about the longest, and a thousand pollers send at most 2,000 tries a second.
const FIRST: Duration = Duration::from_millis(10);
const MOST: Duration = Duration::from_millis(500);

/// A client's waiting slots and its pollers' wake-ups.
pub(crate) struct Waiting {
    /// `None`: unbounded (every waiter waits on the server).
    slots: Option<Arc<Semaphore>>,
    /// Pollers of each advisory key, woken by a release of it here or an announced one.
    wakers: Arc<Wakers>,
    /// The listening connection, once a poller needed it (and again after it closed).
    listener: Arc<tokio::sync::Mutex<Option<Opened>>>,
}

type Wakers = lock_core::driver::Wakers<i64>;

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
            wakers: Arc::default(),
            listener: Arc::default(),
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
        self.wakers.wake(&key);
    }

    /// `LISTEN`s on `key`'s channel, on the listening connection (opened, with every polled
    /// key's channel, if it is not open), unless the key has no poller by then. Best effort:
    /// without it pollers hear of other clients' releases at their next try.
    async fn listen(&self, opener: &Opener, key: i64) {
        let mut conn = self.listener.lock().await;
        let keys: Vec<i64> = match conn.as_ref() {
            Some(c) if !c.is_closed() => vec![key],
            _ => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                match opener.open_with(Some(tx)).await {
                    Ok(opened) => *conn = Some(opened),
                    Err(e) => {
                        tracing::debug!(error = %e, "no listening connection; pollers poll");
                        return;
                    }
                }
                let wakers = self.wakers.clone();
                tokio::spawn(async move {
                    while let Some(n) = rx.recv().await {
                        if let Some(k) = key_of_channel(n.channel()) {
                            wakers.wake(&k);
                        }
                    }
                });
                self.wakers.keys()
            }
        };
        let Some(c) = conn.as_ref() else { return };
        let sql: String = (keys.iter())
            .filter(|k| self.wakers.contains(k))
            .map(|k| format!("LISTEN \"{}\";", channel(*k)))
            .collect();
        if sql.is_empty() {
            return;
        }
        let listened = opener.answered(
            "the LISTEN",
            opener.request_bound(),
            c.client.batch_execute(&sql),
        );
        if let Err(e) = listened.await {
            tracing::debug!(error = %e, "LISTEN failed; pollers poll");
            *conn = None;
        }
    }

    /// Tries with `try_once` until granted, a slot comes free, or `req`'s deadline passes,
    /// pausing on a back-off between tries unless this client releases the name meanwhile.
    pub(crate) async fn poll<F, Fut>(
        self: &Arc<Self>,
        opener: &Arc<Opener>,
        req: &Acquisition<'_>,
        key: i64,
        mut try_once: F,
    ) -> Result<Polled>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<Box<dyn Lease>>>>,
    {
        let woken = Woken {
            of: self,
            waker: self.wakers.waker(&key),
        };
        if woken.waker.first() {
            // In the background: a poller never waits for the listening connection (a login
            // may take the connect timeout), and one release missed meanwhile costs a pause
            // of the first few, which are short.
            let (me, opener) = (self.clone(), opener.clone());
            tokio::spawn(async move { me.listen(&opener, key).await });
        }
        let mut pauses = Backoff::new(FIRST, MOST);
        req.queued();
        loop {
            // Enabled before the try: a release between the try and the pause wakes it.
            let released = woken.waker.notified();
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

/// A poller's hold on its key's wake-up; the entry goes with the last poller of the key, and
/// the listening connection stops listening to it then (unless a poller came meanwhile).
struct Woken<'a> {
    of: &'a Waiting,
    waker: Waker<i64>,
}

impl Drop for Woken<'_> {
    fn drop(&mut self) {
        let key = *self.waker.key();
        if !self.waker.leave() {
            return; // another poller of the key listens on
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (listener, all) = (self.of.listener.clone(), self.of.wakers.clone());
        rt.spawn(async move {
            // Under the listener's lock, as a LISTEN is: a poller that came since keeps it.
            let conn = listener.lock().await;
            if let (Some(c), false) = (conn.as_ref(), all.contains(&key)) {
                let _ = c
                    .client
                    .batch_execute(&format!("UNLISTEN \"{}\"", channel(key)))
                    .await;
            }
        });
    }
}
