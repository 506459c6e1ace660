//! The supervisor's end of the keeper (`keeper.rs`): starting it as the leader of a process
//! group (the command gets one of its own, which the keeper joins), its dead man's switch, the
//! signals it relays, and the last kill should the keeper itself die.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use distlock::{Fencing, Lease, LockName};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::Supervised;

/// The validity window the backend gave (TTL minus drift; ZooKeeper: the session timeout),
/// measured once: renewals keep `valid_until` between 2/3 of it and all of it ahead; and how
/// long before `valid_until` the command gets SIGKILL, for the timer's and the kernel's delays.
pub(crate) fn window(lease: &dyn Lease, granted: Instant) -> (Duration, Duration) {
    let span = lease.valid_until().saturating_duration_since(granted);
    let margin = (span / 20).clamp(Duration::from_millis(5), Duration::from_millis(200));
    (span, margin)
}

/// The supervisor's end of the keeper's dead man's switch (`keeper.rs`): the moment by which
/// the command must be dead, written again whenever it moves. Non-blocking: a keeper that does
/// not read (it is frozen too) must not stall the supervisor.
pub(crate) struct Switch {
    tx: std::os::fd::OwnedFd,
    sent: Option<Instant>,
    /// `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` read together at each call, back to the oldest
    /// that a deadline may still need: the two part only while the machine is suspended.
    clocks: VecDeque<(Instant, u64)>,
}

impl Switch {
    pub(crate) fn new(tx: std::os::fd::OwnedFd) -> Switch {
        Switch {
            tx,
            sent: None,
            clocks: VecDeque::new(),
        }
    }

    /// Writes `kill_at` (on `Instant`'s clock) for a lease whose validity counts from no
    /// earlier than `since` (its `valid_until` less its TTL).
    pub(crate) fn set(&mut self, kill_at: Instant, since: Instant) {
        self.clocks
            .push_back((Instant::now(), crate::keeper::boottime_ns()));
        // Only the latest reading at or before `since` is needed, and `since` never goes back.
        while self.clocks.get(1).is_some_and(|(m, _)| *m <= since) {
            self.clocks.pop_front();
        }
        if self.sent == Some(kill_at) {
            return;
        }
        let at = on_boottime(kill_at, since, &self.clocks);
        // Eight bytes go whole or not at all; a full pipe (a keeper that reads nothing) loses
        // the update, which the next one retries.
        if nix::unistd::write(&self.tx, &at.to_le_bytes()) == Ok(8) {
            self.sent = Some(kill_at);
        }
    }
}

/// `kill_at` on the keeper's clock, `CLOCK_BOOTTIME`, which goes on while the machine is
/// suspended; `Instant` (`CLOCK_MONOTONIC`) stands still meanwhile, and the lease's server does
/// not. Mapped through the clocks as they were read at or before `since`, when the lease's
/// validity began (the oldest reading if none is that old): a renewal sent before a suspend
/// and confirmed after it counts on the server from before the suspend, so a reading taken
/// after the resume would move the deadline past the server's expiry by the suspend's length.
/// A reading older than needed errs early, never late (the offset between the clocks only
/// grows).
fn on_boottime(kill_at: Instant, since: Instant, clocks: &VecDeque<(Instant, u64)>) -> u64 {
    let Some(&(mono, boot)) = clocks
        .iter()
        .rev()
        .find(|(m, _)| *m <= since)
        .or_else(|| clocks.front())
    else {
        return crate::keeper::boottime_ns();
    };
    if kill_at >= mono {
        let ahead = u64::try_from((kill_at - mono).as_nanos()).unwrap_or(u64::MAX);
        boot.saturating_add(ahead)
    } else {
        let behind = u64::try_from((mono - kill_at).as_nanos()).unwrap_or(u64::MAX);
        boot.saturating_sub(behind)
    }
}

/// The command's status as the keeper reports it, or why the keeper itself died.
pub(crate) fn keeper_status(st: std::process::ExitStatus) -> Result<u8, String> {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => Ok(u8::try_from(c & 0xff).unwrap_or(1)),
        (None, Some(sig)) => Err(format!("signal {sig}")),
        _ => Err(format!("{st}")),
    }
}

/// The keeper process (this binary, in keeper mode) and the command's process group.
pub(crate) struct Keeper {
    pub(crate) child: tokio::process::Child,
    pub(crate) pid: Pid,
    /// SIGUSR2 from the keeper: it has blocked its signals and armed its death signal. A
    /// signal sent before would kill it with the default action, so until then signals wait
    /// in `pending` (and a kill goes to the whole group directly).
    pub(crate) ready: tokio::signal::unix::Signal,
    pub(crate) is_ready: bool,
    pending: Vec<Signal>,
    /// This process SIGKILLed the keeper's group itself, before the keeper was ready.
    pub(crate) killed_group: bool,
    pub(crate) switch: Switch,
    /// This process's terminal, which the keeper takes over while the command runs.
    pub(crate) foreground: Option<crate::terminal::Foreground>,
    /// The command's process group, which the keeper joined, as last seen ([`Self::look`]).
    group: Option<Pid>,
}

impl Keeper {
    pub(crate) fn spawn(
        a: &Supervised,
        name: &LockName,
        backend: &str,
        fencing: Fencing,
        lease: &dyn Lease,
        granted: Instant,
        // `elect`'s leadership term, for DISTLOCK_TERM.
        term: Option<distlock::FencingToken>,
    ) -> std::io::Result<Keeper> {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
        use std::os::fd::AsRawFd;
        let grace_ms = u64::try_from(a.grace.as_millis()).unwrap_or(u64::MAX);
        // Before the spawn: SIGUSR2's default action would end distlock.
        let ready = signal(SignalKind::user_defined2())?;
        // The dead man's switch, armed before the command exists.
        let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let mut switch = Switch::new(tx);
        let margin = window(lease, granted).1;
        switch.set(
            lease
                .valid_until()
                .checked_sub(margin)
                .unwrap_or_else(Instant::now),
            granted,
        );
        if switch.sent.is_none() {
            return Err(std::io::Error::other("cannot arm the keeper's deadline"));
        }
        // Should the keeper die, what the command orphaned comes here, not to init, and is
        // found (`kill_group_and_wait`).
        nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
        // Looked at before the keeper can take it over.
        let foreground = crate::terminal::Foreground::before_keeper();
        // A lock held by open files (file://) is handed to the keeper too, so that it stays
        // held until the keeper has killed the command even if distlock dies first (the
        // kernel would otherwise free it with distlock's descriptors, a moment before the
        // keeper hears of the death). The keeper is told which they are: it keeps them from
        // the command (one is writable on the fence counter, and closing or unlocking one
        // would free the lock while the command runs).
        let fds = lease.inheritable_fds();
        let held: Vec<String> = fds.iter().map(|f| f.as_raw_fd().to_string()).collect();
        let mut cmd = tokio::process::Command::new(keeper_exe()?);
        cmd.arg(crate::keeper::ARG)
            .arg(std::process::id().to_string())
            .arg(grace_ms.to_string())
            .arg(rx.as_raw_fd().to_string())
            .arg(if held.is_empty() {
                "-".to_string()
            } else {
                held.join(",")
            })
            .arg("--")
            .args(&a.command)
            .env("DISTLOCK_NAME", name.as_str())
            .env("DISTLOCK_BACKEND", backend)
            // A group of its own: the keeper leads it and the command runs in it.
            .process_group(0);
        match lease.fencing_token() {
            Some(t) => cmd.env("DISTLOCK_FENCING_TOKEN", t.get().to_string()),
            None => cmd.env_remove("DISTLOCK_FENCING_TOKEN"),
        };
        // How far the token can be trusted: a best-effort one (Redis without `appendfsync
        // always`) can repeat after the server lost data in a restart.
        match (lease.fencing_token(), fencing) {
            (Some(_), Fencing::Strict) => cmd.env("DISTLOCK_FENCING", "strict"),
            (Some(_), Fencing::BestEffort) => cmd.env("DISTLOCK_FENCING", "best-effort"),
            _ => cmd.env_remove("DISTLOCK_FENCING"),
        };
        match lease.backend_key() {
            Some(k) => cmd.env("DISTLOCK_KEY", k),
            None => cmd.env_remove("DISTLOCK_KEY"),
        };
        match term {
            Some(t) => cmd.env("DISTLOCK_TERM", t.get().to_string()),
            None => cmd.env_remove("DISTLOCK_TERM"),
        };
        // Inheritable for this one spawn only.
        for fd in fds.iter().chain([&rx]) {
            fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).map_err(std::io::Error::from)?;
        }
        let child = cmd.spawn();
        drop(fds);
        drop(rx);
        let child = child?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| std::io::Error::other("the keeper has no pid"))?;
        Ok(Keeper {
            child,
            pid,
            ready,
            is_ready: false,
            pending: Vec::new(),
            killed_group: false,
            switch,
            foreground,
            group: None,
        })
    }

    /// Notes the command's process group: the one the keeper is in, once it is not the
    /// keeper's own. Only while the keeper is not reaped (its pid could be another's after).
    pub(crate) fn look(&mut self) {
        if let Ok(g) = nix::unistd::getpgid(Some(self.pid)) {
            if g != self.pid {
                self.group = Some(g);
            }
        }
    }

    /// The command's process group as last seen; the keeper's before it joined one.
    pub(crate) fn group(&self) -> Pid {
        self.group.unwrap_or(self.pid)
    }

    /// The command's process group, once seen.
    pub(crate) fn command_group(&self) -> Option<Pid> {
        self.group
    }

    /// The processes of the command in `procs`, and its process groups: the keeper's, the
    /// command's as last seen, and those of the processes re-parented to this process (the
    /// keeper's orphans, once it died: the command's group among them if this process never
    /// saw it), never this process's own group.
    fn of_command(&self, procs: Vec<crate::procs::Proc>) -> (Vec<crate::procs::Proc>, Vec<Pid>) {
        let (me, ours) = (nix::unistd::getpid(), nix::unistd::getpgrp());
        let mut groups = vec![self.pid, self.group()];
        groups.extend(procs.iter().filter(|p| p.parent == me).map(|p| p.group));
        groups.retain(|g| *g != ours);
        groups.sort();
        groups.dedup();
        let procs = procs
            .into_iter()
            .filter(|p| !p.zombie && (p.parent == me || groups.contains(&p.group)))
            .collect();
        (procs, groups)
    }

    /// Asks the keeper to relay `sig` (SIGUSR1: kill everything now). A keeper stopped by its
    /// own command (`kill -STOP $PPID`) would relay nothing: SIGCONT resumes it (the keeper
    /// alone; it relays no SIGCONT).
    pub(crate) fn signal(&mut self, sig: Signal) {
        if self.is_ready {
            let _ = nix::sys::signal::kill(self.pid, sig);
            let _ = nix::sys::signal::kill(self.pid, Signal::SIGCONT);
        } else if sig == Signal::SIGUSR1 {
            // Not set up yet: what runs of the command is in its group.
            let _ = nix::sys::signal::killpg(self.pid, Signal::SIGKILL);
            self.killed_group = true;
        } else {
            self.pending.push(sig);
        }
    }

    pub(crate) fn now_ready(&mut self) {
        self.is_ready = true;
        for sig in std::mem::take(&mut self.pending) {
            self.signal(sig);
        }
    }

    /// After the keeper died: SIGKILLs what is left of the command, its process group and
    /// the processes that had left the group (re-parented to this process, a subreaper as the
    /// keeper was), until nothing of it runs, or `until` passes. True if nothing runs. A
    /// zombie runs nothing and is not counted: one re-parented to init may wait a while to be
    /// reaped (this machine's pid 1 reaps every 2 s), and `kill` still reaches it. (`/proc`
    /// is read from memory: nothing here waits on a device.)
    pub(crate) async fn kill_group_and_wait(&self, until: Instant) -> bool {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        let until = until.max(Instant::now() + Duration::from_secs(1));
        loop {
            let (procs, groups) = self.of_command(crate::procs::all());
            for g in groups {
                let _ = nix::sys::signal::killpg(g, Signal::SIGKILL);
            }
            let left = !procs.is_empty();
            for p in procs {
                let _ = nix::sys::signal::kill(p.pid, Signal::SIGKILL);
            }
            // Reap what was re-parented here (the keeper itself has been reaped already).
            while let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
                waitpid(None, Some(WaitPidFlag::WNOHANG))
            {}
            if !left {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Keeper {
    /// After the keeper ended: the processes of the command still running that SIGKILL may
    /// not reach (EPERM: they changed their user), in its group or re-parented to this
    /// process. Each is sent SIGKILL on the way, and what was re-parented here and ended is
    /// reaped.
    pub(crate) fn unkillable(&self) -> Vec<Pid> {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        while let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
            waitpid(None, Some(WaitPidFlag::WNOHANG))
        {}
        self.of_command(crate::procs::all())
            .0
            .into_iter()
            .filter(|p| {
                nix::sys::signal::kill(p.pid, Signal::SIGKILL) == Err(nix::errno::Errno::EPERM)
            })
            .map(|p| p.pid)
            .collect()
    }
}

/// This very binary, also when it was replaced on disk since it started.
fn keeper_exe() -> std::io::Result<std::path::PathBuf> {
    let proc = std::path::Path::new("/proc/self/exe");
    if proc.exists() {
        Ok(proc.to_path_buf())
    } else {
        std::env::current_exe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// A renewal sent before a 100 s suspend and confirmed after it: the deadline is counted
    /// from the clocks as they were before the suspend, not after it.
    #[test]
    fn a_deadline_written_after_a_resume_keeps_the_servers_expiry() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Monotonic 10 s at boottime 1,000 s; then a suspend of 100 s at monotonic 11 s.
        let clocks: VecDeque<(Instant, u64)> = [
            (at(10), 1_000 * S),
            (at(11), 1_001 * S),
            (at(12), 1_102 * S),
        ]
        .into();
        // Sent at monotonic 11 s (before the suspend), valid 30 s: kill at monotonic 40 s.
        assert_eq!(on_boottime(at(40), at(11), &clocks), 1_030 * S);
        // Had the same validity begun after the resume, it would count from then.
        assert_eq!(on_boottime(at(42), at(12), &clocks), 1_132 * S);
        // No reading that old: the oldest one, which errs early.
        assert_eq!(on_boottime(at(40), at(5), &clocks), 1_030 * S);
        // A deadline already behind the reading.
        assert_eq!(on_boottime(at(9), at(11), &clocks), 1_000 * S - S);
    }
}
