//! `distlock`: run a command under a distributed lock, on any backend, chosen by URL.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use distlock::{DistributedLock, Error, Lease, LeaseState, LockName, LockOptions, Wait};
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// Exit statuses (BSD sysexits), so cron and scripts can tell outcomes apart.
const EX_USAGE: u8 = 64;
const EX_UNAVAILABLE: u8 = 69;
const EX_SOFTWARE: u8 = 70;
const EX_TEMPFAIL: u8 = 75;

const EXAMPLES: &str = "\
Examples:
  # Nightly job that must not run twice at once, across all hosts sharing Redis:
  distlock run --url redis://10.0.0.5:6379 --name nightly-report --no-wait -- ./report.sh

  # Wait up to 10 minutes for the lock, hold it at most 2 hours:
  DISTLOCK_URL=etcd://10.0.0.1:2379 distlock run --name migrate --wait 10m --max-hold 2h -- ./migrate

  # On one machine, no server (the default when no URL is given):
  distlock run --name backup -- rsync -a /data /backup

  # Is it held?
  distlock status --name nightly-report --url redis://10.0.0.5:6379 --json

Exit status of `run`: the command's own; 75 not acquired (busy with --no-wait, or --wait
elapsed); 69 backend unreachable; 64 bad arguments, URL or name; 70 lock lost while the
command ran (it was sent SIGTERM, then SIGKILL after --grace).
URLs: memory://, file:///dir, redis://, rediss://, redlock://h1,h2,h3, zk://h1,h2, etcd://h1,h2";

#[derive(Parser, Debug)]
#[command(
    name = "distlock",
    version,
    about = "Run a command under a distributed lock (Redis, Redlock, ZooKeeper, etcd, or a local file)",
    after_help = EXAMPLES
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Acquire the lock, run the command while renewing it, release it when the command exits.
    Run(RunArgs),
    /// Tell whether the lock is held, with the holder's fencing token and remaining time where
    /// the backend records them (Redlock: no token, by a quorum read; a backend that cannot
    /// inspect at all is probed with a non-waiting acquisition).
    Status(StatusArgs),
}

#[derive(Args, Debug)]
struct Target {
    /// Backend URL [default: $DISTLOCK_URL, else a file:// directory in the runtime/temp dir].
    #[arg(long)]
    url: Option<String>,
    /// Lock name (letters, digits and - _ . : @ + =, at most 128 bytes).
    #[arg(long)]
    name: String,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// Lease TTL; renewed automatically while the command runs.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Wait at most this long for the lock [default: wait as long as it takes].
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// Stop renewing after this long, so a hung command cannot keep the lock forever.
    #[arg(long, value_parser = humantime::parse_duration)]
    max_hold: Option<Duration>,
    /// After the lock is lost: time between SIGTERM and SIGKILL to the command.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's message up to its usage block, on one line.
            let text = e.render().to_string();
            let reason: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
                .collect();
            let reason = reason.join(" ");
            eprintln!(
                "distlock: {} (see distlock --help)",
                reason.trim_start_matches("error: ")
            );
            return ExitCode::from(EX_USAGE);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock: cannot start: {e}");
            return ExitCode::from(EX_SOFTWARE);
        }
    };
    ExitCode::from(rt.block_on(async {
        match cli.cmd {
            Cmd::Run(a) => run(a).await,
            Cmd::Status(a) => status(a).await,
        }
    }))
}

/// `$DISTLOCK_URL`, else a per-user `file://` directory that needs no server.
fn url_of(target: &Target) -> String {
    if let Some(u) = &target.url {
        return u.clone();
    }
    if let Ok(u) = std::env::var("DISTLOCK_URL") {
        return u;
    }
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .map(|p| p.join("distlock"))
        .unwrap_or_else(|| {
            let user = std::env::var("USER").unwrap_or_else(|_| "default".into());
            std::env::temp_dir().join(format!("distlock-{user}"))
        });
    format!("file://{}", base.display())
}

/// The exit status an error maps to, and its one-line message.
fn failure(e: &Error) -> u8 {
    match e {
        Error::Config(_) | Error::InvalidName { .. } | Error::InvalidOptions(_) => EX_USAGE,
        Error::Timeout { .. } => EX_TEMPFAIL,
        Error::Lost { .. } => EX_SOFTWARE,
        _ => EX_UNAVAILABLE,
    }
}

fn fail(what: &str, e: &Error) -> u8 {
    eprintln!("distlock: {what}: {e}");
    failure(e)
}

async fn connect(target: &Target) -> Result<(std::sync::Arc<dyn DistributedLock>, LockName), u8> {
    let name = LockName::new(target.name.as_str()).map_err(|e| fail("bad lock name", &e))?;
    let url = url_of(target);
    let locks = distlock::connect(&url)
        .await
        .map_err(|e| fail(&format!("cannot use {}", distlock::redact(&url)), &e))?;
    Ok((locks, name))
}

async fn status(a: StatusArgs) -> u8 {
    let (locks, name) = match connect(&a.target).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    let info = match locks.inspect(&name).await {
        Ok(info) => info.map(|h| (h.fencing_token.map(|t| t.get()), h.remaining)),
        // Backends that cannot inspect (third-party drivers may not): probe with a non-waiting
        // acquisition.
        Err(Error::Unsupported { .. }) => match probe(locks.as_ref(), &name).await {
            Ok(true) => Some((None, None)),
            Ok(false) => None,
            Err(e) => return fail("cannot query the lock", &e),
        },
        Err(e) => return fail("cannot query the lock", &e),
    };
    let state = if info.is_some() { "held" } else { "free" };
    let (token, remaining) = info.unwrap_or((None, None));
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "name": name.as_str(),
                "backend": locks.backend(),
                "state": state,
                "fencing_token": token,
                "remaining_ms": remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            })
        );
    } else {
        let mut details = Vec::new();
        if let Some(t) = token {
            details.push(format!("fencing token {t}"));
        }
        if let Some(r) = remaining {
            details.push(format!("{} left", humantime::format_duration(round_ms(r))));
        }
        let details = if details.is_empty() {
            String::new()
        } else {
            format!(", {}", details.join(", "))
        };
        println!("{name}: {state} ({} backend{details})", locks.backend());
    }
    0
}

/// Held (`true`) or free, by trying to take the lock without waiting and letting go at once.
async fn probe(locks: &dyn DistributedLock, name: &LockName) -> distlock::Result<bool> {
    let ttl = locks.capabilities().min_ttl.max(Duration::from_secs(1));
    match locks.try_acquire(name, &LockOptions::new(ttl)).await? {
        Some(lease) => {
            if let Err(e) = lease.release().await {
                tracing::warn!(error = %e, "releasing the status probe failed");
            }
            Ok(false)
        }
        None => Ok(true),
    }
}

async fn run(a: RunArgs) -> u8 {
    let (locks, name) = match connect(&a.target).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    let wait = match (a.no_wait, a.wait) {
        (true, _) => Wait::No,
        (false, Some(d)) => Wait::For(d),
        (false, None) => Wait::Forever,
    };
    let opts = LockOptions::new(a.ttl).wait(wait).auto_renew(a.max_hold);
    let mut sigint = match signal(SignalKind::interrupt()) {
        Ok(s) => s,
        Err(e) => return fail("signals", &Error::backend("cli", e)),
    };
    let mut sigterm = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => return fail("signals", &Error::backend("cli", e)),
    };

    // Acquire, showing what we wait for on a terminal; a signal while waiting gives up.
    let start = Instant::now();
    let show = std::io::stderr().is_terminal() && wait != Wait::No;
    let backend = locks.backend();
    let ticker = show.then(|| {
        let name = name.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                eprint!(
                    "\rdistlock: waiting for lock {name} on {backend} ({}s)",
                    start.elapsed().as_secs()
                );
            }
        })
    });
    let acquired = tokio::select! {
        r = locks.acquire(&name, &opts) => Ok(r),
        _ = sigint.recv() => Err(Signal::SIGINT),
        _ = sigterm.recv() => Err(Signal::SIGTERM),
    };
    if let Some(t) = ticker {
        t.abort();
        if start.elapsed() >= Duration::from_secs(1) {
            eprintln!();
        }
    }
    let lease = match acquired {
        Ok(Ok(lease)) => lease,
        Ok(Err(Error::Timeout { waited, .. })) => {
            eprintln!(
                "distlock: not acquired: {name} is held ({})",
                if wait == Wait::No {
                    "--no-wait".to_string()
                } else {
                    format!("waited {}", humantime::format_duration(round_ms(waited)))
                }
            );
            return EX_TEMPFAIL;
        }
        Ok(Err(e)) => return fail(&format!("cannot acquire {name}"), &e),
        Err(sig) => {
            // The dropped acquisition cleans up in the background: give it a moment.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return 128 + sig as u8;
        }
    };
    tracing::info!(%name, backend, token = ?lease.fencing_token(), "acquired");

    let mut cmd = tokio::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("DISTLOCK_NAME", name.as_str())
        .env("DISTLOCK_BACKEND", backend);
    match lease.fencing_token() {
        Some(t) => cmd.env("DISTLOCK_FENCING_TOKEN", t.get().to_string()),
        None => cmd.env_remove("DISTLOCK_FENCING_TOKEN"),
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "distlock: cannot run {}: {e}",
                a.command[0].to_string_lossy()
            );
            release(lease).await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(nix::unistd::Pid::from_raw);
    let forward = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    };

    let lost = lease.lost();
    let lost_wait = lost.wait();
    tokio::pin!(lost_wait);
    let mut lost_seen = false;
    // When the command gets SIGKILL, once the lock was lost and it ignored SIGTERM.
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            _ = sigint.recv() => forward(Signal::SIGINT),
            _ = sigterm.recv() => forward(Signal::SIGTERM),
            _ = &mut lost_wait, if !lost_seen => {
                lost_seen = true; // the signal also resolves on release; only Lost matters
                if lease.state() == LeaseState::Lost {
                    eprintln!(
                        "distlock: lock {name} was lost while the command ran; sending it SIGTERM \
                         (SIGKILL in {})",
                        humantime::format_duration(a.grace)
                    );
                    forward(Signal::SIGTERM);
                    kill_at = Some(Instant::now() + a.grace);
                }
            }
            _ = sleep_until_opt(kill_at), if kill_at.is_some() => {
                forward(Signal::SIGKILL);
                kill_at = None;
            }
        }
    };
    if lease.state() == LeaseState::Lost {
        return EX_SOFTWARE; // nothing to release
    }
    release(lease).await;
    match status {
        Ok(st) => exit_code_of(st),
        Err(e) => {
            eprintln!("distlock: lost track of the command: {e}");
            EX_SOFTWARE
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

async fn release(lease: Box<dyn Lease>) {
    if let Err(e) = lease.release().await {
        tracing::warn!(error = %e, "release failed (the lock frees itself when its lease ends)");
    }
}

/// The command's exit code, or 128 + the signal that ended it (as shells report it).
fn exit_code_of(st: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
        _ => 1,
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
