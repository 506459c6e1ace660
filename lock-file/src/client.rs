//! The operating system's side: opening and `flock`ing lock files off the runtime's threads,
//! the identity of a file behind a path, and peeking at a holder.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use lock_core::{Error, FencingToken, Mode, Result};

use crate::counter;

use crate::config::BACKEND;

/// The holders of the lock file at `path`, read without taking the lock (see
/// `DistributedLock::holders`).
pub(crate) async fn holders(path: PathBuf) -> Result<Vec<lock_core::HolderInfo>> {
    let p = path.clone();
    blocking(move || peek(&p))
        .await?
        .map_err(|e| io_error(&path, e))
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::backend(BACKEND, format!("file task failed: {e}")))
}

pub(crate) fn io_error(path: &Path, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound | io::ErrorKind::InvalidInput => {
            Error::config(format!("lock file {}: {e}", path.display()))
        }
        _ => Error::backend(BACKEND, format!("lock file {}: {e}", path.display())),
    }
}

/// Opens the lock file at `path` (read-only, or `writable`) only if it is a regular file: not
/// through a symbolic link (in a directory others can write to, a link would point the lock,
/// and the counter's writes, at any file of the user running the lock), not a FIFO (whose open
/// would block until someone opens the other end), not a directory. Those are `InvalidInput`.
pub(crate) fn open_lock_file(path: &Path, writable: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(writable);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK only changes how a FIFO or device opens; regular files ignore it.
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let not_regular = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a symbolic link, FIFO, directory or device): refusing to use \
             it as a lock file; remove it",
        )
    };
    let file = match options.open(path) {
        Ok(f) => f,
        #[cfg(unix)]
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ELOOP | libc::EISDIR | libc::ENXIO)
            ) =>
        {
            return Err(not_regular())
        }
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    Ok(file)
}

/// Which file a handle or a path names (device and inode).
pub(crate) type FileId = (u64, u64);

#[cfg(unix)]
pub(crate) fn file_id(m: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
pub(crate) fn file_id(_m: &std::fs::Metadata) -> FileId {
    (0, 0) // no cheap identity: deletion of a held file goes undetected here
}

/// The identity of what `path` names now, `None` if nothing.
pub(crate) fn path_id(path: &Path) -> io::Result<Option<FileId>> {
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
pub(crate) struct Held {
    pub(crate) _lock: File,
    pub(crate) _writer: File,
}

impl Held {
    /// Lets go of the lock now, with its marks and its permit slot (`family`), whoever else
    /// still has a descriptor of these open files: closing alone frees them only with the last
    /// one, and a child that another thread of the process forks holds one until it execs. A
    /// released lock stayed held that long (`tests/flock_interop.rs` failed 6 times in 40 runs
    /// beside its sibling test, which spawns `flock`; never with the tests one at a time).
    /// For a release only: an abandoned lease closes its handles and leaves the lock to the
    /// duplicates it handed on (`Lease::inheritable_fds`), as a holder that dies does.
    pub(crate) fn unlock(&self) {
        #[cfg(target_os = "linux")]
        for file in [&self._writer, &self._lock] {
            let _ = crate::family::unmark(file);
        }
        let _ = fs4::FileExt::unlock(&self._lock);
    }
}

/// What one attempt on a lock file came to.
pub(crate) enum Attempt {
    /// The held handles, the new fencing token, the identity.
    Held(Held, u64, FileId),
    Busy,
    /// Holders of this many permits hold it (see `family`).
    Mismatch(u32),
}

/// Takes the lock on `path` in `mode` if it can. Shared: `flock(LOCK_SH)`, as `flock -s` takes
/// it; a permit: the same, and a permit slot (`family`). An exclusive grant with `value` (an
/// election's candidate) writes it for its token (`election`).
pub(crate) fn lock_file(path: &Path, mode: Mode, value: Option<&[u8]>) -> io::Result<Attempt> {
    ATTEMPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    loop {
        let file = match open_lock_file(path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // First use of the name (or deleted): create it, then lock it read-only.
                counter::create(path)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let locked = match mode {
            Mode::Exclusive => fs4::FileExt::try_lock(&file),
            _ => fs4::FileExt::try_lock_shared(&file),
        };
        match locked {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => return Ok(Attempt::Busy),
            Err(fs4::TryLockError::Error(e)) => return Err(e),
        }
        let id = file_id(&file.metadata()?);
        // Deleted (or replaced) between our open and our lock: we hold an orphan that nobody
        // else will ever look at. Let it go and open what the path names now.
        if path_id(path)? != Some(id) {
            continue;
        }
        // Tested on the read-only handle: a writable one closed again would wake waiters.
        #[cfg(target_os = "linux")]
        let slot = match crate::family::enter(&file, mode)? {
            crate::family::Entry::Admitted(slot) => slot,
            crate::family::Entry::Wait => return Ok(Attempt::Busy),
            crate::family::Entry::Mismatch(held) => return Ok(Attempt::Mismatch(held)),
        };
        let writer = match open_lock_file(path, true) {
            Ok(w) if file_id(&w.metadata()?) == id => w,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        #[cfg(target_os = "linux")]
        if let (Mode::Permits(k), Some(first)) = (mode, slot) {
            // Taken meanwhile by another: rare, and the closing writer wakes the waiters.
            if crate::family::take_slot(&writer, k, first)?.is_none() {
                return Ok(Attempt::Busy);
            }
        }
        // A candidate's value first, stamped with the token the bump will give (nobody else
        // bumps under the exclusive lock): a reader never sees the new token without it.
        #[cfg(target_os = "linux")]
        if let (Mode::Exclusive, Some(v)) = (mode, value) {
            let next = counter::read(&writer)?.saturating_add(1);
            crate::value::write(&writer, next, v)?;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = value; // no elections here: refused before (`Capabilities::election`)
        let token = match mode {
            Mode::Exclusive => counter::bump(&writer)?,
            #[cfg(target_os = "linux")]
            _ => counter::bump_shared(&writer)?,
            #[cfg(not(target_os = "linux"))]
            _ => counter::bump(&writer)?,
        };
        return Ok(Attempt::Held(
            Held {
                _lock: file,
                _writer: writer,
            },
            token,
            id,
        ));
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

/// Who holds `path`'s lock: one exclusive holder with the counter it stores (its token), or
/// the shared holders, counted from the kernel's table of locks (`/proc/locks`; a reader's
/// token is its own to know, the file keeps only the newest), or nobody.
pub(crate) fn peek(path: &Path) -> io::Result<Vec<lock_core::HolderInfo>> {
    let file = match open_lock_file(path, false) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    // Read even when free: a damaged counter is reported here, not only at the next grant.
    let token = FencingToken::new(counter::read(&file)?);
    let exclusive = vec![lock_core::HolderInfo::new(Some(token), None)];
    if let Some(table) = kernel_locks(&file.metadata()?) {
        if table.writers > 0 {
            return Ok(exclusive);
        }
        let shared = lock_core::HolderInfo::new(None, None);
        #[cfg(target_os = "linux")]
        if let Some((n, k)) = crate::family::permits_in(&table.ranges) {
            // Permit holders take the `flock(LOCK_SH)` too: the rest of its holders read.
            let mut all = vec![shared.with_mode(Mode::Permits(k)); n];
            let readers = table.readers.saturating_sub(n);
            all.extend(vec![shared.with_mode(Mode::Shared); readers]);
            return Ok(all);
        }
        return Ok(vec![shared.with_mode(Mode::Shared); table.readers]);
    }
    // No table to read: try the lock for an instant (dropping the file lets go at once).
    Ok(match fs4::FileExt::try_lock(&file) {
        Ok(()) => vec![],
        Err(fs4::TryLockError::WouldBlock) => match fs4::FileExt::try_lock_shared(&file) {
            Ok(()) => vec![lock_core::HolderInfo::new(None, None).with_mode(Mode::Shared)],
            Err(_) => exclusive,
        },
        Err(fs4::TryLockError::Error(e)) => return Err(e),
    })
}

/// The locks granted on one file, from the kernel's table.
#[derive(Default)]
struct KernelLocks {
    /// `flock` holders, exclusive and shared.
    writers: usize,
    readers: usize,
    /// Open-file-description byte-range locks: (write, start).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    ranges: Vec<(bool, i64)>,
}

/// The locks granted on the file `m` describes, from `/proc/locks` (lines `N: FLOCK ADVISORY
/// WRITE|READ PID MAJ:MIN:INODE 0 EOF` and `N: OFDLCK ADVISORY WRITE|READ -1 MAJ:MIN:INODE
/// START END`, waiters marked `->`); `None` where that table cannot be read.
#[cfg(target_os = "linux")]
fn kernel_locks(m: &std::fs::Metadata) -> Option<KernelLocks> {
    use std::os::unix::fs::MetadataExt;
    let table = std::fs::read_to_string("/proc/locks").ok()?;
    let (major, minor) = (
        nix::sys::stat::major(m.dev()),
        nix::sys::stat::minor(m.dev()),
    );
    let file = format!("{major:02x}:{minor:02x}:{}", m.ino());
    let mut locks = KernelLocks::default();
    for line in table.lines().filter(|l| !l.contains("->")) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(5) != Some(&file.as_str()) {
            continue;
        }
        let write = match fields.get(3) {
            Some(&"WRITE") => true,
            Some(&"READ") => false,
            _ => continue,
        };
        match fields.get(1) {
            Some(&"FLOCK") if write => locks.writers += 1,
            Some(&"FLOCK") => locks.readers += 1,
            Some(&"OFDLCK") => {
                if let Some(start) = fields.get(6).and_then(|s| s.parse().ok()) {
                    locks.ranges.push((write, start));
                }
            }
            _ => {}
        }
    }
    Some(locks)
}

#[cfg(not(target_os = "linux"))]
fn kernel_locks(_m: &std::fs::Metadata) -> Option<KernelLocks> {
    None
}

/// The directory is on a tmpfs (`$XDG_RUNTIME_DIR`, often `/tmp`), emptied at every boot with
/// the fencing counters in it: tokens then increase only while the machine runs, which is
/// `BestEffort`, not `Strict`.
#[cfg(target_os = "linux")]
pub(crate) fn forgets_at_boot(dir: &std::path::Path) -> bool {
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    statfs(dir).is_ok_and(|s| s.filesystem_type() == TMPFS_MAGIC)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn forgets_at_boot(_dir: &std::path::Path) -> bool {
    false
}
