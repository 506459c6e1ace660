//! `distlock run` never lets the command run without the lock: the real binary, as separate
//! processes, against the servers of `scripts/services.sh up`. Commands append a timestamp to
//! a file every 50 ms (a heartbeat), so an overlap with the next holder shows exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use conformance_tests::FaultProxy;
use test_support::clock::skew_monotonic;
use test_support::servers;
use test_support::{kill, scratch, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn tmp(tag: &str) -> Scratch {
    scratch(&format!("distlock-sup-{tag}-"))
}

fn unique(tag: &str) -> String {
    format!("sup-{tag}-{}", std::process::id())
}

fn distlock(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DISTLOCK_URL", url)
        .env("RUST_LOG", "error")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// A shell loop that appends `date +%s%N` to `file` every 50 ms, ignoring SIGTERM (so only
/// SIGKILL stops it), in the command's main process and in a background grandchild.
fn heartbeat(file: &Path) -> String {
    let f = file.display();
    format!(
        "trap '' TERM; (while :; do date +%s%N >> {f}; sleep 0.05; done) & \
         while :; do date +%s%N >> {f}; sleep 0.05; done"
    )
}

/// Records when the command started (`date +%s%N` into `file`), then sleeps `secs`.
fn mark_start(file: &Path, secs: f64) -> String {
    format!("date +%s%N > {}; sleep {secs}", file.display())
}

/// A `run` on `name` (TTL 2 s, then `extra` options) whose command is [`heartbeat`] into
/// `hb`, returned once it has beaten four times (so it holds the lock). Its monotonic clock
/// runs `clock_ppm` parts per million fast (negative: slow; see `test_support::clock`).
fn beating_holder(url: &str, name: &str, hb: &Path, extra: &[&str], clock_ppm: i64) -> Child {
    let beat = heartbeat(hb);
    let mut args = vec!["run", "--name", name, "--ttl", "2s"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", &beat]);
    let mut holder = distlock(url, &args);
    if clock_ppm != 0 {
        skew_monotonic(&mut holder, clock_ppm).unwrap();
    }
    let mut holder = holder.spawn().unwrap();
    wait_beats(&mut holder, hb, 4);
    holder
}

/// A second `run` on `name` that waits up to `wait` and records when its command started.
/// `distlock run --name NAME --ttl 2s --grace GRACE -- sh -c SCRIPT` against `url`, once the
/// script has written `beats` lines to `hb`: a holder whose command is running.
fn holding(url: &str, name: &str, grace: &str, script: &str, hb: &Path, beats: usize) -> Child {
    let mut holder = distlock(
        url,
        &[
            "run", "--name", name, "--ttl", "2s", "--grace", grace, "--", "sh", "-c", script,
        ],
    )
    .spawn()
    .unwrap();
    wait_beats(&mut holder, hb, beats);
    holder
}

fn second_run(url: &str, name: &str, start2: &Path, wait: &str) -> Child {
    distlock(
        url,
        &[
            "run",
            "--name",
            name,
            "--ttl",
            "2s",
            "--wait",
            wait,
            "--",
            "sh",
            "-c",
            &mark_start(start2, 0.3),
        ],
    )
    .spawn()
    .unwrap()
}

fn beats(file: &Path) -> Vec<u128> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Waits up to 20 s for `n` beats of `holder`'s command in `file`; fails with the holder's
/// exit status and stderr if it ends first or the beats do not come.
fn wait_beats(holder: &mut Child, file: &Path, n: usize) {
    let end = Instant::now() + Duration::from_secs(20);
    while beats(file).len() < n {
        let exited = holder.try_wait().unwrap();
        if exited.is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let _ = holder.kill();
        let status = holder.wait().unwrap();
        let mut stderr = String::new();
        if let Some(mut e) = holder.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
        }
        panic!(
            "the command beat {} time(s) into {} within 20 s, not {n}; the holder {} \
             (status {status}); its stderr: {stderr}",
            beats(file).len(),
            file.display(),
            if exited.is_some() {
                "exited first"
            } else {
                "was killed"
            },
        );
    }
}

/// Waits for a process, killing it and failing with `promise` if it takes longer than `limit`.
fn finish(mut child: Child, limit: Duration, promise: &str) -> Output {
    let end = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > end {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{promise}: still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_stamp(file: &Path) -> u128 {
    std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("{} not written: {e}", file.display()))
        .trim()
        .parse()
        .unwrap()
}

/// The second run (`second`) exits 0 within `limit`; no heartbeat of the first command came
/// after the second command started, and none at all a while later (its processes are gone,
/// not just quiet).
fn second_ran_alone(tag: &str, second: Child, limit: Duration, hb: &Path, start2: &Path) {
    exits(second, limit, &format!("{tag}: second run"), 0);
    let second = read_stamp(start2);
    let first = beats(hb);
    let last = *first.iter().max().unwrap();
    println!(
        "{tag}: the first command's last heartbeat came {:.1} ms before the second command \
         started",
        (second as f64 - last as f64) / 1e6
    );
    assert!(
        last < second,
        "{tag}: the first command wrote a heartbeat {} ms after the second command started \
         (last beat {last}, second start {second})",
        (last - second) / 1_000_000
    );
    let n = first.len();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        beats(hb).len(),
        n,
        "{tag}: processes of the first command still run"
    );
}

/// [`finish`], then the exit code must be `code`.
fn exits(child: Child, limit: Duration, promise: &str, code: i32) -> Output {
    let out = finish(child, limit, promise);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{promise}: exit code; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The holder's connections are blackholed; its command ignores SIGTERM. Another client gets
/// the lock once the backend lets the lease expire. The first command (with its background
/// grandchild) must be dead before the second starts, and distlock must exit 70.
///
/// Twice: with the holder's clock on time, and with its monotonic clock 1 % slow (the lease's
/// validity, the kill deadline and every timer of the holder then run late in real time). The
/// drift allowance, 1 % of the TTL + 2 ms, covers that even at `valid_until`; a cut-off `run`
/// stops its command sooner, at its first failed renewal (AtRisk).
fn lost_lock_kills_before_the_next_holder(
    tag: &str,
    via_proxy: &str,
    direct: &str,
    proxies: &[FaultProxy],
) {
    for clock_ppm in [0, -SLOW_CLOCK_PPM] {
        lost_lock_once(tag, via_proxy, direct, proxies, clock_ppm);
    }
}

/// The holder exits 70 (lock lost) within 30 s (`what` it went through, for the failure
/// message), and the second run's command ran alone within 60 s.
fn lost_then_second_alone(
    tag: &str,
    what: &str,
    holder: Child,
    second: Child,
    hb: &Path,
    start2: &Path,
) {
    exits(
        holder,
        Duration::from_secs(30),
        &format!("{tag}: {what}"),
        70,
    );
    second_ran_alone(tag, second, Duration::from_secs(60), hb, start2);
}

/// How slow a holder's clock runs in [`lost_lock_kills_before_the_next_holder`]: 1 %.
const SLOW_CLOCK_PPM: i64 = 10_000;

fn lost_lock_once(
    tag: &str,
    via_proxy: &str,
    direct: &str,
    proxies: &[FaultProxy],
    clock_ppm: i64,
) {
    let dir = tmp(tag);
    let name = unique(&format!("{tag}{clock_ppm}"));
    let tag = &if clock_ppm == 0 {
        tag.to_string()
    } else {
        format!("{tag} (holder's clock {:+} %)", clock_ppm as f64 / 1e4)
    };
    let (hb, start2) = (dir.join("hb"), dir.join("start2"));
    let holder = beating_holder(via_proxy, &name, &hb, &["--grace", "10s"], clock_ppm);
    for p in proxies {
        p.blackhole();
    }
    let second = second_run(direct, &name, &start2, "60s");
    lost_then_second_alone(tag, "holder cut off", holder, second, &hb, &start2);
    for p in proxies {
        p.heal();
    }
}

fn proxy(port: u16) -> FaultProxy {
    FaultProxy::start(format!("127.0.0.1:{port}").parse().unwrap()).unwrap()
}

/// [`lost_lock_kills_before_the_next_holder`] on the one server at `port`, through a proxy.
fn lost_lock_behind_one_proxy(tag: &str, scheme: &str, port: u16) {
    let p = proxy(port);
    lost_lock_kills_before_the_next_holder(
        tag,
        &format!("{scheme}://{}", p.addr()),
        &format!("{scheme}://127.0.0.1:{port}"),
        &[p],
    );
}

#[test]
fn lost_lock_redis() {
    lost_lock_behind_one_proxy("lost-redis", "redis", servers::port("redis"));
}

#[test]
fn lost_lock_redlock() {
    let ports: [u16; 5] = servers::numbered("redlock");
    let proxies: Vec<FaultProxy> = ports.iter().map(|p| proxy(*p)).collect();
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let direct: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    lost_lock_kills_before_the_next_holder(
        "lost-redlock",
        &format!("redlock://{}", hosts.join(",")),
        &format!("redlock://{}", direct.join(",")),
        &proxies,
    );
}

#[cfg(feature = "etcd")] // not in the CLI's default features (protoc)
#[test]
fn lost_lock_etcd() {
    lost_lock_behind_one_proxy("lost-etcd", "etcd", servers::port("etcd"));
}

/// The server's own keepalive (set by the driver to the session timeout) cannot see a
/// partition behind a userspace proxy; the proxy gives the session up on its behalf, at the
/// earliest moment the server could (see `FaultProxy::server_keepalive`).
#[test]
fn lost_lock_postgres() {
    let p = proxy(servers::port("pg"));
    p.server_keepalive(Some(Duration::from_secs(2)));
    lost_lock_kills_before_the_next_holder(
        "lost-pg",
        &format!(
            "postgres://locker@{}/postgres?sslmode=disable&session_timeout_ms=2000",
            p.addr()
        ),
        &servers::url("postgres://locker@{pg}/postgres?sslmode=disable&session_timeout_ms=2000"),
        &[p],
    );
}

#[test]
fn lost_lock_zookeeper() {
    let p = proxy(servers::port("zk"));
    lost_lock_kills_before_the_next_holder(
        "lost-zk",
        &format!("zk://{}?session_timeout_ms=2000", p.addr()),
        &servers::url("zk://{zk}?session_timeout_ms=2000"),
        &[p],
    );
}

/// The backend lets the lock go while the command runs and a second `run` waits: `let_go`
/// gets the lock's `DISTLOCK_KEY` and ends the grant on the server. The holder's lease turns
/// Lost before its validity ran out, so the lock may be the second run's already: the command
/// (which ignores SIGTERM, with a `--grace` of 10 s) must be killed at once, not given the
/// grace of an expiring lease. distlock exits 70; no heartbeat of the first command after the
/// second one started.
fn lost_by_the_backend(tag: &str, url: &str, let_go: impl FnOnce(&str)) {
    lost_by_the_backend_running(tag, url, heartbeat, let_go);
}

/// [`lost_by_the_backend`] with the command `command(heartbeat file)` (a shell script).
fn lost_by_the_backend_running(
    tag: &str,
    url: &str,
    command: fn(&Path) -> String,
    let_go: impl FnOnce(&str),
) {
    let dir = tmp(tag);
    let name = unique(tag);
    let (hb, start2, key) = (dir.join("hb"), dir.join("start2"), dir.join("key"));
    let beat = format!(
        "printf %s \"$DISTLOCK_KEY\" > {}; {}",
        key.display(),
        command(&hb)
    );
    let holder = holding(url, &name, "10s", &beat, &hb, 4);
    let second = second_run(url, &name, &start2, "60s");
    // Let the second run reach its wait (on PostgreSQL: queued on the server).
    std::thread::sleep(Duration::from_millis(500));
    let_go(&std::fs::read_to_string(&key).unwrap());
    lost_then_second_alone(
        tag,
        "holder whose lock the backend let go",
        holder,
        second,
        &hb,
        &start2,
    );
}

/// Runs `program args`, failing with its output if it fails.
fn run_tool(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An operator's `pg_terminate_backend` of the holder's session: the server frees the lock at
/// once and grants it to the queued second run. Before the fix, the first command beat on
/// for the grace of an expiring lease (2,013 ms measured with the defaults).
#[test]
fn lost_by_the_backend_postgres() {
    lost_by_the_backend(
        "letgo-pg",
        &servers::url("postgres://locker@{pg}/postgres?sslmode=disable&session_timeout_ms=2000"),
        terminate_holder,
    );
}

/// An operator's `pg_terminate_backend` of the session that holds the advisory lock `key`.
fn terminate_holder(key: &str) {
    run_tool(
        "psql",
        &[
            &test_support::pg_conninfo("pg"),
            "-Atc",
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_locks \
                 WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
                 AND ((classid::int8 << 32) | objid::int8) = {key}"
            ),
        ],
    )
}

/// Processes that fork and exit as fast as they can (each child forks on, its parent exits),
/// ignoring SIGTERM, beating into `file` at every step: a kill that lists processes and then
/// kills each one finds every listed one gone already and its child not listed. The main
/// process beats every 50 ms.
fn fork_loop(file: &Path) -> String {
    format!("exec python3 -c '{FORK_LOOP}' {}", file.display())
}

const FORK_LOOP: &str = r#"
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def beat():
    with open(sys.argv[1], "a") as f:
        f.write("%d\n" % time.time_ns())
for _ in range(4):
    if os.fork() == 0:
        while True:
            if os.fork():
                os._exit(0)
            beat()
while True:
    beat()
    time.sleep(0.05)
"#;

/// The final kill is one atomic signal to the command's group: a fork loop in the command
/// cannot outrun it. The server lets go of the lock (`pg_terminate_backend`) and grants it to
/// the queued second run at once; a kill that hunts processes one by one (measured before the
/// fix: 0.7 to 1.4 s for 4 to 16 such loops) leaves them beating after the second started.
/// Twice: the hunt was outrun in 5 of 6 single runs here.
#[test]
fn a_fork_loop_dies_at_once_when_the_lock_is_lost() {
    for round in 1..=2 {
        lost_by_the_backend_running(
            &format!("forkloop-pg-{round}"),
            &servers::url(
                "postgres://locker@{pg}/postgres?sslmode=disable&session_timeout_ms=2000",
            ),
            fork_loop,
            terminate_holder,
        );
    }
}

/// The lock's key deleted (an operator, an eviction): the holder's next renewal is refused.
/// The second run, which saw the key's time to live, tries again once it would have run out.
#[test]
fn lost_by_the_backend_redis() {
    lost_by_the_backend("letgo-redis", &servers::url("redis://{redis}"), |key| {
        run_tool(
            "redis-cli",
            &["-p", &servers::port("redis").to_string(), "DEL", key],
        )
    });
}

/// A loss during the grace of an at-risk lease kills at once: the grace was for a lock still
/// ours until `valid_until`, and a refused renewal says it may be someone else's now. The
/// holder is cut off until its lease is at risk (SIGTERM, which the command ignores, and
/// SIGKILL 4 s later: a third of the 12 s window); its key is deleted and the partition heals,
/// and the held-back renewal is refused. Before the fix the command beat on until the end of
/// the grace: a stop, once decided, never became a harder one.
#[test]
fn a_loss_during_an_at_risk_grace_kills_at_once() {
    let tag = "risk-then-lost";
    let p = proxy(servers::port("redis"));
    let dir = tmp(tag);
    let name = unique(tag);
    let (hb, key) = (dir.join("hb"), dir.join("key"));
    let script = format!(
        "printf %s \"$DISTLOCK_KEY\" > {}; {}",
        key.display(),
        heartbeat(&hb)
    );
    let mut holder = distlock(
        &format!("redis://{}", p.addr()),
        &[
            "run", "--name", &name, "--ttl", "12s", "--grace", "10s", "--", "sh", "-c", &script,
        ],
    )
    .spawn()
    .unwrap();
    let lines = stderr_lines(&mut holder);
    wait_beats(&mut holder, &hb, 4);
    p.blackhole();
    let said = |what: &str, within: Duration| {
        let end = Instant::now() + within;
        std::iter::from_fn(|| {
            lines
                .recv_timeout(end.saturating_duration_since(Instant::now()))
                .ok()
        })
        .find(|l| l.contains(what))
    };
    said("is at risk", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("{tag}: no 'at risk' within 15 s of the partition"));
    run_tool(
        "redis-cli",
        &[
            "-p",
            &servers::port("redis").to_string(),
            "DEL",
            &std::fs::read_to_string(&key).unwrap(),
        ],
    );
    let healed = now_ns();
    p.heal();
    let lost = said("was lost while the command ran", Duration::from_secs(3));
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(
        lost.is_some(),
        "{tag}: the renewal refused after the partition did not turn the at-risk stop into a \
         kill at once (no 'was lost' from distlock within 3 s of the heal)"
    );
    let last = *beats(&hb).iter().max().unwrap();
    assert!(
        last < healed + 2_000_000_000,
        "{tag}: the command beat {} ms after the heal (the at-risk grace was 4 s; a loss must \
         kill at once)",
        (last - healed) / 1_000_000
    );
}

/// The lines `child` writes to its stderr (which it must have piped), as they come.
fn stderr_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// distlock gets SIGKILL while its command runs: the command's processes die with it, before a
/// second run can start its command.
fn supervisor_killed(tag: &str, url: &str) {
    let dir = tmp(tag);
    let name = unique(tag);
    let (hb, start2) = (dir.join("hb"), dir.join("start2"));
    let mut holder = beating_holder(url, &name, &hb, &[], 0);
    kill("KILL", holder.id());
    let _ = holder.wait();
    let second = second_run(url, &name, &start2, "30s");
    second_ran_alone(tag, second, Duration::from_secs(40), &hb, &start2);
}

#[test]
fn supervisor_killed_file() {
    let dir = tmp("killed-file-locks");
    supervisor_killed("killed-file", &format!("file://{}", dir.display()));
}

#[test]
fn supervisor_killed_redis() {
    supervisor_killed("killed-redis", &servers::url("redis://{redis}"));
}

/// distlock is frozen (SIGSTOP; Ctrl-Z stops it the same way, and no stop of distlock reaches
/// the command, which runs in a process group of its own). It renews nothing, so the lease
/// expires on the server and a second run takes the lock: the first command (which ignores
/// SIGTERM) must be dead before the second starts. Resumed, distlock exits 70.
#[test]
fn frozen_supervisor_cannot_outlive_the_lease() {
    let (tag, url) = ("frozen-redis", &*servers::url("redis://{redis}"));
    let dir = tmp(tag);
    let name = unique(tag);
    let (hb, start2) = (dir.join("hb"), dir.join("start2"));
    let holder = beating_holder(url, &name, &hb, &["--grace", "10s"], 0);
    // Renewals move the keeper's deadline: a command outlives its first TTL while distlock runs.
    std::thread::sleep(Duration::from_secs(3));
    let n = beats(&hb).len();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        beats(&hb).len() > n,
        "{tag}: the command stopped beating 3 s into a healthy 2 s lease (renewals must move \
         the keeper's deadline)"
    );
    kill("STOP", holder.id());
    let second = second_run(url, &name, &start2, "30s");
    let alone = std::panic::catch_unwind(|| {
        second_ran_alone(tag, second, Duration::from_secs(40), &hb, &start2);
    });
    kill("CONT", holder.id());
    if let Err(e) = alone {
        std::panic::resume_unwind(e);
    }
    exits(holder, Duration::from_secs(30), "frozen, then resumed", 70);
}

/// The command freezes its own keeper (`kill -STOP $PPID`), the process that relays every stop
/// to it; then the holder is cut off from Redis. distlock must still see the command (which
/// ignores SIGTERM) dead before a second run starts its own, and exit 70.
#[test]
fn frozen_keeper_cannot_outlive_the_lease() {
    let tag = "frozen-keeper";
    let p = proxy(servers::port("redis"));
    let dir = tmp(tag);
    let name = unique(tag);
    let (hb, start2) = (dir.join("hb"), dir.join("start2"));
    let script = format!("kill -STOP $PPID; {}", heartbeat(&hb));
    let via = format!("redis://{}", p.addr());
    let holder = holding(&via, &name, "10s", &script, &hb, 4);
    p.blackhole();
    let second = second_run(&servers::url("redis://{redis}"), &name, &start2, "60s");
    let alone = std::panic::catch_unwind(|| {
        second_ran_alone(tag, second, Duration::from_secs(60), &hb, &start2);
    });
    // Resumed, a keeper that was left frozen ends the command (so a failure leaves nothing).
    let _ = Command::new("pkill")
        .args(["-CONT", "-P", &holder.id().to_string()])
        .status();
    if let Err(e) = alone {
        std::panic::resume_unwind(e);
    }
    exits(
        holder,
        Duration::from_secs(30),
        &format!("{tag}: holder cut off"),
        70,
    );
}

/// A Ctrl-Z (SIGTSTP) does not stop distlock, which would renew nothing: it says so, and the
/// command runs to its end under the lock, well past the TTL. (A stopped distlock would never
/// exit here: nothing resumes it.)
#[test]
fn ctrl_z_does_not_suspend_a_holder() {
    let name = unique("tstp");
    let url = &*servers::url("redis://{redis}");
    let holder = distlock(
        url,
        &["run", "--name", &name, "--ttl", "2s", "--", "sleep", "4"],
    )
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    kill("TSTP", holder.id());
    let out = exits(holder, Duration::from_secs(20), "a Ctrl-Z'd holder", 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not suspended"),
        "distlock refused the Ctrl-Z without a word: {stderr}"
    );
}

/// The keeper itself is SIGKILLed (the OOM killer, an operator) while the command runs, with
/// a background loop that left the command's process group (`setsid`): distlock must leave
/// nothing of the command running, release the lock, and exit 71 without crying wolf.
#[test]
fn a_killed_keeper_leaves_nothing_running() {
    let tag = "keeper-killed";
    let dir = tmp(tag);
    let url = format!("file://{}", dir.join("locks").display());
    let name = unique(tag);
    let hb = dir.join("hb");
    let f = hb.display();
    let script =
        format!("setsid sh -c 'while :; do date +%s%N >> {f}; sleep 0.05; done' & sleep 30");
    // stderr to a file: an escaped process holding a pipe would keep the test waiting for EOF.
    let log = dir.join("stderr");
    let mut holder = distlock(&url, &["run", "--name", &name, "--", "sh", "-c", &script])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Whatever happens, the loop does not outlive the test.
    let _cleanup = Cleanup(f.to_string());
    wait_beats(&mut holder, &hb, 4);
    let keeper = Command::new("pgrep")
        .args(["-P", &holder.id().to_string()])
        .output()
        .unwrap();
    let keeper = String::from_utf8_lossy(&keeper.stdout).trim().to_string();
    assert!(
        !keeper.is_empty(),
        "distlock has no child process (the keeper)"
    );
    kill("KILL", &keeper);
    exits(
        holder,
        Duration::from_secs(10),
        "distlock, its keeper killed",
        71,
    );
    let stderr = std::fs::read_to_string(&log).unwrap();
    let n = beats(&hb).len();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        beats(&hb).len(),
        n,
        "a process of the command that left its group still runs after distlock exited, its \
         keeper killed; distlock said: {stderr}"
    );
    assert!(
        !stderr.contains("may still run"),
        "distlock said processes may still run, yet the command's group was only zombies: \
         {stderr}"
    );
    assert_free(&url, &name, "once distlock, its keeper killed, has exited");
}

/// A `run --no-wait` on `name` gets the lock at once: it is free `when`.
fn assert_free(url: &str, name: &str, when: &str) {
    let o = distlock(url, &["run", "--name", name, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "the lock must be free {when}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Kills, when dropped, every process whose command line matches its pattern (a regular
/// expression, as pkill(1) reads it: a scratch path matches itself).
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", &self.0])
            .status();
    }
}

/// The `SigBlk` and `SigIgn` lines of `/proc/self/status` as `grep` sees them, run directly by
/// this test or as the command of a `distlock run`.
fn signal_state(under_distlock: Option<&str>) -> String {
    let grep = ["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"];
    let mut cmd = match under_distlock {
        Some(url) => {
            let name = unique("sigmask");
            let mut args = vec!["run", "--name", name.as_str(), "--"];
            args.extend_from_slice(&grep);
            let mut c = distlock(url, &args);
            c.stdout(Stdio::piped());
            c
        }
        None => {
            let mut c = Command::new(grep[0]);
            c.args(&grep[1..]);
            c
        }
    };
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "grep of /proc/self/status failed; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command starts as it would without distlock: no signal blocked (the keeper blocks the
/// ones it reads from a signalfd; a command that inherited that mask would never get the
/// SIGTERM meant to stop it, nor a Ctrl-C), and the same signals ignored.
#[test]
fn the_command_starts_with_no_signal_blocked_or_ignored() {
    let dir = tmp("sigmask");
    let url = format!("file://{}", dir.display());
    let direct = signal_state(None);
    let under = signal_state(Some(&url));
    assert!(
        direct.contains("SigBlk:\t0000000000000000"),
        "the test's own grep: {direct}"
    );
    assert_eq!(
        under, direct,
        "the command's signal mask and ignored signals under `distlock run` (left) differ \
         from the same command's run directly (right)"
    );
}

/// Whether signal `sig` is ignored in a `SigIgn:` line of `/proc/PID/status` in `text`.
fn ignores(text: &str, sig: u32) -> bool {
    text.lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

/// A signal ignored when distlock starts stays ignored, by distlock and by the command, as
/// without distlock (the Unix convention, which `nohup` and a shell's `cmd &` rely on): a
/// `nohup distlock run` survives a hangup, and a shell script's background `distlock run` a
/// Ctrl-C. Before, distlock's handlers replaced the ignore, and it relayed the signal.
#[test]
fn a_signal_ignored_at_start_stays_ignored() {
    const SIGHUP: u32 = 1;
    let dir = tmp("ignored");
    let url = format!("file://{}", dir.display());
    let name = unique("ignored");
    let grep = ["grep", "^SigIgn", "/proc/self/status"];
    let direct = Command::new("nohup").args(grep).output().unwrap();
    let direct = String::from_utf8_lossy(&direct.stdout).into_owned();
    assert!(ignores(&direct, SIGHUP), "`nohup grep` itself: {direct}");
    let mut args = vec![BIN, "run", "--url", &url, "--name", &name, "--"];
    args.extend_from_slice(&grep);
    let under = Command::new("nohup").args(&args).output().unwrap();
    let under = String::from_utf8_lossy(&under.stdout).into_owned();
    assert!(
        ignores(&under, SIGHUP),
        "the command of `nohup distlock run` must find SIGHUP ignored, as under `nohup` \
         alone: {under}"
    );

    // `nohup distlock run`, then a SIGHUP to distlock (a closed terminal's).
    survives(&url, &name, "nohup ", "HUP");
    // A shell script's `distlock run … &`: sh starts it with SIGINT ignored; a Ctrl-C at the
    // script's terminal reaches its whole group, distlock included.
    survives(&url, &name, "", "INT");
}

/// `sh -c "{prefix}distlock run … &"`, then SIG`sig` to distlock: the command must finish,
/// and distlock exit 0.
fn survives(url: &str, name: &str, prefix: &str, sig: &str) {
    let script = "sleep 1; echo finished";
    let run = [
        BIN, "run", "--url", url, "--name", name, "--", "sh", "-c", script,
    ];
    let quoted: Vec<String> = run.iter().map(|a| format!("'{a}'")).collect();
    let background = format!("{prefix}{} & echo $!; wait $!", quoted.join(" "));
    let mut sh = Command::new("sh")
        .args(["-c", &background])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pid = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(sh.stdout.as_mut().unwrap()),
        &mut pid,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    kill(sig, pid.trim());
    let out = exits(
        sh,
        Duration::from_secs(10),
        &format!("`{prefix}distlock run … &` must go on through a SIG{sig}"),
        0,
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("finished"),
        "the command was stopped by a SIG{sig} it should not have seen"
    );
}

/// --max-hold's SIGTERM reaches a command that is not a shell (`sleep`, which leaves its
/// signal mask as it finds it): it ends at once, not at the SIGKILL a long grace later.
#[test]
fn max_hold_sigterm_reaches_a_command_that_is_not_a_shell() {
    let dir = tmp("maxhold-term");
    let url = format!("file://{}", dir.display());
    let name = unique("maxhold-term");
    let started = Instant::now();
    let holder = distlock(
        &url,
        &[
            "run",
            "--name",
            &name,
            "--max-hold",
            "500ms",
            "--grace",
            "30s",
            "--",
            "sleep",
            "60",
        ],
    )
    .spawn()
    .unwrap();
    exits(
        holder,
        Duration::from_secs(10),
        "--max-hold's SIGTERM must end `sleep` at once (the SIGKILL comes only 30 s later)",
        70,
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The command starts a background grandchild (ignoring SIGTERM) and `how` ends the command;
/// a second run waits for the lock. The grandchild never beats after the second started.
fn descendants(tag: &str, url: &str, how: &str) {
    let dir = tmp(tag);
    let name = unique(tag);
    let (hb, start2) = (dir.join("hb"), dir.join("start2"));
    let f = hb.display();
    let main = if how == "exit" {
        "sleep 0.3"
    } else {
        "sleep 30"
    };
    let script =
        format!("(trap '' TERM; while :; do date +%s%N >> {f}; sleep 0.05; done) & {main}; exit 0");
    let holder = holding(url, &name, "500ms", &script, &hb, 2);
    let second = second_run(url, &name, &start2, "30s");
    if how == "sigterm" {
        std::thread::sleep(Duration::from_millis(200));
        kill("TERM", holder.id());
    }
    let expected = if how == "sigterm" { 143 } else { 0 };
    exits(
        holder,
        Duration::from_secs(20),
        &format!("{tag}: holder"),
        expected,
    );
    second_ran_alone(tag, second, Duration::from_secs(30), &hb, &start2);
}

/// Runs `case(tag, url)` on a file backend (in a fresh directory) and on Redis, tagged
/// `{tag}-file` and `{tag}-redis`.
fn on_file_and_redis(tag: &str, case: impl Fn(&str, &str)) {
    let dir = tmp(&format!("{tag}-locks"));
    case(&format!("{tag}-file"), &format!("file://{}", dir.display()));
    case(&format!("{tag}-redis"), &servers::url("redis://{redis}"));
}

#[test]
fn descendants_after_the_command_exits() {
    on_file_and_redis("desc-exit", |tag, url| descendants(tag, url, "exit"));
}

#[test]
fn descendants_after_sigterm_to_distlock() {
    on_file_and_redis("desc-term", |tag, url| descendants(tag, url, "sigterm"));
}

/// `distlock run --name NAME --min-hold HOLD --ttl 3s -- COMMAND...` against `url`, started.
fn min_holder(url: &str, name: &str, hold: &str, command: &[&str]) -> Child {
    let mut args = vec![
        "run",
        "--name",
        name,
        "--min-hold",
        hold,
        "--ttl",
        "3s",
        "--",
    ];
    args.extend_from_slice(command);
    distlock(url, &args).spawn().unwrap()
}

/// `--min-hold 2s` with a 0.1 s command: `--no-wait` runs in those 2 s exit 75, one after
/// them exits 0.
fn min_hold(tag: &str, url: &str) {
    let name = unique(tag);
    let t = Instant::now();
    let holder = min_holder(url, &name, "2s", &["sleep", "0.1"]);
    for at in [500, 1500] {
        std::thread::sleep(Duration::from_millis(at).saturating_sub(t.elapsed()));
        let o = distlock(url, &["run", "--name", &name, "--no-wait", "--", "true"])
            .output()
            .unwrap();
        assert!(
            t.elapsed() < Duration::from_millis(1900),
            "{tag}: machine too slow for the check"
        );
        assert_eq!(
            o.status.code(),
            Some(75),
            "{tag}: a run {at} ms into --min-hold 2s got the lock: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let out = finish(holder, Duration::from_secs(10), "min-hold holder");
    assert_eq!(out.status.code(), Some(0), "{tag}: the command's status");
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "{tag}: released after {:?}, before --min-hold",
        t.elapsed()
    );
    assert_free(url, &name, &format!("{tag}: after --min-hold"));
}

#[test]
fn min_hold_keeps_the_lock_after_a_short_command() {
    on_file_and_redis("minhold", min_hold);
}

/// A SIGTERM during `--min-hold` ends distlock at once and leaves the lock to what holds it
/// on the backend: `outlives` (a TTL, a ZooKeeper session's timeout) says for about how long a
/// `--no-wait` run right after the exit must be refused and by when it must get the lock;
/// `None`: a lock that lives in distlock's own connection or open file ends with it.
fn min_hold_signal(tag: &str, url: &str, outlives: Option<Duration>) {
    let name = unique(tag);
    let holder = min_holder(url, &name, "60s", &["true"]);
    // The command (`true`) has ended; distlock holds the lock for --min-hold.
    std::thread::sleep(Duration::from_millis(700));
    kill("TERM", holder.id());
    let exited = Instant::now();
    exits(holder, Duration::from_secs(5), &format!("{tag}: holder"), 0);
    let Some(outlives) = outlives else {
        assert_free(
            url,
            &name,
            &format!("{tag}: once distlock, which held it, exited"),
        );
        return;
    };
    let o = distlock(url, &["run", "--name", &name, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(75),
        "{tag}: a run {:?} after a SIGTERM in --min-hold got the lock: the lock must be left \
         to expire, not released (nor its node deleted, its lease revoked or its session \
         closed): {}",
        exited.elapsed(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::thread::sleep(outlives.saturating_sub(exited.elapsed()));
    assert_free(
        url,
        &name,
        &format!("{tag}: {outlives:?} after distlock exited"),
    );
}

#[test]
fn a_signal_in_min_hold_leaves_the_lock_to_the_backend() {
    let dir = tmp("minhold-sig-locks");
    min_hold_signal(
        "minhold-sig-file",
        &format!("file://{}", dir.display()),
        None,
    );
    min_hold_signal(
        "minhold-sig-pg",
        &servers::url("postgres://locker@{pg}/postgres?sslmode=disable&session_timeout_ms=2000"),
        None,
    );
    // --ttl 3s; the grant's TTL counts from before distlock's exit.
    let ttl = Some(Duration::from_secs(4));
    min_hold_signal("minhold-sig-redis", &servers::url("redis://{redis}"), ttl);
    min_hold_signal(
        "minhold-sig-redlock",
        &servers::url("redlock://{redlock1},{redlock2},{redlock3}"),
        ttl,
    );
    // The session's timeout (2 s) from distlock's exit, and the server's expiry tick.
    min_hold_signal(
        "minhold-sig-zk",
        &servers::url("zk://{zk}?session_timeout_ms=2000"),
        Some(Duration::from_secs(5)),
    );
    #[cfg(feature = "etcd")] // not in the CLI's default features (protoc)
    min_hold_signal(
        "minhold-sig-etcd",
        &servers::url("etcd://{etcd}"),
        Some(Duration::from_secs(6)),
    );
}

/// Sets `path`'s permission bits.
fn perm(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A scratch directory anyone may write to, holding a setuid-root copy of setpriv(1): run by
/// `nobody`, `setpriv --reuid=0 --regid=0 --clear-groups -- CMD` makes CMD root, as `sudo`
/// would. `None` (the test skipped) unless this process is root.
fn setuid_root_helper(tag: &str) -> Option<(Scratch, std::path::PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        eprintln!("skipped: making a setuid helper needs root");
        return None;
    }
    let dir = tmp(tag);
    perm(&dir, 0o777);
    let helper = dir.join("setpriv-root");
    std::fs::copy("/usr/bin/setpriv", &helper).unwrap();
    perm(&helper, 0o4755);
    Some((dir, helper))
}

/// A command that changes its user, as `sudo` does, cannot be signalled by distlock. Run as
/// `nobody`, with a command made root by a setuid copy of setpriv(1): when the lock is lost
/// (its key deleted), the keeper's SIGKILL gets EPERM. distlock must say so at once and exit
/// 77, not wait forever on a process it may not kill while the lock is granted elsewhere.
#[test]
fn a_command_that_changed_user_is_reported_at_once() {
    use std::os::unix::process::CommandExt;
    let Some((dir, helper)) = setuid_root_helper("setuid") else {
        return;
    };
    let (job, key_file) = (dir.join("job.sh"), dir.join("key"));
    std::fs::write(
        &job,
        format!(
            "echo \"$DISTLOCK_KEY\" > {}\nwhile :; do sleep 0.1; done\n",
            key_file.display()
        ),
    )
    .unwrap();
    perm(&job, 0o755);
    let cleanup = Cleanup(job.display().to_string());
    let name = unique("setuid");
    let mut holder = distlock(
        &servers::url("redis://{redis}"),
        &["run", "--name", &name, "--ttl", "3s", "--"],
    );
    holder
        .arg(&helper)
        .args(["--reuid=0", "--regid=0", "--clear-groups", "--", "sh"])
        .arg(&job)
        .uid(65534)
        .gid(65534);
    let mut holder = holder.spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let key = loop {
        match std::fs::read_to_string(&key_file) {
            Ok(k) if k.ends_with('\n') => break k.trim().to_string(),
            _ if Instant::now() > end => panic!("the command did not start as root"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    run_tool(
        "redis-cli",
        &["-p", &servers::port("redis").to_string(), "DEL", &key],
    );
    let deleted = Instant::now();
    // The root process holds distlock's stderr open: it must be gone before the output can be
    // read to its end.
    while holder.try_wait().unwrap().is_none() && deleted.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let exited = deleted.elapsed();
    drop(cleanup);
    let out = exits(
        holder,
        Duration::from_secs(5),
        "a run whose command changed user, after its lock was lost",
        77,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        exited < Duration::from_secs(3),
        "distlock took {exited:?} after the key's deletion to give up (TTL 3 s): {err}"
    );
    assert!(
        err.contains("another user") && err.contains("lost"),
        "distlock must say that the command changed user and that the lock is lost: {err}"
    );
}

/// The same helper, and a command whose main process ends at once, leaving a root process
/// that runs for 2 s: distlock cannot kill it after the grace, so it keeps the lock (a file
/// lock, which ends with distlock) while that process runs, says so, releases once it is gone,
/// and exits 77.
#[test]
fn a_lock_outlives_what_changed_user_in_the_command() {
    use std::os::unix::process::CommandExt;
    let Some((dir, helper)) = setuid_root_helper("setuid-outlives") else {
        return;
    };
    let locks = dir.join("locks");
    std::fs::create_dir(&locks).unwrap();
    perm(&locks, 0o777);
    let url = format!("file://{}", locks.display());
    let job = dir.join("job.sh");
    std::fs::write(&job, "(sleep 2) &\n").unwrap();
    perm(&job, 0o755);
    let _cleanup = Cleanup(job.display().to_string());
    let name = unique("setuid-outlives");
    let mut holder = distlock(&url, &["run", "--name", &name, "--grace", "100ms", "--"]);
    holder
        .arg(&helper)
        .args(["--reuid=0", "--regid=0", "--clear-groups", "--", "sh"])
        .arg(&job)
        .uid(65534)
        .gid(65534)
        .stderr(Stdio::null());
    let t = Instant::now();
    let mut holder = holder.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let o = distlock(&url, &["run", "--name", &name, "--no-wait", "--", "true"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(75),
        "a run while the root process of the holder's command still ran got the lock: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let end = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = holder.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < end,
            "distlock did not exit once the root process ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(77), "distlock's status");
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "distlock exited after {:?}, before the root process (2 s) ended",
        t.elapsed()
    );
    assert_free(
        &url,
        &name,
        "once the root process ended and distlock exited",
    );
}

/// Pieces of a password that uses every URL delimiter; none may appear in any output.
const PIECES: [&str; 6] = ["pwA1", "pwB2", "pwC3", "pwD4", "pwE5", "pwF6"];

#[test]
fn passwords_never_appear_in_any_output() {
    let raw = "pwA1/pwB2?pwC3#pwD4@pwE5:pwF6";
    let encoded = "pwA1%2FpwB2%3FpwC3%23pwD4%40pwE5%3ApwF6";
    let dir = tmp("secrets");
    let templates = [
        "redis://locker:{pw}@{redis-auth}",
        "redis://:{pw}@{redis-auth}/0?prefix=x",
        "rediss://locker:{pw}@{redis-tls}",
        "redlock://locker:{pw}@{redlock1},{redlock2},{redlock3}",
        "zk://locker:{pw}@{zk-auth}/chroot",
        "etcd://locker:{pw}@{etcd-auth}/prefix",
        "etcd://locker:{pw}@127.0.0.1:1",
        "redis://locker:{pw}@127.0.0.1:1",
        "redlock://locker:{pw}@127.0.0.1:1,{redlock2},{redlock3}",
        "postgres://locker:{pw}@{pg-auth}/postgres?sslmode=disable",
        "postgres://locker:{pw}@127.0.0.1:1/postgres",
        "memory://u:{pw}@store",
        "file://u:{pw}@/tmp/x",
        "nosuch://u:{pw}@h",
        "u:{pw}@h",
    ];
    for t in templates {
        for pw in [raw, encoded] {
            let url = servers::url(&t.replace("{pw}", pw)); // the password has no braces
            let runs: [(Vec<&str>, bool); 5] = [
                (
                    vec![
                        "run",
                        "--url",
                        &url,
                        "--name",
                        "n",
                        "--no-wait",
                        "--",
                        "true",
                    ],
                    false,
                ),
                (vec!["status", "--url", &url, "--name", "n"], false),
                (vec!["status", "--name", "n", "--json"], true),
                (
                    vec!["run", "--url", &url, "--name", "bad name", "--", "true"],
                    false,
                ),
                // The JSON lines carry the spans' fields.
                (
                    vec![
                        "run",
                        "--log-format",
                        "json",
                        "--url",
                        &url,
                        "--name",
                        "n",
                        "--no-wait",
                        "--",
                        "true",
                    ],
                    false,
                ),
            ];
            for (args, env) in runs {
                let mut c = Command::new(BIN);
                c.args(&args)
                    .env("RUST_LOG", "trace")
                    .env("DISTLOCK_URL", if env { url.as_str() } else { "memory://" })
                    .env("TMPDIR", &*dir)
                    .stdin(Stdio::null());
                let o = c.output().unwrap();
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                assert!(!text.contains("panicked"), "{args:?} panicked: {text}");
                for p in PIECES {
                    assert!(
                        !text.contains(p),
                        "password piece {p} printed for {t} ({args:?}): {text}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_default_directory_must_be_private() {
    let base = tmp("defaultdir");
    let uid = nix_uid();
    let run = |tmpdir: &Path, xdg: Option<&Path>| {
        let mut c = Command::new(BIN);
        c.args(["run", "--name", "d", "--no-wait", "--", "true"])
            .env_remove("DISTLOCK_URL")
            .env_remove("XDG_RUNTIME_DIR")
            .env("TMPDIR", tmpdir)
            .stdin(Stdio::null());
        if let Some(x) = xdg {
            c.env("XDG_RUNTIME_DIR", x);
        }
        c.output().unwrap()
    };
    // Fresh: created 0700 and used.
    let fresh = base.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    let o = run(&fresh, None);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let made = fresh.join(format!("distlock-{uid}"));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&made).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "{}", made.display());
    // Pre-created by another user: refused.
    let foreign = base.join("foreign");
    let planted = foreign.join(format!("distlock-{uid}"));
    std::fs::create_dir_all(&planted).unwrap();
    let chown = Command::new("chown")
        .args(["nobody", planted.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(chown.success(), "chown nobody (the tests run as root)");
    let o = run(&foreign, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("another user"), "{err}");
    // Writable by others: refused.
    let open = base.join("open");
    let dir = open.join(format!("distlock-{uid}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let o = run(&open, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("writable by others"), "{err}");
    // XDG_RUNTIME_DIR wins when set.
    let xdg = base.join("xdg");
    std::fs::create_dir_all(&xdg).unwrap();
    let o = run(&open, Some(&xdg));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(xdg.join("distlock").join("d.lock").exists());
}

fn nix_uid() -> u32 {
    let o = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

#[test]
fn any_duration_gives_a_working_run_or_a_usage_error() {
    let dir = tmp("durations");
    let url = format!("file://{}", dir.display());
    for (args, want) in [
        (vec!["--ttl", "0s"], 64),
        (vec!["--ttl", "100years"], 64),
        (vec!["--ttl", "18446744073709551615s"], 64),
        (vec!["--ttl", "99999999999999999999999999h"], 64),
        // Too short to keep: the lease runs out before the command's keeper is ready, and
        // the command is stopped (not a failure to supervise, 71).
        (vec!["--ttl", "1ms"], 70),
        (vec!["--ttl", "5ms"], 70),
        (vec!["--wait", "99years"], 0),
        (vec!["--wait", "1000years"], 64),
        (vec!["--grace", "99years"], 0),
        (vec!["--grace", "0s"], 0),
        (vec!["--max-hold", "99years"], 0),
        // As the library's `max_hold`: zero is a usage error, not a command stopped at once.
        (vec!["--max-hold", "0s"], 64),
        (vec!["--min-hold", "0s"], 0),
        (vec!["--min-hold", "1000years"], 64),
    ] {
        let mut all = vec!["run", "--name", "dur"];
        all.extend(&args);
        all.extend(["--", "sleep", "0.2"]);
        let o = distlock(&url, &all).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("keeper died"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(want), "{args:?}: {err}");
    }
}
