//! A Redis Cluster over TLS (`rediss+cluster://`): three masters this test starts itself
//! (ports of `test_support::ports`, certificates from `scripts/services.sh certs`), speaking
//! TLS to clients and on their cluster bus (`tls-cluster yes`), as managed services' cluster
//! modes with in-transit encryption do.
#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, LockName, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::partition::Members;
use test_support::ports::free_ports;
use test_support::Scratch;

/// Three TLS masters, a third of the slots each, killed when dropped.
struct TlsCluster {
    _servers: Members,
    ports: Vec<u16>,
    ca: PathBuf,
    _dir: Scratch,
}

impl TlsCluster {
    fn start() -> TlsCluster {
        let dir = test_support::scratch("distlock-cluster-tls");
        test_support::test_certificates(&dir);
        let held = free_ports(3);
        let ports = held.numbers();
        held.release();
        let mut servers = Members::default();
        for port in &ports {
            let node = dir.join(port.to_string());
            std::fs::create_dir_all(&node).unwrap();
            let file = |f: &str| dir.join(f).display().to_string();
            let child = Command::new("redis-server")
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args([
                    "--protected-mode",
                    "no",
                    "--dir",
                    &node.display().to_string(),
                ])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                .args(["--tls-cert-file", &file("server.crt")])
                .args(["--tls-key-file", &file("server.key")])
                .args(["--tls-ca-cert-file", &file("ca.crt")])
                .args(["--tls-auth-clients", "no"])
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(node.join("log")).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server (scripts/services.sh install)");
            servers.0.push(child);
        }
        let cluster = TlsCluster {
            _servers: servers,
            ports,
            ca: dir.join("ca.crt"),
            _dir: dir,
        };
        cluster.form();
        cluster
    }

    /// `redis-cli` over TLS to the node on `port`: its output.
    fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert", &self.ca.display().to_string()])
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Slots split in three, the nodes introduced to each other; returns once every node
    /// says the cluster is ok.
    fn form(&self) {
        let until = Instant::now() + Duration::from_secs(20);
        for port in &self.ports {
            while !self.cli(*port, &["PING"]).contains("PONG") {
                assert!(
                    Instant::now() < until,
                    "the TLS node on {port} never answered"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for (i, port) in self.ports.iter().enumerate() {
            let (first, last) = (i * 5462, ((i + 1) * 5462 - 1).min(16383));
            let (first, last) = (first.to_string(), last.to_string());
            self.cli(*port, &["CLUSTER", "ADDSLOTSRANGE", &first, &last]);
        }
        for port in &self.ports[1..] {
            self.cli(
                self.ports[0],
                &["CLUSTER", "MEET", "127.0.0.1", &port.to_string()],
            );
        }
        for port in &self.ports {
            while !self
                .cli(*port, &["CLUSTER", "INFO"])
                .contains("cluster_state:ok")
            {
                assert!(
                    Instant::now() < until,
                    "the TLS cluster was not ok within 20 s: {}",
                    self.cli(*port, &["CLUSTER", "NODES"])
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    fn url(&self, scheme: &str, query: &str) -> String {
        format!("{scheme}://127.0.0.1:{}{query}", self.ports[0])
    }
}

async fn connect(url: &str) -> lock_core::Result<RedisLock> {
    let config = RedisConfig::from_url(url)?.with_connect_timeout(Duration::from_secs(1));
    RedisLock::connect(config).await
}

#[test]
fn a_tls_cluster_grants_on_every_shard_and_wakes_waiters() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = TlsCluster::start();
        let ca = format!("?tls_ca_file={}", c.ca.display());
        let url = c.url("rediss+cluster", &ca);
        let (a, b) = (connect(&url).await.unwrap(), connect(&url).await.unwrap());
        // Thirty names: their keys land on every master.
        let opts = LockOptions::new(Duration::from_secs(10));
        let mut leases = Vec::new();
        for i in 0..30 {
            let name: LockName = format!("tls-{i}").parse().unwrap();
            leases.push(
                a.try_acquire(&name, &opts)
                    .await
                    .unwrap()
                    .expect("a free lock"),
            );
        }
        for port in &c.ports {
            let keys: u64 = c.cli(*port, &["DBSIZE"]).trim().parse().unwrap_or(0);
            assert!(
                keys > 0,
                "no lock key on the master on {port}: not every shard took part"
            );
        }
        for lease in leases {
            lease.release().await.unwrap();
        }
        // A waiter hears the release (announcements over TLS as well).
        let name: LockName = "tls-wait".parse().unwrap();
        let lease = a
            .try_acquire(&name, &opts.clone().auto_renew(None))
            .await
            .unwrap()
            .expect("a free lock");
        let waiting = {
            let (name, opts) = (name.clone(), opts.clone().wait_for(Duration::from_secs(20)));
            tokio::spawn(async move { b.acquire(&name, &opts).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "the waiter returned while the lock was held"
        );
        lease.release().await.unwrap();
        let granted = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the waiter was not granted within 1 s of the release")
            .unwrap()
            .unwrap();
        granted.release().await.unwrap();

        // Without the private CA the nodes' certificates are not trusted; in plain TCP the
        // TLS ports do not answer: each an error, in time.
        for (what, url) in [
            ("no CA", c.url("rediss+cluster", "")),
            ("plain TCP", c.url("redis+cluster", "")),
        ] {
            let started = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(10), connect(&url)).await;
            match r {
                Err(_) => panic!("{what}: no answer within 10 s"),
                Ok(Ok(_)) => panic!("{what}: connected"),
                Ok(Err(e)) => assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "{what}: {e} after {:?}",
                    started.elapsed()
                ),
            }
        }
    });
}
