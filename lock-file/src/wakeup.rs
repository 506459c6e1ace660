//! Waking waiters: in-process by a `Notify` per name (lock-core's `Wakers`), across processes
//! by an inotify watch for the holder's writable handle being closed.

use std::path::Path;

use lock_core::LockName;

/// This process's wake-up entries, one per name with a waiter or a held lease; shared by a
/// `FileLock` and its clones.
pub(crate) type Wakers = lock_core::driver::Wakers<LockName>;

/// A waiter's or a lease's handle on its name's wake-up entry.
pub(crate) type Waker = lock_core::driver::Waker<LockName>;

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
