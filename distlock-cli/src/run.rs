//! `distlock run`: acquire, run the command under the keeper, and keep every process of it
//! inside the lease (see `keeper.rs` for the process side).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlock::{Error, LeaderValue, Lease, LeaseState, LockName, LockOptions, Mode, Wait};
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::{ElectArgs, RunArgs, Supervised};
use crate::exit::{say, to_stderr, Failure, EX_NOPERM, EX_OSERR, EX_SOFTWARE};
use crate::progress::Progress;
use crate::supervisor::{keeper_status, window, Keeper};
use crate::target::Secrets;

/// `distlock run`: the lock in the mode asked for.
pub(crate) async fn run(a: RunArgs, secrets: &Secrets) -> u8 {
    let mode = match (a.shared, a.permits) {
        (true, _) => Mode::Shared,
        (false, Some(k)) => Mode::Permits(k),
        (false, None) => Mode::Exclusive,
    };
    supervised(a.supervised, mode, None, secrets).await
}

/// `distlock elect`: leadership is the name's exclusive lock, granted with the candidate's
/// value (`lock_core::Election` reads it so); the command gets its term.
pub(crate) async fn elect(a: ElectArgs, secrets: &Secrets) -> u8 {
    match LeaderValue::new(a.value.into_encoded_bytes()) {
        Ok(value) => supervised(a.supervised, Mode::Exclusive, Some(value), secrets).await,
        Err(error) => Failure::Lock {
            what: "bad --value".into(),
            error,
        }
        .report(secrets),
    }
}

/// The command under the lock of `mode`, taken with `value` if given.
async fn supervised(
    a: Supervised,
    mode: Mode,
    value: Option<LeaderValue>,
    secrets: &Secrets,
) -> u8 {
    if !cfg!(target_os = "linux") {
        return Failure::Supervision(
            "run needs Linux: it relies on PR_SET_PDEATHSIG and PR_SET_CHILD_SUBREAPER to keep \
             the command from outliving the lock (status works everywhere)"
                .into(),
        )
        .report(secrets);
    }
    // A job kept at least longer than it may run would be stopped before its lock may go.
    if let (Some(min), Some(max)) = (a.min_hold, a.max_hold) {
        if min > max {
            return Failure::Usage(format!(
                "--min-hold ({}) is longer than --max-hold ({}): the command would be stopped \
                 before the lock may be let go; make --min-hold at most --max-hold",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ))
            .report(secrets);
        }
    }
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            return Failure::Supervision(format!("cannot handle signals: {e}")).report(secrets)
        }
    };
    // The handlers are in place from here on, so a signal must end a slow connect too.
    let connected = tokio::select! {
        r = crate::connect(&a.target) => r,
        sig = signals.recv() => return 128 + sig as u8,
    };
    let (locks, name) = match connected {
        Ok(x) => x,
        Err(f) => return f.report(secrets),
    };
    let wait = match (a.no_wait, a.wait) {
        (true, _) => Wait::No,
        (false, Some(d)) => Wait::For(d),
        (false, None) => Wait::Forever,
    };
    // Renewal is never stopped by the watchdog: --max-hold stops the *command*, and the lock
    // is released once it is dead, so no lease ends while a process of the command runs.
    let mut opts = LockOptions::new(a.ttl)
        .wait(wait)
        .auto_renew(None)
        .mode(mode);
    let elected = value.is_some();
    if let Some(v) = value {
        opts = opts.value(v);
    }

    // Acquire, showing what we wait for on a terminal; a signal while waiting gives up.
    let backend = locks.backend();
    let waiting = Progress::start(
        format!("waiting for lock {name} on {backend}"),
        wait != Wait::No,
    );
    let asked = Instant::now();
    let acquired = tokio::select! {
        r = locks.acquire(&name, &opts) => Ok(r),
        sig = signals.recv() => Err(sig),
    };
    waiting.done();
    let lease = match acquired {
        Ok(Ok(lease)) => lease,
        Ok(Err(Error::Timeout { waited, .. })) => {
            let how = if wait == Wait::No {
                "--no-wait".to_string()
            } else {
                format!(
                    "waited {}",
                    humantime::format_duration(crate::round_ms(waited))
                )
            };
            return Failure::NotAcquired(format!("not acquired: {name} is held ({how})"))
                .report(secrets);
        }
        Ok(Err(error)) => {
            return Failure::Lock {
                what: format!("cannot acquire {name}"),
                error,
            }
            .report(secrets)
        }
        Err(sig) => {
            // The dropped acquisition cleans up in the background: give it a moment.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return 128 + sig as u8;
        }
    };
    let granted = Instant::now();
    tracing::info!(%name, backend, token = ?lease.fencing_token(), "acquired");
    // The lock's timings, said once at the end whichever way the run ends (`--log-format`).
    let timings = Timings {
        name: name.clone(),
        waited: granted - asked,
        granted,
        renewals: AtomicU64::new(0),
    };

    let fencing = locks.capabilities().fencing;
    let term = lease.fencing_token().filter(|_| elected);
    let spawned = Keeper::spawn(&a, &name, backend, fencing, lease.as_ref(), granted, term);
    let mut keeper = match spawned {
        Ok(k) => k,
        Err(e) => {
            release(lease, &timings).await;
            return Failure::Supervision(format!("cannot start the command's keeper: {e}"))
                .report(secrets);
        }
    };
    let (stop, status) = supervise(
        &a,
        &name,
        lease.as_ref(),
        &mut keeper,
        &mut signals,
        granted,
        secrets,
    )
    .await;
    if let Some(fg) = keeper.foreground.take() {
        fg.take_back(keeper.group());
    }
    let code = match status {
        Ok(code) => code,
        Err(why) => {
            // The keeper itself was killed: its group may still run. Kill it from here. If this
            // process killed it (the lease ran out before the keeper was ready), that is the
            // stop it announced, not a failure to supervise.
            let ours = keeper.killed_group && stop.is_some();
            if !ours {
                say(
                    secrets,
                    &format!("the command's keeper died ({why}); killing its process group"),
                );
            }
            if !keeper.kill_group_and_wait(lease.valid_until()).await {
                if !keeper.unkillable().is_empty() {
                    return hold_while_they_run(lease, &keeper, &name, secrets, &timings).await;
                }
                say(
                    secrets,
                    "processes of the command may still run: the lock is left to expire, \
                     not released",
                );
                timings.note(lease.as_ref());
                lease.abandon();
                return EX_OSERR;
            }
            if !ours {
                release(lease, &timings).await;
                return EX_OSERR;
            }
            EX_SOFTWARE
        }
    };
    if !keeper.unkillable().is_empty() {
        return hold_while_they_run(lease, &keeper, &name, secrets, &timings).await;
    }
    if let Some(stop) = stop {
        timings.note(lease.as_ref());
        if lease.state() != LeaseState::Lost {
            release(lease, &timings).await;
        }
        tracing::debug!(?stop, "command stopped");
        return EX_SOFTWARE;
    }
    // Run-once across machines: keep the lock until --min-hold has passed.
    if let Some(until) = a.min_hold.and_then(|d| granted.checked_add(d)) {
        let lost = lease.lost();
        tokio::select! {
            _ = tokio::time::sleep_until(until.into()) => {}
            _ = lost.wait() => {
                timings.note(lease.as_ref());
                say(secrets, &format!("lock {name} was lost during --min-hold (the command had ended)"));
                return code;
            }
            _ = signals.recv() => {
                // Leave it to what holds it on the backend (a TTL, a ZooKeeper session's
                // timeout): releasing now would let another run start at once. So nothing is
                // sent: not a release, nor `abandon` (on ZooKeeper it deletes the node, the
                // session being shared), nor the close of a session or the revoke of a lease
                // that dropping the client could send. The process ends here, the lease in
                // hand; a PostgreSQL or file lock ends with it (`--help`).
                timings.note(lease.as_ref());
                std::mem::forget(lease);
                std::process::exit(i32::from(code));
            }
        }
    }
    release(lease, &timings).await;
    code
}

/// Said as the run's last debug line when dropped: how long it waited for the lock, how long
/// it held it, and how many renewals the backend confirmed (where the driver counts them).
struct Timings {
    name: LockName,
    waited: Duration,
    granted: Instant,
    /// The lease's renewal count plus one, noted as it ends (0: not known).
    renewals: AtomicU64,
}

impl Timings {
    /// Notes the lease's renewals before it ends: the count goes with it.
    fn note(&self, lease: &dyn Lease) {
        if let Some(n) = lease.renewals() {
            self.renewals.store(n.saturating_add(1), Ordering::Relaxed);
        }
    }
}

impl Drop for Timings {
    fn drop(&mut self) {
        let renewals = self.renewals.load(Ordering::Relaxed).checked_sub(1);
        tracing::debug!(
            lock.name = %self.name,
            lock.waited_ms = self.waited.as_secs_f64() * 1e3,
            lock.held_ms = self.granted.elapsed().as_secs_f64() * 1e3,
            lock.renewals = renewals,
            "run finished"
        );
    }
}

/// Why the command was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Lost,
    AtRisk,
    Unconfirmed,
    MaxHold,
}

/// Runs until the keeper exits (nothing of the command is left): the reason the command was
/// stopped, if it was, and the command's status (or why the keeper itself died).
async fn supervise(
    a: &Supervised,
    name: &LockName,
    lease: &dyn Lease,
    keeper: &mut Keeper,
    signals: &mut Signals,
    granted: Instant,
    secrets: &Secrets,
) -> (Option<Stop>, Result<u8, String>) {
    let (span, margin) = window(lease, granted);
    // Inside the window the grace must leave room for healthy renewals: at most a third.
    let lease_grace = a.grace.min(span / 3);
    // How often the lease state is looked at (it is local: no request).
    let tick = (span / 20).clamp(Duration::from_millis(5), Duration::from_millis(50));
    let max_hold_at = a.max_hold.and_then(|d| granted.checked_add(d));

    let mut stop: Option<(Stop, Option<Instant>)> = None;
    let mut killed = false;
    // A loss wakes the loop at once, not at its next tick: the backend may be granting the
    // lock elsewhere as it lets go (a terminated PostgreSQL session's waiter is granted in the
    // same moment).
    let mut lost = std::pin::pin!(lease.lost().wait());
    let mut lost_seen = false;
    loop {
        let now = Instant::now();
        let lease_kill_at = lease.valid_until().checked_sub(margin).unwrap_or(now);
        let since = lease
            .valid_until()
            .checked_sub(lease.ttl())
            .unwrap_or(granted);
        keeper.switch.set(lease_kill_at, since);
        let term_at = lease_kill_at.checked_sub(lease_grace).unwrap_or(now);
        let why = match lease.state() {
            LeaseState::Lost => Some(Stop::Lost),
            LeaseState::AtRisk => Some(Stop::AtRisk),
            LeaseState::Held if now >= term_at => Some(Stop::Unconfirmed),
            LeaseState::Held if max_hold_at.is_some_and(|t| now >= t) => Some(Stop::MaxHold),
            LeaseState::Held => None,
        };
        // A stop with a grace (at risk, unconfirmed, --max-hold) gives way to a loss that
        // comes during it: the grace was for a lock still ours, and it may be gone now.
        let escalates = matches!(stop, Some((s, _)) if s != Stop::Lost) && why == Some(Stop::Lost);
        if stop.is_none() || escalates {
            if let Some(why) = why {
                // A lease that turns Lost before its validity ran out was let go by the
                // backend (a closed session, a refused renewal: the key deleted, the lease
                // revoked, the node or file gone): the lock may be someone else's already, so
                // no grace. AtRisk and an unconfirmed expiry leave the lock ours until
                // `valid_until`, and the grace fits before it.
                let grace = match why {
                    Stop::MaxHold => a.grace,
                    Stop::Lost => Duration::ZERO,
                    Stop::AtRisk | Stop::Unconfirmed => lease_grace,
                };
                if grace.is_zero() && !killed {
                    // The next holder may be starting now: the kill goes first, the words
                    // after it.
                    keeper.signal(Signal::SIGUSR1);
                    killed = true;
                }
                let what = match why {
                    Stop::Lost => format!(
                        "lock {name} was lost while the command ran (the backend let it go: it \
                         may be held elsewhere already)"
                    ),
                    Stop::AtRisk => {
                        format!("lock {name} is at risk (a renewal or the connection failed)")
                    }
                    Stop::Unconfirmed => {
                        format!("lock {name}: no renewal confirmed and its validity runs out")
                    }
                    Stop::MaxHold => format!("lock {name} was held for --max-hold"),
                };
                let how = if grace.is_zero() {
                    "killing the command at once (SIGKILL)".to_string()
                } else {
                    format!(
                        "stopping the command (SIGTERM now, SIGKILL in {})",
                        humantime::format_duration(crate::round_ms(grace))
                    )
                };
                say(secrets, &format!("{what}; {how}"));
                if !grace.is_zero() {
                    keeper.signal(Signal::SIGTERM);
                }
                stop = Some((why, now.checked_add(grace)));
            }
        }
        // A shell's `fg` may have brought this process to the foreground (it was started in
        // the background): the terminal goes on to the command, as it would to any job.
        // Only to the command's group: one the keeper is not in yet would keep it from the
        // command (`terminal::hand_to_command`).
        keeper.look();
        if let (Some(fg), Some(group)) = (&keeper.foreground, keeper.command_group()) {
            fg.give_to(group);
        }
        // Whatever else happens, nothing of the command runs once the lease may move.
        let kill_at = match stop {
            Some((_, Some(t))) => t.min(lease_kill_at),
            _ => lease_kill_at,
        };
        if !killed && now >= kill_at {
            keeper.signal(Signal::SIGUSR1);
            killed = true;
        }
        let mut next = now + tick;
        if stop.is_none() {
            next = next.min(term_at.max(now));
        }
        if !killed {
            next = next.min(kill_at.max(now));
        }
        tokio::select! {
            st = keeper.child.wait() => {
                let status = match st {
                    Ok(st) => keeper_status(st),
                    Err(e) => Err(e.to_string()),
                };
                return (stop.map(|s| s.0), status);
            }
            sig = signals.recv() => keeper.signal(sig),
            _ = keeper.ready.recv(), if !keeper.is_ready => keeper.now_ready(),
            () = &mut lost, if !lost_seen => lost_seen = true,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

/// Processes of the command outlived it that no signal of distlock's reaches: they changed
/// their user (`sudo`). distlock says so at once and, the lock being theirs in effect, keeps it
/// (renewed) while they run: released once they are gone, never left to a PostgreSQL or file
/// lock's end with distlock. If it is lost meanwhile, distlock says that too and exits: they
/// run on without it. Either way the status is 77.
async fn hold_while_they_run(
    lease: Box<dyn Lease>,
    keeper: &Keeper,
    name: &LockName,
    secrets: &Secrets,
    timings: &Timings,
) -> u8 {
    let pids = |p: &[nix::unistd::Pid]| {
        p.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    say(
        secrets,
        &format!(
            "process(es) {} of the command cannot be stopped: they run as another user (the \
             command changed user, as sudo does), and distlock may not signal them; run \
             distlock itself as that user (`sudo distlock run ...`), not the other way round",
            pids(&keeper.unkillable())
        ),
    );
    let lost = lease.lost();
    let mut lost = std::pin::pin!(lost.wait());
    loop {
        let left = keeper.unkillable();
        if left.is_empty() {
            release(lease, timings).await;
            return EX_NOPERM;
        }
        if lease.state() == LeaseState::Lost {
            timings.note(lease.as_ref());
            say(
                secrets,
                &format!(
                    "lock {name} is lost and process(es) {} of the command still run without it",
                    pids(&left)
                ),
            );
            return EX_NOPERM;
        }
        tokio::select! {
            () = &mut lost => {}
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

async fn release(lease: Box<dyn Lease>, timings: &Timings) {
    timings.note(lease.as_ref());
    if let Err(e) = lease.release().await {
        tracing::warn!(error = %e, "release failed (the lock frees itself when its lease ends)");
    }
}

/// The signals `run` relays to the command: SIGINT, SIGTERM, SIGHUP, SIGQUIT; and SIGTSTP,
/// which it refuses. One that was ignored when distlock started (`nohup`, or a shell's `cmd &`
/// without job control, ignore SIGHUP, and SIGINT and SIGQUIT) gets no handler: it stays
/// ignored, by distlock and (inherited through the keeper) by the command, as it would be
/// without distlock.
struct Signals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    quit: Option<tokio::signal::unix::Signal>,
    tstp: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        let ignored = ignored_at_start()?;
        let handle = |sig: Signal| -> std::io::Result<Option<tokio::signal::unix::Signal>> {
            if ignored.contains(sig) {
                return Ok(None);
            }
            signal(SignalKind::from_raw(sig as i32)).map(Some)
        };
        Ok(Signals {
            int: handle(Signal::SIGINT)?,
            term: handle(Signal::SIGTERM)?,
            hup: handle(Signal::SIGHUP)?,
            quit: handle(Signal::SIGQUIT)?,
            // A stopped distlock renews nothing: its lease (or its place in the queue) would
            // expire while the command, in a group of its own, runs on until the keeper's
            // switch kills it. A Ctrl-Z is refused instead, and said so.
            tstp: handle(Signal::SIGTSTP)?,
        })
    }

    /// The next of the relayed ones to arrive.
    async fn recv(&mut self) -> Signal {
        loop {
            tokio::select! {
                _ = next(&mut self.int) => return Signal::SIGINT,
                _ = next(&mut self.term) => return Signal::SIGTERM,
                _ = next(&mut self.hup) => return Signal::SIGHUP,
                _ = next(&mut self.quit) => return Signal::SIGQUIT,
                _ = next(&mut self.tstp) => to_stderr(crate::terminal::NOT_SUSPENDED),
            }
        }
    }
}

/// The next delivery of `s`; never, for a signal left ignored.
async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// The signals this process ignores, read before it sets any handler: `SigIgn` of
/// `/proc/self/status` (procfs answers from memory; nothing waits on a device).
fn ignored_at_start() -> std::io::Result<nix::sys::signal::SigSet> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .ok_or_else(|| std::io::Error::other("no SigIgn in /proc/self/status"))?;
    let mut set = nix::sys::signal::SigSet::empty();
    for sig in Signal::iterator() {
        if (sig as i32) >= 1 && mask & (1u64 << ((sig as i32) - 1)) != 0 {
            set.add(sig);
        }
    }
    Ok(set)
}
