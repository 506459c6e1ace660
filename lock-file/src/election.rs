//! An election on one machine: the exclusive holder of `<name>.lock` leads, its token is the
//! term, and its value is written in the lock file past the counter's slots, stamped with the
//! token it was written under — a value left by an earlier holder (which the next grant does
//! not erase) is never read as the current one's. Observers hear every grant (the counter's
//! write), proclaim (the value's) and release or death (the holder's writable handle closing)
//! from inotify.

use std::io;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use lock_core::{Change, ChangeFeed, Error, FencingToken, Leader, Mode, Result};

use crate::client::{blocking, io_error, open_lock_file, peek};
use crate::config::BACKEND;
use crate::value::{read, write};

/// The exclusive holder of `path`, with the value written for its token.
pub(crate) async fn leader(path: PathBuf) -> Result<Option<Leader>> {
    let p = path.clone();
    blocking(move || {
        let holders = peek(&p)?;
        let [h] = holders.as_slice() else {
            return Ok(None);
        };
        let (Mode::Exclusive, Some(term)) = (h.mode, h.fencing_token) else {
            return Ok(None);
        };
        let file = match open_lock_file(&p, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let value = read(&file, term.get())?;
        Ok(Some(Leader::new(
            value,
            FencingToken::new(term.get()),
            None,
        )))
    })
    .await?
    .map_err(|e| io_error(&path, e))
}

/// An inotify watch on the lock file (made first if the name was never used).
pub(crate) async fn watch(path: PathBuf) -> Result<Box<dyn ChangeFeed>> {
    let p = path.clone();
    let events = blocking(move || {
        use inotify::{Inotify, WatchMask};
        if !p.exists() {
            crate::counter::create(&p)?;
        }
        let inotify = Inotify::init()?;
        let mask = WatchMask::MODIFY
            | WatchMask::CLOSE_WRITE
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF;
        inotify.watches().add(&p, mask)?;
        inotify.into_event_stream([0u8; 256])
    })
    .await?
    .map_err(|e| io_error(&path, e))?;
    Ok(Box::new(Feed { events }))
}

struct Feed {
    events: inotify::EventStream<[u8; 256]>,
}

#[async_trait]
impl ChangeFeed for Feed {
    async fn changed(&mut self) -> Result<Change> {
        use futures_util::StreamExt;
        use inotify::EventMask;
        match self.events.next().await {
            Some(Ok(e))
                if !e.mask.intersects(
                    EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED,
                ) =>
            {
                Ok(Change::Notified)
            }
            // The file went: the observer watches what the path names next.
            Some(Ok(_)) => Err(Error::unavailable(BACKEND, "the lock file was replaced")),
            Some(Err(e)) => Err(Error::unavailable(BACKEND, e)),
            None => Err(Error::unavailable(BACKEND, "the watch ended")),
        }
    }

    /// A holder that dies closes its writable handle: an event like a release.
    fn reports_expiry(&self) -> bool {
        true
    }
}

/// Proclaims `value` for the holder of `token` whose handles are `held`, if `path` still names
/// its file.
pub(crate) fn proclaim(
    held: &crate::client::Held,
    path: &Path,
    id: crate::client::FileId,
    token: u64,
    value: &[u8],
) -> io::Result<bool> {
    if crate::client::path_id(path)? != Some(id) {
        return Ok(false);
    }
    write(&held._writer, token, value)?;
    Ok(true)
}
