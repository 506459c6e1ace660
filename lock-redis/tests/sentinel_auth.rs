//! Sentinels that want a login of their own (`requirepass` in `sentinel.conf`), apart from the
//! Redis servers' password: a master and a sentinel this test starts itself, on ports of
//! `test_support::ports`, so that the deployment of `scripts/services.sh` (whose sentinels
//! take no password) stays as its failover tests need it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Error, LockName, LockOptions};
use lock_redis::{RedisConfig, RedisLock};
use test_support::partition::Members;
use test_support::ports::free_ports;
use test_support::Scratch;

/// The Redis server's password (`requirepass`), which the sentinel also uses (`auth-pass`).
const SERVER_PW: &str = "server-pw";
/// The sentinel's own password.
const SENTINEL_PW: &str = "sentinel-pw";

/// A master and one sentinel that monitors it, killed when dropped.
struct Deployment {
    _servers: Members,
    sentinel: u16,
    _dir: Scratch,
}

fn start() -> Deployment {
    let dir = test_support::scratch("distlock-sentinel-auth");
    let held = free_ports(2);
    let (master, sentinel) = (held.numbers()[0], held.numbers()[1]);
    held.release();
    let log = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    let server = Command::new("redis-server")
        .args(["--port", &master.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            SERVER_PW,
        ])
        .stdin(Stdio::null())
        .stdout(log("server.log"))
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/services.sh install)");
    let conf = dir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sentinel}\nbind 127.0.0.1\ndir {}\nsentinel monitor m 127.0.0.1 {master} 1\n\
             sentinel auth-pass m {SERVER_PW}\nrequirepass {SENTINEL_PW}\n",
            dir.display()
        ),
    )
    .unwrap();
    let watcher = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(log("sentinel.log"))
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server --sentinel");
    Deployment {
        _servers: Members(vec![server, watcher]),
        sentinel,
        _dir: dir,
    }
}

/// The deployment's URL with `query`, and with the servers' password if `server_pw`.
fn url(d: &Deployment, server_pw: bool, query: &str) -> String {
    let auth = if server_pw {
        format!(":{SERVER_PW}@")
    } else {
        String::new()
    };
    format!("redis+sentinel://{auth}127.0.0.1:{}/m{query}", d.sentinel)
}

async fn connect(url: &str) -> lock_core::Result<RedisLock> {
    let config = RedisConfig::from_url(url)?.with_connect_timeout(Duration::from_secs(1));
    RedisLock::connect(config).await
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
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let d = start();
        // Up once the sentinel answers (its master is configured, so it names it at once).
        let with_login = url(&d, true, &format!("?sentinel_password={SENTINEL_PW}"));
        let until = Instant::now() + Duration::from_secs(10);
        let lock = loop {
            match connect(&with_login).await {
                Ok(lock) => break lock,
                Err(e) if Instant::now() > until => {
                    panic!("with both passwords: no connection within 10 s: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let name: LockName = "sentinel-auth".parse().unwrap();
        let lease = lock
            .try_acquire(&name, &LockOptions::new(Duration::from_secs(5)))
            .await
            .unwrap()
            .expect("a free lock");
        lease.release().await.unwrap();

        let missing = connect(&url(&d, true, "")).await;
        refusal(missing, "no sentinel password", "sentinel_password=");
        let wrong = connect(&url(&d, true, "?sentinel_password=wrong-pw")).await;
        refusal(wrong, "a wrong sentinel password", "sentinel_password=");
        // The sentinel's login is not the servers': without theirs the master refuses.
        let query = format!("?sentinel_password={SENTINEL_PW}");
        let no_server = connect(&url(&d, false, &query)).await;
        refusal(no_server, "no server password", "rejected the credentials");
    });
}
