//! The terminal a `distlock run` was typed at: the command gets it, as it would without
//! distlock, and distlock takes it back once the command is done.
//!
//! The command runs in a process group of its own, which the keeper joins (`keeper.rs`). A
//! group that is not the terminal's foreground is stopped by SIGTTIN when it reads the terminal
//! (and by SIGTTOU when it writes under `stty tostop`): a command asking a question would hang
//! there, stopped, with the lock held. So, as a shell does for a job, when distlock is a job of
//! a shell with job control (it leads its own process group) and that group is the terminal's
//! foreground, the keeper makes the command's group the foreground as it starts the command
//! ([`hand_to_command`]), and distlock takes the terminal back after the keeper has exited
//! ([`Foreground::take_back`]). A Ctrl-C then reaches the command directly, as without
//! distlock; a Ctrl-Z is refused ([`NOT_SUSPENDED`]) by whichever of the two gets it. A
//! distlock started in the background (`&`) leaves its command in the background, where a read
//! of the terminal stops it as it would any job; once `fg` has made distlock's group the
//! foreground, distlock hands the terminal on and resumes the command
//! ([`Foreground::give_to`]).
//!
//! A distlock that does not lead its group shares it with whoever started it, typically a
//! script without job control, which may go on using the terminal (`distlock run … &` then
//! `read`): taking the terminal would stop the script. There, as before, the command stays in
//! the background, and one that reads the terminal is stopped (the keeper says so).
//!
//! Setting the foreground from a background group draws SIGTTOU unless it is blocked: the
//! keeper blocks it with its other signals, distlock for its whole life
//! ([`block_background_stops`]), which also keeps a distlock whose command has the terminal from
//! being stopped by writing a warning under `tostop`.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;

use nix::errno::Errno;
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::unistd::{getpgid, getpgrp, getpid, tcgetpgrp, tcsetpgrp, Pid};

/// What distlock and the keeper say when a Ctrl-Z (SIGTSTP) would stop a run.
pub(crate) const NOT_SUSPENDED: &str = "\ndistlock: not suspended: a stopped run would hold its \
     lock with nothing running, or renew nothing and lose it (Ctrl-C stops it)\n";

/// What the keeper says when the command is stopped for using the terminal from the
/// background (distlock was started in the background, or by a script).
pub(crate) const STOPPED_IN_BACKGROUND: &str = "\ndistlock: the command is stopped: it used the \
     terminal from a background process group; it holds the lock until it is killed or, if \
     distlock is a job of an interactive shell, until `fg` gives it the terminal\n";

/// Blocks SIGTTOU in the calling thread and the threads it starts later. Call it before any
/// other thread exists. The keeper inherits the mask (std's spawn passes it on) and blocks
/// SIGTTOU itself anyway; the command starts with no signal blocked (`keeper.rs` `spawn`).
pub(crate) fn block_background_stops() {
    let _ = SigSet::from(Signal::SIGTTOU).thread_block();
}

/// The controlling terminal, if the process has one.
fn controlling() -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NOCTTY | nix::libc::O_CLOEXEC)
        .open("/dev/tty")
        .ok()
}

/// In the keeper, once it has started the command in `group` and joined it: makes `group` the
/// terminal's foreground if `supervisor` leads the foreground group. SIGTTOU must be blocked.
/// The command may have touched the terminal before (it starts in the background: a group of
/// its own cannot exist before its first process does) and been stopped for it: it is resumed.
pub(crate) fn hand_to_command(supervisor: Pid, group: Pid) {
    let Some(tty) = controlling() else {
        return;
    };
    if tcgetpgrp(&tty) == Ok(supervisor)
        && getpgid(Some(supervisor)) == Ok(supervisor)
        && tcsetpgrp(&tty, group).is_ok()
    {
        let _ = killpg(group, Signal::SIGCONT);
    }
}

/// distlock's controlling terminal, which the keeper takes over while the command runs if
/// distlock's group is its foreground then, and this gives back.
pub(crate) struct Foreground {
    tty: File,
    /// Whether this process's group was the foreground before the keeper started.
    was_ours: bool,
}

impl Foreground {
    /// `None` if this process has no controlling terminal, or does not lead its process
    /// group (a script's command, not a shell's job: the terminal stays with the script).
    pub(crate) fn before_keeper() -> Option<Foreground> {
        if getpgrp() != getpid() {
            return None;
        }
        let tty = controlling()?;
        let was_ours = tcgetpgrp(&tty) == Ok(getpgrp());
        Some(Foreground { tty, was_ours })
    }

    /// While the command runs, at every turn of distlock's supervision loop (a shell's `fg`
    /// of a running job sends no signal): if this process's group is the terminal's
    /// foreground, gives the terminal to the command's `group` and resumes that group, whose
    /// command may be stopped for having read the terminal from the background.
    pub(crate) fn give_to(&self, group: Pid) {
        if tcgetpgrp(&self.tty) == Ok(getpgrp()) && tcsetpgrp(&self.tty, group).is_ok() {
            let _ = killpg(group, Signal::SIGCONT);
        }
    }

    /// Once the keeper has exited: makes this process's group the foreground again if the
    /// terminal is still with the command's `group` (which took it over), or, if it was this
    /// group's before, with a group that has no process left (one the command made, now
    /// gone). A live group of someone else's that took the terminal meanwhile keeps it.
    pub(crate) fn take_back(self, group: Pid) {
        let Ok(fg) = tcgetpgrp(&self.tty) else {
            return;
        };
        let gone = || killpg(fg, None) == Err(Errno::ESRCH);
        if fg == group || (self.was_ours && fg != getpgrp() && gone()) {
            let _ = tcsetpgrp(&self.tty, getpgrp());
        }
    }
}
