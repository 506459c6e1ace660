//! The keeper: a small process between `distlock run` and the command, so that nothing the
//! command starts can run without the lock.
//!
//! `distlock run` (the supervisor) holds the lease; it starts the keeper (this binary again,
//! `/proc/self/exe`, with [`ARG`]) as the leader of a new process group, and the keeper starts
//! the command as the leader of another new group, and joins that group itself: so a Ctrl-Z
//! or a Ctrl-C typed at the terminal reaches both (see below). The keeper
//! - asks the kernel for `SIGUSR1` when the supervisor dies (`PR_SET_PDEATHSIG`), also by
//!   SIGKILL or the OOM killer, and then kills every process of the command at once;
//! - is a child subreaper (`PR_SET_CHILD_SUBREAPER`): whatever the command forks and orphans
//!   (a `cmd &` in a script, a daemon that double-forks, even one that leaves the group with
//!   `setsid`) is re-parented to the keeper, so "the keeper has no child left" means exactly
//!   "nothing of the command runs";
//! - when the command's main process exits, sends SIGTERM to what is left and SIGKILL after
//!   the grace, and exits only once nothing is left, with the command's status (a signal `N`
//!   as `128 + N`);
//! - kills with one signal to the command's group, which the kernel delivers to every member
//!   at once (a process forking at that moment either has no child yet or its child gets it
//!   too): before that the keeper steps out of the group into one of its own, so that the
//!   SIGKILL does not reach it. A fork loop cannot outrun it, as it can outrun a hunt of
//!   `/proc` for processes to kill one by one; only the processes that left the group
//!   (`setsid`) are hunted so, as re-parented to the keeper;
//! - tells the supervisor with SIGUSR2 once it has blocked its signals (before that, a signal
//!   would end it with the default action, so the supervisor holds its signals back);
//! - when the supervisor leads the terminal's foreground group (a job of an interactive
//!   shell), makes the command's group the foreground, so that the command can read the
//!   terminal (`terminal.rs`); a Ctrl-Z then comes to that group, keeper included,
//!   and the keeper refuses it: SIGTSTP is blocked, and every process of the command gets
//!   SIGCONT; SIGTTIN and SIGTTOU are blocked too, so that the keeper itself never stops;
//! - starts the command with no signal blocked (`spawn`);
//! - relays SIGINT, SIGTERM, SIGHUP and SIGQUIT from the supervisor to all of it, and on
//!   `SIGUSR1` (the supervisor's "the lease is about to move", or its death) SIGKILLs all of it;
//!   the supervisor follows each with a SIGCONT, which the keeper does not block or relay: a
//!   keeper the command stopped (`kill -STOP $PPID`) resumes and acts;
//! - holds a dead man's switch: the supervisor writes, through a pipe, the moment by which the
//!   command must be dead unless a renewal is confirmed, each time that moment moves. A
//!   supervisor that is alive but does nothing (SIGSTOP, a debugger, a hung process; the
//!   command is in a group of its own, which a stop of the supervisor does not reach) sends
//!   no later one, and the keeper SIGKILLs all of it then, as the supervisor would have.
//!   The deadline is on `CLOCK_BOOTTIME`, which, unlike the `CLOCK_MONOTONIC` of every other
//!   timer here, goes on while the machine is suspended: a timerfd on it wakes the keeper as
//!   the machine resumes, if the lease ran out meanwhile.
//!
//! The keeper never execs anything else and reads no input, so it cannot be confused by the
//! command; signals are read from a signalfd with the sender's pid, so that the keeper relays
//! only the supervisor's signals (and not its own group-wide ones back to the group).

use std::ffi::OsString;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::{getpgrp, getpid, getppid, setpgid, Pid};

use crate::exit::to_stderr;

/// The hidden first argument that makes this binary a keeper.
pub(crate) const ARG: &str = "__distlock_keeper";

/// Exit status of a keeper that could not start the command's supervision at all.
const EX_OSERR: u8 = 71;

/// How often the keeper looks again for processes to kill once it is killing (a process can
/// fork between the look and the kill; its child is found on the next round).
const KILL_ROUND: Duration = Duration::from_millis(10);

/// Runs the keeper: `args` are what follows [`ARG`]: `PARENT_PID GRACE_MS SWITCH_FD HELD_FDS
/// -- COMMAND...`, where `SWITCH_FD` is the read end of the dead man's switch's pipe and
/// `HELD_FDS` the descriptors that hold the lock (comma-separated; `-`: none). Returns the
/// exit status for the supervisor.
pub(crate) fn main(args: &[OsString]) -> u8 {
    let Some((parent, grace, switch_fd, held, command)) = parse(args) else {
        to_stderr("distlock: the keeper is internal to `distlock run`\n");
        return EX_OSERR;
    };
    // A descriptor of its own on the pipe (close-on-exec, non-blocking), and the inherited
    // one closed: the command must not inherit it, or it could read the deadlines.
    let switch = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{switch_fd}"));
    let _ = nix::unistd::close(switch_fd);
    let switch = match switch {
        Ok(f) => f,
        Err(e) => {
            to_stderr(&format!(
                "distlock: keeper: cannot open its deadline pipe: {e}\n"
            ));
            return EX_OSERR;
        }
    };
    let timer = match TimerFd::new(
        nix::sys::timerfd::ClockId::CLOCK_BOOTTIME,
        TimerFlags::TFD_CLOEXEC | TimerFlags::TFD_NONBLOCK,
    ) {
        Ok(t) => t,
        Err(e) => {
            to_stderr(&format!(
                "distlock: keeper: cannot make its deadline timer: {e}\n"
            ));
            return EX_OSERR;
        }
    };
    // Blocked signals wait in the signalfd; the command starts with none blocked (`spawn`).
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGCHLD,
        // A Ctrl-Z is refused, not obeyed (`terminal.rs`).
        Signal::SIGTSTP,
        // Setting the terminal's foreground from the background.
        Signal::SIGTTOU,
        // Sent to the whole group when the command reads the terminal from the background:
        // the command stops, the keeper must not.
        Signal::SIGTTIN,
    ] {
        mask.add(s);
    }
    if let Err(e) = mask.thread_block() {
        to_stderr(&format!("distlock: keeper: cannot block signals: {e}\n"));
        return EX_OSERR;
    }
    // The death signal must be armed before the parent check, or a parent dying in between
    // would go unnoticed.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGUSR1) {
        to_stderr(&format!(
            "distlock: keeper: cannot watch the supervisor: {e}\n"
        ));
        return EX_OSERR;
    }
    if getppid() != parent {
        return EX_OSERR; // the supervisor is already gone: start nothing
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        to_stderr(&format!(
            "distlock: keeper: cannot become a subreaper: {e}\n"
        ));
        return EX_OSERR;
    }
    let signals = match SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    {
        Ok(s) => s,
        Err(e) => {
            to_stderr(&format!("distlock: keeper: signalfd: {e}\n"));
            return EX_OSERR;
        }
    };
    // Tell the supervisor that its signals are safe to send now.
    let _ = kill(parent, Signal::SIGUSR2);
    let child = match spawn(command, &held) {
        Ok(c) => c,
        Err(e) => {
            to_stderr(&format!(
                "distlock: cannot run {}: {}\n",
                command[0].to_string_lossy(),
                e.desc()
            ));
            return if e == Errno::ENOENT { 127 } else { 126 };
        }
    };
    // In the command's group, a Ctrl-Z reaches the keeper too, which refuses it. Should the
    // join fail (it cannot: the child is not reaped yet), the keeper only misses those.
    let _ = setpgid(Pid::from_raw(0), child);
    crate::terminal::hand_to_command(parent, child);
    Keeper {
        parent,
        group: child,
        child,
        grace,
        status: None,
        kill_at: None,
        killing: false,
        switch: Some(switch),
        deadline: Deadline::default(),
        timer,
    }
    .supervise(&signals)
}

/// Starts the command (searched for in `PATH`) as it would start without distlock: with no
/// signal blocked and SIGPIPE at its default action, as the leader of a new process group. `std::process::Command` passes on the
/// spawner's signal mask, which here holds every signal the keeper reads from its signalfd:
/// a command that does not clear its mask itself (most programs but shells) would never get
/// the SIGTERM meant to stop it, nor a Ctrl-C. The Rust runtime ignores SIGPIPE in the keeper.
/// The lock's descriptors (`held`) stay open here and are closed in the command: it could
/// write the fence counter through one, or free the lock by closing or unlocking one it does
/// not know.
fn spawn(command: &[OsString], held: &[RawFd]) -> Result<Pid, Errno> {
    use nix::spawn::{posix_spawnp, PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
    use std::ffi::CString;
    use std::os::unix::ffi::OsStringExt;
    // Arguments and the environment come from the OS, which allows no NUL in them.
    let c = |bytes: Vec<u8>| CString::new(bytes).map_err(|_| Errno::EINVAL);
    let args = command
        .iter()
        .map(|a| c(a.clone().into_vec()))
        .collect::<Result<Vec<_>, _>>()?;
    let env = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            c(kv)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let program = args.first().ok_or(Errno::EINVAL)?;
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_sigmask(&SigSet::empty())?;
    attr.set_sigdefault(&SigSet::from(Signal::SIGPIPE))?;
    attr.set_pgroup(Pid::from_raw(0))?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF
            | PosixSpawnFlags::POSIX_SPAWN_SETPGROUP,
    )?;
    let mut actions = PosixSpawnFileActions::init()?;
    for fd in held {
        actions.add_close(*fd)?;
    }
    posix_spawnp(program, &actions, &attr, &args, &env)
}

type Parsed<'a> = (Pid, Duration, RawFd, Vec<RawFd>, &'a [OsString]);

fn parse(args: &[OsString]) -> Option<Parsed<'_>> {
    let parent: i32 = args.first()?.to_str()?.parse().ok()?;
    let grace: u64 = args.get(1)?.to_str()?.parse().ok()?;
    let switch: RawFd = args.get(2)?.to_str()?.parse().ok()?;
    let held: Vec<RawFd> = match args.get(3)?.to_str()? {
        "-" => Vec::new(),
        list => list
            .split(',')
            .map(|f| f.parse().ok().filter(|f| *f >= 3 && *f != switch))
            .collect::<Option<_>>()?,
    };
    if args.get(4)?.to_str()? != "--" || args.len() < 6 || switch < 3 {
        return None;
    }
    Some((
        Pid::from_raw(parent),
        Duration::from_millis(grace),
        switch,
        held,
        &args[5..],
    ))
}

/// `CLOCK_BOOTTIME` in nanoseconds: the machine's (not a process's) clock, which the
/// supervisor's deadlines and the keeper's reading of them share; `CLOCK_MONOTONIC` (that of
/// `Instant`) plus the time the machine was suspended.
pub(crate) fn boottime_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    })
}

/// The dead man's switch: the latest deadline the supervisor wrote (8 bytes, little-endian
/// `CLOCK_BOOTTIME` nanoseconds, each write whole: a pipe never splits one of `PIPE_BUF` bytes
/// or fewer), and the bytes of one not read whole yet.
#[derive(Default)]
struct Deadline {
    at_ns: Option<u64>,
    partial: Vec<u8>,
}

impl Deadline {
    /// Takes in what was read from the pipe.
    fn feed(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        let whole = self.partial.len() / 8 * 8;
        if let Some(last) = self.partial[..whole].chunks_exact(8).last() {
            let mut b = [0u8; 8];
            b.copy_from_slice(last);
            self.at_ns = Some(u64::from_le_bytes(b));
        }
        self.partial.drain(..whole);
    }

    /// How long until it passes (zero once it has); `None` before the first deadline.
    fn left(&self) -> Option<Duration> {
        self.at_ns
            .map(|at| Duration::from_nanos(at.saturating_sub(boottime_ns())))
    }
}

struct Keeper {
    parent: Pid,
    /// The process group the command runs in, which the command's main process leads and
    /// the keeper is in until it kills.
    group: Pid,
    child: Pid,
    grace: Duration,
    /// The command's status, once its main process has ended.
    status: Option<u8>,
    /// When what is left of the command gets SIGKILL.
    kill_at: Option<Instant>,
    killing: bool,
    /// The read end of the dead man's switch's pipe, until the supervisor closes its end.
    switch: Option<std::fs::File>,
    deadline: Deadline,
    /// Readable once the deadline has passed, also across a suspend of the machine.
    timer: TimerFd,
}

impl Keeper {
    fn supervise(mut self, signals: &SignalFd) -> u8 {
        loop {
            if self.kill_at.is_some_and(|t| Instant::now() >= t) {
                self.killing = true;
            }
            if !self.killing && self.deadline.left() == Some(Duration::ZERO) {
                // Disarmed, or its readable state would end every poll at once from now on.
                let _ = self.timer.unset();
                to_stderr(
                    "distlock: keeper: distlock confirmed no renewal before the lease's \
                     validity ran out (is it stopped or hung?): killing the command\n",
                );
                self.killing = true;
            }
            if self.killing {
                let (killed, denied) = self.signal_all(Signal::SIGKILL);
                if killed == 0 && !denied.is_empty() {
                    // What is left changed its user (`sudo`): no signal of ours reaches it,
                    // and waiting for it would hold distlock forever. distlock, which these
                    // processes are handed to as the keeper exits, decides what to do.
                    let pids: Vec<String> = denied.iter().map(|p| p.to_string()).collect();
                    to_stderr(&format!(
                        "distlock: keeper: cannot kill process {} of the command: it runs as \
                         another user (it changed user, as sudo does)\n",
                        pids.join(", ")
                    ));
                    return self.status.unwrap_or(EX_OSERR);
                }
            }
            // After the kill: a flood of orphans to reap (a fork loop's) must not hold it up.
            if let Some(done) = self.reap() {
                return done;
            }
            let timeout = if self.killing {
                Some(KILL_ROUND)
            } else {
                let kill = self
                    .kill_at
                    .map(|t| t.saturating_duration_since(Instant::now()));
                match (kill, self.deadline.left()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            };
            let timeout = match timeout {
                None => PollTimeout::NONE,
                // Rounded up, so a deadline is never polled a millisecond early in a loop.
                Some(d) => PollTimeout::try_from(d + Duration::from_micros(999))
                    .unwrap_or(PollTimeout::MAX),
            };
            let mut fds = vec![
                PollFd::new(signals.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.timer.as_fd(), PollFlags::POLLIN),
            ];
            if let Some(switch) = &self.switch {
                fds.push(PollFd::new(switch.as_fd(), PollFlags::POLLIN));
            }
            let polled = poll(&mut fds, timeout);
            drop(fds);
            match polled {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => self.killing = true, // cannot wait for signals: end it all
            }
            self.read_switch();
            while let Ok(Some(info)) = signals.read_signal() {
                let Ok(sig) = Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) else {
                    continue;
                };
                let from_parent = i32::try_from(info.ssi_pid).ok() == Some(self.parent.as_raw());
                match sig {
                    Signal::SIGCHLD => {} // reaped at the top of the loop
                    Signal::SIGTSTP => {
                        to_stderr(crate::terminal::NOT_SUSPENDED);
                        self.signal_all(Signal::SIGCONT);
                    }
                    Signal::SIGTTOU | Signal::SIGTTIN => {}
                    // The supervisor's "kill it all now", or the kernel's word that it died.
                    Signal::SIGUSR1 => self.killing = true,
                    // Only the supervisor's: the keeper's own group-wide signals come back to
                    // it, and a terminal's reach the whole group by themselves.
                    _ if from_parent => {
                        self.signal_all(sig);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Reads the deadlines the supervisor wrote. At its end of the pipe closed, the last one
    /// stays: nothing extends it any more.
    fn read_switch(&mut self) {
        use std::io::Read;
        let Some(switch) = self.switch.as_mut() else {
            return;
        };
        let mut buf = [0u8; 512];
        loop {
            match switch.read(&mut buf) {
                Ok(0) => {
                    self.switch = None;
                    return;
                }
                Ok(n) => {
                    let before = self.deadline.at_ns;
                    self.deadline.feed(&buf[..n]);
                    if let Some(at) = self
                        .deadline
                        .at_ns
                        .filter(|_| self.deadline.at_ns != before)
                    {
                        // Setting it again also clears an expiry of the previous deadline.
                        let when = TimeSpec::from(Duration::from_nanos(at.max(1)));
                        let _ = self.timer.set(
                            Expiration::OneShot(when),
                            TimerSetTimeFlags::TFD_TIMER_ABSTIME,
                        );
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // WouldBlock: all read. Another error: the pipe is unusable; keep the deadline.
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::WouldBlock {
                        self.switch = None;
                    }
                    return;
                }
            }
        }
    }

    /// Reaps every child that has ended; the command's status once nothing is left.
    fn reap(&mut self) -> Option<u8> {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    if pid == self.child {
                        self.child_ended(u8::try_from(code & 0xff).unwrap_or(1));
                    }
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    if pid == self.child {
                        self.child_ended(128u8.saturating_add(sig as u8));
                    }
                }
                // A Ctrl-Z that a command's own handler turned into a stop after the keeper
                // had already resumed the group.
                Ok(WaitStatus::Stopped(pid, Signal::SIGTSTP)) => {
                    let _ = kill(pid, Signal::SIGCONT);
                }
                // The command used the terminal from the background: as with any job, `fg`
                // resumes it (distlock, brought to the foreground, hands it the terminal).
                Ok(WaitStatus::Stopped(_, Signal::SIGTTIN | Signal::SIGTTOU)) => {
                    to_stderr(crate::terminal::STOPPED_IN_BACKGROUND);
                }
                Ok(WaitStatus::StillAlive) => return None,
                Ok(_) | Err(Errno::EINTR) => {}
                // No child left, living or dead: nothing of the command runs any more.
                Err(_) => return Some(self.status.unwrap_or(EX_OSERR)),
            }
        }
    }

    fn child_ended(&mut self, status: u8) {
        self.status = Some(status);
        // Whatever the command left behind would run on without the lock: stop it.
        self.signal_all(Signal::SIGTERM);
        let at = Instant::now().checked_add(self.grace);
        self.kill_at = match (self.kill_at, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Sends `sig` to every process of the command: its process group, and the processes
    /// re-parented to the keeper that left the group. Returns how many living processes it
    /// reached, and those it may not signal (EPERM: they changed their user).
    fn signal_all(&self, sig: Signal) -> (usize, Vec<Pid>) {
        let me = getpid();
        if sig == Signal::SIGKILL && getpgrp() == self.group {
            // Out of the group before killing it; a group of its own, which no other process
            // can have: its id is the keeper's pid. The command's group lives on meanwhile
            // (its id is taken while any member is, zombies included).
            let _ = setpgid(me, me);
        }
        if sig != Signal::SIGKILL || getpgrp() != self.group {
            // Group-wide in one call: also reaches a process forked a moment ago. For any
            // other signal the keeper gets it too, blocked, and ignores it (it is not from
            // the supervisor).
            let _ = killpg(self.group, sig);
        }
        let (mut reached, mut denied) = (0, Vec::new());
        for p in crate::procs::all() {
            if p.pid != me && !p.zombie && (p.group == self.group || p.parent == me) {
                match kill(p.pid, sig) {
                    Ok(()) => reached += 1,
                    Err(Errno::EPERM) => denied.push(p.pid),
                    Err(_) => {} // ended meanwhile
                }
            }
        }
        (reached, denied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked() {
        let a = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(parse(&a(&["1", "100", "5", "-", "--", "true"])).is_some());
        assert_eq!(
            parse(&a(&["1", "100", "5", "6,7", "--", "true"])).map(|p| p.3),
            Some(vec![6, 7])
        );
        assert!(parse(&a(&["1", "100", "5", "-", "--"])).is_none());
        assert!(parse(&a(&["x", "100", "5", "-", "--", "true"])).is_none());
        assert!(parse(&a(&["1", "100", "5", "-", "true"])).is_none());
        assert!(parse(&a(&["1", "100", "5", "--", "true"])).is_none());
        assert!(parse(&a(&["1", "100", "5", "6,x", "--", "true"])).is_none());
        assert!(parse(&a(&["1", "100", "5", "1", "--", "true"])).is_none());
        assert!(
            parse(&a(&["1", "100", "0", "-", "--", "true"])).is_none(),
            "stdin is no pipe"
        );
    }

    #[test]
    fn the_switch_keeps_the_last_whole_deadline() {
        let mut d = Deadline::default();
        assert_eq!(d.left(), None);
        let far = boottime_ns() + 3_600_000_000_000;
        let mut bytes = 1u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&far.to_le_bytes());
        bytes.extend_from_slice(&7u64.to_le_bytes()[..3]);
        d.feed(&bytes);
        assert_eq!(
            d.at_ns,
            Some(far),
            "the last whole one, not the partial one"
        );
        assert!(d.left().is_some_and(|l| l > Duration::from_secs(3500)));
        d.feed(&7u64.to_le_bytes()[3..]);
        assert_eq!(d.at_ns, Some(7));
        assert_eq!(
            d.left(),
            Some(Duration::ZERO),
            "a deadline in the past has passed"
        );
    }
}
