//! `distlock run` typed at an interactive terminal: the command gets the terminal as it would
//! without distlock (it reads it, Ctrl-C reaches it), a Ctrl-Z stops nothing, and the terminal
//! comes back to distlock once the command is done. Each test runs the real binary as the
//! leader of a new session whose controlling terminal is a pseudo-terminal (`setsid -c`), the
//! test typing at its master side; the lock is a `file://` one, so no server is needed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::fs::File;
use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::pty::openpty;
use nix::unistd::{tcgetpgrp, Pid};
use test_support::{scratch, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// A `distlock run` on a terminal of its own, and everything it wrote to it.
struct OnTerminal {
    child: Child,
    master: File,
    screen: Arc<Mutex<Vec<u8>>>,
    _dir: Scratch,
}

impl OnTerminal {
    /// `distlock run --url file://… --name term-<pid> EXTRA -- sh -c SCRIPT` as the foreground
    /// process group of a new terminal, the way a shell would start it.
    fn run(extra: &[&str], script: &str) -> OnTerminal {
        let dir = scratch("distlock-term-");
        let (url, name) = lock_of(&dir);
        let mut args = vec![BIN, "run", "--url", &url, "--name", &name];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        OnTerminal::start(&args, dir)
    }

    /// An interactive bash, with job control, on a new terminal: the test types the commands.
    fn shell() -> OnTerminal {
        let dir = scratch("distlock-term-");
        OnTerminal::start(&["bash", "--norc", "--noprofile", "-i"], dir)
    }

    /// `program` as the leader of a new session whose controlling terminal is a new
    /// pseudo-terminal, on its stdin, stdout and stderr.
    fn start(program: &[&str], dir: Scratch) -> OnTerminal {
        let pty = openpty(None, None).expect("a pseudo-terminal");
        let slave = File::from(pty.slave);
        // setsid(1) does not fork here (a child of this test leads no group): the pid is the
        // program's, and it leads the session and its foreground group. env(1) first puts
        // SIGINT and SIGQUIT back to their defaults, as an interactive shell does for the jobs
        // it starts: a test run started as a background job of a shell without job control
        // (`scripts/test.sh &`) has them ignored, distlock keeps an ignored signal ignored
        // (as `nohup` expects), and a Ctrl-C typed here would reach no one.
        let child = Command::new("env")
            .args(["--default-signal=INT,QUIT", "setsid", "-c"])
            .args(program)
            .env("RUST_LOG", "error")
            .env("PS1", "$ ")
            .env("HISTFILE", "/dev/null")
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave)
            .spawn()
            .expect("env(1) from coreutils, setsid(1) from util-linux");
        let master = File::from(pty.master);
        let screen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().unwrap();
        let into = screen.clone();
        // Until EIO: the last process with the terminal open is gone.
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                into.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        OnTerminal {
            child,
            master,
            screen,
            _dir: dir,
        }
    }

    /// The `file://` URL of the run's locks, under `dir`, and a lock name.
    fn url_and_name(&self) -> (String, String) {
        lock_of(&self._dir)
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.screen.lock().unwrap()).into_owned()
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    fn type_in(&mut self, keys: &[u8]) {
        self.master.write_all(keys).unwrap();
    }

    /// Waits up to `within` for `text` on the terminal; `Err` says what was there instead,
    /// and what every process of the session was doing.
    fn shows(&self, text: &str, within: Duration) -> Result<(), String> {
        self.shows_times(text, 1, within)
    }

    /// Waits up to `within` for `text` to be on the terminal `times` times.
    fn shows_times(&self, text: &str, times: usize, within: Duration) -> Result<(), String> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if self.screen().matches(text).count() >= times {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "{text:?} not {times} time(s) on the terminal within {within:?}; the terminal \
             shows {:?}; the session's processes: {}",
            self.screen(),
            session(self.pid())
        ))
    }

    /// Waits up to `within` for distlock to exit.
    fn exits(&mut self, within: Duration) -> Result<ExitStatus, String> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Ok(st);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "distlock still runs {within:?} on; the terminal shows {:?}; the session's \
             processes: {}",
            self.screen(),
            session(self.pid())
        ))
    }
}

impl Drop for OnTerminal {
    fn drop(&mut self) {
        // Nothing of a failed test may stay behind, stopped or not.
        for p in session_processes(self.pid()) {
            if let Some(pid) = p.split(' ').next().and_then(|p| p.parse().ok()) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lock_of(dir: &Scratch) -> (String, String) {
    let url = format!("file://{}", dir.join("locks").display());
    (url, format!("term-{}", std::process::id()))
}

/// Waits up to `within` for a process of session `sid` named `comm` to be stopped.
fn stopped(sid: Pid, comm: &str, within: Duration) -> Result<(), String> {
    in_state(sid, comm, true, within)
}

/// Waits up to `within` for a process of session `sid` named `comm` that is not stopped.
fn running(sid: Pid, comm: &str, within: Duration) -> Result<(), String> {
    in_state(sid, comm, false, within)
}

fn in_state(sid: Pid, comm: &str, stopped: bool, within: Duration) -> Result<(), String> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let list = session_processes(sid);
        if list.iter().any(|p| {
            let f: Vec<&str> = p.split(' ').collect();
            f.get(1).is_some_and(|s| s.starts_with('T') == stopped) && f.get(2) == Some(&comm)
        }) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let what = if stopped { "stopped" } else { "running" };
    Err(format!(
        "no {comm} {what} within {within:?}: {}",
        session(sid)
    ))
}

/// The processes of session `sid`, each as "pid state comm" (state T: stopped), from ps(1).
fn session_processes(sid: Pid) -> Vec<String> {
    ps(sid, "pid=,stat=,comm=")
}

/// The processes of session `sid`, for a failure report: also their pending, blocked, ignored
/// and caught signals (hexadecimal masks).
fn session(sid: Pid) -> String {
    let list = ps(sid, "pid=,stat=,comm=,pending=,blocked=,ignored=,caught=");
    format!(
        "[{}] (pid state comm pending blocked ignored caught)",
        list.join(", ")
    )
}

fn ps(sid: Pid, format: &str) -> Vec<String> {
    let out = Command::new("ps")
        .args(["-o", format, "-s", &sid.to_string()])
        .output()
        .expect("ps(1) from procps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn exits_with(t: &mut OnTerminal, code: i32, within: Duration) {
    let st = t.exits(within).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        st.code(),
        Some(code),
        "distlock's exit status; the terminal shows {:?}",
        t.screen()
    );
}

#[test]
fn the_command_reads_the_terminal_distlock_was_typed_at() {
    let mut t = OnTerminal::run(&[], r#"echo ready; read line; echo "got:$line""#);
    t.shows("ready", Duration::from_secs(10)).unwrap();
    t.type_in(b"hello\n");
    t.shows("got:hello", Duration::from_secs(5))
        .unwrap_or_else(|e| {
            panic!(
                "a command under `distlock run` at a terminal must be able to read it, as it \
             could without distlock (a background process group gets SIGTTIN and stops): {e}"
            )
        });
    exits_with(&mut t, 0, Duration::from_secs(5));
}

#[test]
fn ctrl_c_reaches_the_command() {
    let mut t = OnTerminal::run(&[], "echo ready; sleep 30");
    t.shows("ready", Duration::from_secs(10)).unwrap();
    // Not before `sleep` runs: a Ctrl-C while the shell forks it is caught by the shell's
    // handler in the child before its exec, and lost (a race of the shell's, with or
    // without distlock: seen 3 times in 90 runs here).
    running(t.pid(), "sleep", Duration::from_secs(10)).unwrap();
    t.type_in(b"\x03");
    exits_with(&mut t, 130, Duration::from_secs(5));
}

#[test]
fn ctrl_z_stops_nothing() {
    // The Ctrl-Z comes while `sleep` (a child of the shell) runs, then while the shell reads.
    let mut t = OnTerminal::run(
        &[],
        r#"echo ready; sleep 1; echo slept; read line; echo "got:$line"; sleep 0.2; echo end"#,
    );
    t.shows("ready", Duration::from_secs(10)).unwrap();
    t.type_in(b"\x1a");
    t.shows("not suspended", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("a Ctrl-Z must be refused, and said so: {e}"));
    // A stop shows in /proc at once; give it a moment to (not) happen.
    std::thread::sleep(Duration::from_millis(300));
    let stopped: Vec<String> = session_processes(t.pid())
        .into_iter()
        .filter(|p| {
            p.split(' ')
                .nth(1)
                .is_some_and(|stat| stat.starts_with('T'))
        })
        .collect();
    assert!(
        stopped.is_empty(),
        "a Ctrl-Z left processes of the run stopped (the lock held, nothing running, and the \
         shell not given back the terminal): {stopped:?}; the session: {}",
        session(t.pid())
    );
    t.shows("slept", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the command must go on after a refused Ctrl-Z: {e}"));
    t.type_in(b"\x1a");
    t.shows_times("not suspended", 2, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("a second Ctrl-Z must be refused too: {e}"));
    t.type_in(b"on\n");
    t.shows("end", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the command must go on after a refused Ctrl-Z: {e}"));
    exits_with(&mut t, 0, Duration::from_secs(5));
}

#[test]
fn the_terminal_comes_back_to_distlock_after_the_command() {
    // --min-hold keeps distlock (and the lock) after the command has ended.
    let mut t = OnTerminal::run(&["--min-hold", "60s"], "echo done");
    t.shows("done", Duration::from_secs(10)).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let mut fg = tcgetpgrp(&t.master);
    while fg != Ok(t.pid()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
        fg = tcgetpgrp(&t.master);
    }
    assert_eq!(
        fg,
        Ok(t.pid()),
        "the terminal's foreground group 5 s after the command ended must be distlock's \
         again (its pid {}), or a Ctrl-C reaches no one; the session: {}",
        t.pid(),
        session(t.pid())
    );
    // A Ctrl-C in --min-hold ends distlock at once (the lock is left to expire).
    t.type_in(b"\x03");
    exits_with(&mut t, 0, Duration::from_secs(5));
}

#[test]
fn a_run_started_in_the_background_gets_the_terminal_with_fg() {
    let mut t = OnTerminal::shell();
    let (url, name) = t.url_and_name();
    t.shows("$ ", Duration::from_secs(10)).unwrap();
    t.type_in(
        format!("{BIN} run --url {url} --name {name} -- sh -c 'read l; echo \"got:$l\"' &\n")
            .as_bytes(),
    );
    // In the background, its read of the terminal stops it, as it would any background job.
    stopped(t.pid(), "sh", Duration::from_secs(10)).unwrap();
    t.shows("the command is stopped", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the keeper must say why the run makes no progress: {e}"));
    t.type_in(b"fg\n");
    std::thread::sleep(Duration::from_millis(500));
    t.type_in(b"hi\n");
    t.shows("got:hi", Duration::from_secs(5))
        .unwrap_or_else(|e| {
            panic!(
            "`fg` brings distlock to the foreground: its command, stopped reading the terminal \
             in the background, must get the terminal and go on, as any job would: {e}"
        )
        });
    t.type_in(b"echo \"status:$?\"\n");
    t.shows("status:0", Duration::from_secs(5))
        .unwrap_or_else(|e| {
            panic!("distlock must end with the command, and give the shell back the terminal: {e}")
        });
}

#[test]
fn a_script_keeps_its_terminal_while_a_run_goes_on_in_the_background() {
    // A shell script (no job control: its commands share its process group) starts a run in
    // the background, then reads the terminal itself.
    let dir = scratch("distlock-term-");
    let (url, name) = lock_of(&dir);
    let script = format!(
        "{BIN} run --url {url} --name {name} -- sleep 3 & sleep 0.5; echo asking; read line; \
         echo \"script-read:$line\"; wait"
    );
    let mut t = OnTerminal::start(&["sh", "-c", &script], dir);
    t.shows("asking", Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    t.type_in(b"abc\n");
    t.shows("script-read:abc", Duration::from_secs(5))
        .unwrap_or_else(|e| {
            panic!(
                "a run in a script's background must not take the terminal from the script \
                 (the script, now in the background, is stopped by its read): {e}"
            )
        });
    exits_with(&mut t, 0, Duration::from_secs(10));
}

/// A server that accepts and never answers makes distlock wait for the driver's timeout: on a
/// terminal it says, each second, what it is waiting for (which server, the password hidden),
/// instead of hanging silently; and the line ends when the wait does.
#[test]
fn a_silent_server_is_said_while_distlock_waits_for_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept every connection and keep it open, answering nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    let url =
        format!("redis://app:hunter2@127.0.0.1:{port}?connect_timeout_ms=2500&timeout_ms=2500");
    let dir = scratch("distlock-term-");
    let mut t = OnTerminal::start(&[BIN, "status", "--url", &url, "--name", "x"], dir);
    let said = format!("connecting to redis://app:***@127.0.0.1:{port}?connect_timeout_ms=2500&timeout_ms=2500 (1s)");
    t.shows(&said, Duration::from_secs(5)).unwrap();
    t.shows("(2s)", Duration::from_secs(5)).unwrap();
    exits_with(&mut t, 69, Duration::from_secs(10));
    let screen = t.screen();
    assert!(!screen.contains("hunter2"), "{screen}");
    // The progress line ended before the error was said.
    assert!(screen.contains("s)\r\ndistlock: cannot use"), "{screen:?}");
}
