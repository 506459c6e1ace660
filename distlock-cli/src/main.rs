//! `distlock`: run a command under a distributed lock, on any backend, chosen by URL.
// `print!` and `eprint!` panic when the reader has gone away (EPIPE): output goes through
// `exit::to_stderr` and `status`'s checked write instead.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod cli;
mod exit;
mod keeper;
mod leader;
mod procs;
mod progress;
mod run;
mod status;
mod supervisor;
mod target;
mod terminal;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use distlock::{DistributedLock, LockName};

use crate::cli::{Cli, Cmd, LogFormat, Target};
use crate::exit::Failure;
use crate::target::Secrets;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == keeper::ARG) {
        return ExitCode::from(keeper::main(&args[2..]));
    }
    let secrets = Arc::new(Secrets::from_args_and_env());
    let cli = match Cli::try_parse_from(&args) {
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
            let f = Failure::Usage(format!(
                "{} (see distlock --help)",
                reason.trim_start_matches("error: ")
            ));
            return ExitCode::from(f.report(&secrets));
        }
    };
    init_logs(cli.log_format, &secrets);
    // Before any thread exists, so that every thread has it blocked (`terminal.rs`).
    terminal::block_background_stops();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let f = Failure::Supervision(format!("cannot start: {e}"));
            return ExitCode::from(f.report(&secrets));
        }
    };
    ExitCode::from(rt.block_on(async {
        match cli.cmd {
            Cmd::Run(a) => run::run(a, &secrets).await,
            Cmd::Elect(a) => run::elect(a, &secrets).await,
            Cmd::Leader(a) => leader::leader(a, &secrets).await,
            Cmd::Status(a) => status::status(a, &secrets).await,
        }
    }))
}

/// The lock name, checked, and the driver for the target URL.
pub(crate) async fn connect(
    target: &Target,
) -> Result<(Arc<dyn DistributedLock>, LockName), Failure> {
    let name = LockName::new(target.name.as_str()).map_err(|error| Failure::Lock {
        what: "bad lock name".into(),
        error,
    })?;
    let url = target::url_of(target.url.as_deref()).map_err(Failure::Usage)?;
    // A server that accepts and never answers takes the driver's whole timeout: say so.
    let connecting =
        progress::Progress::start(format!("connecting to {}", distlock::redact(&url)), true);
    let connected = distlock::connect(&url).await;
    connecting.done();
    let locks = connected.map_err(|error| Failure::Lock {
        what: format!("cannot use {}", distlock::redact(&url)),
        error,
    })?;
    // A memory lock lives inside one process: no other `distlock` ever sees it, so it
    // excludes no other run and reads free. Said, not refused: it has been a documented URL.
    if locks.backend() == "memory" {
        exit::to_stderr(&format!(
            "distlock: warning: {} is private to one process and excludes no other run; use \
             file:///dir (one machine) or a server\n",
            distlock::redact(&url)
        ));
    }
    Ok((locks, name))
}

pub(crate) fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Log lines on stderr, scrubbed, as `--log-format` asks: JSON lines carry the fields of the
/// spans they happened in, and a line closes each acquisition and release span.
fn init_logs(format: LogFormat, secrets: &Arc<Secrets>) {
    let filter = |default: &str| {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
    };
    let writer = ScrubbedStderr(secrets.clone());
    match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(std::io::stderr().is_terminal())
            .with_env_filter(filter("warn"))
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .with_writer(writer)
            .with_env_filter(filter("warn,lock_core=debug,distlock=info"))
            .init(),
    }
}

/// stderr for log lines, with the command line's secrets hidden (a driver's log line may
/// carry a piece of a URL).
struct ScrubbedStderr(Arc<Secrets>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ScrubbedStderr {
    type Writer = ScrubbedLine;
    fn make_writer(&'a self) -> ScrubbedLine {
        ScrubbedLine(Vec::new(), self.0.clone())
    }
}

/// One log event, written to stderr scrubbed when it is complete.
struct ScrubbedLine(Vec<u8>, Arc<Secrets>);

impl std::io::Write for ScrubbedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ScrubbedLine {
    fn drop(&mut self) {
        let text = self.1.scrub(&String::from_utf8_lossy(&self.0));
        exit::to_stderr(&text);
    }
}
