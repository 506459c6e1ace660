//! Waking waiters: in-process by a `Notify` per name, across processes by an inotify watch
//! for the holder's writable handle being closed.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use lock_core::LockName;
use tokio::sync::Notify;

/// This process's wake-up entries, one `Notify` per name with a waiter or a held lease; shared
/// by a `FileLock` and its clones.
#[derive(Default)]
pub(crate) struct Wakers(Mutex<HashMap<LockName, Arc<Notify>>>);

impl Wakers {
    /// How many names have an entry.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().len()
    }

    /// A handle on `name`'s entry, made if missing.
    pub(crate) fn waker(self: &Arc<Self>, name: &LockName) -> Waker {
        let mut w = self.0.lock();
        Waker {
            notify: w.entry(name.clone()).or_default().clone(),
            wakers: self.clone(),
            name: name.clone(),
        }
    }
}

/// A waiter's inotify watch on one lock file: wakes when a writable handle on it is closed
/// (a holder let go, or died), or when the file is deleted or moved.
#[cfg(target_os = "linux")]
pub(crate) struct ReleaseWatch {
    pub(crate) events: inotify::EventStream<[u8; 256]>,
}

#[cfg(target_os = "linux")]
impl ReleaseWatch {
    /// `None` when inotify cannot be used (instance limit reached, file gone): poll instead.
    pub(crate) fn new(path: &Path) -> Option<Self> {
        use inotify::{Inotify, WatchMask};
        let inotify = Inotify::init().ok()?;
        inotify
            .watches()
            .add(
                path,
                WatchMask::CLOSE_WRITE | WatchMask::DELETE_SELF | WatchMask::MOVE_SELF,
            )
            .ok()?;
        let events = inotify.into_event_stream([0u8; 256]).ok()?;
        Some(ReleaseWatch { events })
    }

    /// The next event; `false` when the watch ended (file deleted or moved, or an error).
    pub(crate) async fn next(&mut self) -> bool {
        use futures_util::StreamExt;
        use inotify::EventMask;
        match self.events.next().await {
            Some(Ok(e)) => !e
                .mask
                .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED),
            _ => false,
        }
    }
}

/// No notification here: waiters poll.
#[cfg(not(target_os = "linux"))]
pub(crate) struct ReleaseWatch;

#[cfg(not(target_os = "linux"))]
impl ReleaseWatch {
    pub(crate) fn new(_: &Path) -> Option<Self> {
        None
    }
    pub(crate) async fn next(&mut self) -> bool {
        std::future::pending().await
    }
}

/// A waiter's or a lease's handle on a name's wake-up entry. The entry goes with the last
/// handle, so the map holds only names somebody waits on or holds.
pub(crate) struct Waker {
    pub(crate) notify: Arc<Notify>,
    pub(crate) wakers: Arc<Wakers>,
    pub(crate) name: LockName,
}

impl std::ops::Deref for Waker {
    type Target = Notify;
    fn deref(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        let mut w = self.wakers.0.lock();
        // Handles are only made under this lock, so the count cannot grow meanwhile: two is
        // the map's and this one's.
        if Arc::strong_count(&self.notify) == 2
            && w.get(&self.name)
                .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            w.remove(&self.name);
        }
    }
}
