//! Taking the OS lock: one attempt off the runtime's threads, and the waiting loop around it
//! (woken in-process by the releasing lease, across processes by inotify, with a jittered
//! back-off as the safety net).

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::driver::{Acquisition, Backoff, Grant, ManagedLease};
use lock_core::{FencingToken, Lease, LockName, LockOptions, Renewal, Result};

use crate::client::{blocking, io_error, lock_file, Attempt};
use crate::lease::FileLeaseOps;
use crate::wakeup::{ReleaseWatch, Wakers};

pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(5);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(100);
/// The safety-net retry of a waiter that inotify wakes (between half and all of this).
pub(crate) const WATCHED_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One attempt on `name`'s lock file at `path`, off the runtime's threads. Cancel-safe: if
/// this future is dropped, the blocking attempt still finishes and its file (and lock) is
/// dropped with its result.
pub(crate) async fn try_once(
    wakers: &Arc<Wakers>,
    path: PathBuf,
    name: &LockName,
    ttl: Duration,
    opts: &LockOptions,
) -> Result<Option<Box<dyn Lease>>> {
    let (p, value) = (path.clone(), opts.value.clone());
    let mode = opts.mode;
    let got = blocking(move || lock_file(&p, mode, value.as_ref().map(|v| v.as_bytes())))
        .await?
        .map_err(|e| io_error(&path, e))?;
    let (file, token, id) = match got {
        Attempt::Held(file, token, id) => (file, token, id),
        Attempt::Busy => return Ok(None),
        Attempt::Mismatch(held) => {
            return Err(lock_core::Error::PermitsMismatch {
                name: name.clone(),
                held,
                asked: mode.limit().unwrap_or(0),
            })
        }
    };
    // The lock lasts while this process holds the file; the watchdog re-checks that the
    // path still names it (a deleted file is a broken lock), and honours max_hold.
    let renewal = match opts.renewal {
        Renewal::Manual => Renewal::Auto { max_hold: None },
        auto => auto,
    };
    let ops = FileLeaseOps {
        file: Arc::new(Mutex::new(Some(file))),
        path,
        id,
        token,
        ttl,
        name: name.clone(),
        waker: wakers.waker(name),
    };
    Ok(Some(Box::new(ManagedLease::new(
        name.clone(),
        Grant {
            token: Some(FencingToken::new(token)),
            ttl,
            valid_until: Instant::now() + ttl,
        },
        renewal,
        ops,
    ))))
}

/// Attempts on `path` (`name`'s lock file) until one is granted or `req`'s deadline passes.
pub(crate) async fn contend(
    wakers: &Arc<Wakers>,
    path: PathBuf,
    req: Acquisition<'_>,
) -> Result<Option<Box<dyn Lease>>> {
    let (name, ttl, opts, deadline) = (req.name(), req.ttl(), req.opts(), req.deadline());
    let waker = wakers.waker(name);
    // Releases by other processes (or other `FileLock`s), where the OS can tell us.
    let mut elsewhere: Option<ReleaseWatch> = None;
    let mut watched = false;
    let mut pauses = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
    loop {
        // Registered before the attempt, so a release right after it is not missed.
        let released = waker.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        if let Some(lease) = try_once(wakers, path.clone(), name, ttl, opts).await? {
            return Ok(Some(lease));
        }
        let now = Instant::now();
        if deadline.passed() {
            return Ok(None);
        }
        req.queued();
        if !watched {
            // Watch first, then look once more: a release in between is not missed.
            watched = true;
            elsewhere = ReleaseWatch::new(&path);
            if elsewhere.is_some() {
                // The OS wakes us on a release: polling is only the safety net now.
                pauses = Backoff::new(FIRST_BACKOFF, WATCHED_MAX_BACKOFF);
                continue;
            }
        }
        let mut pause = pauses.pause();
        if let Some(d) = deadline.at() {
            pause = pause.min(d - now);
        }
        tokio::select! {
            _ = released => {}
            still = async {
                match elsewhere.as_mut() {
                    Some(w) => w.next().await,
                    None => std::future::pending().await,
                }
            } => {
                if !still {
                    // The file was deleted or replaced: watch what the path names next.
                    elsewhere = None;
                    watched = false;
                    pauses = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
                }
            }
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
