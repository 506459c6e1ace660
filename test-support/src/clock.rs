//! Clock faults.
//!
//! - [`ClockedServer`]: redis-servers and ZooKeeper servers a test starts itself, whose time
//!   of day it can step forward or back at any moment, or make run fast or slow from the
//!   start, as an NTP step or a bad oscillator would. Their monotonic clocks are left alone
//!   (an NTP step leaves them too). Every step is confirmed through the server (Redis's
//!   `TIME`, the `mtime` ZooKeeper gives a new node) before the call returns, so a shim that is
//!   not in effect fails the test at the step, not as a lock that mysteriously held.
//! - [`StepFile`]: the same fault for a process the test starts its own way (a cluster's
//!   members), which the safety nemesis steps through `Servers::step_clock`; not confirmed
//!   (the test that uses it checks the effect once itself).
//! - [`skew_monotonic`]: a process (a client) whose monotonic clocks, which every timer and
//!   every lease's validity is counted on, run fast or slow.
//!
//! The fault is `shim/clock.c`, preloaded into the process (see its header for why not
//! libfaketime). It cannot reach a Go binary such as etcd, which reads the clock without libc.

use std::fs::File;
use std::io;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use conformance_tests::{ClockStep, Servers};
use lock_core::BoxError;

use crate::partition::Members;
use crate::ports::free_ports;
use crate::shim::shim;
pub use crate::shim::{skew_monotonic, StepFile};
use crate::Scratch;

/// A server process of the test's own (no persistence) whose time of day the test sets;
/// killed on drop.
#[derive(Debug)]
pub struct ClockedServer {
    kind: Kind,
    port: u16,
    step: StepFile,
    process: Members,
    dir: Scratch,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Redis,
    /// A redis-server in cluster mode, a cluster of its own with no slot assigned.
    RedisClusterNode,
    ZooKeeper,
}

/// How long a server may take to answer after it was started (a JVM on a loaded machine).
const READY_WITHIN: Duration = Duration::from_secs(30);

const ZK_CLASSPATH: &str =
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar";

impl ClockedServer {
    /// Starts `n` redis-servers on free loopback ports whose clocks run `ppm` parts per
    /// million fast (negative: slow; 0: on time) from their start, with no step. Returns once
    /// each answers.
    ///
    /// # Errors
    /// What kept one from starting (no shim, no redis-server, no answer within 30 s), with its
    /// log.
    pub async fn redis(n: usize, ppm: i64) -> Result<Vec<ClockedServer>, String> {
        Self::start(Kind::Redis, n, ppm).await
    }

    /// Starts a redis-server in cluster mode (`cluster-enabled yes`), on time, that has joined
    /// no cluster and serves no slot.
    ///
    /// # Errors
    /// As for [`redis`](Self::redis).
    pub async fn redis_cluster_node() -> Result<ClockedServer, String> {
        let mut one = Self::start(Kind::RedisClusterNode, 1, 0).await?;
        one.pop().ok_or_else(|| "no server".to_string())
    }

    /// Starts a standalone ZooKeeper server (tick 500 ms, sessions of 1–20 s), as
    /// [`redis`](Self::redis) does.
    ///
    /// # Errors
    /// As for [`redis`](Self::redis).
    pub async fn zookeeper(ppm: i64) -> Result<ClockedServer, String> {
        let mut one = Self::start(Kind::ZooKeeper, 1, ppm).await?;
        one.pop().ok_or_else(|| "no server".to_string())
    }

    async fn start(kind: Kind, n: usize, ppm: i64) -> Result<Vec<ClockedServer>, String> {
        shim()?;
        let ports = free_ports(n);
        let numbers = ports.numbers();
        ports.release();
        let mut servers = Vec::with_capacity(n);
        for port in numbers {
            let server = Self::spawn(kind, port, ppm);
            servers.push(server.map_err(|e| format!("{kind:?} server: {e}"))?);
        }
        for s in &servers {
            s.wait_ready().await?;
        }
        Ok(servers)
    }

    fn spawn(kind: Kind, port: u16, ppm: i64) -> io::Result<ClockedServer> {
        let dir = crate::scratch("distlock-clock");
        let step = StepFile::new(&dir, "step")?;
        let mut cmd = match kind {
            Kind::Redis | Kind::RedisClusterNode => {
                let mut cmd = Command::new("redis-server");
                cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                    .arg("--dir")
                    .arg(&*dir);
                if matches!(kind, Kind::RedisClusterNode) {
                    cmd.args(["--cluster-enabled", "yes"]);
                }
                cmd
            }
            Kind::ZooKeeper => {
                let data = dir.join("data");
                std::fs::create_dir_all(&data)?;
                let cfg = format!(
                    "tickTime=500\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                     minSessionTimeout=1000\nmaxSessionTimeout=20000\nadmin.enableServer=false\n\
                     forceSync=no\n",
                    data.display()
                );
                std::fs::write(dir.join("zoo.cfg"), cfg)?;
                let mut cmd = Command::new("java");
                cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-cp", ZK_CLASSPATH])
                    .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
                    .arg(dir.join("zoo.cfg"));
                cmd
            }
        };
        let log = File::create(dir.join("log"))?;
        step.apply(&mut cmd, ppm).map_err(io::Error::other)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(ClockedServer {
            kind,
            port,
            step,
            process: Members(vec![child]),
            dir,
        })
    }

    async fn wait_ready(&self) -> Result<(), String> {
        let until = Instant::now() + READY_WITHIN;
        loop {
            match self.offset().await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > until => {
                    let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
                    return Err(format!(
                        "{:?} server on {} not up within {READY_WITHIN:?}: {e}\n{log}",
                        self.kind, self.port
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Its process id.
    fn pid(&self) -> Result<u32, BoxError> {
        let child = self.process.0.first().ok_or("no process")?;
        Ok(child.id())
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Sets the server's clock to the real time moved by `step` (it replaces the previous
    /// step, it does not add to it), and confirms that the server reads it (within 500 ms,
    /// which the rate of a fast or slow clock must leave room for).
    ///
    /// # Errors
    /// The file could not be written, or the server does not show the step.
    pub async fn set_step(&self, step: ClockStep) -> Result<(), String> {
        self.step
            .set(step)
            .map_err(|e| format!("the step file: {e}"))?;
        let seen = self.offset().await?;
        let want = step.nanos() as f64 / 1e9;
        if (seen - want).abs() > 0.5 {
            return Err(format!(
                "server {} reads its clock {seen:+.3} s off after a step to {want:+.3} s: the \
                 clock shim is not in effect",
                self.port
            ));
        }
        Ok(())
    }

    /// The server's time of day less this process's, in seconds, as the server tells it:
    /// Redis's `TIME`; the `mtime` of a node ZooKeeper creates (milliseconds). The round trip
    /// is included: a few hundred µs on loopback.
    ///
    /// # Errors
    /// The server did not answer within 2 s.
    pub async fn offset(&self) -> Result<f64, String> {
        let server = async {
            match self.kind {
                Kind::Redis | Kind::RedisClusterNode => self.redis_time().await,
                Kind::ZooKeeper => self.zk_time().await,
            }
        };
        let server = tokio::time::timeout(Duration::from_secs(2), server)
            .await
            .map_err(|_| "no answer within 2 s".to_string())??;
        let ours = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| e.to_string())?;
        Ok(server - ours.as_secs_f64())
    }

    async fn redis_time(&self) -> Result<f64, String> {
        let client = redis::Client::open(format!("redis://{}", self.addr()));
        let mut conn = client
            .map_err(|e| e.to_string())?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(secs as f64 + micros as f64 / 1e6)
    }

    async fn zk_time(&self) -> Result<f64, String> {
        use zookeeper_client::{Acls, Client, CreateMode};
        let client = Client::connect(&self.addr())
            .await
            .map_err(|e| e.to_string())?;
        let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (stat, _) = client
            .create("/distlock-clock-probe-", b"", &opts)
            .await
            .map_err(|e| e.to_string())?;
        Ok(stat.mtime as f64 / 1e3)
    }
}

/// One clocked server as the safety nemesis breaks it: frozen by pid, and its clock stepped
/// (confirmed through the server at each step). Not restarted: it keeps nothing on disk.
#[async_trait]
impl Servers for ClockedServer {
    fn members(&self) -> Vec<String> {
        vec![format!("{:?}@{}", self.kind, self.port)]
    }

    async fn freeze(&self, _: usize) -> Result<(), BoxError> {
        crate::kill("STOP", self.pid()?);
        Ok(())
    }

    async fn thaw(&self, _: usize) -> Result<(), BoxError> {
        crate::kill("CONT", self.pid()?);
        Ok(())
    }

    async fn restart(&self, _: &[usize]) -> Result<(), BoxError> {
        Err("a clocked server is not restarted".into())
    }

    fn restart_keeps_locks(&self) -> bool {
        false
    }

    fn can_step_clock(&self) -> bool {
        true
    }

    async fn step_clock(&self, _: usize, step: ClockStep) -> Result<(), BoxError> {
        Ok(self.set_step(step).await?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report
mod tests {
    use super::*;

    /// Set in the child that [`a_process_with_a_skewed_monotonic_clock_counts_at_its_rate`]
    /// starts: it prints how long a 400 ms sleep looked on its own monotonic clock and on its
    /// time of day (which the fault leaves alone).
    const CHILD: &str = "DISTLOCK_CLOCK_SELF_TEST_CHILD";

    #[test]
    fn a_process_with_a_skewed_monotonic_clock_counts_at_its_rate() {
        if std::env::var_os(CHILD).is_some() {
            let (start, wall) = (Instant::now(), SystemTime::now());
            std::thread::sleep(Duration::from_millis(400)); // a relative, real-time sleep
            let real = wall.elapsed().unwrap_or_default().as_nanos();
            println!("elapsed-ns={} {real}", start.elapsed().as_nanos());
            return;
        }
        let mut child = Command::new(std::env::current_exe().unwrap());
        child
            .args([
                "--exact",
                "--nocapture",
                "clock::tests::a_process_with_a_skewed_monotonic_clock_counts_at_its_rate",
            ])
            .env(CHILD, "1");
        let out = skew_monotonic(&mut child, -500_000)
            .unwrap()
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().find_map(|l| l.strip_prefix("elapsed-ns="));
        let line = line.unwrap_or_else(|| panic!("the child printed no elapsed time: {stdout}"));
        let (seen, real) = line.split_once(' ').unwrap();
        let (seen, real): (f64, f64) = (seen.parse().unwrap(), real.parse().unwrap());
        // Half speed: the monotonic clock counts half of the real time that passed, however
        // long the sleep took on a loaded machine.
        let rate = seen / real;
        assert!(
            (0.45..0.55).contains(&rate),
            "a process whose monotonic clock runs at half speed counted {:.0} ms of a {:.0} ms \
             sleep (rate {rate:.3}): the shim is not in effect",
            seen / 1e6,
            real / 1e6
        );
    }
}
