//! Loopback ports for servers a test starts itself ([`free_ports`]).
//!
//! A port the kernel hands out (`bind` to port 0) lies in its ephemeral range, where every
//! outgoing connection on the machine also takes its source port. Between a test letting go of
//! such a port and its server binding it (a JVM takes a second or two to get there), another
//! test's connection can take it, and the server exits ("Address already in use"): a cluster
//! of 3 with one member missing agrees on no leader. So the ports come from a band below the
//! ephemeral range ([`BAND`]), which the kernel never picks, handed out in turn across every
//! test process on the machine (a counter file under a lock), so two tests' clusters do not
//! meet on one port either until the band has come round.

use std::fs::OpenOptions;
use std::io::{Read, Seek, Write};
use std::net::TcpListener;
use std::ops::RangeInclusive;

/// Where [`free_ports`] takes its ports: below Linux's default ephemeral range (32768–60999),
/// clear of the fixed ports of `scripts/servers.tsv` (12xxx–16xxx, 26xxx), and such that a
/// Redis Cluster node's bus port (its port + 10,000) is clear of both too.
pub const BAND: RangeInclusive<u16> = 17000..=21999;

/// The counter file every test process on the machine shares.
const COUNTER: &str = "distlock-test-ports";

/// `n` distinct loopback ports nobody listens on, held (bound) until [`Ports::release`]:
/// start the proxies while they are held, so nothing else binds them, and release them just
/// before the servers bind them. Taken in turn from [`BAND`] (see the module's docs).
///
/// # Panics
/// If the counter file cannot be used, or the band has not `n` free ports.
#[allow(clippy::expect_used)]
pub fn free_ports(n: usize) -> Ports {
    let path = std::env::temp_dir().join(COUNTER);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .expect("the test ports' counter file");
    fs4::FileExt::lock(&file).expect("the test ports' counter file's lock");
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    let next = text.trim().parse::<u16>().unwrap_or(*BAND.start());
    let size = usize::from(BAND.end() - BAND.start()) + 1;
    let held: Vec<TcpListener> = (0..size)
        .map(|i| in_band(next, i))
        .filter_map(|port| TcpListener::bind(("127.0.0.1", port)).ok())
        .take(n)
        .collect();
    assert!(
        held.len() == n,
        "{n} free loopback ports wanted in {BAND:?}, {} found",
        held.len()
    );
    let last = (held.last())
        .and_then(|l| l.local_addr().ok())
        .map_or(next, |a| a.port());
    let after = in_band(last, 1);
    let _ = file.rewind();
    let _ = file.set_len(0);
    let _ = write!(file, "{after}");
    Ports(held)
}

/// The port `i` places after `from` in [`BAND`], coming round at its end.
fn in_band(from: u16, i: usize) -> u16 {
    let (start, size) = (
        usize::from(*BAND.start()),
        usize::from(BAND.end() - BAND.start()) + 1,
    );
    let from = usize::from(from).clamp(start, start + size - 1) - start;
    u16::try_from(start + (from + i) % size).unwrap_or(*BAND.start())
}

/// Ports held by [`free_ports`].
#[derive(Debug)]
pub struct Ports(Vec<TcpListener>);

impl Ports {
    /// The ports, in order.
    ///
    /// # Panics
    /// If a bound socket has no address (it always has).
    #[allow(clippy::expect_used)]
    pub fn numbers(&self) -> Vec<u16> {
        let port = |l: &TcpListener| l.local_addr().expect("a bound socket's address").port();
        self.0.iter().map(port).collect()
    }

    /// Lets go of them, for the servers to bind.
    pub fn release(self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The band lies below this machine's ephemeral range (where it does not, the kernel may
    /// hand a released port to an outgoing connection, and this test says so).
    #[test]
    fn the_band_is_below_the_ephemeral_range() {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let low: u32 = range.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            u32::from(*BAND.end()) + 10_000 < low,
            "the test ports' band {BAND:?} (and a cluster node's bus port, +10,000) must lie \
             below the ephemeral range starting at {low}"
        );
    }

    /// Ports come in turn: a second call starts after the first one's last, across calls
    /// (and, through the counter file, across processes), and each is in the band.
    #[test]
    fn ports_are_handed_out_in_turn() {
        let first = free_ports(3).numbers();
        let second = free_ports(3).numbers();
        for p in first.iter().chain(&second) {
            assert!(BAND.contains(p), "{p} outside {BAND:?}");
        }
        // Another process's call may come in between, and a bound port is skipped, so only
        // the order is certain: the second batch does not start where the first did.
        assert!(
            !first.contains(&second[0]),
            "{second:?} reuses {first:?}'s ports"
        );
    }

    /// The place after the band's end is its start.
    #[test]
    fn the_band_comes_round() {
        assert_eq!(in_band(*BAND.end(), 1), *BAND.start());
        assert_eq!(in_band(*BAND.start(), 0), *BAND.start());
        assert_eq!(
            in_band(1, 0),
            *BAND.start(),
            "a counter outside the band restarts it"
        );
    }
}
