//! `FileLock`: one advisory-locked file per name.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{Grant, LeaseOps, ManagedLease};
use lock_core::{
    Capabilities, Deadline, DistributedLock, Error, Fencing, FencingToken, Lease, LockName,
    LockOptions, Renewal, Result,
};
use tokio::sync::Notify;

use crate::counter;

const BACKEND: &str = "file";
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(100);
/// The safety-net retry of a waiter that inotify wakes (between half and all of this).
const WATCHED_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Locks for the processes of one machine: `<dir>/<name>.lock`, held with an OS advisory lock.
///
/// Cheap to clone; clones share the in-process wake-ups. Two `FileLock`s (in one process or
/// in several) on the same directory exclude each other.
#[derive(Clone)]
pub struct FileLock {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Wakes this process's waiters on a name when a lease of this process releases it.
    wakers: Mutex<HashMap<LockName, Arc<Notify>>>,
}

impl FileLock {
    /// Uses `dir` (created if missing) for the lock files.
    pub async fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        let d = dir.clone();
        blocking(move || std::fs::create_dir_all(&d))
            .await?
            .map_err(|e| {
                Error::config(format!(
                    "cannot use {} as the lock directory: {e}",
                    dir.display()
                ))
            })?;
        Ok(FileLock {
            inner: Arc::new(Inner {
                dir,
                wakers: Mutex::default(),
            }),
        })
    }

    /// [`open`](Self::open) from a `file:///absolute/dir` URL.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
    /// let dir = std::env::temp_dir().join("lock-file-url-doc");
    /// let locks = lock_file::FileLock::from_url(&format!("file://{}", dir.display())).await?;
    /// assert_eq!(locks.dir(), dir);
    /// assert!(lock_file::FileLock::from_url("file://elsewhere/x").await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn from_url(url: &str) -> Result<Self> {
        let u = url::Url::parse(url)
            .map_err(|e| Error::config(format!("file URL: {e} (expected file:///dir)")))?;
        let local = matches!(u.host_str(), None | Some("") | Some("localhost"));
        if u.scheme() != "file" || !local || u.query().is_some() || u.fragment().is_some() {
            return Err(Error::config(
                "a file URL is file:///absolute/dir (a local directory, no query)",
            ));
        }
        let dir = u
            .to_file_path()
            .map_err(|()| Error::config("file URL: not an absolute local path (file:///dir)"))?;
        Self::open(dir).await
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The file that holds `name`'s lock and fencing counter.
    pub fn path_of(&self, name: &LockName) -> PathBuf {
        self.inner.dir.join(format!("{name}.lock"))
    }

    /// How many names this `FileLock` (and its clones) keeps a wake-up entry for: one per
    /// name with a waiter or a held lease, none for names merely used before. A diagnostic.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lock_core::Result<()> {
    /// let locks = lock_file::FileLock::open(std::env::temp_dir().join("lock-file-tracked")).await?;
    /// assert_eq!(locks.tracked_names(), 0);
    /// # Ok(()) }
    /// ```
    pub fn tracked_names(&self) -> usize {
        self.inner
            .wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    fn waker(&self, name: &LockName) -> Waker {
        let mut w = self.inner.wakers.lock().unwrap_or_else(|p| p.into_inner());
        Waker {
            notify: w.entry(name.clone()).or_default().clone(),
            inner: self.inner.clone(),
            name: name.clone(),
        }
    }

    /// One attempt, off the runtime's threads. Cancel-safe: if this future is dropped, the
    /// blocking attempt still finishes and its file (and lock) is dropped with its result.
    async fn try_once(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
    ) -> Result<Option<Box<dyn Lease>>> {
        let path = self.path_of(name);
        let p = path.clone();
        let got = blocking(move || lock_file(&p))
            .await?
            .map_err(|e| io_error(&path, e))?;
        let Some((file, token, id)) = got else {
            return Ok(None);
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
            ttl,
            name: name.clone(),
            waker: self.waker(name),
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

    async fn contend(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        let waker = self.waker(name);
        let path = self.path_of(name);
        // Releases by other processes (or other `FileLock`s), where the OS can tell us.
        let mut elsewhere: Option<ReleaseWatch> = None;
        let mut watched = false;
        let mut backoff = FIRST_BACKOFF;
        loop {
            // Registered before the attempt, so a release right after it is not missed.
            let released = waker.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(lease) = self.try_once(name, ttl, opts).await? {
                return Ok(Some(lease));
            }
            let now = Instant::now();
            if deadline.passed() {
                return Ok(None);
            }
            if !watched {
                // Watch first, then look once more: a release in between is not missed.
                watched = true;
                elsewhere = ReleaseWatch::new(&path);
                if elsewhere.is_some() {
                    continue;
                }
            }
            let most = if elsewhere.is_some() {
                WATCHED_MAX_BACKOFF
            } else {
                MAX_BACKOFF
            };
            let mut pause = jitter(backoff);
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
                    }
                }
                _ = tokio::time::sleep(pause) => {}
            }
            backoff = (backoff * 2).min(most);
        }
    }
}

/// A waiter's inotify watch on one lock file: wakes when a writable handle on it is closed
/// (a holder let go, or died), or when the file is deleted or moved.
#[cfg(target_os = "linux")]
struct ReleaseWatch {
    events: inotify::EventStream<[u8; 256]>,
}

#[cfg(target_os = "linux")]
impl ReleaseWatch {
    /// `None` when inotify cannot be used (instance limit reached, file gone): poll instead.
    fn new(path: &Path) -> Option<Self> {
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
    async fn next(&mut self) -> bool {
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
struct ReleaseWatch;

#[cfg(not(target_os = "linux"))]
impl ReleaseWatch {
    fn new(_: &Path) -> Option<Self> {
        None
    }
    async fn next(&mut self) -> bool {
        std::future::pending().await
    }
}

/// Between half and all of `d`, so pollers in several processes do not march in step.
fn jitter(d: Duration) -> Duration {
    let r = RandomState::new().build_hasher().finish();
    d / 2 + d.mul_f64((r % 1000) as f64 / 2000.0)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::backend(BACKEND, format!("file task failed: {e}")))
}

fn io_error(path: &Path, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound => {
            Error::config(format!("lock file {}: {e}", path.display()))
        }
        _ => Error::backend(BACKEND, format!("lock file {}: {e}", path.display())),
    }
}

/// Which file a handle or a path names (device and inode).
type FileId = (u64, u64);

#[cfg(unix)]
fn file_id(m: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
fn file_id(_m: &std::fs::Metadata) -> FileId {
    (0, 0) // no cheap identity: deletion of a held file goes undetected here
}

/// A waiter's or a lease's handle on a name's wake-up entry. The entry goes with the last
/// handle, so the map holds only names somebody waits on or holds.
struct Waker {
    notify: Arc<Notify>,
    inner: Arc<Inner>,
    name: LockName,
}

impl std::ops::Deref for Waker {
    type Target = Notify;
    fn deref(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        let mut w = self.inner.wakers.lock().unwrap_or_else(|p| p.into_inner());
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

/// The identity of what `path` names now, `None` if nothing.
fn path_id(path: &Path) -> io::Result<Option<FileId>> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(file_id(&m))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A held lock: the handle the OS lock is on, and a writable handle kept open until release.
/// Closing a writable handle is what tells waiters in other processes (inotify's
/// `IN_CLOSE_WRITE`) that the lock was let go — including when the kernel closes it because
/// the holder died. Attempts use read-only handles, so a failed attempt wakes nobody.
struct Held {
    _lock: File,
    _writer: File,
}

/// Takes the lock on `path` if free: the held handles, the new fencing token, the identity.
fn lock_file(path: &Path) -> io::Result<Option<(Held, u64, FileId)>> {
    ATTEMPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    loop {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // First use of the name (or deleted): create it, then lock it read-only.
                counter::create(path)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => return Ok(None),
            Err(fs4::TryLockError::Error(e)) => return Err(e),
        }
        let id = file_id(&file.metadata()?);
        // Deleted (or replaced) between our open and our lock: we hold an orphan that nobody
        // else will ever look at. Let it go and open what the path names now.
        if path_id(path)? != Some(id) {
            continue;
        }
        let writer = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(w) if file_id(&w.metadata()?) == id => w,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let token = counter::bump(&writer)?;
        return Ok(Some((
            Held {
                _lock: file,
                _writer: writer,
            },
            token,
            id,
        )));
    }
}

/// Lock attempts this process made (every driver instance): what the conformance suite counts
/// to prove that waiting does not poll.
static ATTEMPTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many lock attempts (tries of the OS lock) this process has made so far, over every
/// `FileLock`. A diagnostic: a waiter that is woken by releases makes one per release, a
/// poller many.
///
/// ```
/// let before = lock_file::attempts();
/// assert!(lock_file::attempts() >= before);
/// ```
pub fn attempts() -> u64 {
    ATTEMPTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether someone holds `path`'s lock, and the counter it stores (a free lock is taken for
/// an instant, its counter read, and let go).
fn peek(path: &Path) -> io::Result<Option<lock_core::HolderInfo>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let free = match fs4::FileExt::try_lock(&file) {
        Ok(()) => true, // dropping the file lets go at once
        Err(fs4::TryLockError::WouldBlock) => false,
        Err(fs4::TryLockError::Error(e)) => return Err(e),
    };
    // Read even when free: a damaged counter is reported here, not only at the next grant.
    let token = FencingToken::new(counter::read(&file)?);
    Ok((!free).then(|| lock_core::HolderInfo::new(Some(token), None)))
}

#[async_trait]
impl DistributedLock for FileLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .with_fencing(Fencing::Strict)
            .with_inspect(true)
            .with_per_lock_ttl(false)
    }

    async fn acquire_until(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        self.contend(name, ttl, opts, deadline).await
    }

    /// Held if the file's advisory lock cannot be taken; the token is the counter in the file.
    /// The lock lives as long as its process, so there is no remaining time to report.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        let path = self.path_of(name);
        let p = path.clone();
        blocking(move || peek(&p))
            .await?
            .map_err(|e| io_error(&path, e))
    }
}

impl fmt::Debug for FileLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileLock")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

struct FileLeaseOps {
    /// The locked file; `None` once released (closing it releases the OS lock).
    file: Arc<Mutex<Option<Held>>>,
    path: PathBuf,
    id: FileId,
    ttl: Duration,
    name: LockName,
    waker: Waker,
}

impl fmt::Debug for FileLeaseOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileLease")
            .field("path", &self.path)
            .finish()
    }
}

impl FileLeaseOps {
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.clone(),
        }
    }

    /// Takes the file out (the caller closes it, which releases the OS lock, then wakes a
    /// local waiter).
    fn let_go(&self) -> Option<Held> {
        self.file.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[async_trait]
impl LeaseOps for FileLeaseOps {
    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let (file, path, id) = (self.file.clone(), self.path.clone(), self.id);
        let held = blocking(move || {
            let open = file.lock().unwrap_or_else(|p| p.into_inner()).is_some();
            Ok::<_, io::Error>(open && path_id(&path)? == Some(id))
        })
        .await?
        .map_err(|e| io_error(&self.path, e))?;
        if held {
            Ok(start + self.ttl)
        } else {
            Err(self.not_held())
        }
    }

    async fn release(&self) -> Result<()> {
        let Some(file) = self.let_go() else {
            return Err(self.not_held());
        };
        let (path, id) = (self.path.clone(), self.id);
        let still_ours = blocking(move || {
            let ours = path_id(&path);
            drop(file); // closing releases the lock
            ours
        })
        .await;
        self.waker.notify_one();
        let still_ours = still_ours?.map_err(|e| io_error(&self.path, e))?;
        if still_ours == Some(id) {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    fn lapses_without_renewal(&self) -> bool {
        false
    }

    /// Both handles: the locked one keeps the lock; the writable one, closed last, is what
    /// wakes waiters in other processes.
    #[cfg(unix)]
    fn inheritable_fds(&self) -> Vec<std::os::fd::OwnedFd> {
        let held = self.file.lock().unwrap_or_else(|p| p.into_inner());
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
