//! Readers and permit holders on one lock file (Linux).
//!
//! Both take the file's `flock(LOCK_SH)`, which keeps writers (`LOCK_EX`) out and lets them
//! in together; what keeps readers and permit holders apart, and counts the permits, are
//! open-file-description byte-range locks on the same file (`F_OFD_*`, which never interact
//! with `flock`), far past the counter:
//!
//! - a reader read-locks the byte [`READERS_AT`];
//! - a holder of one of `k` permits read-locks the byte `COUNTS_AT + k`, and write-locks one
//!   slot byte `SLOTS_AT + i`, `i < k`: at most `k` slots, at most `k` holders.
//!
//! Each marks its own class first and then tests (`F_OFD_GETLK`) for the other: of a reader
//! and a permit holder that enter together, the later test sees the earlier mark, so they
//! never both hold (one of them may back off needlessly when both test at once; it retries).
//! A permit holder that sees another count marked is refused: one name, one limit. The kernel
//! drops every mark with its file, also when the holder dies.

use std::fs::File;
use std::io;

use lock_core::Mode;
use nix::fcntl::{fcntl, FcntlArg};

/// The readers' byte. The counter's writers lock `1 << 40` (`counter::bump_shared`).
const READERS_AT: libc::off_t = 2 << 40;
/// `COUNTS_AT + k`: marked by the holders of `k` permits.
const COUNTS_AT: libc::off_t = 3 << 40;
/// `SLOTS_AT + i`: held by the holder of permit slot `i`.
const SLOTS_AT: libc::off_t = 5 << 40;

/// Whether a reader or a permit holder may join a file whose `flock(LOCK_SH)` it holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Its class is marked and no other class holds (for permits: slot `i` looked free).
    Admitted(Option<u32>),
    /// The other class holds, or every permit slot is taken.
    Wait,
    /// Holders of this many permits hold the name.
    Mismatch(u32),
}

fn range(kind: libc::c_int, start: libc::off_t, len: libc::off_t) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    }
}

/// Read-locks `at` on `file`'s open file description, without waiting.
fn mark(file: &File, at: libc::off_t) -> io::Result<()> {
    let r = range(libc::F_RDLCK, at, 1);
    fcntl(file, FcntlArg::F_OFD_SETLK(&r))
        .map(drop)
        .map_err(io::Error::from)
}

/// The first lock of another open file description that a write lock on `len` bytes from
/// `start` would conflict with: its start.
fn other_at(file: &File, start: libc::off_t, len: libc::off_t) -> io::Result<Option<libc::off_t>> {
    if len <= 0 {
        return Ok(None);
    }
    let mut probe = range(libc::F_WRLCK, start, len);
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe)).map_err(io::Error::from)?;
    Ok((probe.l_type != libc::F_UNLCK as libc::c_short).then_some(probe.l_start))
}

/// Drops every mark and slot that `file`'s open file description holds, now, whoever else
/// still has a descriptor of it.
pub(crate) fn unmark(file: &File) -> io::Result<()> {
    let all = range(libc::F_UNLCK, 0, 0);
    fcntl(file, FcntlArg::F_OFD_SETLK(&all))
        .map(drop)
        .map_err(io::Error::from)
}

/// Marks `mode`'s class on `file` (the handle holding the `flock`) and tests for the others.
/// The marks stay until `file` is closed.
pub(crate) fn enter(file: &File, mode: Mode) -> io::Result<Entry> {
    let all_counts = libc::off_t::from(u32::MAX) + 1;
    match mode {
        Mode::Exclusive => Ok(Entry::Admitted(None)),
        Mode::Shared => {
            mark(file, READERS_AT)?;
            Ok(match other_at(file, COUNTS_AT, all_counts)? {
                Some(_) => Entry::Wait,
                None => Entry::Admitted(None),
            })
        }
        Mode::Permits(k) => {
            let own = COUNTS_AT + libc::off_t::from(k);
            mark(file, own)?;
            if other_at(file, READERS_AT, 1)?.is_some() {
                return Ok(Entry::Wait);
            }
            let below = other_at(file, COUNTS_AT, own - COUNTS_AT)?;
            let above = other_at(file, own + 1, COUNTS_AT + all_counts - own - 1)?;
            if let Some(at) = below.or(above) {
                return Ok(Entry::Mismatch(
                    u32::try_from(at - COUNTS_AT).unwrap_or(u32::MAX),
                ));
            }
            Ok(match free_slot(file, k, 0)? {
                Some(i) => Entry::Admitted(Some(i)),
                None => Entry::Wait,
            })
        }
        _ => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{mode:?} is not a mode of this driver"),
        )),
    }
}

/// The first slot from `from` below `k` that no other holder has, tested without taking it.
fn free_slot(file: &File, k: u32, from: u32) -> io::Result<Option<u32>> {
    for i in from..k {
        if other_at(file, SLOTS_AT + libc::off_t::from(i), 1)?.is_none() {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// Takes a permit slot on `writer` (a writable handle: a write lock needs one), starting at
/// `first`, which looked free: the slot, or `None` if all were taken meanwhile.
pub(crate) fn take_slot(writer: &File, k: u32, first: u32) -> io::Result<Option<u32>> {
    let mut from = first;
    while let Some(i) = free_slot(writer, k, from)? {
        let slot = range(libc::F_WRLCK, SLOTS_AT + libc::off_t::from(i), 1);
        match fcntl(writer, FcntlArg::F_OFD_SETLK(&slot)) {
            Ok(_) => return Ok(Some(i)),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => from = i + 1,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// From `/proc/locks` lines of one file (the `OFDLCK` ones): how many permit slots are held,
/// and the count their holders marked.
pub(crate) fn permits_in(locks: &[(bool, i64)]) -> Option<(usize, u32)> {
    let slots = locks
        .iter()
        .filter(|(write, at)| *write && *at >= SLOTS_AT)
        .count();
    let count = locks
        .iter()
        .find(|(write, at)| !*write && (COUNTS_AT..SLOTS_AT).contains(at))
        .and_then(|(_, at)| u32::try_from(at - COUNTS_AT).ok())?;
    Some((slots, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("f.lock"))
            .unwrap()
    }

    #[test]
    fn readers_and_permit_holders_exclude_each_other_and_counts_must_agree() {
        let dir = tempfile::tempdir().unwrap();
        let (r1, r2, p1, p2) = (
            file(dir.path()),
            file(dir.path()),
            file(dir.path()),
            file(dir.path()),
        );
        assert_eq!(enter(&r1, Mode::Shared).unwrap(), Entry::Admitted(None));
        assert_eq!(enter(&r2, Mode::Shared).unwrap(), Entry::Admitted(None));
        assert_eq!(enter(&p1, Mode::Permits(2)).unwrap(), Entry::Wait);
        drop((r1, r2));
        let p1 = file(dir.path());
        assert_eq!(
            enter(&p1, Mode::Permits(2)).unwrap(),
            Entry::Admitted(Some(0))
        );
        assert_eq!(take_slot(&p1, 2, 0).unwrap(), Some(0));
        assert_eq!(
            enter(&p2, Mode::Permits(2)).unwrap(),
            Entry::Admitted(Some(1))
        );
        assert_eq!(take_slot(&p2, 2, 1).unwrap(), Some(1));
        let p3 = file(dir.path());
        assert_eq!(enter(&p3, Mode::Permits(2)).unwrap(), Entry::Wait);
        let p4 = file(dir.path());
        assert_eq!(enter(&p4, Mode::Permits(3)).unwrap(), Entry::Mismatch(2));
        let r3 = file(dir.path());
        assert_eq!(enter(&r3, Mode::Shared).unwrap(), Entry::Wait);
        // Those who must wait close their handles, and their marks go with them.
        drop((r3, p3, p4, p1));
        let p5 = file(dir.path());
        assert_eq!(
            enter(&p5, Mode::Permits(2)).unwrap(),
            Entry::Admitted(Some(0))
        );
        // A slot taken between the test and the take: the next free one, or none.
        assert_eq!(take_slot(&p5, 2, 1).unwrap(), None);
        assert_eq!(take_slot(&p5, 2, 0).unwrap(), Some(0));
    }
}
