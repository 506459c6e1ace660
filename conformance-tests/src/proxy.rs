//! A loopback TCP proxy that injects network faults between a client and a real server.

use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::proxy_mode::{until_due, until_open, Mode};
use crate::witness::Witness;
use tokio::time::Instant;

struct Shared {
    /// Where new connections go (see [`FaultProxy::redirect`]).
    upstream: watch::Sender<SocketAddr>,
    mode: watch::Sender<Mode>,
    cuts: watch::Sender<u64>,
    shutdown: watch::Sender<bool>,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    accepted: AtomicU64,
    /// The client addresses of the connections open now (see [`FaultProxy::witness`]).
    open: Mutex<HashSet<SocketAddr>>,
    /// Those of them that are witnesses, closed last at a cut.
    witnesses: Mutex<HashSet<SocketAddr>>,
    /// See [`FaultProxy::lose_replies`]: the bytes to look for and how many more times.
    trap: Mutex<Option<(Vec<u8>, u32)>>,
    /// See [`FaultProxy::server_keepalive`].
    keepalive: Mutex<Option<Duration>>,
    /// When the latest client chunks arrived, oldest first, [`SENT_KEPT`] at most (see
    /// [`FaultProxy::first_sent_since`]).
    sent: Mutex<VecDeque<std::time::Instant>>,
}

impl Shared {
    /// Whether this client chunk springs the trap (and counts it down).
    fn springs_trap(&self, chunk: &[u8]) -> bool {
        let mut trap = self.trap.lock();
        let Some((pattern, left)) = trap.as_mut() else {
            return false;
        };
        if pattern.is_empty()
            || !chunk
                .windows(pattern.len())
                .any(|w| w == pattern.as_slice())
        {
            return false;
        }
        *left -= 1;
        if *left == 0 {
            *trap = None;
        }
        true
    }
}

/// How many client chunks' arrival times a proxy keeps.
const SENT_KEPT: usize = 4096;

/// How long a trapped connection stays open after its request was forwarded: long enough for a
/// loopback server to apply the request, so the client loses a reply to something that happened.
const TRAP_LINGER: Duration = Duration::from_millis(100);

/// A TCP proxy on `127.0.0.1` in front of one upstream server, with faults switched at run time.
///
/// Point a client at [`FaultProxy::addr`] instead of the server. The proxy runs on its own
/// thread, so it outlives the runtime of the test that created it and stops when dropped.
///
/// ```no_run
/// use std::time::Duration;
/// use conformance_tests::FaultProxy;
/// let proxy = FaultProxy::start("127.0.0.1:6379".parse()?)?;
/// // connect a driver to proxy.addr() ...
/// proxy.blackhole();               // partition: nothing flows, connections stay open
/// proxy.heal();                    // held-back bytes flow again
/// proxy.delay(Duration::from_millis(200));
/// proxy.cut();                     // every open connection is closed
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free loopback port.
    pub fn start(upstream: SocketAddr) -> io::Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream: watch::channel(upstream).0,
            mode: watch::channel(Mode::Pass).0,
            cuts: watch::channel(0).0,
            shutdown: watch::channel(false).0,
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            open: Mutex::new(HashSet::new()),
            witnesses: Mutex::new(HashSet::new()),
            trap: Mutex::new(None),
            keepalive: Mutex::new(None),
            sent: Mutex::new(VecDeque::new()),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let s = shared.clone();
        // Subscribed here, not in the thread: a drop right after start must still stop it.
        let shutdown = shared.shutdown.subscribe();
        std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                rt.block_on(async move {
                    match TcpListener::from_std(std_listener) {
                        Ok(listener) => accept_loop(listener, s, shutdown).await,
                        Err(e) => tracing::error!(error = %e, "fault proxy cannot listen"),
                    }
                })
            })?;
        Ok(FaultProxy { addr, shared })
    }

    /// A proxy in front of each of `servers` (`host:port` strings), each delaying traffic by
    /// `delay` to begin with: what [`Harness::faulty_client`](crate::Harness::faulty_client)
    /// typically puts between its client and the backend.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let proxies = conformance_tests::FaultProxy::in_front_of(["127.0.0.1:2379"], Duration::ZERO)?;
    /// let endpoints: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    /// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    /// ```
    pub fn in_front_of<S: AsRef<str>>(
        servers: impl IntoIterator<Item = S>,
        delay: Duration,
    ) -> Result<Vec<FaultProxy>, crate::BoxError> {
        let mut proxies = Vec::new();
        for server in servers {
            let addr = server.as_ref();
            let upstream = addr
                .parse()
                .map_err(|e| format!("fault proxy upstream {addr:?}: {e}"))?;
            let proxy = FaultProxy::start(upstream)?;
            proxy.delay(delay);
            proxies.push(proxy);
        }
        Ok(proxies)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server behind the proxy (for new connections).
    pub fn upstream(&self) -> SocketAddr {
        *self.shared.upstream.borrow()
    }

    /// Sends new connections to another server from now on; open ones stay where they are
    /// (follow with [`cut`](Self::cut) to move every client). What a failover behind one
    /// address, or a name that now resolves elsewhere, looks like to a client.
    pub fn redirect(&self, upstream: SocketAddr) {
        self.shared.upstream.send_replace(upstream);
    }

    /// Closes every open connection at once (clients see the connection drop); new connections
    /// are still accepted.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Partition: nothing is forwarded in either direction and new connections reach nobody,
    /// but every connection stays open. Bytes sent meanwhile are held back, like TCP
    /// retransmissions, and flow after [`heal`](Self::heal).
    pub fn blackhole(&self) {
        self.shared.mode.send_replace(Mode::Blackhole);
    }

    /// In a partition, what the server's TCP keepalive does to a client it no longer hears:
    /// each connection's server side is closed once `after` has passed since the last bytes
    /// that reached the server (the client side stays open and silent, as a partition leaves
    /// it; it is closed when the partition heals, as the server's reset would). A userspace
    /// proxy otherwise hides a partition from the server: its own socket answers the server's
    /// keepalive probes. For backends whose lock is the connection's session (PostgreSQL);
    /// give the earliest moment the real server could give up.
    pub fn server_keepalive(&self, after: Option<Duration>) {
        {
            let mut k = self.shared.keepalive.lock();
            *k = after;
        }
    }

    /// Forwards data `d` late, in both directions: a link's latency (each chunk leaves `d`
    /// after it arrived, however many are on their way; a new connection opens `d` late).
    pub fn delay(&self, d: Duration) {
        self.shared.mode.send_replace(Mode::Delay(d));
    }

    /// Back to plain forwarding.
    pub fn heal(&self) {
        self.shared.mode.send_replace(Mode::Pass);
    }

    /// The next `times` client requests that contain `pattern` reach the server, but their
    /// replies never come back: the proxy swallows everything the server sends on that
    /// connection from then on and closes it shortly after (100 ms, so the server has applied
    /// the request). What a connection lost between a request and its reply looks like — the
    /// client cannot tell whether the request took effect. Matching is on the bytes of one
    /// read, so pick a pattern that a single request carries whole (a path, a key).
    ///
    /// ```no_run
    /// # use conformance_tests::FaultProxy;
    /// # let proxy = FaultProxy::start("127.0.0.1:2181".parse()?)?;
    /// proxy.lose_replies(b"/distlock/my-lock", 2); // e.g. a create, then the lookup after it
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lose_replies(&self, pattern: &[u8], times: u32) {
        {
            let mut trap = self.shared.trap.lock();
            *trap = (times > 0).then(|| (pattern.to_vec(), times));
        }
    }

    /// Whether requests armed by [`lose_replies`](Self::lose_replies) are still to come.
    pub fn trap_armed(&self) -> bool {
        self.shared.trap.lock().is_some()
    }

    /// When the first client chunk that arrived at or after `since` arrived (read by the
    /// proxy, before any delay), if one did. Only the latest 4,096 are kept: after more than
    /// that, the earliest kept one (a later bound, never an earlier).
    ///
    /// ```no_run
    /// # let proxy = conformance_tests::FaultProxy::start("127.0.0.1:6379".parse()?)?;
    /// let before = std::time::Instant::now();
    /// // ... a request through the proxy ...
    /// let sent = proxy.first_sent_since(before); // Some(t), before <= t
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn first_sent_since(&self, since: std::time::Instant) -> Option<std::time::Instant> {
        let sent = self.shared.sent.lock();
        let from = sent.partition_point(|t| *t < since);
        sent.get(from).copied()
    }

    /// Bytes forwarded from clients to the server so far.
    pub fn bytes_to_upstream(&self) -> u64 {
        self.shared.bytes_up.load(Ordering::Relaxed)
    }

    /// Bytes forwarded from the server to clients so far.
    pub fn bytes_to_clients(&self) -> u64 {
        self.shared.bytes_down.load(Ordering::Relaxed)
    }

    /// Connections open now, witnesses not counted.
    pub fn open_connections(&self) -> usize {
        let witnesses = self.shared.witnesses.lock().clone();
        let open = self.shared.open.lock();
        open.iter().filter(|a| !witnesses.contains(a)).count()
    }

    /// Connections accepted so far (reconnects show up here).
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// A plain connection through this proxy, read by a thread of its own, which the proxy
    /// closes after every other connection at a cut: when this process could first see the
    /// whole of the next [`cut`](Self::cut), whatever its other threads are doing. A
    /// cut's notice by a client of the proxy is late by this much before any work of that
    /// client's own (the machine's load: up to 112 ms measured with eight test lanes on two
    /// cores). Wait for [`Witness::armed`] before the cut.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// # let proxy = conformance_tests::FaultProxy::start("127.0.0.1:5432".parse()?)?;
    /// let mut witness = proxy.witness();
    /// if witness.armed().await {
    ///     proxy.cut();
    ///     let seen = witness.seen().await; // None: it saw nothing within a second
    /// }
    /// # Ok(()) }
    /// ```
    pub fn witness(&self) -> Witness {
        let shared = self.shared.clone();
        Witness::through(self.addr, move |me| {
            let held = shared.open.lock().contains(&me);
            if held {
                shared.witnesses.lock().insert(me);
            }
            held
        })
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream())
            .field("mode", &*self.shared.mode.borrow())
            .finish()
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    if *shutdown.borrow_and_update() {
        return;
    }
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, peer)) = accepted {
                    shared.accepted.fetch_add(1, Ordering::Relaxed);
                    // Subscribed before the task starts, so a cut right after accept counts.
                    let cuts = shared.cuts.subscribe();
                    let stop = shared.shutdown.subscribe();
                    let upstream = *shared.upstream.borrow();
                    shared.open.lock().insert(peer);
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        connection(client, peer, upstream, &shared, cuts, stop).await;
                        shared.open.lock().remove(&peer);
                        shared.witnesses.lock().remove(&peer);
                    });
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

async fn connection(
    client: TcpStream,
    peer: SocketAddr,
    upstream: SocketAddr,
    shared: &Shared,
    mut cuts: watch::Receiver<u64>,
    mut shutdown: watch::Receiver<bool>,
) {
    let trapped = Trapped::default();
    let work = async {
        // A partitioned network does not let the connection reach the server either, and a
        // slow one delays its opening.
        until_due(&mut shared.mode.subscribe(), Instant::now()).await?;
        let server = TcpStream::connect(upstream).await.ok()?;
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        let heard = Heard::default();
        let up = pump(cr, sw, Direction::Up(shared), &trapped, &heard);
        let down = pump(sr, cw, Direction::Down(shared), &trapped, &heard);
        tokio::join!(up, down, reaper(shared, &heard));
        Some(())
    };
    let linger = async {
        trapped.notified().await;
        tokio::time::sleep(TRAP_LINGER).await;
    };
    // Biased: a cut that comes with a heal (held-back bytes released at the same moment) must
    // drop those bytes, never let them through.
    let cut = async {
        let _ = cuts.changed().await;
        if shared.witnesses.lock().contains(&peer) {
            after_the_others(shared).await;
        }
    };
    tokio::select! {
        biased;
        _ = cut => {}
        _ = shutdown.changed() => {}
        _ = linger => {}
        _ = work => {}
    }
}

/// A witness's connection closes last at a cut: once every other connection open at the cut
/// was closed (or 100 ms passed), so its close tells when the whole cut was made. A thread
/// descheduled halfway through the cut's closes would otherwise let the witness see it before
/// the server or the client of another connection could (a loaded two-core machine).
async fn after_the_others(shared: &Shared) {
    let witnesses = shared.witnesses.lock().clone();
    let others: Vec<SocketAddr> = (shared.open.lock().iter())
        .filter(|a| !witnesses.contains(a))
        .copied()
        .collect();
    let give_up = std::time::Instant::now() + Duration::from_millis(100);
    while std::time::Instant::now() < give_up && {
        let open = shared.open.lock();
        others.iter().any(|a| open.contains(a))
    } {
        // The other connections' tasks were woken by the same cut, on this thread's runtime.
        tokio::task::yield_now().await;
    }
}

/// When the server last heard from one connection's client, and whether the server has given
/// up on it (see [`FaultProxy::server_keepalive`]).
struct Heard {
    last: Mutex<std::time::Instant>,
    reaped: watch::Sender<bool>,
}

impl Default for Heard {
    fn default() -> Self {
        Heard {
            last: Mutex::new(std::time::Instant::now()),
            reaped: watch::channel(false).0,
        }
    }
}

impl Heard {
    fn now(&self) {
        {
            let mut last = self.last.lock();
            *last = std::time::Instant::now();
        }
    }
}

/// Gives the connection up on the server's behalf once it has heard nothing for the keepalive
/// time during a partition. Returns when that happened or the connection ended.
async fn reaper(shared: &Shared, heard: &Heard) {
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Both pumps have ended: so has the connection.
        if heard.reaped.receiver_count() == 0 {
            return;
        }
        let after = *shared.keepalive.lock();
        let silent = heard.last.lock().elapsed();
        let partitioned = *shared.mode.borrow() == Mode::Blackhole;
        if let Some(after) = after.filter(|a| partitioned && silent >= *a) {
            tracing::debug!(
                ?after,
                "fault proxy: the server gives up on a silent client"
            );
            heard.reaped.send_replace(true);
            return;
        }
    }
}

/// One connection's trap state: once sprung, nothing more reaches the client.
#[derive(Default)]
struct Trapped {
    sprung: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Trapped {
    fn spring(&self) {
        self.sprung.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }

    fn is_sprung(&self) -> bool {
        self.sprung.load(Ordering::SeqCst)
    }

    async fn notified(&self) {
        if !self.is_sprung() {
            self.notify.notified().await;
        }
    }
}

/// Which way a pump forwards; the shared state counts its bytes.
enum Direction<'a> {
    Up(&'a Shared),
    Down(&'a Shared),
}

/// Forwards one direction of a connection until either side closes, the server gives up on
/// the client ([`FaultProxy::server_keepalive`]), or the proxy stops.
///
/// A delay is a link's latency: every chunk leaves the delay after it arrived, however many
/// are on their way (pipelined, as on a wire), never sooner because an earlier one was due.
/// A blackhole holds the chunk it has read, and TCP's flow control the rest.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction<'_>,
    trapped: &Trapped,
    heard: &Heard,
) {
    let (Direction::Up(shared) | Direction::Down(shared)) = direction;
    let mut reaped = heard.reaped.subscribe();
    let gave_up = {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        let read = async {
            let mut mode = shared.mode.subscribe();
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = from.read(&mut buf).await {
                let arrived = Instant::now();
                if let Direction::Up(shared) = direction {
                    let mut sent = shared.sent.lock();
                    if sent.len() == SENT_KEPT {
                        sent.pop_front();
                    }
                    sent.push_back(arrived.into_std());
                }
                if until_open(&mut mode).await.is_none()
                    || tx.send((arrived, buf[..n].to_vec())).is_err()
                {
                    break;
                }
            }
            drop(tx); // the writer sends what is queued, then closes
        };
        let write = async {
            let mut mode = shared.mode.subscribe();
            while let Some((arrived, chunk)) = rx.recv().await {
                if until_due(&mut mode, arrived).await.is_none() {
                    return;
                }
                let counter = match direction {
                    Direction::Up(shared) => {
                        // Sprung before the request is forwarded, so no part of its reply can
                        // slip by.
                        if !trapped.is_sprung() && shared.springs_trap(&chunk) {
                            trapped.spring();
                        }
                        &shared.bytes_up
                    }
                    Direction::Down(_) if trapped.is_sprung() => continue,
                    Direction::Down(shared) => &shared.bytes_down,
                };
                if to.write_all(&chunk).await.is_err() {
                    return;
                }
                if matches!(direction, Direction::Up(_)) {
                    heard.now();
                }
                counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            let _ = to.shutdown().await;
        };
        let forward = async {
            tokio::pin!(write);
            tokio::select! {
                () = read => write.await,
                () = &mut write => {} // the other side is gone: nothing more to read for
            }
        };
        tokio::select! {
            () = forward => false,
            _ = async { reaped.wait_for(|r| *r).await.is_ok() } => true,
        }
    };
    if gave_up {
        // The server gave up on this client: its side closes now; the client's side stays
        // open and silent until the partition heals.
        let mut mode = shared.mode.subscribe();
        match direction {
            Direction::Up(_) => {
                let _ = to.shutdown().await;
                drop(to);
            }
            Direction::Down(_) => drop(from),
        }
        let _ = until_open(&mut mode).await;
    }
}
