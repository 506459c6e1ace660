//! A plain connection through a [`FaultProxy`](crate::FaultProxy), read by a thread of its
//! own: when this process could first see a cut (see [`FaultProxy::witness`](crate::FaultProxy::witness)).

use std::io::{self, Read};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long a [`Witness`] waits to be held by its proxy, and then for the close.
const WAIT: Duration = Duration::from_secs(1);

/// A plain connection through a [`FaultProxy`](crate::FaultProxy) that tells when this
/// process saw it closed. Its thread ends within two seconds in any case.
#[derive(Debug)]
pub struct Witness {
    armed: oneshot::Receiver<()>,
    seen: oneshot::Receiver<Instant>,
}

impl Witness {
    /// Connects to `proxy` on a thread of its own; armed once `held` says the proxy holds
    /// the connection (by its client address): a cut before the proxy's accept misses it.
    pub(crate) fn through(
        proxy: SocketAddr,
        held: impl Fn(SocketAddr) -> bool + Send + 'static,
    ) -> Witness {
        let (armed_tx, armed) = oneshot::channel();
        let (seen_tx, seen) = oneshot::channel();
        let watch = move || {
            let Ok(mut socket) = std::net::TcpStream::connect(proxy) else {
                return;
            };
            let Ok(me) = socket.local_addr() else {
                return;
            };
            let give_up = Instant::now() + WAIT;
            while !held(me) {
                if Instant::now() > give_up {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if armed_tx.send(()).is_err() || socket.set_read_timeout(Some(WAIT)).is_err() {
                return;
            }
            if closed(&mut socket) {
                let _ = seen_tx.send(Instant::now());
            }
        };
        let spawned = std::thread::Builder::new()
            .name(format!("cut-witness-{}", proxy.port()))
            .spawn(watch);
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "fault proxy: no witness thread");
        }
        Witness { armed, seen }
    }

    /// A witness of a link without sockets (the negative controls' simulated wire): armed at
    /// once; `seen` resolves with the instant the wire reports it seen (see its `witness`).
    pub(crate) fn of_parts(seen: oneshot::Receiver<Instant>) -> Witness {
        let (armed_tx, armed) = oneshot::channel();
        let _ = armed_tx.send(());
        Witness { armed, seen }
    }

    /// Whether the proxy holds the connection, so a cut from now on closes it (`false`: it
    /// could not connect, or was not held within a second).
    pub async fn armed(&mut self) -> bool {
        (&mut self.armed).await.is_ok()
    }

    /// When its thread saw the connection close: `None` if it did not within a second of
    /// being armed (no cut came).
    pub async fn seen(self) -> Option<Instant> {
        self.seen.await.ok()
    }
}

/// Reads `socket` until it closes (`true`) or its read timeout passes (`false`).
fn closed(socket: &mut std::net::TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // a server's greeting
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true, // a reset is a close too
        }
    }
}
