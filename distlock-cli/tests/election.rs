//! End to end: `distlock elect` and `distlock leader`, the real binary as separate processes,
//! on etcd (the election's reference backend) and on a backend without elections.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_support::{kill, scratch, servers};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn etcd() -> String {
    servers::url("etcd://{etcd}")
}

fn distlock(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DISTLOCK_URL", url)
        .env("RUST_LOG", "error")
        .args(args)
        .stdin(Stdio::null());
    c
}

fn output(mut c: Command) -> Output {
    c.output().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn wait_for(path: &Path, limit: Duration) {
    let end = Instant::now() + limit;
    while !path.exists() {
        assert!(Instant::now() < end, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `distlock leader --json` now: (value, term), `None` for no leader.
fn leader(url: &str, name: &str) -> Option<(String, u64)> {
    let o = output(distlock(url, &["leader", "--name", name, "--json"]));
    assert_eq!(code(&o), 0, "leader: {}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["backend"], "etcd", "{v}");
    Some((v["value"].as_str()?.to_string(), v["term"].as_u64()?))
}

/// `distlock elect --value <value> -- sh -c "echo $DISTLOCK_TERM > <dir>/<value>; <then>"`,
/// returned once the command runs (it leads).
fn leading(url: &str, name: &str, value: &str, dir: &Path, then: &str) -> Child {
    let started = dir.join(value);
    let script = format!("echo $DISTLOCK_TERM > {}; {then}", started.display());
    let args = [
        "elect", "--name", name, "--value", value, "--ttl", "5s", "--grace", "1s", "--", "sh",
        "-c", &script,
    ];
    let child = distlock(url, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&started, Duration::from_secs(10));
    child
}

fn term_in(dir: &Path, value: &str) -> u64 {
    let t = std::fs::read_to_string(dir.join(value)).unwrap();
    t.trim()
        .parse()
        .unwrap_or_else(|_| panic!("DISTLOCK_TERM was {t:?}"))
}

/// The leader runs with its term as DISTLOCK_TERM, `leader` shows its value and that term, a
/// second candidate that does not wait exits 75 without running, and after the leader's
/// command ended (it resigned) the next candidate leads with a higher term; after that, nobody.
#[test]
fn elect_runs_the_leader_with_its_term_and_resigns_when_done() {
    let dir = scratch("distlock-cli-elect-");
    let url = etcd();
    let name = format!("elect-{}", std::process::id());
    assert_eq!(leader(&url, &name), None);
    let stop = dir.join("stop");
    let first = leading(
        &url,
        &name,
        "first",
        &dir,
        &format!("while [ ! -e {} ]; do sleep 0.05; done", stop.display()),
    );
    let t1 = term_in(&dir, "first");
    assert_eq!(leader(&url, &name), Some(("first".into(), t1)));
    let busy = output(distlock(
        &url,
        &[
            "elect",
            "--name",
            &name,
            "--value",
            "second",
            "--no-wait",
            "--",
            "true",
        ],
    ));
    assert_eq!(code(&busy), 75, "a second leader: {}", text(&busy.stderr));
    std::fs::write(&stop, "").unwrap();
    let out = first.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let next = leading(&url, &name, "next", &dir, "true");
    let t2 = term_in(&dir, "next");
    assert!(t2 > t1, "the next term {t2} is not above {t1}");
    assert_eq!(code(&next.wait_with_output().unwrap()), 0);
    assert_eq!(leader(&url, &name), None, "the last leader resigned");
}

/// `leader --watch --json` prints a line per change — nobody, a leader, nobody again after it
/// resigned, the next leader with a higher term — and ends with exit 0 on SIGTERM.
#[test]
fn leader_watch_prints_each_change_and_ends_on_sigterm() {
    let dir = scratch("distlock-cli-watch-");
    let url = etcd();
    let name = format!("watch-{}", std::process::id());
    let mut watcher = distlock(&url, &["leader", "--name", &name, "--watch", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
    let mut next = || -> serde_json::Value {
        let line = lines.next().expect("a line").unwrap();
        serde_json::from_str(&line).unwrap()
    };
    assert_eq!(next()["value"], serde_json::Value::Null, "nobody leads yet");
    let one = leading(&url, &name, "one", &dir, "sleep 0.3");
    let seen = next();
    assert_eq!(
        (seen["value"].as_str(), seen["term"].as_u64()),
        (Some("one"), Some(term_in(&dir, "one")))
    );
    assert_eq!(code(&one.wait_with_output().unwrap()), 0);
    assert_eq!(
        next()["value"],
        serde_json::Value::Null,
        "the leader resigned"
    );
    let two = leading(&url, &name, "two", &dir, "true");
    let seen = next();
    assert_eq!(seen["value"], "two", "{seen}");
    assert_eq!(code(&two.wait_with_output().unwrap()), 0);
    kill("TERM", watcher.id());
    let end = watcher.wait().unwrap();
    assert_eq!(end.code(), Some(0), "leader --watch after SIGTERM");
}

/// A leader whose key an operator deletes is stopped at once, as `run` is: exit 70.
#[test]
fn a_deleted_leader_key_stops_the_command_and_exits_70() {
    let dir = scratch("distlock-cli-deposed-");
    let url = servers::url("etcd://{etcd}?prefix=");
    let name = format!("deposed-{}", std::process::id());
    let child = leading(&url, &name, "doomed", &dir, "exec sleep 30");
    let t = Instant::now();
    let del = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &servers::addr("etcd"),
            "del",
            "--prefix",
            &format!("{name}/"),
        ])
        .output()
        .unwrap();
    assert_eq!(text(&del.stdout).trim(), "1", "{}", text(&del.stderr));
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 70, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("was lost"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "ran on for {:?}",
        t.elapsed()
    );
}

/// Where the backend holds no elections (Redlock: no fencing token to be a term), `elect` and
/// `leader` exit 64 without running anything; a value beyond 4096 bytes is refused too.
#[test]
fn no_elections_where_the_backend_has_none_and_no_oversized_values() {
    let redlock = servers::url("redlock://{redlock1},{redlock2},{redlock3}");
    let dir = scratch("distlock-cli-noelect-");
    let ran = dir.join("ran");
    let touch = format!("touch {}", ran.display());
    let o = output(distlock(
        &redlock,
        &[
            "elect", "--name", "x", "--value", "v", "--", "sh", "-c", &touch,
        ],
    ));
    assert_eq!(code(&o), 64, "{}", text(&o.stderr));
    assert!(!ran.exists(), "the command ran without leadership");
    let o = output(distlock(&redlock, &["leader", "--name", "x"]));
    assert_eq!(code(&o), 64, "{}", text(&o.stderr));
    let long = "v".repeat(4097);
    let o = output(distlock(
        &etcd(),
        &[
            "elect", "--name", "x", "--value", &long, "--", "sh", "-c", &touch,
        ],
    ));
    assert_eq!(code(&o), 64, "{}", text(&o.stderr));
    assert!(!ran.exists(), "the command ran with a refused value");
}
