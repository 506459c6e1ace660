//! The fencing counter stored in each lock file, written so that no crash can lower it.
//!
//! The file holds two fixed-size slots, `<20-digit value> <8-hex checksum>\n` each. A bump
//! writes the new value into the slot the last value is *not* in, in place (no truncation),
//! and flushes it before the grant returns. A crash part-way through damages at most that one
//! slot, whose checksum then fails; the other still holds the last granted value. The counter
//! is the largest valid slot. A file with no valid slot (emptied, or not written by this
//! driver) is an error, never a counter of 0.
//!
//! The file cannot be replaced by rename (write-to-temp, rename): its inode is what holders
//! lock. So a new lock file is made complete under a temporary name and hard-linked into
//! place, and the directory flushed, before anyone can lock it: the lock path never names an
//! empty file.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes per slot: 20 digits, a space, 8 hex digits, a newline.
const SLOT: usize = 30;

/// FNV-1a (32 bit): enough to tell a torn slot (or value) from a written one.
pub(crate) fn checksum(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

fn slot(value: u64) -> String {
    let digits = format!("{value:020}");
    format!("{digits} {:08x}\n", checksum(digits.as_bytes()))
}

fn parse_slot(bytes: &[u8]) -> Option<u64> {
    let (digits, rest) = (bytes.get(..20)?, bytes.get(20..SLOT)?);
    if rest.first() != Some(&b' ') || rest.last() != Some(&b'\n') {
        return None;
    }
    let sum = u32::from_str_radix(std::str::from_utf8(rest.get(1..9)?).ok()?, 16).ok()?;
    if sum != checksum(digits) || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Where a counter's value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// The two-slot layout.
    Slots,
    /// A bare decimal line, as earlier versions of this driver wrote it; converted on the
    /// next bump.
    Legacy,
}

/// The counter in `bytes` (the whole file).
fn decode(bytes: &[u8]) -> io::Result<(u64, Layout)> {
    let slots = [bytes.get(..SLOT), bytes.get(SLOT..2 * SLOT)];
    if let Some(v) = slots.iter().flatten().filter_map(|s| parse_slot(s)).max() {
        return Ok((v, Layout::Slots));
    }
    let text = std::str::from_utf8(bytes).unwrap_or("");
    let line = text.strip_suffix('\n').unwrap_or(text);
    if !line.is_empty() && line.len() <= 20 && line.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(v) = line.parse() {
            return Ok((v, Layout::Legacy));
        }
    }
    let shown: String = String::from_utf8_lossy(bytes).chars().take(40).collect();
    Err(invalid(if bytes.is_empty() {
        "the fencing counter is empty (a crash of an older version while writing it, or an \
         outside truncation): refusing to restart tokens at 1; restore it or delete the file"
            .to_string()
    } else {
        format!(
            "holds {shown:?}, not a fencing counter: refusing to restart tokens at 1; restore \
             it or delete the file"
        )
    }))
}

fn read_all(mut file: &File) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(2 * SLOT);
    file.seek(SeekFrom::Start(0))?;
    file.take(4096).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The counter's current value (the last token granted; 0 for a new file).
pub(crate) fn read(file: &File) -> io::Result<u64> {
    decode(&read_all(file)?).map(|(v, _)| v)
}

/// Increments the counter in the locked, writable `file` and flushes it; returns the new
/// value, the grant's token.
pub(crate) fn bump(mut file: &File) -> io::Result<u64> {
    let (last, layout) = decode(&read_all(file)?)?;
    let next = last
        .checked_add(1)
        .ok_or_else(|| invalid("fencing counter exhausted".into()))?;
    let index = usize::from(next % 2 == 1);
    match layout {
        Layout::Slots => {
            file.seek(SeekFrom::Start((index * SLOT) as u64))?;
            file.write_all(slot(next).as_bytes())?;
        }
        Layout::Legacy => {
            // One write of both slots: torn, it leaves no valid slot and no clean legacy
            // line, which is an error on the next read, not a lower counter.
            let mut both = [slot(last), slot(last)];
            both[index] = slot(next);
            file.seek(SeekFrom::Start(0))?;
            file.write_all(both.concat().as_bytes())?;
        }
    }
    file.sync_data()?;
    Ok(next)
}

/// [`bump`] for a holder of the shared lock, beside other shared holders who may bump at the
/// same moment: serialised by an exclusive lock on a byte past the counter's slots (an
/// open-file-description lock, which no `flock` of the file touches and the kernel drops with
/// the file), and by this process's own mutex.
#[cfg(target_os = "linux")]
pub(crate) fn bump_shared(file: &File) -> io::Result<u64> {
    use nix::fcntl::{fcntl, FcntlArg};
    static IN_PROCESS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = IN_PROCESS.lock();
    let range = |kind: libc::c_int| libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: GUARD_AT,
        l_len: 1,
        l_pid: 0,
    };
    let locked = range(libc::F_WRLCK);
    fcntl(file, FcntlArg::F_OFD_SETLKW(&locked)).map_err(io::Error::from)?;
    let bumped = bump(file);
    let unlocked = range(libc::F_UNLCK);
    // Closing the file drops the range lock too; an error here leaves it to that.
    let _ = fcntl(file, FcntlArg::F_OFD_SETLK(&unlocked));
    bumped
}

/// The byte the counter's writers lock ([`bump_shared`]): far past the two slots.
#[cfg(target_os = "linux")]
const GUARD_AT: libc::off_t = 1 << 40;

/// Makes `path` a lock file with a counter of 0, atomically: complete and flushed under a
/// temporary name, linked into place (never over an existing file), directory flushed.
/// An existing file is left alone.
pub(crate) fn create(path: &Path) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let (Some(dir), Some(file_name)) = (path.parent(), path.file_name()) else {
        return Err(invalid(format!("{} is not a file path", path.display())));
    };
    // Dot-prefixed and ending in `.tmp`: no lock file (`<name>.lock`) can have this name.
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        file_name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(format!("{}{}", slot(0), slot(0)).as_bytes())?;
        f.sync_all()?;
        drop(f);
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => sync_dir(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(()) // directories cannot be opened for flushing here
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A path in a fresh directory that goes when the returned guard drops.
    fn temp(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::Builder::new()
            .prefix("lock-file-counter-")
            .tempdir()
            .unwrap();
        let p = dir.path().join(name);
        (dir, p)
    }

    fn rw(path: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    #[test]
    fn a_new_file_counts_from_one() {
        let (_dir, p) = temp("new.lock");
        create(&p).unwrap();
        let f = rw(&p);
        assert_eq!(read(&f).unwrap(), 0);
        assert_eq!((bump(&f).unwrap(), bump(&f).unwrap()), (1, 2));
        assert_eq!(read(&f).unwrap(), 2);
        create(&p).unwrap(); // an existing file is left alone
        assert_eq!(read(&rw(&p)).unwrap(), 2);
    }

    /// The crash the old truncate-then-write could leave: an empty counter is an error.
    #[test]
    fn an_empty_or_foreign_counter_is_an_error_not_zero() {
        for content in ["", "\n", "hello\n", "-3\n", "99999999999999999999999\n"] {
            let (_dir, p) = temp("bad.lock");
            std::fs::write(&p, content).unwrap();
            let f = rw(&p);
            assert!(read(&f).is_err(), "{content:?} read as a counter");
            assert!(bump(&f).is_err(), "{content:?} bumped");
            assert_eq!(
                std::fs::read_to_string(&p).unwrap(),
                content,
                "file changed"
            );
        }
    }

    #[test]
    fn a_legacy_counter_is_converted() {
        let (_dir, p) = temp("legacy.lock");
        std::fs::write(&p, "41\n").unwrap();
        let f = rw(&p);
        assert_eq!(bump(&f).unwrap(), 42);
        assert_eq!(bump(&f).unwrap(), 43);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 2 * SLOT as u64);
    }

    /// Every crash point of a bump — any subset of the new slot's bytes reached the disk,
    /// from none to all — leaves a counter at least the last granted value.
    #[test]
    fn no_crash_point_lowers_the_counter() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for last in [0u64, 1, 8, 9, 10, 99, 199, 999_999, u64::MAX - 2] {
            let before = if last == 0 {
                format!("{}{}", slot(0), slot(0))
            } else {
                let mut s = [slot(last - 1), slot(last - 1)];
                s[usize::from(last % 2 == 1)] = slot(last);
                s.concat()
            };
            let next = last + 1;
            let index = usize::from(next % 2 == 1);
            let new = slot(next).into_bytes();
            for trial in 0..2000u32 {
                let mut bytes = before.clone().into_bytes();
                for (i, b) in new.iter().enumerate() {
                    // Prefixes first (a write cut short), then random subsets.
                    let reached = if trial <= SLOT as u32 {
                        (i as u32) < trial
                    } else {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng % 2 == 0
                    };
                    if reached {
                        bytes[index * SLOT + i] = *b;
                    }
                }
                let (v, _) = decode(&bytes).unwrap();
                assert!(
                    v == last || v == next,
                    "crash state {bytes:?} reads {v}, last {last}"
                );
            }
        }
    }
}
