//! The command line: subcommands, options, help texts.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  # Nightly job that must not run twice at once, across all hosts sharing Redis:
  distlock run --url redis://10.0.0.5:6379 --name nightly-report --no-wait -- ./report.sh

  # Cron on several machines, run once per hour at most (hold the lock >= 10 minutes):
  distlock run --url etcd://10.0.0.1:2379 --name hourly --no-wait --min-hold 10m -- ./hourly.sh

  # Wait up to 10 minutes for the lock, hold it at most 2 hours:
  DISTLOCK_URL=etcd://10.0.0.1:2379 distlock run --name migrate --wait 10m --max-hold 2h -- ./migrate

  # On one machine, no server (the default when no URL is given):
  distlock run --name backup -- rsync -a /data /backup

  # Readers beside readers, never beside the migration (shared mode: file, PostgreSQL):
  distlock run --url postgres://app@db/app --name schema --shared -- ./nightly-export.sh
  distlock run --url postgres://app@db/app --name schema -- ./migrate.sh

  # Is it held, and by whom?
  distlock status --name nightly-report --url redis://10.0.0.5:6379 --json

  # Leader election: run the scheduler on one host at a time; who leads, and each change:
  distlock elect --url etcd://10.0.0.1:2379 --name scheduler --value \"$(hostname):8080\" -- ./scheduler
  distlock leader --url etcd://10.0.0.1:2379 --name scheduler --watch --json

Supervision (`run`, Linux): the command runs in a process group of its own, under a small
keeper process. Nothing of it runs without the lock:
  - when the command's main process exits, whatever it left running (background jobs,
    workers) gets SIGTERM, then SIGKILL after --grace; the lock is released only after that;
  - if distlock itself dies (even by SIGKILL), the keeper kills the command's processes;
  - if distlock stops or hangs (SIGSTOP, a debugger), the keeper kills them when the lease's
    validity runs out, as distlock would have;
  - if the lease is at risk (a renewal failed, the connection dropped) or its validity runs
    low without a confirmed renewal, the command gets SIGTERM and, --grace later, SIGKILL, so
    that it is dead before the lease can expire and the lock move to someone else.
    There the grace is capped at a third of the lease's validity window: a --grace as long
    as the TTL or longer is shortened to TTL/3 in that case. distlock then exits 70;
  - if the backend lets the lock go before its validity runs out (a terminated PostgreSQL
    session, a deleted key, a revoked etcd lease, a deleted node or lock file), the lock may
    be someone else's already: the command gets SIGKILL at once, with no grace; exit 70.
  - a process that changes its user (`distlock run -- sudo ...`) cannot be signalled by
    distlock: it is said at once, the lock is kept (renewed) while such a process runs and
    released after it, or, if the lock is lost meanwhile, distlock says so and exits; exit 77
    either way. Run distlock as that user instead (`sudo distlock run -- ...`).
The command's environment adds DISTLOCK_NAME, DISTLOCK_BACKEND, DISTLOCK_FENCING_TOKEN (where
the backend fences), DISTLOCK_FENCING (`strict`, or `best-effort` where the token can repeat
after the server lost data in a restart, as Redis without `appendfsync always` can) and
DISTLOCK_KEY (the lock's key, node or file on the backend); `elect` adds DISTLOCK_TERM (the
leadership's term: its fencing token).
SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to distlock reach all of the command's processes;
one that was ignored when distlock started (nohup, a script's `cmd &`) stays ignored.
Typed at an interactive shell, the command gets the terminal as it would without distlock (it
can read it; Ctrl-C reaches it), and distlock takes it back when the command is done; started
in the background, it gets the terminal with `fg`. From a script, the terminal stays with the
script. A Ctrl-Z (SIGTSTP) is refused, with a message: a stopped run would hold or lose its
lock idly.

Exit status of `run` and `elect`: the command's own (128+N if a signal N ended it); 75 not acquired (busy
with --no-wait, or --wait elapsed); 69 backend unreachable; 77 credentials refused, or a
command that changed its user, which distlock may not stop (see Supervision); 64 bad
arguments, URL, name or default directory, --shared or --permits on a backend without that
mode (docs/lock-family.md), or another K than the name's runs use; 70 lock lost or at risk while the command ran (it was stopped), or
--max-hold reached; 71 distlock could not supervise (signals, keeper); 127/126 command not
found / not runnable. A closed stderr changes none of these. `status`: 0 (held or free: see
its output), 74 if the answer cannot be written, else 64, 69 or 77 as for `run`; `leader` the
same (64 too where the backend holds no elections: Redlock, docs/election.md).
URLs: file:///dir, redis://, rediss://, redis+sentinel://s1,s2,s3/MASTER, rediss+sentinel://s1,s2/MASTER,
redis+cluster://n1,n2, rediss+cluster://n1,n2, redlock://h1,h2,h3,
zk://h1,h2, etcd://h1,h2, postgres://user@host/db (memory:// runs, with a warning: it lives
in this process only) (a password containing / ? # @ must be percent-encoded: %2F %3F %23 %40).";

/// The longest duration any option accepts.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

#[derive(Parser, Debug)]
#[command(
    name = "distlock",
    version,
    about = "Run a command under a distributed lock (Redis, Redlock, ZooKeeper, etcd, PostgreSQL, or a local file)",
    after_help = EXAMPLES
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
    /// How log lines on stderr are written: `text` for people, `json` for log collectors (one
    /// JSON object per line, with the fields of the spans it happened in, and one line per
    /// acquisition and release with their outcome and timings: docs/observability.md).
    /// RUST_LOG filters them (default: warn; with json also the lock's own lines: lock_core's
    /// debug, distlock's info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Lines for people.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// Acquire the lock, run the command while renewing it, release it when nothing of the
    /// command runs any more.
    Run(RunArgs),
    /// Campaign for leadership of the name with a value (who you are), run the command while
    /// leader with exactly the supervision of `run`, resign when nothing of it runs any more.
    /// DISTLOCK_TERM (the leadership's term, its fencing token) joins the environment.
    Elect(ElectArgs),
    /// Print who leads the name (value and term), or that nobody does; with --watch, one line
    /// per change until interrupted.
    Leader(LeaderArgs),
    /// Tell whether the lock is held, with every holder (each reader, each permit), its mode,
    /// fencing token and remaining time where the backend records them (Redlock: no token, by
    /// a quorum read; a backend that cannot inspect at all is probed with a non-waiting
    /// acquisition).
    Status(StatusArgs),
}

#[derive(Args, Debug)]
pub(crate) struct Target {
    /// Backend URL [default: $DISTLOCK_URL, else file://$XDG_RUNTIME_DIR/distlock, else
    /// file://$TMPDIR/distlock-UID; that directory must be yours and not writable by others].
    #[arg(long)]
    pub(crate) url: Option<String>,
    /// Lock name (letters, digits and - _ . : @ + =, at most 128 bytes).
    #[arg(long)]
    pub(crate) name: String,
}

/// `run`'s options: a supervised command under an exclusive, shared or permit lock.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) supervised: Supervised,
    /// Take the lock shared: any number of shared runs at once, none beside an exclusive one
    /// (a read lock; without it, the run is exclusive). Exit 64 where the backend has no shared
    /// mode.
    #[arg(long, conflicts_with = "permits")]
    pub(crate) shared: bool,
    /// Take one of K permits: at most K runs of the name at once (a semaphore). Every run of
    /// the name must give the same K: another K while one runs or waits exits 64.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) permits: Option<u32>,
}

/// `elect`'s options: a supervised command under the leadership of the name.
#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    #[command(flatten)]
    pub(crate) supervised: Supervised,
    /// What this candidate says of itself while it leads (e.g. host:port), at most 4096 bytes:
    /// `distlock leader` and every observer show it.
    #[arg(long)]
    pub(crate) value: OsString,
}

/// `leader`'s options.
#[derive(Args, Debug)]
pub(crate) struct LeaderArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    /// One JSON object per line (`value`, `term`, `backend`; `value` and `term` null when
    /// nobody leads) instead of a sentence.
    #[arg(long)]
    pub(crate) json: bool,
    /// Keep watching: a line per change (a new leader, a proclaimed value, nobody), until
    /// interrupted (SIGINT or SIGTERM: exit 0).
    #[arg(long)]
    pub(crate) watch: bool,
}

/// What `run` and `elect` share: where, how long, and the command.
#[derive(Args, Debug)]
pub(crate) struct Supervised {
    #[command(flatten)]
    pub(crate) target: Target,
    /// Lease TTL; renewed automatically while the command runs.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub(crate) ttl: Duration,
    /// Wait at most this long for the lock [default: wait as long as it takes].
    #[arg(long, value_parser = duration, conflicts_with = "no_wait")]
    pub(crate) wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held.
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// Stop the command after this long (SIGTERM, SIGKILL after --grace), so a hung command
    /// cannot keep the lock forever; exit 70. Greater than zero (leave it out for no limit).
    #[arg(long, value_parser = positive_duration)]
    pub(crate) max_hold: Option<Duration>,
    /// Keep the lock (renewing it) at least this long after acquiring it, even if the command
    /// ends sooner: a job started by cron on several machines runs once. A SIGINT/SIGTERM in
    /// that time leaves the lock to expire by its TTL instead of releasing it (a ZooKeeper
    /// lock by its session's timeout; a PostgreSQL or file:// lock, which lives in distlock's
    /// connection or open file, ends with distlock).
    #[arg(long, value_parser = duration)]
    pub(crate) min_hold: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when the command is stopped (see Supervision below).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub(crate) grace: Duration,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub(crate) json: bool,
    /// Tell held from free by the exit status, for scripts: 0 held, 1 free (an error keeps
    /// its own status, 64 and above). Without it both are 0.
    #[arg(long)]
    pub(crate) exit_code: bool,
}

/// A duration as humans write it (`30s`, `1h 30m`, `250ms`), at most 100 years.
fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d > MAX_DURATION {
        return Err("longer than 100 years".into());
    }
    Ok(d)
}

/// A [`duration`] greater than zero: a limit of nothing is a mistake (or a misreading of
/// `0` as "no limit"), not a command to stop at once.
fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        Duration::ZERO => {
            Err("must be greater than zero (leave the option out for no limit)".into())
        }
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded_and_never_panic() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(duration("101years").is_err());
        assert!(duration("99999999999999999999999s").is_err());
        assert!(duration("18446744073709551615s").is_err());
        assert!(duration("").is_err());
        assert!(duration("-1s").is_err());
        assert!(positive_duration("0s").is_err());
        assert_eq!(positive_duration("1ms"), Ok(Duration::from_millis(1)));
    }
}
