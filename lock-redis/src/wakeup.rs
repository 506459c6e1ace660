//! Release notifications: one subscription per lock name that has waiters, on the lock's own
//! (RESP3) connection, shared by every waiter of that name.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::Notify;

use crate::conn::Conn;

#[derive(Default)]
struct Channel {
    waiters: usize,
    notify: Arc<Notify>,
    /// Serialises SUBSCRIBE/UNSUBSCRIBE of this channel; true while subscribed.
    subscribed: Arc<tokio::sync::Mutex<bool>>,
    /// Subscribed by `SSUBSCRIBE` (sharded pub/sub).
    sharded: bool,
    /// The server ended a sharded subscription itself (its slot moved to another node), or
    /// may have: the next [`Wakeups::watch`] subscribes again.
    lapsed: Arc<AtomicBool>,
}

/// Channel name → waiters. The push callback reads it; waiters register in it.
#[derive(Default)]
pub(crate) struct Wakeups {
    channels: Mutex<HashMap<String, Channel>>,
    dedup: Option<ReleaseDedup>,
}

/// Remembers recent release announcements (channel + releasing token) so that nodes sharing it
/// wake a waiter once per release, not once per node that announced it.
///
/// ```
/// let d = lock_redis::raw::ReleaseDedup::default();
/// assert!(d.first_sighting("distlock:{a}:released", b"tok1"));
/// assert!(!d.first_sighting("distlock:{a}:released", b"tok1"));
/// assert!(d.first_sighting("distlock:{a}:released", b"tok2"));
/// ```
#[derive(Clone, Default)]
pub struct ReleaseDedup {
    seen: Arc<Mutex<Recent>>,
}

/// Recent announcements: a set for lookups, a queue for eviction order.
type Recent = (
    std::collections::HashSet<Vec<u8>>,
    std::collections::VecDeque<Vec<u8>>,
);

impl ReleaseDedup {
    /// How many recent announcements are remembered.
    const CAPACITY: usize = 4096;

    /// True the first time this (channel, payload) is seen.
    pub fn first_sighting(&self, channel: &str, payload: &[u8]) -> bool {
        let mut key = Vec::with_capacity(channel.len() + 1 + payload.len());
        key.extend_from_slice(channel.as_bytes());
        key.push(0);
        key.extend_from_slice(payload);
        let mut guard = self.seen.lock();
        let (set, order) = &mut *guard;
        if !set.insert(key.clone()) {
            return false;
        }
        order.push_back(key);
        if order.len() > Self::CAPACITY {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
        true
    }
}

impl std::fmt::Debug for ReleaseDedup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReleaseDedup")
    }
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

impl Wakeups {
    pub(crate) fn with_dedup(dedup: Option<ReleaseDedup>) -> Self {
        Wakeups {
            channels: Mutex::default(),
            dedup,
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock()
    }

    /// Called by the connection for every push message; must not block.
    pub(crate) fn on_push(&self, info: PushInfo) {
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(ch) = info.data.first().and_then(bytes) {
                    let ch = String::from_utf8_lossy(ch);
                    let payload = info.data.get(1).and_then(bytes).unwrap_or_default();
                    if let Some(d) = &self.dedup {
                        if !d.first_sighting(&ch, payload) {
                            return; // another node already announced this release
                        }
                    }
                    // One release, one local waiter: the others stay asleep (no herd). If that
                    // waiter is cancelled before it runs, tokio hands the wake-up to the next.
                    if let Some(c) = self.map().get(&*ch) {
                        c.notify.notify_one();
                    }
                }
            }
            // Messages may have been lost while disconnected: every waiter re-checks.
            PushKind::Disconnection => {
                for c in self.map().values() {
                    c.notify.notify_waiters();
                }
            }
            // A node drops the sharded subscriptions of a slot it gives up (a migration), and
            // the cluster client then forgets them: the channel's waiters re-check, and
            // subscribe again where the slot is now. (The confirmation of this client's own
            // unsubscribe looks the same; a waiter that arrived meanwhile subscribes once more,
            // which costs one request.)
            PushKind::SUnsubscribe => {
                let ch = info
                    .data
                    .first()
                    .and_then(bytes)
                    .map(String::from_utf8_lossy);
                if let Some(c) = ch.and_then(|ch| self.map().get(&*ch).map(|c| c.clone_parts())) {
                    c.0.store(true, Ordering::Relaxed);
                    c.1.notify_waiters();
                }
            }
            _ => {}
        }
    }

    /// The connection moved to another server (a Sentinel failover): subscribes `conn` to
    /// every channel that has waiters and wakes them all (announcements may have been lost).
    /// A waiter's later unsubscribe goes to the old connection, so a channel can stay
    /// subscribed here without waiters: its messages find none and are dropped.
    pub(crate) async fn moved_to(&self, conn: &Conn) {
        let channels: Vec<(String, Arc<tokio::sync::Mutex<bool>>, Arc<Notify>)> = self
            .map()
            .iter()
            .map(|(ch, c)| (ch.clone(), c.subscribed.clone(), c.notify.clone()))
            .collect();
        for (channel, subscribed, notify) in channels {
            let s = subscribed.lock().await;
            if *s {
                // Behind sentinels: announcements are never sharded there.
                let _ = conn.clone().subscribe(&channel, false).await;
            }
            drop(s);
            notify.notify_waiters();
        }
    }

    /// Registers a waiter for `channel` and makes sure the connection is subscribed before
    /// returning, so a release after this call cannot go unnoticed.
    /// With `sharded`, by sharded pub/sub (`SSUBSCRIBE`).
    pub(crate) async fn watch(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
        sharded: bool,
    ) -> redis::RedisResult<ReleaseWatch> {
        let (notify, subscribed, lapsed) = {
            let mut map = self.map();
            let c = map.entry(channel.to_string()).or_default();
            c.waiters += 1;
            c.sharded = sharded;
            (c.notify.clone(), c.subscribed.clone(), c.lapsed.clone())
        };
        let watch = ReleaseWatch {
            wakeups: self.clone(),
            conn: conn.clone(),
            channel: channel.to_string(),
            notify,
            lapsed: lapsed.clone(),
            sharded,
        };
        let mut s = subscribed.lock().await;
        // Cleared in any case: a subscription made now is a fresh one.
        let lapsed = lapsed.swap(false, Ordering::Relaxed);
        if !*s || lapsed {
            conn.clone().subscribe(channel, sharded).await?;
            *s = true;
        }
        Ok(watch)
    }
}

/// A waiter's registration for one lock's release announcements on one node. Keep it while
/// waiting; dropping the last one of a lock unsubscribes.
pub struct ReleaseWatch {
    wakeups: Arc<Wakeups>,
    conn: Conn,
    channel: String,
    notify: Arc<Notify>,
    lapsed: Arc<AtomicBool>,
    sharded: bool,
}

impl ReleaseWatch {
    /// Notified once per release announcement (one local waiter per message) and for every
    /// waiter when the connection drops (messages may have been lost). Create the `notified()`
    /// future and `enable()` it before checking the lock, then await it.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }

    /// Whether the server may have ended the subscription (a cluster node drops the sharded
    /// subscriptions of a slot it gives up): then drop this watch and watch anew, which
    /// subscribes where the slot is now.
    pub fn lapsed(&self) -> bool {
        self.lapsed.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReleaseWatch")
    }
}

impl Channel {
    /// What the push handler needs to mark the channel lapsed and wake its waiters.
    fn clone_parts(&self) -> (Arc<AtomicBool>, Arc<Notify>) {
        (self.lapsed.clone(), self.notify.clone())
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        let subscribed = {
            let mut map = self.wakeups.map();
            let Some(c) = map.get_mut(&self.channel) else {
                return;
            };
            c.waiters = c.waiters.saturating_sub(1);
            if c.waiters > 0 {
                return;
            }
            c.subscribed.clone()
        };
        let (wakeups, mut conn, channel, sharded) = (
            self.wakeups.clone(),
            self.conn.clone(),
            std::mem::take(&mut self.channel),
            self.sharded,
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut s = subscribed.lock().await;
                // A new waiter may have arrived meanwhile: then it keeps the subscription.
                let idle = wakeups.map().get(&channel).map_or(true, |c| c.waiters == 0);
                if idle && *s {
                    if conn.unsubscribe(&channel, sharded).await.is_ok() {
                        *s = false;
                    }
                    let mut map = wakeups.map();
                    if map.get(&channel).is_some_and(|c| c.waiters == 0) && !*s {
                        map.remove(&channel);
                    }
                }
            });
        }
    }
}
