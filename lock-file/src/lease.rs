//! The backend half of a held file lock: renew checks that the path still names the locked
//! file; release closes it (the kernel drops the lock).

use parking_lot::Mutex;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::LeaseOps;
use lock_core::{Error, LockName, Result};

use crate::client::{blocking, io_error, path_id, FileId, Held};

use crate::wakeup::Waker;

pub(crate) struct FileLeaseOps {
    /// The locked file; `None` once released (closing it releases the OS lock).
    pub(crate) file: Arc<Mutex<Option<Held>>>,
    pub(crate) path: PathBuf,
    pub(crate) id: FileId,
    /// The grant's token: what a proclaimed value is stamped with.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) token: u64,
    pub(crate) ttl: Duration,
    pub(crate) name: LockName,
    pub(crate) waker: Waker,
}

impl FileLeaseOps {
    /// Takes the file out (the caller closes it, which releases the OS lock, then wakes a
    /// local waiter).
    fn let_go(&self) -> Option<Held> {
        self.file.lock().take()
    }
}

#[async_trait]
impl LeaseOps for FileLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.path.to_string_lossy().into_owned())
    }

    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let (file, path, id) = (self.file.clone(), self.path.clone(), self.id);
        let held = blocking(move || {
            let open = file.lock().is_some();
            Ok::<_, io::Error>(open && path_id(&path)? == Some(id))
        })
        .await?
        .map_err(|e| io_error(&self.path, e))?;
        if held {
            Ok(start + self.ttl)
        } else {
            Err(Error::not_held(&self.name))
        }
    }

    /// Writes the value for this grant's token, while this lease still holds the file the
    /// path names.
    #[cfg(target_os = "linux")]
    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        let (file, path, id, token) = (self.file.clone(), self.path.clone(), self.id, self.token);
        let value = value.clone();
        let done = blocking(move || match &*file.lock() {
            Some(held) => crate::election::proclaim(held, &path, id, token, value.as_bytes()),
            None => Ok(false),
        })
        .await?
        .map_err(|e| io_error(&self.path, e))?;
        if done {
            Ok(())
        } else {
            Err(Error::not_held(&self.name))
        }
    }

    async fn release(&self, _valid_until: Instant) -> Result<()> {
        let Some(file) = self.let_go() else {
            return Err(Error::not_held(&self.name));
        };
        let (path, id) = (self.path.clone(), self.id);
        let still_ours = blocking(move || {
            let ours = path_id(&path);
            file.unlock();
            drop(file); // closing the writable handle wakes other processes' waiters
            ours
        })
        .await;
        self.waker.notify_one();
        let still_ours = still_ours?.map_err(|e| io_error(&self.path, e))?;
        if still_ours == Some(id) {
            Ok(())
        } else {
            Err(Error::not_held(&self.name))
        }
    }

    fn lapses_without_renewal(&self) -> bool {
        false
    }

    /// Both handles: the locked one keeps the lock; the writable one, closed last, is what
    /// wakes waiters in other processes.
    #[cfg(unix)]
    fn inheritable_fds(&self) -> Vec<std::os::fd::OwnedFd> {
        let held = self.file.lock();
        held.iter()
            .flat_map(|h| [&h._lock, &h._writer])
            .filter_map(|f| f.try_clone().ok().map(std::os::fd::OwnedFd::from))
            .collect()
    }

    /// A crashed holder's lock is released by the kernel at once; so is an abandoned one.
    fn abandon(&self) {
        drop(self.let_go());
        self.waker.notify_one();
    }
}
