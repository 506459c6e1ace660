//! Exit statuses (BSD sysexits), so cron and scripts can tell outcomes apart, and the one place
//! that prints a failure.

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

/// The exit status for a backend error.
pub(crate) fn code_of(e: &Error) -> u8 {
    match e {
        Error::Config { .. } | Error::InvalidName { .. } | Error::InvalidOptions(_) => EX_USAGE,
        Error::Timeout { .. } => EX_TEMPFAIL,
        Error::Lost { .. } => EX_SOFTWARE,
        Error::Unauthenticated { .. } => EX_NOPERM,
        _ => EX_UNAVAILABLE,
    }
}

/// Prints `distlock: {what}` on one line, with every secret of the command line hidden.
pub(crate) fn say(secrets: &Secrets, what: &str) {
    let line = secrets.scrub(what);
    eprintln!("distlock: {}", line.replace('\n', " "));
}

/// Prints a backend failure and returns its exit status.
pub(crate) fn fail(secrets: &Secrets, what: &str, e: &Error) -> u8 {
    say(secrets, &format!("{what}: {e}"));
    code_of(e)
}
