//! distlock and other clients on one lock, each side running its own code: `etcdctl lock`
//! (etcd's Go `concurrency.Mutex`), Curator's `InterProcessMutex` (compiled here with javac),
//! kazoo's `Lock` and redis-py's `Lock`, against the servers of `scripts/services.sh up`,
//! installed by `scripts/services.sh install`. For every pair, both ways:
//! 1. while the foreign client holds, `distlock run --no-wait` exits 75;
//! 2. while distlock holds, the foreign client does not get the lock;
//! 3. a waiter of either kind gets the lock promptly after the other releases;
//! 4. a mixed queue is served in arrival order, where the backend queues (etcd, ZooKeeper).
//!
//! Every holder, distlock's or foreign, runs the same protocol: it prints `acquired` when it
//! holds the lock and releases once its release file exists.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use test_support::servers;
use test_support::{scratch, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");
const FOREIGN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/foreign");
/// The `zk` server, as `host:port`.
fn zk_hosts() -> String {
    servers::addr("zk")
}
/// How soon after a release the next waiter must hold the lock: both backends wake waiters
/// by a watch, in milliseconds; this leaves room for a busy machine.
const PROMPT: Duration = Duration::from_secs(2);
/// How long a waiter is watched not to get a held lock.
const EXCLUDED_FOR: Duration = Duration::from_millis(1500);

/// A client that can take the lock: distlock or a foreign one.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    Distlock,
    /// `distlock run --shared`.
    DistlockShared,
    /// `distlock elect --value distlock-N`.
    DistlockElect,
    #[cfg(feature = "etcd")] // etcd is not in the CLI's default features
    Etcdctl,
    /// `etcdctl elect NAME etcdctl-N`, resigning at SIGINT.
    #[cfg(feature = "etcd")]
    EtcdctlElect,
    Curator,
    /// Curator's `InterProcessReadWriteLock`: its read lock, and its write lock.
    CuratorRead,
    CuratorWrite,
    /// Curator's `LeaderSelector`, participant id `curator-N`.
    CuratorElect,
    Kazoo,
    /// kazoo's `Election`, identifier `kazoo-N`.
    KazooElect,
    RedisPy,
    /// redis-py's `Lock` on the master its `Sentinel` finds (`master_for`).
    RedisPySentinel,
    RedisPyCluster,
    /// `psql` holding `pg_advisory_lock` on the key of the documented SQL expression.
    Psql,
    /// `psql` holding `pg_advisory_lock_shared` on that key.
    PsqlShared,
}

/// A backend and the name of one lock on it, as each client spells it.
struct Lock {
    /// distlock's URL: the key layout the foreign clients use.
    url: String,
    name: String,
    dir: Scratch,
    /// Classes compiled for Curator, when a test uses it.
    classes: Option<PathBuf>,
}

impl Lock {
    #[cfg(feature = "etcd")]
    fn etcd(tag: &str) -> Lock {
        Lock::new(servers::url("etcd://{etcd}?prefix="), tag)
    }
    fn zk(tag: &str) -> Lock {
        Lock::new(
            servers::url("zk://{zk}?base=/&session_timeout_ms=4000"),
            tag,
        )
    }
    /// distlock's exclusive nodes named as Curator's read-write lock names its writers.
    fn zk_rw(tag: &str) -> Lock {
        Lock::new(
            servers::url("zk://{zk}?base=/&session_timeout_ms=4000&nodes=rwlock"),
            tag,
        )
    }
    /// Any URL: every distlock lock `n` is the advisory lock on the key of `n`.
    fn pg(tag: &str) -> Lock {
        Lock::new(
            servers::url("postgres://locker@{pg}/postgres?sslmode=disable&session_timeout_ms=2000"),
            tag,
        )
    }
    /// The documented SQL expression of this lock's advisory-lock key.
    fn pg_key(&self) -> String {
        format!(
            "('x' || left(encode(sha256(convert_to('{}', 'UTF8')), 'hex'), 16))::bit(64)::bigint",
            self.name
        )
    }
    /// Plain keys with no prefix: distlock's lock `n` is redis-py's `r.lock("n")`.
    fn redis(tag: &str) -> Lock {
        Lock::new(servers::url("redis://{redis}?keys=plain&prefix="), tag)
    }
    /// The same, through the sentinels of the Sentinel deployment.
    fn redis_sentinel(tag: &str) -> Lock {
        let sentinels = "{sentinel1},{sentinel2},{sentinel3}/distlock?keys=plain&prefix=";
        Lock::new(servers::url(&format!("redis+sentinel://{sentinels}")), tag)
    }
    /// The same, on the Redis Cluster (the key in its slot's master).
    fn redis_cluster(tag: &str) -> Lock {
        let nodes = "{cluster1},{cluster2}?keys=plain&prefix=";
        Lock::new(servers::url(&format!("redis+cluster://{nodes}")), tag)
    }
    fn new(url: String, tag: &str) -> Lock {
        Lock {
            url,
            name: format!("interop-{tag}-{}", std::process::id()),
            dir: scratch(&format!("distlock-interop-{tag}-")),
            classes: None,
        }
    }

    /// Starts `client` on this lock; `n` tells its files apart from the other holders'.
    fn start(&mut self, client: Client, n: usize) -> Holder {
        let release = self.dir.join(format!("release-{n}"));
        let r = release.display().to_string();
        let hold = format!("echo acquired; while [ ! -e {r} ]; do sleep 0.02; done");
        let path = format!("/{}", self.name);
        let mut cmd = match client {
            Client::Distlock | Client::DistlockShared => {
                let mut c = Command::new(BIN);
                c.env("DISTLOCK_URL", &self.url)
                    .env("RUST_LOG", "error")
                    .args(["run", "--name", &self.name, "--wait", "60s"]);
                if client == Client::DistlockShared {
                    c.arg("--shared");
                }
                c.args(["--", "sh", "-c", &hold]);
                c
            }
            Client::DistlockElect => {
                let mut c = Command::new(BIN);
                c.env("DISTLOCK_URL", &self.url)
                    .env("RUST_LOG", "error")
                    .args(["elect", "--name", &self.name, "--wait", "60s"])
                    .args(["--value", &format!("distlock-{n}"), "--", "sh", "-c", &hold]);
                c
            }
            #[cfg(feature = "etcd")]
            Client::EtcdctlElect => {
                // etcdctl prints its key and proposal once elected, and resigns at SIGINT.
                let out = self.dir.join(format!("elect-{n}"));
                let o = out.display();
                let script = format!(
                    "etcdctl --endpoints={} elect {} etcdctl-{n} > {o} & pid=$!; \
                     until grep -q etcdctl-{n} {o} 2>/dev/null; do sleep 0.02; done; {hold}; \
                     kill -INT $pid; wait $pid",
                    servers::addr("etcd"),
                    self.name
                );
                let mut c = Command::new("sh");
                c.env("ETCDCTL_API", "3").args(["-c", &script]);
                c
            }
            #[cfg(feature = "etcd")]
            Client::Etcdctl => {
                let mut c = Command::new("etcdctl");
                c.env("ETCDCTL_API", "3")
                    .args([&*servers::url("--endpoints={etcd}"), "lock", &self.name])
                    .args(["--", "sh", "-c", &hold]);
                c
            }
            Client::Kazoo => python("kazoo_hold.py", [&*zk_hosts(), &path, &r]),
            Client::KazooElect => {
                let id = format!("kazoo-{n}");
                python("kazoo_hold.py", [&*zk_hosts(), &path, &r, "election", &id])
            }
            Client::RedisPy => python("redis_hold.py", [&*servers::url("{redis}"), &self.name, &r]),
            Client::RedisPySentinel => {
                let sentinels =
                    servers::url("sentinel:{sentinel1},{sentinel2},{sentinel3}/distlock");
                python("redis_hold.py", [&*sentinels, &self.name, &r])
            }
            Client::RedisPyCluster => {
                let nodes = servers::url("cluster:{cluster1},{cluster2}");
                python("redis_hold.py", [&*nodes, &self.name, &r])
            }
            Client::Psql | Client::PsqlShared => {
                // One session: lock (waiting in the server's queue), then hold until released.
                let f = match client {
                    Client::PsqlShared => "pg_advisory_lock_shared",
                    _ => "pg_advisory_lock",
                };
                let mut c = psql();
                c.arg("-c")
                    .arg(format!("SELECT {f}({})", self.pg_key()))
                    .arg("-c")
                    .arg(format!("\\! {hold}"));
                c
            }
            Client::Curator | Client::CuratorRead | Client::CuratorWrite | Client::CuratorElect => {
                let kind = match client {
                    Client::CuratorRead => "read",
                    Client::CuratorWrite => "write",
                    Client::CuratorElect => "elect",
                    _ => "mutex",
                };
                let classes = self.curator_classes();
                let mut c = Command::new("java");
                c.args(["-cp", &format!("{}:{}", classes.display(), curator_jars())])
                    .args(["CuratorHold", &zk_hosts(), &path, &r, kind])
                    .arg(format!("curator-{n}"));
                c
            }
        };
        Holder::spawn(format!("{client:?} #{n}"), &mut cmd, release)
    }

    fn curator_classes(&mut self) -> PathBuf {
        if let Some(c) = &self.classes {
            return c.clone();
        }
        let out = self.dir.join("classes");
        std::fs::create_dir_all(&out).unwrap();
        let javac = Command::new("javac")
            .args(["-d", &out.display().to_string(), "-cp", &curator_jars()])
            .arg(format!("{FOREIGN}/CuratorHold.java"))
            .output()
            .expect("javac (scripts/services.sh install puts it there)");
        assert!(
            javac.status.success(),
            "javac CuratorHold.java: {}",
            String::from_utf8_lossy(&javac.stderr)
        );
        self.classes = Some(out.clone());
        out
    }

    /// What `distlock leader` prints for this lock now.
    fn leader_says(&self) -> String {
        let out = Command::new(BIN)
            .env("DISTLOCK_URL", &self.url)
            .args(["leader", "--name", &self.name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `distlock run --no-wait` on the held lock exits 75 (busy) within a few seconds.
    fn no_wait_is_busy(&self, holder: &str) {
        let out = Command::new(BIN)
            .env("DISTLOCK_URL", &self.url)
            .env("RUST_LOG", "error")
            .args(["run", "--name", &self.name, "--no-wait", "--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(75),
            "`distlock run --no-wait` while {holder} holds: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The contenders queued on the backend (holder included); Redis has no queue, so there
    /// the holder and `n − 1` waiters are assumed after a second.
    fn contenders(&self, n: usize) -> usize {
        if self.url.starts_with("postgres") {
            let out = psql()
                .arg("-c")
                .arg(format!(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
                     AND ((classid::int8 << 32) | objid::int8) = {}",
                    self.pg_key()
                ))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or(0)
        } else if self.url.starts_with("redis") {
            std::thread::sleep(Duration::from_secs(1));
            n
        } else if self.url.starts_with("etcd") {
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args([
                    &*servers::url("--endpoints={etcd}"),
                    "get",
                    "--prefix",
                    "--keys-only",
                ])
                .arg(format!("{}/", self.name))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count()
        } else {
            let path = format!("/{}", self.name);
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let c = lock_zookeeper::zookeeper_client::Client::connect(&zk_hosts())
                        .await
                        .unwrap();
                    c.list_children(&path).await.map_or(0, |v| v.len())
                })
        }
    }

    /// Waits until `n` contenders are queued: a waiter that was started is in line.
    fn queued(&self, n: usize, who: &str) {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let now = self.contenders(n);
            if now >= n {
                return;
            }
            assert!(
                Instant::now() < end,
                "{who} not in the queue after 20 s ({now} of {n} contenders)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `psql` on `pg` of `scripts/services.sh` (PostgreSQL's own client, from
/// `scripts/services.sh install`): unaligned, tuples only, no `.psqlrc`.
fn psql() -> Command {
    let mut c = Command::new("psql");
    c.args([
        "-h",
        "127.0.0.1",
        "-p",
        &servers::port("pg").to_string(),
        "-U",
        "locker",
        "-d",
        "postgres",
    ])
    .args(["-X", "-q", "-A", "-t"]);
    c
}

/// `python <script> <args>` in the virtualenv of `scripts/services.sh install`.
fn python<'a>(script: &str, args: impl IntoIterator<Item = &'a str>) -> Command {
    let venv = test_support::services(&["foreign"]);
    let mut c = Command::new(format!("{venv}/venv/bin/python"));
    c.arg(format!("{FOREIGN}/{script}")).args(args);
    c
}

/// The jars Curator's recipes need, from Debian's `libcurator-recipes-java`.
fn curator_jars() -> String {
    [
        "curator-recipes",
        "curator-framework",
        "curator-client",
        "zookeeper",
        "zookeeper-jute",
        "guava",
        "slf4j-api",
        "slf4j-nop",
    ]
    .map(|j| format!("/usr/share/java/{j}.jar"))
    .join(":")
}

/// One running holder (or waiter) process.
struct Holder {
    what: String,
    child: Child,
    acquired: mpsc::Receiver<Instant>,
    release: PathBuf,
}

impl Holder {
    fn spawn(what: String, cmd: &mut Command, release: PathBuf) -> Holder {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e} (scripts/services.sh install)"));
        let stdout = child.stdout.take().unwrap();
        let (tx, acquired) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.trim() == "acquired" {
                    let _ = tx.send(Instant::now());
                }
            }
        });
        Holder {
            what,
            child,
            acquired,
            release,
        }
    }

    /// When it printed `acquired`, if it did within `limit`.
    fn acquired_within(&self, limit: Duration) -> Option<Instant> {
        self.acquired.recv_timeout(limit).ok()
    }

    fn holds(&self) {
        assert!(
            self.acquired_within(Duration::from_secs(30)).is_some(),
            "{} did not get the free lock within 30 s",
            self.what
        );
    }

    /// Releases and waits for the process to exit 0; returns when the release was asked.
    fn release(mut self) -> Instant {
        let at = Instant::now();
        std::fs::write(&self.release, b"").unwrap();
        let end = at + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                assert!(st.success(), "{} exited {st}: {err}", self.what);
                return at;
            }
            assert!(
                Instant::now() < end,
                "{} still running 20 s after its release",
                self.what
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.release, b"");
        if matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(200));
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `waiter` gets the lock within [`PROMPT`] of `holder`'s release, and not before it.
fn hand_off(holder: Holder, waiter: &Holder) {
    assert!(
        waiter.acquired_within(EXCLUDED_FOR).is_none(),
        "{} got the lock while {} held it",
        waiter.what,
        holder.what
    );
    let (from, what) = (holder.what.clone(), waiter.what.clone());
    let released = holder.release();
    let got = waiter.acquired_within(PROMPT + Duration::from_secs(10));
    let got = got.unwrap_or_else(|| panic!("{what} not woken within 10 s of {from}'s release"));
    let after = got.saturating_duration_since(released);
    assert!(
        after <= PROMPT,
        "{what} got the lock {after:?} after {from}'s release (promised within {PROMPT:?})"
    );
}

/// Promises 1–3 between distlock and `foreign`, both ways.
fn exclusion_both_ways(lock: Lock, foreign: Client) {
    exclusion_both_ways_as(lock, foreign, Client::Distlock);
}

/// [`exclusion_both_ways`] with distlock taking the lock as `ours` (exclusive or shared).
fn exclusion_both_ways_as(mut lock: Lock, foreign: Client, ours: Client) {
    // The foreign client holds: distlock is busy, then waits and is handed the lock.
    let f = lock.start(foreign, 1);
    f.holds();
    lock.no_wait_is_busy(&f.what);
    let d = lock.start(ours, 2);
    lock.queued(2, &d.what);
    hand_off(f, &d);
    // distlock holds: the foreign client waits, and is handed the lock.
    let f = lock.start(foreign, 3);
    lock.queued(2, &f.what);
    hand_off(d, &f);
    f.release();
}

/// Promise 4: holder, then waiters queued in the order `order`; each release hands the lock to
/// the next in that order.
fn arrival_order(mut lock: Lock, order: &[Client]) {
    let mut line: Vec<Holder> = Vec::new();
    for (n, &client) in order.iter().enumerate() {
        let h = lock.start(client, n);
        if n == 0 {
            h.holds();
        } else {
            lock.queued(n + 1, &h.what);
        }
        line.push(h);
    }
    let mut line = line.into_iter();
    let mut holder = line.next().unwrap();
    for next in line {
        hand_off(holder, &next);
        holder = next;
    }
    holder.release();
}

#[cfg(feature = "etcd")]
#[test]
fn etcdctl_lock_and_distlock_exclude_each_other() {
    exclusion_both_ways(Lock::etcd("etcdctl"), Client::Etcdctl);
}

#[cfg(feature = "etcd")]
#[test]
fn etcdctl_and_distlock_waiters_are_served_in_arrival_order() {
    use Client::{Distlock, Etcdctl};
    arrival_order(
        Lock::etcd("etcd-fifo"),
        &[Distlock, Etcdctl, Distlock, Etcdctl, Distlock],
    );
}

/// `DISTLOCK_KEY` is the key etcdctl sees: the holder's key under `<name>/`.
/// Shared mode is the same queue: an `etcdctl lock` holder keeps a distlock reader out and the
/// other way round.
#[cfg(feature = "etcd")]
#[test]
fn etcdctl_lock_and_distlock_readers_exclude_each_other() {
    exclusion_both_ways_as(
        Lock::etcd("etcdctl-shared"),
        Client::Etcdctl,
        Client::DistlockShared,
    );
}

/// A reader that arrives behind a waiting `etcdctl lock` writer waits behind it (no writer
/// starvation across clients), and readers hold together.
#[cfg(feature = "etcd")]
#[test]
fn a_reader_waits_behind_a_waiting_etcdctl_writer() {
    use Client::{DistlockShared as R, Etcdctl as W};
    arrival_order(Lock::etcd("etcdctl-fifo-shared"), &[R, W, R]);
    // Readers together: the second is granted while the first holds.
    let mut lock = Lock::etcd("etcdctl-readers");
    let (a, b) = (lock.start(R, 1), lock.start(R, 2));
    a.holds();
    b.holds();
}

#[cfg(feature = "etcd")]
#[test]
fn distlock_key_is_the_key_etcdctl_sees() {
    let lock = Lock::etcd("key");
    let out = Command::new(BIN)
        .env("DISTLOCK_URL", &lock.url)
        .args(["run", "--name", &lock.name, "--", "sh", "-c"])
        .arg(servers::url("ETCDCTL_API=3 etcdctl --endpoints={etcd} get --prefix --keys-only \"$DISTLOCK_NAME/\"; echo \"key=$DISTLOCK_KEY\""))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let keys: Vec<&str> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("key="))
        .collect();
    let key = text.lines().find_map(|l| l.strip_prefix("key=")).unwrap();
    assert!(key.starts_with(&format!("{}/", lock.name)), "{text}");
    assert_eq!(keys, [key], "etcdctl's view of the lock: {text}");
}

/// `etcdctl elect` and `distlock elect` are one election: each keeps the other out while it
/// leads and hands leadership on when it resigns, both ways, in arrival order.
#[cfg(feature = "etcd")]
#[test]
fn etcdctl_elect_and_distlock_elect_are_one_election() {
    exclusion_both_ways_as(
        Lock::etcd("elect"),
        Client::EtcdctlElect,
        Client::DistlockElect,
    );
    use Client::{DistlockElect as D, EtcdctlElect as E};
    arrival_order(Lock::etcd("elect-fifo"), &[E, D, E, D]);
}

/// Each side reads the other's leader: `etcdctl elect --listen` prints distlock's value, and
/// `distlock leader` (once, and `--watch`) prints etcdctl's proposal and term.
#[cfg(feature = "etcd")]
#[test]
fn etcdctl_and_distlock_see_each_others_leader() {
    let mut lock = Lock::etcd("elect-values");
    let ours = lock.start(Client::DistlockElect, 1);
    ours.holds();
    let listen = Command::new("timeout")
        .args([
            "2",
            "etcdctl",
            &*servers::url("--endpoints={etcd}"),
            "elect",
            "--listen",
        ])
        .arg(&lock.name)
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    let heard = String::from_utf8_lossy(&listen.stdout);
    assert!(
        heard.lines().any(|l| l == "distlock-1"),
        "etcdctl elect --listen: {heard}"
    );
    ours.release();
    let mut watch = Command::new(BIN)
        .env("DISTLOCK_URL", &lock.url)
        .env("RUST_LOG", "error")
        .args(["leader", "--name", &lock.name, "--watch", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let theirs = lock.start(Client::EtcdctlElect, 2);
    theirs.holds();
    let once = lock.leader_says();
    assert!(
        once.contains("led by etcdctl-2 (term "),
        "distlock leader: {once}"
    );
    let (tx, rx) = mpsc::channel();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|l: &String| l.contains("\"value\":\"etcdctl-2\""))
    {
        match rx.recv_timeout(PROMPT) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("distlock leader --watch never showed etcdctl-2: {seen:?}"),
        }
    }
    theirs.release();
    test_support::kill("TERM", watch.id());
    assert_eq!(watch.wait().unwrap().code(), Some(0));
}

/// Curator's `LeaderSelector` and kazoo's `Election` elect among one queue with `distlock
/// elect`, both ways.
#[test]
fn curator_and_kazoo_elections_and_distlock_elect_are_one_election() {
    exclusion_both_ways_as(
        Lock::zk("curator-elect"),
        Client::CuratorElect,
        Client::DistlockElect,
    );
    exclusion_both_ways_as(
        Lock::zk("kazoo-elect"),
        Client::KazooElect,
        Client::DistlockElect,
    );
}

/// The leader's value is seen on every side: Curator's `getLeader()` and kazoo's first
/// contender name distlock's leader by its value, and `distlock leader` names theirs by their
/// participant id (the node's data, where both recipes keep it).
#[test]
fn curator_kazoo_and_distlock_see_each_others_leader() {
    let mut lock = Lock::zk("zk-leader");
    let path = format!("/{}", lock.name);
    let ours = lock.start(Client::DistlockElect, 1);
    ours.holds();
    let classes = lock.curator_classes();
    let curator = Command::new("java")
        .args(["-cp", &format!("{}:{}", classes.display(), curator_jars())])
        .args(["CuratorHold", &zk_hosts(), &path, "-", "leader"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&curator.stdout);
    assert!(
        said.contains("leader=distlock-1"),
        "Curator getLeader(): {said}"
    );
    let kazoo = python("kazoo_hold.py", [&*zk_hosts(), &path, "-", "leader"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&kazoo.stdout);
    assert!(
        said.contains("leader=distlock-1"),
        "kazoo contenders(): {said}"
    );
    ours.release();
    for (client, n, id) in [
        (Client::CuratorElect, 2, "curator-2"),
        (Client::KazooElect, 3, "kazoo-3"),
    ] {
        let theirs = lock.start(client, n);
        theirs.holds();
        let once = lock.leader_says();
        assert!(
            once.contains(&format!("led by {id} (term ")),
            "distlock leader: {once}"
        );
        theirs.release();
    }
}

#[test]
fn curator_and_distlock_exclude_each_other() {
    exclusion_both_ways(Lock::zk("curator"), Client::Curator);
}

#[test]
fn curator_and_distlock_waiters_are_served_in_arrival_order() {
    use Client::{Curator, Distlock};
    arrival_order(
        Lock::zk("curator-fifo"),
        &[Curator, Distlock, Curator, Distlock],
    );
}

/// Curator's `InterProcessReadWriteLock` and distlock with `nodes=rwlock`: each side's writer
/// keeps the other's readers out, both ways.
#[test]
fn curator_rwlock_and_distlock_exclude_each_other() {
    exclusion_both_ways_as(
        Lock::zk_rw("curator-w"),
        Client::CuratorWrite,
        Client::DistlockShared,
    );
    exclusion_both_ways(Lock::zk_rw("curator-r"), Client::CuratorRead);
}

/// One mixed FIFO queue: a reader behind a waiting writer waits behind it, whichever client
/// each one is; readers of both clients hold together.
#[test]
fn curator_rwlock_and_distlock_share_one_fifo_queue() {
    use Client::{CuratorRead, CuratorWrite, Distlock, DistlockShared};
    arrival_order(
        Lock::zk_rw("curator-fifo-1"),
        &[CuratorRead, Distlock, CuratorRead],
    );
    arrival_order(
        Lock::zk_rw("curator-fifo-2"),
        &[DistlockShared, CuratorWrite, DistlockShared],
    );
    let mut lock = Lock::zk_rw("curator-readers");
    let (a, b) = (lock.start(CuratorRead, 1), lock.start(DistlockShared, 2));
    a.holds();
    b.holds();
}

#[test]
fn kazoo_and_distlock_exclude_each_other() {
    exclusion_both_ways(Lock::zk("kazoo"), Client::Kazoo);
}

#[test]
fn kazoo_and_distlock_waiters_are_served_in_arrival_order() {
    use Client::{Distlock, Kazoo};
    arrival_order(
        Lock::zk("kazoo-fifo"),
        &[Distlock, Kazoo, Distlock, Kazoo, Distlock],
    );
}

#[test]
fn psql_and_distlock_exclude_each_other() {
    exclusion_both_ways(Lock::pg("psql"), Client::Psql);
}

#[test]
fn psql_and_distlock_waiters_are_served_in_arrival_order() {
    use Client::{Distlock, Psql};
    arrival_order(
        Lock::pg("psql-fifo"),
        &[Psql, Distlock, Psql, Distlock, Psql],
    );
}

/// `DISTLOCK_KEY` on PostgreSQL is the key the documented SQL expression gives, as `psql`
/// computes it.
/// `pg_advisory_lock_shared` from psql and `distlock run --shared` are the same lock: readers
/// of both hold together, and each side's writer keeps the other's readers out.
#[test]
fn psql_and_distlock_readers_share_and_writers_exclude_them() {
    let mut lock = Lock::pg("psql-readers");
    let (a, b) = (
        lock.start(Client::PsqlShared, 1),
        lock.start(Client::DistlockShared, 2),
    );
    a.holds();
    b.holds();
    drop((a, b));
    exclusion_both_ways_as(
        Lock::pg("psql-writer"),
        Client::Psql,
        Client::DistlockShared,
    );
    exclusion_both_ways(Lock::pg("psql-reader"), Client::PsqlShared);
}

#[test]
fn distlock_key_is_the_key_psql_computes() {
    let lock = Lock::pg("pg-key");
    let out = Command::new(BIN)
        .env("DISTLOCK_URL", &lock.url)
        .args([
            "run",
            "--name",
            &lock.name,
            "--",
            "sh",
            "-c",
            "echo \"$DISTLOCK_KEY\"",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let key = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let sql = psql()
        .arg("-c")
        .arg(format!("SELECT {}", lock.pg_key()))
        .output()
        .unwrap();
    assert_eq!(
        key,
        String::from_utf8_lossy(&sql.stdout).trim(),
        "DISTLOCK_KEY vs psql"
    );
}

#[test]
fn redis_py_and_distlock_exclude_each_other() {
    exclusion_both_ways(Lock::redis("redis-py"), Client::RedisPy);
}

/// Behind sentinels: redis-py's `Sentinel(...).master_for("distlock")` and its `Lock`, and
/// distlock's `redis+sentinel://` in plain keys, are one lock both ways.
#[test]
fn redis_py_sentinel_and_distlock_sentinel_exclude_each_other() {
    exclusion_both_ways(
        Lock::redis_sentinel("redis-py-sentinel"),
        Client::RedisPySentinel,
    );
}

/// On a Redis Cluster: redis-py's `RedisCluster` and its `Lock`, and distlock's
/// `redis+cluster://` in plain keys, are one lock both ways.
#[test]
fn redis_py_cluster_and_distlock_cluster_exclude_each_other() {
    exclusion_both_ways(
        Lock::redis_cluster("redis-py-cluster"),
        Client::RedisPyCluster,
    );
}

/// `distlock status` on a lock redis-py holds: held by another client, and no token (the
/// counter, had there been one, would be an earlier distlock holder's).
#[test]
fn status_names_a_redis_py_holder_as_another_client() {
    let mut lock = Lock::redis("redis-py-status");
    let f = lock.start(Client::RedisPy, 1);
    f.holds();
    let out = Command::new(BIN)
        .env("DISTLOCK_URL", &lock.url)
        .args(["status", "--name", &lock.name, "--json"])
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(json.contains("\"state\":\"held\""), "{json}");
    assert!(json.contains("\"foreign_holder\":true"), "{json}");
    assert!(json.contains("\"fencing_token\":null"), "{json}");
    f.release();
}
