//! Exit statuses (BSD sysexits), so cron and scripts can tell outcomes apart; the CLI's own
//! error, [`Failure`]; and the one place that prints it.

use distlock::Error;

use crate::target::Secrets;

/// Bad arguments, URL, lock name or default directory.
pub(crate) const EX_USAGE: u8 = 64;
/// The backend did not answer.
pub(crate) const EX_UNAVAILABLE: u8 = 69;
/// The lock was lost (or at risk) while the command ran, or `--max-hold` was reached.
pub(crate) const EX_SOFTWARE: u8 = 70;
/// distlock itself could not do its job (signals, the keeper process).
pub(crate) const EX_OSERR: u8 = 71;
/// Not acquired: busy with `--no-wait`, or `--wait` elapsed.
pub(crate) const EX_TEMPFAIL: u8 = 75;
/// The backend refused the credentials (or a permission the lock needs).
pub(crate) const EX_NOPERM: u8 = 77;
/// `status --exit-code`: the lock is free (held is 0).
pub(crate) const EX_FREE: u8 = 1;
/// `status` could not write its answer (stdout closed or a broken pipe).
pub(crate) const EX_IOERR: u8 = 74;

/// The exit status for a backend error.
fn code_of(e: &Error) -> u8 {
    match e {
        // A mode the backend lacks, or another count of permits than the name's users ask
        // with: the arguments, not the service, must change.
        Error::Config { .. }
        | Error::InvalidName { .. }
        | Error::InvalidOptions(_)
        | Error::Unsupported { .. }
        | Error::PermitsMismatch { .. } => EX_USAGE,
        Error::Timeout { .. } => EX_TEMPFAIL,
        Error::Lost { .. } => EX_SOFTWARE,
        Error::Unauthenticated { .. } => EX_NOPERM,
        _ => EX_UNAVAILABLE,
    }
}

/// Why distlock stops without running (or finishing) the command: each kind has its exit
/// status, and its message is printed once, on one line, with the secrets hidden.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad arguments, URL, lock name or default directory (64).
    Usage(String),
    /// The lock service refused or failed: its error decides the status (64, 69, 70, 75, 77).
    Lock {
        /// What distlock was doing.
        what: String,
        /// What the driver said.
        error: Error,
    },
    /// Not acquired: busy with `--no-wait`, or `--wait` elapsed (75).
    NotAcquired(String),
    /// distlock itself could not supervise: signals, the keeper, the runtime (71).
    Supervision(String),
}

impl Failure {
    /// The exit status.
    pub(crate) fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => EX_USAGE,
            Failure::Lock { error, .. } => code_of(error),
            Failure::NotAcquired(_) => EX_TEMPFAIL,
            Failure::Supervision(_) => EX_OSERR,
        }
    }

    /// Prints it and returns its exit status.
    pub(crate) fn report(self, secrets: &Secrets) -> u8 {
        let code = self.code();
        match self {
            Failure::Lock { what, error } => say(secrets, &format!("{what}: {error}")),
            Failure::Usage(m) | Failure::NotAcquired(m) | Failure::Supervision(m) => {
                say(secrets, &m)
            }
        }
        code
    }
}

/// Prints `distlock: {what}` on one line, with every secret of the command line hidden.
pub(crate) fn say(secrets: &Secrets, what: &str) {
    let line = secrets.scrub(what);
    to_stderr(&format!("distlock: {}\n", line.replace('\n', " ")));
}

/// Writes to stderr, ignoring failure: a reader that went away (`2>&1 | head`, a log
/// collector restarting) must not stop the supervision or change the exit status, as
/// `eprint!`'s panic would.
pub(crate) fn to_stderr(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(text.as_bytes());
}
