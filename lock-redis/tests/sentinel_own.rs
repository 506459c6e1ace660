//! Sentinel deployments this test starts itself, on ports of `test_support::ports`, for what
//! the shared deployment of `scripts/services.sh` (plain Redis, no passwords) cannot show:
//! sentinels that want a login of their own, sentinels and servers speaking TLS only
//! (`rediss+sentinel://`), and Valkey's servers and sentinels. Each is a master, a replica
//! and one sentinel; a failover is the sentinel's `SENTINEL FAILOVER` (no kill: what is
//! tested is following the switch over these transports and servers, which the shared
//! deployment's tests measure under kills and freezes).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Error, LeaseState, LockName, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::partition::Members;
use test_support::ports::free_ports;
use test_support::Scratch;

/// The Redis server's password (`requirepass`), which the sentinel also uses (`auth-pass`).
const SERVER_PW: &str = "server-pw";
/// The sentinel's own password.
const SENTINEL_PW: &str = "sentinel-pw";

/// What a deployment is made of.
#[derive(Clone, Copy)]
struct Kind {
    /// `redis-server`, or the Valkey binary (which is its own sentinel too).
    valkey: bool,
    /// TLS only: servers and sentinel on their `tls-port`, replication over TLS.
    tls: bool,
    /// Passwords on the servers and, apart, on the sentinel.
    passwords: bool,
    /// A replica of the master, for a failover.
    replica: bool,
}

/// A master (`ports[0]`), maybe a replica (`ports[1]`) and one sentinel (`ports[2]`) that
/// monitors the master as `m`, killed when dropped.
struct Deployment {
    kind: Kind,
    servers: Members,
    binary: String,
    ports: Vec<u16>,
    dir: Scratch,
}

impl Deployment {
    /// Starts the servers, and the sentinel once the replica (if any) follows the master: the
    /// sentinel's first `INFO` of the master then names it (else it learns of it at its next,
    /// 10 s later).
    fn start(kind: Kind) -> Deployment {
        let dir = test_support::scratch("distlock-sentinel-own");
        if kind.tls {
            test_support::test_certificates(&dir);
        }
        let held = free_ports(3);
        let ports = held.numbers();
        held.release();
        let binary = match kind.valkey {
            true => test_support::valkey_server(),
            false => "redis-server".to_string(),
        };
        let mut d = Deployment {
            kind,
            servers: Members::default(),
            binary,
            ports,
            dir,
        };
        let server = |d: &Deployment, port: u16, replica_of: Option<u16>| {
            let mut lines = d.common(port);
            lines.extend([
                "save \"\"".to_string(),
                "appendonly no".to_string(),
                format!("dbfilename {port}.rdb"),
            ]);
            if kind.passwords {
                lines.extend([
                    format!("requirepass {SERVER_PW}"),
                    format!("masterauth {SERVER_PW}"),
                ]);
            }
            if let Some(master) = replica_of {
                lines.push(format!("replicaof 127.0.0.1 {master}"));
            }
            lines
        };
        let master = d.ports[0];
        d.spawn("master", server(&d, master, None), false);
        if kind.replica {
            d.spawn("replica", server(&d, d.ports[1], Some(master)), false);
            d.wait(
                "the replica acknowledges a write",
                Duration::from_secs(20),
                || d.acknowledged(),
            );
        }
        let mut sentinel = d.common(d.ports[2]);
        sentinel.extend([
            format!("sentinel monitor m 127.0.0.1 {master} 1"),
            "sentinel down-after-milliseconds m 1000".to_string(),
            "sentinel failover-timeout m 4000".to_string(),
        ]);
        if kind.passwords {
            sentinel.extend([
                format!("sentinel auth-pass m {SERVER_PW}"),
                format!("requirepass {SENTINEL_PW}"),
            ]);
        }
        d.spawn("sentinel", sentinel, true);
        d
    }

    /// The lines of a configuration file that every server's and the sentinel's share.
    fn common(&self, port: u16) -> Vec<String> {
        let file = |f: &str| self.dir.join(f).display().to_string();
        let mut lines = vec![
            "bind 127.0.0.1".to_string(),
            format!("dir {}", self.dir.display()),
        ];
        if self.kind.tls {
            lines.extend([
                "port 0".to_string(),
                format!("tls-port {port}"),
                format!("tls-cert-file {}", file("server.crt")),
                format!("tls-key-file {}", file("server.key")),
                format!("tls-ca-cert-file {}", file("ca.crt")),
                "tls-auth-clients no".to_string(),
                "tls-replication yes".to_string(),
            ]);
        } else {
            lines.push(format!("port {port}"));
        }
        lines
    }

    /// Starts the binary on the configuration `lines` as `name` (its log `name.log`).
    fn spawn(&mut self, name: &str, lines: Vec<String>, sentinel: bool) {
        let conf = self.dir.join(format!("{name}.conf"));
        std::fs::write(&conf, lines.join("\n") + "\n").unwrap();
        let mut cmd = Command::new(&self.binary);
        cmd.arg(&conf);
        if sentinel {
            cmd.arg("--sentinel");
        }
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .expect("the server binary (scripts/services.sh install)");
        self.servers.0.push(child);
    }

    /// Whether the replica acknowledges a write to the master now (`WAIT 1` after an `INCR`).
    fn acknowledged(&self) -> bool {
        let out = self.cli(self.ports[0], "INCR probe\nWAIT 1 1000\n");
        out.lines().nth(1).map(str::trim) == Some("1")
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The deployment's URL with `query` (which starts with `?` or is empty), with the
    /// servers' password if `server_pw`.
    fn url(&self, server_pw: bool, query: &str) -> String {
        let auth = if server_pw {
            format!(":{SERVER_PW}@")
        } else {
            String::new()
        };
        let scheme = if self.kind.tls { "rediss" } else { "redis" };
        let sentinel = self.ports[2];
        format!("{scheme}+sentinel://{auth}127.0.0.1:{sentinel}/m{query}")
    }

    /// The URL a client of this deployment uses: every password, and the CA over TLS.
    fn client_url(&self) -> String {
        let mut query = Vec::new();
        if self.kind.passwords {
            query.push(format!("sentinel_password={SENTINEL_PW}"));
        }
        if self.kind.tls {
            query.push(format!("tls_ca_file={}", self.ca().display()));
        }
        let query = match query.is_empty() {
            true => String::new(),
            false => format!("?{}", query.join("&")),
        };
        self.url(self.kind.passwords, &query)
    }

    /// `redis-cli` to the server or sentinel on `port` (with TLS and the password as this
    /// deployment wants them), reading commands from `input`: its output.
    fn cli(&self, port: u16, input: &str) -> String {
        let mut cmd = Command::new("redis-cli");
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--no-auth-warning",
        ]);
        if self.kind.tls {
            cmd.args(["--tls", "--cacert", &self.ca().display().to_string()]);
        }
        if self.kind.passwords {
            let pw = if port == self.ports[2] {
                SENTINEL_PW
            } else {
                SERVER_PW
            };
            cmd.args(["-a", pw]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli (scripts/services.sh install)");
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// The port of the master the sentinel names now, if it answers.
    fn named(&self) -> Option<u16> {
        let out = self.cli(self.ports[2], "SENTINEL get-master-addr-by-name m\n");
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// The last lines of each process's log, for a failure's message.
    fn logs(&self) -> String {
        let mut text = String::new();
        for name in ["master", "replica", "sentinel"] {
            let log =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(8)..].join("\n");
            text.push_str(&format!("\n--- {name}.log (tail)\n{tail}"));
        }
        text
    }

    /// Waits until `ready()`, or fails naming `what` with the logs.
    fn wait(&self, what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
        let until = Instant::now() + within;
        while !ready() {
            assert!(
                Instant::now() < until,
                "{what}: not within {within:?}{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the sentinel names the master and knows its replica, and the replica
    /// acknowledges the master's writes: ready for a failover.
    fn wait_until_ready(&self) {
        let within = Duration::from_secs(20);
        self.wait("the sentinel names the master", within, || {
            self.named() == Some(self.ports[0])
        });
        if !self.kind.replica {
            return;
        }
        self.wait("the replica acknowledges a write", within, || {
            self.acknowledged()
        });
        let replica = self.ports[1].to_string();
        self.wait("the sentinel knows the replica", within, || {
            self.cli(self.ports[2], "SENTINEL replicas m\n")
                .lines()
                .any(|l| l.trim() == replica)
        });
    }
}

async fn connect(url: &str) -> lock_core::Result<RedisLock> {
    let config = RedisConfig::from_url(url)?.with_connect_timeout(Duration::from_secs(1));
    RedisLock::connect(config).await
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

/// The sentinel's refusal, with its message: `Unauthenticated` naming what to set, and never
/// a password.
fn refusal(r: lock_core::Result<RedisLock>, what: &str, names: &str) -> String {
    let e = match r {
        Ok(_) => panic!("{what}: connected"),
        Err(e) => e,
    };
    let text = e.to_string();
    assert!(
        matches!(e, Error::Unauthenticated { .. }),
        "{what}: not Unauthenticated: {e:?}"
    );
    assert!(
        text.contains(names),
        "{what}: does not name {names}: {text}"
    );
    for pw in [SERVER_PW, SENTINEL_PW, "wrong-pw"] {
        assert!(!text.contains(pw), "{what}: shows a password: {text}");
    }
    text
}

#[test]
fn a_sentinel_that_wants_a_login_gets_its_own() {
    let kind = Kind {
        valkey: false,
        tls: false,
        passwords: true,
        replica: false,
    };
    runtime().block_on(async {
        let d = Deployment::start(kind);
        d.wait_until_ready();
        let lock = connect(&d.client_url()).await.unwrap();
        let name: LockName = "sentinel-auth".parse().unwrap();
        let lease = lock
            .try_acquire(&name, &LockOptions::new(Duration::from_secs(5)))
            .await
            .unwrap()
            .expect("a free lock");
        lease.release().await.unwrap();

        let missing = connect(&d.url(true, "")).await;
        refusal(missing, "no sentinel password", "sentinel_password=");
        let wrong = connect(&d.url(true, "?sentinel_password=wrong-pw")).await;
        refusal(wrong, "a wrong sentinel password", "sentinel_password=");
        // The sentinel's login is not the servers': without theirs the master refuses.
        let query = format!("?sentinel_password={SENTINEL_PW}");
        let no_server = connect(&d.url(false, &query)).await;
        refusal(no_server, "no server password", "rejected the credentials");
    });
}

/// A held lease and a client follow a `SENTINEL FAILOVER` to the replica: the lease is
/// confirmed there (Held, renewed), another client is refused its lock and granted it once
/// released, and a new lock is granted on the new master.
async fn follows_a_failover(d: &Deployment) {
    d.wait_until_ready();
    let url = d.client_url();
    let (a, b) = (connect(&url).await.unwrap(), connect(&url).await.unwrap());
    let name: LockName = "sentinel-own-failover".parse().unwrap();
    let opts = LockOptions::new(Duration::from_secs(60)).auto_renew(None);
    let lease = a
        .try_acquire(&name, &opts)
        .await
        .unwrap()
        .expect("a free lock");
    // The grant reached the replica before it is promoted: this test is about following.
    d.wait(
        "the replica acknowledges the grant",
        Duration::from_secs(10),
        || d.acknowledged(),
    );
    let answer = d.cli(d.ports[2], "SENTINEL FAILOVER m\n");
    assert!(
        answer.contains("OK"),
        "SENTINEL FAILOVER: {answer}{}",
        d.logs()
    );
    d.wait(
        "the sentinel names the replica",
        Duration::from_secs(20),
        || d.named() == Some(d.ports[1]),
    );
    let switched = Instant::now();
    while !(lease.state() == LeaseState::Held && lease.renewals().unwrap_or(0) > 0) {
        assert!(
            switched.elapsed() < Duration::from_secs(5),
            "5 s after the failover the lease is {:?} with {:?} renewals: not confirmed on \
             the new master{}",
            lease.state(),
            lease.renewals(),
            d.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        b.try_acquire(&name, &opts).await.unwrap().is_none(),
        "another client was granted a held lock after the failover"
    );
    lease.release().await.unwrap();
    let next = b.try_acquire(&name, &opts).await.unwrap();
    next.expect("after the release nobody can take the lock")
        .release()
        .await
        .unwrap();
    let fresh: LockName = "sentinel-own-fresh".parse().unwrap();
    let lease = a
        .try_acquire(&fresh, &opts)
        .await
        .unwrap()
        .expect("a free lock");
    let key = lease.backend_key().expect("a Redis lease names its key");
    // On the new master, written there (the old one is its replica now, or on its way).
    let exists = d.cli(d.ports[1], &format!("EXISTS {key}\n"));
    assert_eq!(exists.trim(), "1", "{key} is not on the new master");
    lease.release().await.unwrap();
}

/// `rediss+sentinel://`: TLS to the sentinel and to the servers it names (their TLS ports),
/// with the CA of `tls_ca_file`; without that CA, or over plain TCP, the connection fails in
/// time with an error.
#[cfg(feature = "tls")]
#[test]
fn tls_sentinels_name_tls_servers_and_a_client_follows_their_failover() {
    let kind = Kind {
        valkey: false,
        tls: true,
        passwords: false,
        replica: true,
    };
    runtime().block_on(async {
        let d = Deployment::start(kind);
        follows_a_failover(&d).await;
        for (what, url) in [
            ("no CA", d.url(false, "")),
            ("plain TCP", d.url(false, "").replacen("rediss", "redis", 1)),
        ] {
            let asked = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(10), connect(&url)).await;
            match r {
                Err(_) => panic!("{what}: no answer within 10 s"),
                Ok(Ok(_)) => panic!("{what}: connected"),
                Ok(Err(e)) => assert!(
                    matches!(e, Error::Unavailable { .. }),
                    "{what}: {e:?} after {:?}",
                    asked.elapsed()
                ),
            }
        }
    });
}

/// Valkey behind Valkey's own sentinels (the same binary with `--sentinel`).
#[test]
fn valkey_sentinels_are_followed_as_redis_ones() {
    let kind = Kind {
        valkey: true,
        tls: false,
        passwords: false,
        replica: true,
    };
    runtime().block_on(async {
        let d = Deployment::start(kind);
        follows_a_failover(&d).await;
    });
}
