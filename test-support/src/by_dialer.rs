//! One listening address whose connections are sent on by who dialed them: what lets a test
//! cut one member of a cluster off both ways when every member names each peer at one shared
//! address (etcd's advertised peer URLs). Put a [`ByDialer`] at that address and a
//! [`FaultProxy`](conformance_tests::FaultProxy) per dialer behind it, and each member's
//! connections to the peer pass through a proxy of their own.
//!
//! The dialer is the process that holds the other end of the connection: `/proc/net/tcp`
//! names the socket's inode, and `/proc/<pid>/fd` which process holds it (Linux only).

use parking_lot::Mutex;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The process ids of a cluster's members, by index (`None` until started), which a
/// [`ByDialer`] reads when a connection comes in.
pub type Pids = Arc<Mutex<Vec<Option<u32>>>>;

/// How long an incoming connection's dialer is looked for: a member's pid is recorded only
/// once `spawn` returns, and the member may dial before that.
const LOOK_FOR: Duration = Duration::from_secs(2);

/// A TCP forwarder on a free loopback port: a connection that member `j` (process `pids[j]`)
/// dials goes on to `routes[j]`; one from a process not in `pids`, or with no route, is
/// closed, so that nothing reaches the member by a way around the faults.
#[derive(Debug)]
pub struct ByDialer {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
}

impl ByDialer {
    /// Starts one, on a thread of its own (it outlives the test's runtime, and stops when
    /// dropped).
    ///
    /// # Errors
    /// If it cannot listen, or its thread cannot start.
    pub fn start(pids: Pids, routes: Vec<Option<SocketAddr>>) -> io::Result<ByDialer> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (shutdown, stop) = watch::channel(false);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("by-dialer-{}", addr.port()))
            .spawn(move || {
                rt.block_on(async move {
                    if let Ok(listener) = TcpListener::from_std(listener) {
                        accept_loop(listener, pids, routes, stop).await;
                    }
                })
            })?;
        Ok(ByDialer { addr, shutdown })
    }

    /// Where members dial it.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ByDialer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

async fn accept_loop(
    listener: TcpListener,
    pids: Pids,
    routes: Vec<Option<SocketAddr>>,
    mut stop: watch::Receiver<bool>,
) {
    let Ok(own) = listener.local_addr() else {
        return;
    };
    let routes = Arc::new(routes);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, dialer)) = accepted else { continue };
                let (pids, routes, mut stop) = (pids.clone(), routes.clone(), stop.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = forward(inbound, dialer, own, &pids, &routes) => {}
                        _ = stop.changed() => {}
                    }
                });
            }
            _ = stop.changed() => return,
        }
    }
}

/// Sends `inbound` (from `dialer` to `own`) on by its dialer's route, or closes it.
async fn forward(
    mut inbound: TcpStream,
    dialer: SocketAddr,
    own: SocketAddr,
    pids: &Pids,
    routes: &[Option<SocketAddr>],
) {
    let deadline = tokio::time::Instant::now() + LOOK_FOR;
    let member = loop {
        let pids = pids.lock().clone();
        let found = tokio::task::spawn_blocking(move || owner(dialer, own, &pids))
            .await
            .ok()
            .flatten();
        if found.is_some() || tokio::time::Instant::now() >= deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let Some(to) = member.and_then(|m| routes.get(m).copied().flatten()) else {
        return;
    };
    let Ok(mut outbound) = TcpStream::connect(to).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
}

/// The index in `pids` of the process that holds the socket dialed from `dialer` to `own`.
fn owner(dialer: SocketAddr, own: SocketAddr, pids: &[Option<u32>]) -> Option<usize> {
    let socket = format!("socket:[{}]", inode(dialer, own)?);
    pids.iter().position(|pid| {
        pid.is_some_and(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == socket.as_str())
                })
            })
        })
    })
}

/// The inode of the TCP socket whose local address is `local` and remote `remote` (an IPv4
/// socket, or an IPv6 one with IPv4-mapped addresses).
fn inode(local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    [("/proc/net/tcp", false), ("/proc/net/tcp6", true)]
        .into_iter()
        .find_map(|(table, v6)| {
            let (local, remote) = (proc_net(local, v6)?, proc_net(remote, v6)?);
            let table = std::fs::read_to_string(table).ok()?;
            table.lines().skip(1).find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let matches = fields.get(1) == Some(&local.as_str())
                    && fields.get(2) == Some(&remote.as_str());
                matches.then(|| fields.get(9)?.parse().ok()).flatten()
            })
        })
}

/// IPv4 `addr` as `/proc/net/tcp` prints it (or, `v6`, `/proc/net/tcp6` its IPv4-mapped form):
/// the address as 32-bit words in the machine's byte order, then the port, in upper-case hex.
fn proc_net(addr: SocketAddr, v6: bool) -> Option<String> {
    let SocketAddr::V4(a) = addr else {
        return None;
    };
    let word = |bytes: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(bytes));
    let mapped = if v6 {
        format!("{0}{0}{1}", word([0; 4]), word([0, 0, 0xff, 0xff]))
    } else {
        String::new()
    };
    Some(format!(
        "{mapped}{}:{:04X}",
        word(a.ip().octets()),
        a.port()
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the failure report
    use super::*;

    #[test]
    #[cfg(target_endian = "little")]
    fn proc_net_prints_loopback_as_the_kernel_does() {
        let addr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(proc_net(addr, false).as_deref(), Some("0100007F:1F90"));
        assert_eq!(
            proc_net(addr, true).as_deref(),
            Some("0000000000000000FFFF00000100007F:1F90")
        );
    }

    /// This process dials a `ByDialer` whose routes are a decoy for another process (pid 1)
    /// and the target for this one: the connection reaches the target, the decoy nothing.
    /// Then a dialer that is no member, and a member with no route: both connections are
    /// closed without reaching anyone.
    #[test]
    fn a_connection_goes_on_by_the_process_that_dialed_it() {
        crate::serial(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let decoy = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let (to_target, to_decoy) = (target.local_addr().ok(), decoy.local_addr().ok());
            let (me, other) = (Some(std::process::id()), Some(1));
            let routed = ByDialer::start(
                Arc::new(Mutex::new(vec![other, me])),
                vec![to_decoy, to_target],
            )
            .unwrap();
            let mut a = TcpStream::connect(routed.addr()).await.unwrap();
            let (mut b, _) = tokio::time::timeout(Duration::from_secs(5), target.accept())
                .await
                .expect("the dialer's route was not taken within 5 s")
                .unwrap();
            a.write_all(b"ping").await.unwrap();
            let mut got = [0; 4];
            b.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping");

            for (why, pids, routes) in [
                ("from no member", vec![other], vec![to_decoy]),
                ("with no route", vec![me], vec![None]),
            ] {
                let dropped = ByDialer::start(Arc::new(Mutex::new(pids)), routes).unwrap();
                let mut c = TcpStream::connect(dropped.addr()).await.unwrap();
                let read = tokio::time::timeout(LOOK_FOR * 2, c.read(&mut got))
                    .await
                    .unwrap_or_else(|_| panic!("a connection {why} was not closed"));
                assert!(
                    matches!(read, Ok(0) | Err(_)),
                    "a connection {why}: {read:?}"
                );
            }
            let reached = tokio::time::timeout(Duration::from_millis(200), decoy.accept()).await;
            assert!(
                reached.is_err(),
                "a connection reached another dialer's route"
            );
        });
    }
}
