//! End to end: the real `distlock` binary, run as separate processes, on every backend of
//! `scripts/services.sh up` and on files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_support::servers;
use test_support::{kill, scratch, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn tmp(tag: &str) -> Scratch {
    scratch(&format!("distlock-cli-{tag}-"))
}

fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.join("locks").display())
}

fn distlock(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DISTLOCK_URL", url)
        .env("RUST_LOG", "error")
        .args(args);
    c
}

/// A file `tag` in `dir` and a shell command that creates it: whether a command ran.
fn ran_marker(dir: &Path, tag: &str) -> (std::path::PathBuf, String) {
    let ran = dir.join(tag);
    let touch = format!("touch {}", ran.display());
    (ran, touch)
}

/// `distlock run --name x -- touch <marker>` on `url`: its exit code, its stderr, and whether
/// the command ran.
fn run_marked(dir: &Path, url: &str, tag: &str) -> (i32, String, bool) {
    let (ran, script) = ran_marker(dir, tag);
    let o = output(distlock(
        url,
        &["run", "--name", "x", "--", "sh", "-c", &script],
    ));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (code(&o), err, ran.exists())
}

fn output(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Waits for a `run` whose lock was lost: it must exit 70 (EX_SOFTWARE, "lost").
fn exits_lost(holder: Child) -> Output {
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 70, "{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn wait_for(path: &Path, limit: Duration) {
    let end = Instant::now() + limit;
    while !path.exists() {
        assert!(Instant::now() < end, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(mut c: Command) -> Child {
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts `distlock run <args> -- sh -c "touch started; <then>"` in `dir` and returns once the
/// command runs, that is once it holds the lock.
fn holding(url: &str, dir: &Path, args: &[&str], then: &str) -> Child {
    let started = dir.join("started");
    let script = format!("touch {}; {then}", started.display());
    let mut argv = vec!["run"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--", "sh", "-c", &script]);
    let child = spawn(distlock(url, &argv));
    wait_for(&started, Duration::from_secs(10));
    child
}

#[test]
fn bad_arguments_urls_and_names_exit_64_with_one_line() {
    let dir = tmp("usage");
    let url = file_url(&dir);
    for args in [
        vec!["run", "--name", "x"],
        vec!["run", "--name", "bad name", "--", "true"],
        vec!["run", "--name", "x", "--ttl", "soon", "--", "true"],
        vec![
            "run",
            "--name",
            "x",
            "--url",
            "nosuch://u:secretpw@h",
            "--",
            "true",
        ],
        vec!["run", "--name", "x", "--url", "not a url", "--", "true"],
        vec![
            "run",
            "--name",
            "x",
            "--wait",
            "1s",
            "--no-wait",
            "--",
            "true",
        ],
    ] {
        let o = output(distlock(&url, &args));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(code(&o), 64, "{args:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
        assert!(!err.contains("secretpw"), "{err}");
    }
}

/// `--shared` and `--permits K` take the lock in that mode where the backend has it (the file
/// backend's both, the memory driver's both, within its one process), and exit 64 without
/// running the command where it has not (Redlock's permits), for `--permits 0`, and for both
/// at once: never an exclusive lock in their place.
#[test]
fn shared_and_permits_run_where_the_backend_has_them_and_exit_64_elsewhere() {
    let dir = tmp("modes");
    let (marker, touch) = ran_marker(&dir, "ran");
    let file = file_url(&dir);
    let redlock = servers::url("redlock://{redlock1},{redlock2},{redlock3}");
    let shared: &[&str] = &["--shared"];
    let permits: &[&str] = &["--permits", "3"];
    for (url, mode, runs) in [
        ("memory://", shared, true),
        ("memory://", permits, true),
        (file.as_str(), shared, true),
        (file.as_str(), permits, true),
        (redlock.as_str(), permits, false),
    ] {
        let args = [
            &["run", "--name", "x"][..],
            mode,
            &["--", "sh", "-c", &touch],
        ]
        .concat();
        let o = output(distlock(url, &args));
        let err = String::from_utf8_lossy(&o.stderr);
        if runs {
            assert_eq!(code(&o), 0, "{url} {mode:?}: {err}");
            assert!(marker.exists(), "{url} {mode:?}: the command did not run");
            std::fs::remove_file(&marker).unwrap();
        } else {
            assert_eq!(code(&o), 64, "{url} {mode:?}: {err}");
            assert!(err.contains("does not support"), "{mode:?}: {err}");
            assert!(
                !marker.exists(),
                "{url} {mode:?}: the command ran without its mode"
            );
        }
    }
    // Two shared runs of one name on the file backend at once; an exclusive one waits.
    let mut reader = holding(&file, &dir, &["--name", "r", "--shared"], "sleep 2");
    let o = output(distlock(
        &file,
        &["run", "--name", "r", "--shared", "--no-wait", "--", "true"],
    ));
    assert_eq!(
        code(&o),
        0,
        "a second reader: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = output(distlock(
        &file,
        &["run", "--name", "r", "--no-wait", "--", "true"],
    ));
    assert_eq!(
        code(&o),
        75,
        "a writer beside a reader: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = output(distlock(&file, &["status", "--name", "r", "--json"]));
    let status = String::from_utf8_lossy(&o.stdout);
    assert_eq!(status.matches("\"mode\":\"shared\"").count(), 1, "{status}");
    assert!(reader.wait().unwrap().success());
    // Two of two permits held by runs on the file backend: a third exits 75; status lists both.
    let two = ["--name", "p", "--permits", "2"];
    let _ = std::fs::remove_file(dir.join("started"));
    let mut first = holding(&file, &dir, &two, "sleep 3");
    std::fs::remove_file(dir.join("started")).unwrap();
    let mut second = holding(&file, &dir, &two, "sleep 3");
    let o = output(distlock(
        &file,
        &[&["run"][..], &two, &["--no-wait", "--", "true"]].concat(),
    ));
    assert_eq!(
        code(&o),
        75,
        "a third permit of two: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = output(distlock(&file, &["status", "--name", "p", "--json"]));
    let status = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        status.matches("\"mode\":\"permit\",\"permits\":2").count(),
        2,
        "{status}"
    );
    assert!(first.wait().unwrap().success());
    assert!(second.wait().unwrap().success());
    for bad in [
        vec!["--permits", "0"],
        vec!["--permits", "-1"],
        vec!["--shared", "--permits", "2"],
    ] {
        let args = [
            &["run", "--name", "x"][..],
            &bad,
            &["--", "sh", "-c", &touch],
        ]
        .concat();
        let o = output(distlock("memory://", &args));
        assert_eq!(
            code(&o),
            64,
            "{bad:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!marker.exists(), "{bad:?}: the command ran");
    }
}

/// `memory://` is a lock inside one process: two `run`s would both hold it at once. Both
/// commands say so on stderr (a warning: it has been a documented URL), and work as usual.
#[test]
fn a_memory_url_is_warned_about() {
    let dir = tmp("memory");
    let (marker, touch) = ran_marker(&dir, "ran");
    for url in ["memory://", "memory://jobs"] {
        for (args, want) in [
            (vec!["run", "--name", "x", "--", "sh", "-c", &touch], 0),
            (vec!["status", "--name", "x"], 0),
        ] {
            let o = output(distlock(url, &args));
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(code(&o), want, "{url} {args:?}: {err}");
            assert!(
                err.contains("one process"),
                "{url} {args:?}: no warning: {err}"
            );
        }
        assert!(marker.exists(), "{url}: the command did not run");
    }
}

/// A `DISTLOCK_URL` that is set but not UTF-8 is a usage error: falling back to the default
/// directory would lock somewhere other than where the user pointed.
#[test]
fn a_distlock_url_that_is_not_utf8_is_refused_not_ignored() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tmp("not-utf8");
    let (marker, touch) = ran_marker(&dir, "ran");
    let url = std::ffi::OsStr::from_bytes(b"file:///tmp/\xff");
    for args in [
        vec!["run", "--name", "x", "--", "sh", "-c", &touch],
        vec!["status", "--name", "x"],
    ] {
        let mut c = Command::new(BIN);
        c.env("DISTLOCK_URL", url)
            .env("TMPDIR", &*dir)
            .env_remove("XDG_RUNTIME_DIR")
            .args(&args);
        let o = output(c);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(code(&o), 64, "{args:?}: {err}");
        assert!(err.contains("DISTLOCK_URL"), "{args:?}: {err}");
        assert!(!marker.exists(), "the command ran on the default directory");
    }
}

/// The default directory is used as it is named, whatever bytes `$TMPDIR` holds: `%41` is
/// not `A`, `#` and `?` are not a fragment or a query, and a byte that is not UTF-8 is kept
/// (a lossy conversion would lock in another directory than the one checked to be private).
#[test]
fn the_default_directory_is_the_one_named_whatever_its_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let base = tmp("odd-tmpdir");
    for odd in [&b"p%41"[..], b"p#x", b"p?x", b"p x", b"p\xfe"] {
        let tmpdir = base.join(std::ffi::OsStr::from_bytes(odd));
        std::fs::create_dir_all(&tmpdir).unwrap();
        let mut c = Command::new(BIN);
        c.args(["run", "--name", "odd", "--", "true"])
            .env_remove("DISTLOCK_URL")
            .env_remove("XDG_RUNTIME_DIR")
            .env("TMPDIR", &tmpdir);
        let o = output(c);
        let shown = String::from_utf8_lossy(odd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(code(&o), 0, "TMPDIR {shown}: {err}");
        let uid = String::from_utf8_lossy(&Command::new("id").arg("-u").output().unwrap().stdout)
            .trim()
            .to_string();
        let lock = tmpdir.join(format!("distlock-{uid}")).join("odd.lock");
        assert!(
            lock.exists(),
            "TMPDIR {shown}: no lock file at {}",
            lock.display()
        );
    }
}

/// A reader of distlock's output that went away (`2>&1 | head -1`, a log collector restarting)
/// leaves writes failing with EPIPE: distlock still exits with the status of what happened,
/// never panics (101), and the supervision goes on.
#[test]
fn a_broken_output_pipe_changes_no_exit_status() {
    let dir = tmp("epipe");
    let url = file_url(&dir);
    let broken = || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        writer
    };
    for (args, want) in [
        (
            vec!["run", "--name", "x", "--url", "nosuch://h", "--", "true"],
            64,
        ),
        (
            vec!["run", "--name", "x", "--ttl", "5ms", "--", "sleep", "1"],
            70,
        ),
        (vec!["run", "--name", "x", "--", "/nonexistent/cmd"], 127),
        (vec!["run", "--name", "x", "--", "sh", "-c", "exit 3"], 3),
        (vec!["status", "--name", "x"], 0),
    ] {
        let o = distlock(&url, &args)
            .stdin(Stdio::null())
            .stderr(broken())
            .status()
            .unwrap();
        assert_eq!(o.code(), Some(want), "{args:?} with stderr a broken pipe");
    }
    let o = distlock(&url, &["status", "--name", "x"])
        .stdin(Stdio::null())
        .stdout(broken())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(&o), 74, "status with stdout a broken pipe: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn an_unreachable_backend_exits_69() {
    let o = output(distlock(
        "redis://127.0.0.1:1",
        &["run", "--name", "x", "--", "true"],
    ));
    assert_eq!(code(&o), 69, "{}", String::from_utf8_lossy(&o.stderr));
}

/// A listener on loopback that accepts connections and never answers, for as long as the test
/// process lives.
fn silent_server() -> std::net::SocketAddr {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept() {
            open.push(stream);
        }
    });
    addr
}

/// SIGTERM or SIGINT while `run` is still connecting (here to a server that never answers, whose
/// login PostgreSQL's defaults give 16 s) ends it at once with 128 + the signal, and the
/// command never runs: an operator's Ctrl-C, or a service manager's stop, is not held up by a
/// slow backend.
#[test]
fn a_signal_while_connecting_ends_run_at_once() {
    let addr = silent_server();
    let dir = tmp("connect-signal");
    for (sig, want) in [("TERM", 143), ("INT", 130)] {
        let (ran, script) = ran_marker(&dir, &format!("ran-{sig}"));
        let url = format!("postgres://locker@{addr}/postgres");
        // SIGINT at its default, as a shell's foreground job has it: a test run started as
        // `scripts/test.sh &` ignores it, and distlock keeps an ignored signal ignored
        // (`supervision.rs` `a_signal_ignored_at_start_stays_ignored`).
        let mut c = Command::new("env");
        c.args(["--default-signal=INT,QUIT", BIN])
            .env("DISTLOCK_URL", &url)
            .env("RUST_LOG", "error")
            .args(["run", "--name", "x", "--", "sh", "-c", &script]);
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = c.stdin(Stdio::null()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let sent = Instant::now();
        kill(sig, child.id());
        while child.try_wait().unwrap().is_none() {
            assert!(
                sent.elapsed() < Duration::from_secs(3),
                "SIG{sig} while connecting: distlock still running 3 s later"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(
            code(&o),
            want,
            "SIG{sig} while connecting: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!ran.exists(), "SIG{sig}: the command ran without the lock");
    }
}

/// A server that accepts connections and never answers (a frozen process, a half-dead proxy)
/// is EX_UNAVAILABLE (69) on every backend, within the driver's default timeouts (PostgreSQL's
/// login is the longest: 10 s connect + 6 s session), and the command never runs.
#[test]
fn a_server_that_never_answers_exits_69_without_running_the_command() {
    let addr = silent_server();
    let dir = tmp("silent");
    let runs: Vec<(String, Child, std::path::PathBuf)> = [
        format!("redis://{addr}"),
        format!("redlock://{addr}"),
        format!("etcd://{addr}"),
        format!("zk://{addr}"),
        format!("postgres://locker@{addr}/postgres"),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, url)| {
        let (ran, script) = ran_marker(&dir, &format!("ran-{i}"));
        let mut c = distlock(
            &url,
            &["run", "--name", "x", "--no-wait", "--", "sh", "-c", &script],
        );
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        (url, c.stdin(Stdio::null()).spawn().unwrap(), ran)
    })
    .collect();
    let end = Instant::now() + Duration::from_secs(40);
    for (url, mut child, ran) in runs {
        while child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < end,
                "{url}: distlock still waiting for a server that never answers after 40 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(
            code(&o),
            69,
            "{url}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!ran.exists(), "{url}: the command ran without the lock");
    }
}

/// Refused credentials are EX_NOPERM (77), told apart from bad arguments (64) and from a
/// backend that is down (69); the command does not run, and the password shows nowhere.
#[test]
fn refused_credentials_exit_77_without_running_the_command() {
    let dir = tmp("noperm");
    let (code, err, ran) = run_marked(
        &dir,
        &servers::url("redis://locker:WRONG-cli-secret@{redis-auth}"),
        "ran",
    );
    assert_eq!(code, 77, "{err}");
    assert!(!ran, "the command ran without the lock");
    assert!(!err.contains("WRONG-cli-secret"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
}

/// A database the server does not have, or a PostgreSQL fencing table that cannot be one (its
/// schema missing, another table's shape), is a bad URL (64), not a backend that is down (69):
/// retrying cannot help. The command does not run.
#[test]
fn a_database_the_server_does_not_have_exits_64() {
    let dir = tmp("nodb");
    for (i, url) in [
        &*servers::url("redis://{redis}/16"),
        &*servers::url("redlock://{redlock1},{redlock2},{redlock3}/16"),
        &*servers::url("postgres://locker@{pg}/distlock_no_such_db"),
        &*servers::url("postgres://locker@{pg}/postgres?table=distlock_no_such_schema.fence"),
        &*servers::url("postgres://locker@{pg}/postgres?table=pg_catalog.pg_class"),
    ]
    .into_iter()
    .enumerate()
    {
        let (code, err, ran) = run_marked(&dir, url, &format!("ran-{i}"));
        assert_eq!(code, 64, "{url}: {err}");
        assert!(!ran, "{url}: the command ran");
    }
}

/// Credentials given to a server that does not check them (Redis's `nopass` default user,
/// PostgreSQL `trust`, ZooKeeper's digest, etcd with auth disabled) are accepted, as the
/// backend's own clients accept them (`etcdctl --user` on such a server works): the same URL
/// serves a development server and a production one. The command runs and exits 0.
#[test]
fn credentials_a_server_does_not_check_are_accepted() {
    let dir = tmp("unchecked");
    let mut urls = vec![
        servers::url("redis://:unchecked-pw@{redis}"),
        servers::url("redlock://:unchecked-pw@{redlock1},{redlock2},{redlock3}"),
        // Its own chroot: with credentials, the nodes the driver makes are that user's alone.
        servers::url("zk://bob:unchecked-pw@{zk}/distlock-cli-unchecked?session_timeout_ms=2000"),
        servers::url("postgres://locker:unchecked-pw@{pg}/postgres"),
    ];
    if cfg!(feature = "etcd") {
        urls.push(servers::url("etcd://bob:unchecked-pw@{etcd}"));
    }
    for (i, url) in urls.iter().enumerate() {
        let (code, err, ran) = run_marked(&dir, url, &format!("ran-{i}"));
        assert_eq!(code, 0, "{url}: {err}");
        assert!(ran, "{url}: the command did not run");
        assert!(
            !err.contains("unchecked-pw"),
            "{url}: password shown: {err}"
        );
    }
}

#[test]
fn exit_status_environment_and_signals_pass_through() {
    let dir = tmp("status");
    let url = file_url(&dir);
    let env_file = dir.join("env");
    let script = format!(
        "echo \"$DISTLOCK_NAME $DISTLOCK_BACKEND $DISTLOCK_FENCING_TOKEN $DISTLOCK_FENCING \
         $DISTLOCK_KEY\" > {}; exit 3",
        env_file.display()
    );
    let o = output(distlock(
        &url,
        &["run", "--name", "pass", "--", "sh", "-c", &script],
    ));
    assert_eq!(code(&o), 3);
    let env = std::fs::read_to_string(&env_file).unwrap();
    let key = dir.join("locks").join("pass.lock");
    assert_eq!(
        env.trim(),
        format!("pass file 1 strict {}", key.display()),
        "environment of the command"
    );
    // A token that can repeat after a restart says so: Redis without `appendfsync always`.
    let script = format!("echo \"$DISTLOCK_FENCING\" > {}", env_file.display());
    let o = output(distlock(
        &test_support::servers::url("redis://{redis}"),
        &[
            "run",
            "--name",
            &format!("pass-{}", std::process::id()),
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(&env_file).unwrap().trim(),
        "best-effort",
        "DISTLOCK_FENCING on a Redis without appendfsync always"
    );

    // SIGTERM to distlock reaches the command, which dies of it; distlock reports 128+15 and
    // releases the lock.
    let mut holder = holding(&url, &dir, &["--name", "sig"], "exec sleep 30");
    kill("TERM", holder.id());
    let st = holder.wait().unwrap();
    assert_eq!(st.code(), Some(143));
    let o = output(distlock(
        &url,
        &["run", "--name", "sig", "--no-wait", "--", "true"],
    ));
    assert_eq!(code(&o), 0, "lock not released after the signal");
}

#[test]
fn no_wait_on_a_held_lock_exits_75_within_a_second() {
    let dir = tmp("nowait");
    let url = file_url(&dir);
    let mut holder = holding(&url, &dir, &["--name", "busy"], "sleep 3");
    let t = Instant::now();
    let o = output(distlock(
        &url,
        &["run", "--name", "busy", "--no-wait", "--", "true"],
    ));
    assert_eq!(code(&o), 75, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
    let o = output(distlock(&url, &["status", "--name", "busy", "--json"]));
    let status = String::from_utf8_lossy(&o.stdout);
    assert!(status.contains("\"held\""), "{status}");
    assert!(status.contains("\"fencing_token\":1"), "{status}");
    // Every holder listed, each with its mode: here the one exclusive run.
    assert_eq!(
        status.matches("\"mode\":\"exclusive\"").count(),
        1,
        "{status}"
    );
    assert_eq!(status.matches("\"mode\"").count(), 1, "{status}");
    let o = output(distlock(
        &url,
        &["run", "--name", "busy", "--wait", "200ms", "--", "true"],
    ));
    assert_eq!(code(&o), 75);
    assert!(holder.wait().unwrap().success());
}

#[test]
fn a_lost_lock_stops_the_command_and_exits_70() {
    let dir = tmp("lost");
    let url = file_url(&dir);
    let t = Instant::now();
    let args = ["--name", "lost", "--ttl", "1s", "--grace", "1s"];
    let holder = holding(&url, &dir, &args, "exec sleep 30");
    // An operator breaks the lock: the holder's next check finds its file gone.
    std::fs::remove_file(dir.join("locks").join("lost.lock")).unwrap();
    let out = exits_lost(holder);
    assert!(String::from_utf8_lossy(&out.stderr).contains("was lost"));
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the command ran on for {:?}",
        t.elapsed()
    );
}

#[test]
fn a_lock_deleted_on_the_server_stops_the_command_and_exits_70() {
    let dir = tmp("lost-redis");
    let name = format!("lost-redis-{}", std::process::id());
    let args = ["--name", &name, "--ttl", "1s", "--grace", "1s"];
    let holder = holding(
        &servers::url("redis://{redis}"),
        &dir,
        &args,
        "exec sleep 30",
    );
    // An operator deletes the lock key: the next renewal is refused.
    let del = Command::new("redis-cli")
        .args([
            "-p",
            &servers::port("redis").to_string(),
            "DEL",
            &format!("distlock:{{{name}}}"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&del.stdout).trim(),
        "1",
        "key not found"
    );
    exits_lost(holder);
}

/// Two `run`s on one name at once: each command records its start and end; no overlap.
fn never_overlap(url: &str, tag: &str) {
    let dir = tmp(tag);
    let log = dir.join("log");
    let name = format!("overlap-{tag}-{}", std::process::id());
    let script = format!(
        "echo start $(date +%s%N) >> {log}; sleep 0.3; echo end $(date +%s%N) >> {log}",
        log = log.display()
    );
    let runs: Vec<Child> = (0..2)
        .map(|_| {
            spawn(distlock(
                url,
                &[
                    "run", "--name", &name, "--ttl", "3s", "--wait", "30s", "--", "sh", "-c",
                    &script,
                ],
            ))
        })
        .collect();
    for r in runs {
        let out = r.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{tag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<(&str, u128)> = text
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    assert_eq!(events.len(), 4, "{tag}: {text}");
    let kinds: Vec<&str> = events.iter().map(|e| e.0).collect();
    assert_eq!(
        kinds,
        ["start", "end", "start", "end"],
        "{tag}: overlap: {text}"
    );
}

/// `pg` of `scripts/services.sh`.
fn pg() -> String {
    servers::url("postgres://locker@{pg}/postgres?sslmode=disable&session_timeout_ms=2000")
}

#[test]
fn two_runs_never_overlap_on_every_backend() {
    let dir = tmp("overlap-file");
    never_overlap(&file_url(&dir), "file");
    never_overlap(&servers::url("redis://{redis}"), "redis");
    never_overlap(
        &servers::url("redlock://{redlock1},{redlock2},{redlock3},{redlock4},{redlock5}"),
        "redlock",
    );
    never_overlap(
        &servers::url("zk://{zk}?session_timeout_ms=2000"),
        "zookeeper",
    );
    never_overlap(&pg(), "postgres");
    #[cfg(feature = "etcd")] // not in the CLI's default features (protoc)
    never_overlap(&servers::url("etcd://{etcd}"), "etcd");
}

/// A holder killed with SIGKILL: the next `run` gets the lock once the backend lets go.
fn killed_holder_frees(url: &str, tag: &str, within: Duration) {
    let dir = tmp(tag);
    let name = format!("killed-{tag}-{}", std::process::id());
    let mut holder = holding(url, &dir, &["--name", &name, "--ttl", "2s"], "sleep 5");
    kill("KILL", holder.id());
    let _ = holder.wait();
    let t = Instant::now();
    let o = output(distlock(
        url,
        &[
            "run", "--name", &name, "--ttl", "2s", "--wait", "20s", "--", "true",
        ],
    ));
    assert_eq!(code(&o), 0, "{tag}: {}", String::from_utf8_lossy(&o.stderr));
    assert!(t.elapsed() < within, "{tag}: freed after {:?}", t.elapsed());
}

#[test]
fn a_killed_holder_frees_the_lock() {
    let dir = tmp("killed-file");
    // The kernel releases a dead process's flock at once.
    killed_holder_frees(&file_url(&dir), "file", Duration::from_secs(1));
    // Servers: within the TTL (2 s) plus a margin.
    killed_holder_frees(
        &servers::url("redis://{redis}"),
        "redis",
        Duration::from_secs(4),
    );
    // The kernel closes a dead process's connection, and the server ends its session at once.
    killed_holder_frees(&pg(), "postgres", Duration::from_secs(1));
    #[cfg(feature = "etcd")]
    killed_holder_frees(
        &servers::url("etcd://{etcd}"),
        "etcd",
        Duration::from_secs(5),
    );
}

/// The keeper holds a `file://` lock's descriptors (so the lock outlives a killed distlock),
/// but the command must not get them: one writable on the fence counter, and a lock the
/// command could drop by closing or unlocking a descriptor it does not know. Descriptors the
/// caller passed to distlock on purpose still reach the command.
#[test]
fn the_command_gets_no_descriptor_of_the_lock() {
    let dir = tmp("fds");
    let url = file_url(&dir);
    let listing = dir.join("fds");
    // The command's own descriptors, each with what it points to.
    let inner = format!(
        "for f in /proc/$$/fd/*; do echo \"$f $(readlink $f)\"; done > {}",
        listing.display()
    );
    let outer = format!(
        "exec {BIN} run --name fds -- sh -c '{inner}' 7</etc/hostname",
        inner = inner.replace('\'', "'\\''")
    );
    let o = output({
        let mut c = Command::new("sh");
        c.env("DISTLOCK_URL", &url)
            .env("RUST_LOG", "error")
            .args(["-c", &outer]);
        c
    });
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let fds = std::fs::read_to_string(&listing).unwrap();
    let locks = dir.join("locks");
    assert!(
        !fds.contains(&*locks.to_string_lossy()),
        "the command holds descriptors of the lock's files:\n{fds}"
    );
    assert!(
        fds.lines().any(|l| l.contains("/fd/7 /etc/hostname")),
        "a descriptor passed to distlock on purpose did not reach the command:\n{fds}"
    );
}

/// `--min-hold` longer than `--max-hold` would stop the command before the lock may go: a usage
/// error (64) before anything is acquired or run; equal ones are fine.
#[test]
fn min_hold_longer_than_max_hold_is_a_usage_error() {
    let dir = tmp("min-max");
    let url = file_url(&dir);
    let (marker, touch) = ran_marker(&dir, "ran");
    for cmd in ["run", "elect"] {
        let mut args = vec![cmd, "--name", "x", "--min-hold", "2s", "--max-hold", "1s"];
        if cmd == "elect" {
            args.extend(["--value", "me"]);
        }
        args.extend(["--", "sh", "-c", &touch]);
        let o = output(distlock(&url, &args));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(code(&o), 64, "{cmd}: {err}");
        assert!(
            err.contains("--min-hold (2s) is longer than --max-hold (1s)"),
            "{cmd}: {err}"
        );
        assert!(!marker.exists(), "{cmd}: the command ran");
        let o = output(distlock(&url, &["status", "--name", "x", "--exit-code"]));
        assert_eq!(code(&o), 1, "{cmd}: a refused run left the lock held");
    }
    let o = output(distlock(
        &url,
        &[
            "run",
            "--name",
            "x",
            "--min-hold",
            "10ms",
            "--max-hold",
            "10ms",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    ));
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(marker.exists());
}

/// `status --exit-code`: 0 while held, 1 while free, an error's own status otherwise; without
/// the option both are 0, as before.
#[test]
fn status_exit_code_tells_held_from_free() {
    let dir = tmp("exit-code");
    let url = file_url(&dir);
    let free = |args: &[&str]| code(&output(distlock(&url, args)));
    assert_eq!(free(&["status", "--name", "x", "--exit-code"]), 1);
    assert_eq!(free(&["status", "--name", "x", "--exit-code", "--json"]), 1);
    assert_eq!(free(&["status", "--name", "x"]), 0);
    let started = dir.join("started");
    let script = format!("touch {}; sleep 30", started.display());
    let mut holder = distlock(&url, &["run", "--name", "x", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&started, Duration::from_secs(10));
    let held = free(&["status", "--name", "x", "--exit-code"]);
    let plain = free(&["status", "--name", "x"]);
    kill("TERM", holder.id());
    let _ = holder.wait();
    assert_eq!(
        (held, plain),
        (0, 0),
        "held: --exit-code {held}, plain {plain}"
    );
    let bad = distlock("nosuch://x", &["status", "--name", "x", "--exit-code"]);
    assert_eq!(code(&output(bad)), 64, "an error keeps its own status");
}

/// Each server backend names, in the acquisition's span, what holds the lock on its side
/// (docs/observability.md): PostgreSQL the backend pid, ZooKeeper the session and its node,
/// etcd the key's create revision and its lease, Redlock how many masters granted.
#[test]
fn log_format_json_gives_each_backends_detail_of_a_grant() {
    let mut backends = vec![
        (
            servers::url("postgres://locker@{pg}/postgres?sslmode=disable"),
            vec!["lock.postgres.pid"],
        ),
        (
            servers::url("zk://{zk}"),
            vec!["lock.zookeeper.session", "lock.zookeeper.node"],
        ),
        (
            servers::url("redlock://{redlock1},{redlock2},{redlock3}"),
            vec!["lock.redlock.masters", "lock.redlock.quorum"],
        ),
    ];
    if cfg!(feature = "etcd") {
        backends.push((
            servers::url("etcd://{etcd}"),
            vec!["lock.etcd.revision", "lock.etcd.lease"],
        ));
    }
    for (url, fields) in backends {
        let mut c = distlock(
            &url,
            &[
                "run",
                "--log-format",
                "json",
                "--name",
                "detail",
                "--",
                "true",
            ],
        );
        c.env(
            "RUST_LOG",
            "warn,lock_core=debug,lock_postgres=debug,lock_zookeeper=debug,lock_redlock=debug,\
             lock_etcd=debug",
        );
        let o = output(c);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(code(&o), 0, "{url}: {err}");
        let lines: Vec<serde_json::Value> = err
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let grant = lines
            .iter()
            .find(|v| fields.iter().all(|f| !v["fields"][f].is_null()))
            .unwrap_or_else(|| panic!("{url}: no event with {fields:?}: {err}"));
        assert_eq!(
            grant["span"]["name"], "lock.acquire",
            "{url}: the detail is not in the acquisition's span: {grant}"
        );
        assert_eq!(grant["span"]["lock.name"], "detail", "{grant}");
    }
}

/// `--log-format json`: every stderr line is one JSON object; the acquisition's and the
/// release's spans close with a line each, with the lock's fields (name, backend, outcome,
/// token, timings), and at debug the run's last line says how long it waited and held and how
/// many renewals the backend confirmed; the
/// text format stays the default. Given after the subcommand too (a global flag).
#[test]
fn log_format_json_writes_one_object_per_line_with_the_locks_spans() {
    let dir = tmp("json");
    let url = file_url(&dir);
    let mut c = distlock(
        &url,
        &[
            "run",
            "--log-format",
            "json",
            "--name",
            "jobs",
            "--",
            "true",
        ],
    );
    c.env("RUST_LOG", "warn,lock_core=debug,distlock=debug");
    let o = output(c);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(code(&o), 0, "{err}");
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}")))
        .collect();
    let span_closed = |name: &str| {
        lines
            .iter()
            .find(|v| v["span"]["name"] == name && v["fields"]["message"] == "close")
            .unwrap_or_else(|| panic!("no line closing the {name} span in {err}"))
    };
    let acquire = &span_closed("lock.acquire")["span"];
    assert_eq!(acquire["lock.name"], "jobs", "{acquire}");
    assert_eq!(acquire["lock.backend"], "file", "{acquire}");
    assert_eq!(acquire["lock.outcome"], "granted", "{acquire}");
    assert!(acquire["lock.fencing_token"].is_u64(), "{acquire}");
    assert!(acquire["lock.waited_ms"].is_f64(), "{acquire}");
    let release = &span_closed("lock.release")["span"];
    assert_eq!(release["lock.outcome"], "released", "{release}");
    let last = lines.last().map(|v| &v["fields"]);
    assert!(
        last.is_some_and(|f| f["message"] == "run finished"
            && f["lock.held_ms"].is_f64()
            && f["lock.waited_ms"].is_f64()
            && f["lock.renewals"].is_u64()),
        "the last line must give the lock's timings and renewals: {err}"
    );
    // The renewals are the lease's: a 600 ms TTL on Redis held for 1 s is renewed about every
    // 200 ms (never fewer than 3 times, never 10).
    let mut c = distlock(
        &servers::url("redis://{redis}"),
        &[
            "run",
            "--log-format",
            "json",
            "--name",
            "renewed",
            "--ttl",
            "600ms",
            "--",
            "sleep",
            "1",
        ],
    );
    c.env("RUST_LOG", "warn,distlock=debug");
    let o = output(c);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(code(&o), 0, "{err}");
    let last: serde_json::Value = err
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON last line: {err}"));
    let renewals = last["fields"]["lock.renewals"].as_u64();
    assert!(
        renewals.is_some_and(|n| (3..10).contains(&n)),
        "a 600 ms lease held for 1 s: {renewals:?} renewals in the run's last line: {err}"
    );
    // Text by default: no JSON.
    let mut c = distlock(&url, &["run", "--name", "jobs", "--", "true"]);
    c.env("RUST_LOG", "info");
    let o = output(c);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        err.lines().count() > 0 && err.lines().all(|l| !l.starts_with('{')),
        "{err}"
    );
}
