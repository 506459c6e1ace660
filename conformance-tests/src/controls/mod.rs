//! Negative controls: deliberately broken drivers that the suite must catch.
//!
//! Each [`Flaw`] breaks one promise of the contract on top of the (correct) in-memory driver.
//! The suite's own tests run the cases each flaw names in [`Flaw::caught_by`] and assert that at
//! least one fails — and that [`Flaw::None`], the same wrapper with nothing broken, passes every
//! case, so the failures come from the flaw alone. A suite that passes a broken driver is the
//! worst bug this project can have.

mod acquire;
mod catches;
mod election;
mod family;
mod flight;
mod harness;
mod intermittent;
mod lease;
mod lock;
mod pace;
mod report;
mod secured;
mod tls;
mod waiting;
mod wire;

pub use harness::{FlawedHarness, FlawedLock};

/// How long a blocking flaw keeps the runtime's thread per call: a blocking read of a reply
/// from a server across a network.
const BLOCKING_CALL: std::time::Duration = std::time::Duration::from_millis(100);

/// One broken promise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Flaw {
    /// Nothing broken: must pass every case.
    None,
    /// Every client has its own store: two clients can hold one name.
    NoMutualExclusion,
    /// Locks never expire, whatever the TTL.
    NoExpiry,
    /// Locks expire at half their TTL while `valid_until` claims the whole TTL.
    EarlyExpiry,
    /// Release deletes the lock whoever holds it.
    ReleaseWithoutOwnerCheck,
    /// Renew of a lost lease sets the lock again, over whoever holds it now, and reports
    /// success.
    RenewResurrects,
    /// After release of an auto-renewed lease, a leftover renewal re-acquires the lock.
    WatchdogResurrects,
    /// Fencing tokens go down.
    NonMonotonicFencing,
    /// The lost signal never fires and the state is always Held.
    LostSignalNeverFires,
    /// Waiting `acquire` calls `try_acquire` every 2 ms.
    SpinningWaiter,
    /// `acquire` ignores its bounded wait and waits forever.
    IgnoresWaitTimeout,
    /// A cancelled waiting `acquire` leaves a ghost holder behind for many TTLs.
    CancelLeavesGhost,
    /// `inspect` says every lock is free.
    InspectBlind,
    /// A `try_acquire` cancelled while its request is in flight leaves the grant that request
    /// still gets to a ghost, until the TTL.
    CancelInFlightLeavesGhost,
    /// At `max_hold` the lock is freed on the backend while the lease still says Held and its
    /// lost signal fires only at `valid_until` (a watchdog that deletes, then marks Lost).
    MaxHoldFreesBeforeLost,
    /// Taking over an expired lock is check-then-set: racers that all saw it expired are all
    /// granted it, each overwriting the last.
    ExpiredTakeoverNotAtomic,
    /// `inspect` still shows a holder that expired (a lazily expired record).
    InspectShowsExpiredHolder,
    /// `inspect` reports the lease's TTL as the time remaining, however much has passed.
    InspectRemainingIsTheTtl,
    /// The TTL sent to the store is rounded down to whole 100 ms; `valid_until` uses the
    /// requested one.
    TtlRoundedDown,
    /// Through a slow wire, `valid_until` is measured from the reply instead of from before the
    /// request.
    ValidUntilFromReply,
    /// A grant made right after a release on the same client, within a tenth of the TTL of
    /// that lease's last confirmation, counts its TTL from the end of the released lease's
    /// validity (the fresh-spare path of an etcd change that was reverted).
    RegrantOverstatesValidity,
    /// A bounded `acquire` (`wait_for`) checks the lock once a second instead of waking on a
    /// release.
    BoundedWaitPolls,
    /// `try_acquire` on a held lock waits up to a TTL for it before saying no.
    TryAcquireWaits,
    /// `try_acquire` calls that overlap on a free name all say no: racers that each took a
    /// part of the lock take each other's refusals for a holder (a Redlock driver that counts
    /// any majority of refusals as held, and so never retries a split vote).
    SplitVoteGivesUp,
    /// A waiter that timed out stays queued for many TTLs: later *waiting* acquires queue
    /// behind it (`try_acquire` does not look at the queue).
    TimedOutWaiterStaysQueued,
    /// When the holder expires rather than releases, waiters race for the lock, the latest
    /// arrival first.
    NoFifoAfterExpiry,
    /// A renewal of an expired lease succeeds when the same client holds the lock again, and
    /// extends the lock by another TTL.
    StaleRenewExtendsSameClient,
    /// Releasing an expired lease that nobody took over returns `Ok`.
    ReleaseOfExpiredIsOk,
    /// Dropping a lease leaves the lock held for many TTLs instead of freeing it.
    DropKeepsLock,
    /// `abandon` leaves the lost signal pending forever.
    AbandonKeepsLostPending,
    /// The driver declares a `max_ttl` of 12 h but accepts anything up to the global one.
    MaxTtlNotEnforced,
    /// The backend key is the name cut to 127 bytes.
    NameTruncated,
    /// Name escaping that is not one-to-one: `.` becomes `__`, so `a.` and `a__` are one key.
    EscapingNotInjective,
    /// The fencing counter is forgotten once a name sits idle for two TTLs (a counter key with
    /// a TTL): tokens start again at 1.
    CounterForgetsIdleNames,
    /// Declares `Strict` fencing, but a backend restart loses the counter (Redis without
    /// `appendfsync always`): tokens start again at 1.
    CounterLostOnRestart,
    /// While its link is down, a renewal "succeeds" without reaching the backend (a driver
    /// that assumes the best when it cannot tell).
    RenewsBlindWhilePartitioned,
    /// A client never reconnects once its connection broke: every call after a partition
    /// fails, even after the network healed.
    NeverReconnects,
    /// A dropped connection ends the leases made over it (the driver lets their locks go
    /// instead of reconnecting and renewing).
    CutLosesLease,
    /// The lock is the connection's session (`outlives_connection = false`): a cut frees it on
    /// the backend at once, but the lease learns of it only at its next renewal.
    SessionLostLate,
    /// The client's `Debug` shows its URL, password and all.
    SecretInDebug,
    /// Errors quote the URL with the password scrubbed only in its decoded form, so a
    /// percent-encoded password shows.
    SecretInErrors,
    /// Any password is accepted.
    AnyPasswordAccepted,
    /// TLS without a CA file trusts any certificate.
    TrustsAnyCertificate,
    /// A CA file that cannot be read is ignored (the system's roots are used instead).
    MissingCaFileIgnored,
    /// A CA given as PEM bytes is dropped on the way to the TLS setup.
    PemCaIgnored,
    /// `release` only stops renewing and returns `Ok`: the lock stays held until its TTL.
    ReleaseOnlyStopsRenewal,
    /// `renew` returns `Ok` without extending anything.
    RenewIsANoOp,
    /// An auto-renewed lease is never renewed (a watchdog that was never started).
    AutoRenewNeverRuns,
    /// `max_hold` is ignored: an auto-renewed lease is renewed for ever.
    MaxHoldIgnored,
    /// Taking over a lock whose holder expired reuses that holder's fencing token.
    TakeoverKeepsToken,
    /// An unbounded waiting `acquire` checks the lock once a second instead of waking on a
    /// release.
    UnboundedWaitPolls,
    /// `acquire` with `Wait::No` waits up to a TTL.
    NoWaitWaits,
    /// `release` leaves the lost signal pending for ever.
    ReleaseLeavesLostPending,
    /// Ownership is the client's, not the lease's: a release of an expired lease frees the
    /// lock when the same client holds it again.
    OwnerIsTheClient,
    /// Dropping a lease deletes the lock by name, whoever holds it now.
    DropReleasesByName,
    /// Waiters are woken latest arrival first.
    WaitersLifo,
    /// `valid_until` claims half a TTL more than the lock was granted for.
    ValidityBeyondTtl,
    /// A renewal of a lease that lost the lock extends whoever holds it now and says `Ok`
    /// (an expiry reset by name, without a check of the owner).
    RenewWithoutOwnerCheck,
    /// The watchdog of a dropped auto-renewed lease keeps renewing it for ten TTLs.
    DroppedLeaseKeepsRenewing,
    /// The second waiter to arrive on a name is never woken.
    WaiterStarves,
    /// A waiter that timed out stays queued, is granted the lock after the release, and holds
    /// it, unused, for many TTLs.
    TimedOutWaiterGrantedLater,
    /// Leases carry tokens, but the driver declares `Fencing::None`.
    FencingUndeclared,
    /// Names are folded to lower case on the way to the key (a case-insensitive key column).
    NamesFoldCase,
    /// Bad options are found out only after the request went out: the lock is taken, left to
    /// its TTL, and the caller gets `InvalidOptions`.
    ValidatesAfterLocking,
    /// The lease reports its TTL rounded down to whole 100 ms (the server's granularity),
    /// shorter than the one requested and granted.
    GrantedTtlRoundedDown,
    /// The CA file named in the URL is dropped (the system's roots are used instead).
    UrlCaIgnored,
    /// A refused renewal is taken for a passing failure: the lost signal fires only a TTL
    /// later.
    RefusalNoticedLate,
    /// Grants three times the requested TTL (and says so): a crashed holder blocks everyone
    /// for longer than the caller chose.
    TtlInflated,
    /// The lost signal fires at the first `valid_until`, whatever renewals came since.
    LostTimerNotRenewed,
    /// A renewed lease claims a third of a TTL more validity than the backend granted.
    RenewOverstatesValidity,
    /// A request that found the backend unreachable is reported as a refusal (`Ok(None)`:
    /// "someone holds it").
    UnreachableIsRefusal,
    /// A grant whose answer took longer than a third of the TTL is distrusted, undone and
    /// reported as a refusal (`Ok(None)`), as ZooKeeper's driver did with a late listing.
    SlowIsBusy,
    /// Requests wait for an unreachable backend for as long as it takes: no request timeout.
    HangsWhileUnreachable,
    /// `abandon` releases the lock instead of leaving it to expire.
    AbandonReleases,
    /// A release deletes by pattern: every lock whose name extends the released one goes too.
    ReleaseByPrefix,
    /// TLS accepts a certificate from the trusted CA for any name (libpq's `verify-ca` where
    /// `verify-full` was asked for).
    IgnoresServerName,
    /// Given a CA, TLS accepts any certificate: the CA only switches TLS on.
    GivenCaTrustsAnyCertificate,
    /// A wait whose deadline passed before the first request gives up without trying:
    /// `wait_for(Duration::ZERO)` never gets even a free lock.
    SpentDeadlineGivesUp,
    /// The watchdog renews a tenth of the TTL before `valid_until` instead of at a third of
    /// it: one late wake-up from expiry, every cycle.
    WatchdogRenewsLate,
    /// The watchdog renews every two-hundredth of the TTL (a unit slip): it floods the
    /// backend.
    WatchdogSpins,
    /// `release` marks the lease finished before its request goes out, so a release cancelled
    /// in between frees nothing: the lock stays until its TTL.
    CancelledReleaseKeepsLock,
    /// The lease reports AtRisk while a renewal is under way, and a renewal cancelled part-way
    /// leaves it so for good (a supervisor would stop healthy work).
    CancelledRenewLeavesAtRisk,
    /// An acquisition cancelled right after the grant, before its last step, leaves the grant
    /// held until its TTL.
    CancelledGrantStays,
    /// The try runs on a task of its own that hands its grant to the caller over a channel,
    /// and undoes it only when the send fails: a grant that lies in the channel when the
    /// caller's future is dropped stays until its TTL.
    UnreadGrantStays,
    /// Dropping the client handle ends its leases' locks, though the leases live on.
    ClientDropEndsLeases,
    /// Every lease says it lives at the same backend key, whatever its name.
    BackendKeyIgnoresName,
    /// A renewal takes a new fencing token (it runs the counter's increment again).
    TokenChangesOnRenew,
    /// A TTL of exactly the declared `min_ttl` is refused (an off-by-one in the driver's own
    /// check).
    MinTtlRefused,
    /// A TTL of exactly the declared `min_ttl` is refused at once with a retryable
    /// `Unavailable`, as if every grant at that TTL came back too late to use.
    MinTtlUnavailable,
    /// A TTL of exactly the declared `min_ttl` is always refused as a late grant, after the
    /// whole TTL has passed: the case's retries of a slow round trip must end.
    MinTtlAlwaysLate,
    /// A lease that turns Lost reports nothing: no `lock.lost`, no event (a driver with a
    /// `Lease` of its own that forgot `LeaseReport::lost`).
    LossNotReported,
    /// A busy `try_acquire` is reported as granted (its outcome mislabelled).
    BusyReportedAsGranted,
    /// `Lease::renewals` counts only the watchdog's renewals, not a `renew` call's (a lease
    /// that keeps its count beside the watchdog instead of where renewals are confirmed).
    ManualRenewalsUncounted,
    /// A waiter granted on its holder's release is not reported as a hand-off (a driver that
    /// never calls `Acquisition::queued`).
    HandoffNotReported,
    /// `acquire` starts its report when the acquisition is over: every duration it records is
    /// about zero (a driver that reads its clock in the wrong place).
    AcquireTimedFromItsEnd,
    /// A lease over the wire reports under another backend's name (`memory`, the store's),
    /// so none of its renewals, turns or loss is the driver's.
    LeaseReportsAsAnotherBackend,
    /// An acquisition whose reply was lost with its connection reports an error and leaves
    /// the grant it may have made to its TTL (it undoes only cancelled ones).
    LostReplyLeavesGrant,
    /// A release lost with its connection is not sent again: the lock waits out its TTL.
    FailedReleaseLeftToTtl,
    /// A dropped lease's background release is sent once: lost with its connection, the lock
    /// waits out its TTL (an explicit release is still sent again).
    DroppedReleaseSentOnce,
    /// `try_acquire` waits for its reply on the runtime's thread (a blocking socket read of
    /// 100 ms, acted out by `std::thread::sleep`): every other task on that thread stalls.
    BlocksTheRuntime,
    /// The watchdog's renewals each block the runtime's thread for 100 ms (a blocking client
    /// call inside the spawned task), while every call the application makes is async.
    WatchdogBlocksTheRuntime,
    /// The first request after a connection was cut blocks the runtime's thread for 100 ms
    /// (a blocking dial on reconnect); on healthy links every call is async.
    BlocksOnReconnect,
    /// The lock is its connection's session: a cut frees it on the backend at once, but the
    /// lease looks for a closed connection only every sixth of its TTL (the width the history
    /// checker excused before it was bounded by what was measured).
    SessionLostByPolling,
    /// The lock is its connection's session, and for a moment after any client's connection
    /// is cut, every waiting `acquire` is granted at once, whoever holds the name: two waiters
    /// (neither of them cut) hold it together.
    CutGrantsTwoWaiters,
    /// On one client (the first made behind a link), a waiting `acquire` whose deadline
    /// passes never returns: the timeout's wake-up is lost. Every other client is correct.
    DeadlineHangsOnOneClient,
    /// A client that re-acquires a name it has just released, with nobody in between, gets
    /// the released grant's token again (a fast path that hands the grant back).
    RegrantKeepsToken,
    /// On one grant in twenty of a client, the token repeats the name's previous one.
    IntermittentRepeatedToken,
    /// On one grant in twenty of a client, `valid_until` claims half a TTL more than granted.
    IntermittentOverstatedValidity,
    /// On one waiting grant in twenty of a client, the waiter misses the release's wake-up
    /// and sleeps until the holder's expiry.
    IntermittentLostWakeup,
    /// On one grant in twenty of a client, the lease never turns Lost and its lost signal
    /// never fires when it expires (a release still resolves it).
    IntermittentSilentLoss,
    /// On a FIFO driver, `try_acquire` takes a lock that is free while waiters are queued.
    TryAcquireJumpsQueue,
    /// A renewal is checked against the client that holds the name, not the lease, but only
    /// while the lease is valid by its own clock: a lease whose lock was deleted renews its
    /// client's newer lease.
    BrokenRenewExtendsSameClient,
    /// A waiting `acquire` cancelled after its request joined the queue, before the reply,
    /// stays queued: the next release grants the lock to nobody, until its TTL.
    CancelledWaiterKeepsItsPlace,
    /// A waiting `acquire` cancelled while its grant is on its way back leaves the grant to
    /// its TTL.
    CancelledWaiterKeepsItsGrant,
    /// A grant whose reply crossed a slow wire after its validity had passed is handed out,
    /// born Lost.
    BornLostHandedOut,
    /// A waiter granted over a slow wire counts its validity from the grant's reply.
    WaiterValidityFromReply,
    /// Each automatic renewal over a slow wire counts its validity from its reply.
    AutoRenewValidityFromReply,
    /// `backend_key` leaves out the namespace the server's key begins with.
    BackendKeyWithoutNamespace,
    /// `inspect` reports the newest token handed out for any name, not the holder's.
    InspectShowsNewestToken,
    /// The lease claims a networked driver's conservative validity (its TTL less the drift
    /// allowance) but sends a renewal asked after it anyway: the store, which keeps the grant
    /// longer (a TTL rounded up), renews it and the lease says Held again. Lost is not final.
    RenewInDriftRevives,
    /// The backend key a lease reports is cut to its first hundred bytes of name: two long
    /// names report one key.
    BackendKeyTruncated,
    /// A lease's lost signal belongs to the connection it was granted on: after that
    /// connection was cut and re-made, a loss of the lease never fires it.
    LostSignalForgottenOnReconnect,
    /// Declares `survives_restart`, but a restart of the backend forgets every held lock.
    RestartForgetsLocks,
    /// Declares `expires_by = Elapsed`, but ends locks by the server's time of day: a step
    /// ahead ends those whose end it passes, one behind keeps them that much longer.
    ExpiresByTimeOfDay,
    /// [`Flaw::ExpiresByTimeOfDay`] on the way back only: a step of the time of day behind
    /// keeps every held lock that much longer, its holder dead or not.
    ClockBehindKeepsLocks,
    /// Tokens are the server's time of day at the grant (in milliseconds, plus the counter):
    /// a step behind makes them go down.
    TokensFollowTheClock,
    /// Shared requests are granted as exclusive ones: readers never overlap.
    SharedIsExclusive,
    /// `holders` lists only the newest holder, like a single-holder `inspect`.
    HoldersShowsOne,
    /// Readers and permits are kept on keys of their own, apart from the exclusive lock of
    /// the same name: a writer and readers (or permit holders) hold one name together.
    FamilyKeysSeparate,
    /// A reader's request beside readers is granted at once, ahead of a waiting writer.
    ReadersJumpWriters,
    /// Shared and permit holds never expire: a crashed reader or permit holder keeps the name.
    FamilyNeverExpires,
    /// A stale release of a reader or a permit holder (its lease expired) frees every holder
    /// of the name, and still answers `NotHeld`.
    StaleReleaseFreesAll,
    /// A waiting reader or permit request cancelled before its grant is granted later anyway,
    /// and held for many TTLs by nobody.
    CancelledFamilyWaiterStays,
    /// Tokens are counted per mode: a writer after readers can get a lower token.
    TokensPerMode,
    /// A permit's token is its slot, 1 to K: a later holder can get a lower token.
    PermitTokensWrap,
    /// A waiting reader or permit request polls every 5 ms.
    FamilyWaiterPolls,
    /// A waiting reader or permit request misses every wake-up and looks again a TTL later.
    FamilyMissedWakeup,
    /// A semaphore grants one permit more than asked.
    PermitsOffByOne,
    /// Each permit count is a semaphore of its own: a request with another count is granted
    /// instead of refused.
    PermitCountIgnored,
    /// A permit count is checked against holders only: beside a waiter that asks with another
    /// count, a request is refused as busy and waits, where the queue says it never fits.
    MismatchOnlyWithHolders,
    /// Declares neither shared mode nor permits, and serves both as exclusive locks instead of
    /// `Unsupported`.
    ModeServedExclusive,
    /// The lock is its connection's session, and for a moment after any client's connection
    /// is cut, every waiting permit request is granted at once, however many permits are
    /// held: K + 1 holders, of whom only the cut one may be excused.
    CutGrantsPermitBeyondK,
    /// A campaign's value is not stored with its grant: the leader reads as nobody in
    /// particular (an empty value).
    ValueNotStored,
    /// The leader's value is read from where candidates write theirs as they start to
    /// campaign (a value key beside the lock, set before the lock is won): it names the newest
    /// candidate, not the leader.
    LeaderIsNewestCandidate,
    /// `proclaim` answers Ok and changes nothing.
    ProclaimIgnored,
    /// `proclaim` writes the value's key without checking the lock is still the lease's: a
    /// deposed leader overwrites its successor's value (and is told it failed).
    ProclaimUnchecked,
    /// The change feed never reports anything: observers learn of a change only at the
    /// leader's lapse.
    FeedSilent,
    /// The change feed reports a change every 5 ms: observers poll the backend.
    ObserverPolls,
    /// Declares no election and refuses `leader` and `watch`, but takes an acquisition with a
    /// holder's value (and drops the value) instead of refusing it as `Unsupported`.
    ElectionUndeclared,
    /// A leader read that finds no holder answers with the last leader this client read (a
    /// missing key taken for "unchanged"): observers never see a leadership end.
    LeaderNeverGone,
}

impl Flaw {
    /// Every flaw, [`Flaw::None`] first.
    pub const ALL: &'static [Flaw] = &[
        Flaw::None,
        Flaw::NoMutualExclusion,
        Flaw::NoExpiry,
        Flaw::EarlyExpiry,
        Flaw::ReleaseWithoutOwnerCheck,
        Flaw::RenewResurrects,
        Flaw::WatchdogResurrects,
        Flaw::NonMonotonicFencing,
        Flaw::LostSignalNeverFires,
        Flaw::SpinningWaiter,
        Flaw::IgnoresWaitTimeout,
        Flaw::CancelLeavesGhost,
        Flaw::InspectBlind,
        Flaw::CancelInFlightLeavesGhost,
        Flaw::MaxHoldFreesBeforeLost,
        Flaw::ExpiredTakeoverNotAtomic,
        Flaw::InspectShowsExpiredHolder,
        Flaw::InspectRemainingIsTheTtl,
        Flaw::TtlRoundedDown,
        Flaw::ValidUntilFromReply,
        Flaw::RegrantOverstatesValidity,
        Flaw::BoundedWaitPolls,
        Flaw::TryAcquireWaits,
        Flaw::SplitVoteGivesUp,
        Flaw::TimedOutWaiterStaysQueued,
        Flaw::NoFifoAfterExpiry,
        Flaw::StaleRenewExtendsSameClient,
        Flaw::ReleaseOfExpiredIsOk,
        Flaw::DropKeepsLock,
        Flaw::AbandonKeepsLostPending,
        Flaw::MaxTtlNotEnforced,
        Flaw::NameTruncated,
        Flaw::EscapingNotInjective,
        Flaw::CounterForgetsIdleNames,
        Flaw::CounterLostOnRestart,
        Flaw::RenewsBlindWhilePartitioned,
        Flaw::NeverReconnects,
        Flaw::CutLosesLease,
        Flaw::SessionLostLate,
        Flaw::SecretInDebug,
        Flaw::SecretInErrors,
        Flaw::AnyPasswordAccepted,
        Flaw::TrustsAnyCertificate,
        Flaw::MissingCaFileIgnored,
        Flaw::PemCaIgnored,
        Flaw::ReleaseOnlyStopsRenewal,
        Flaw::RenewIsANoOp,
        Flaw::AutoRenewNeverRuns,
        Flaw::MaxHoldIgnored,
        Flaw::TakeoverKeepsToken,
        Flaw::UnboundedWaitPolls,
        Flaw::NoWaitWaits,
        Flaw::ReleaseLeavesLostPending,
        Flaw::OwnerIsTheClient,
        Flaw::DropReleasesByName,
        Flaw::WaitersLifo,
        Flaw::ValidityBeyondTtl,
        Flaw::RenewWithoutOwnerCheck,
        Flaw::DroppedLeaseKeepsRenewing,
        Flaw::WaiterStarves,
        Flaw::TimedOutWaiterGrantedLater,
        Flaw::FencingUndeclared,
        Flaw::NamesFoldCase,
        Flaw::ValidatesAfterLocking,
        Flaw::GrantedTtlRoundedDown,
        Flaw::UrlCaIgnored,
        Flaw::RefusalNoticedLate,
        Flaw::TtlInflated,
        Flaw::LostTimerNotRenewed,
        Flaw::RenewOverstatesValidity,
        Flaw::UnreachableIsRefusal,
        Flaw::SlowIsBusy,
        Flaw::HangsWhileUnreachable,
        Flaw::AbandonReleases,
        Flaw::ReleaseByPrefix,
        Flaw::IgnoresServerName,
        Flaw::GivenCaTrustsAnyCertificate,
        Flaw::SpentDeadlineGivesUp,
        Flaw::WatchdogRenewsLate,
        Flaw::WatchdogSpins,
        Flaw::CancelledReleaseKeepsLock,
        Flaw::CancelledRenewLeavesAtRisk,
        Flaw::CancelledGrantStays,
        Flaw::UnreadGrantStays,
        Flaw::ClientDropEndsLeases,
        Flaw::BackendKeyIgnoresName,
        Flaw::TokenChangesOnRenew,
        Flaw::MinTtlRefused,
        Flaw::MinTtlUnavailable,
        Flaw::MinTtlAlwaysLate,
        Flaw::LossNotReported,
        Flaw::BusyReportedAsGranted,
        Flaw::ManualRenewalsUncounted,
        Flaw::HandoffNotReported,
        Flaw::AcquireTimedFromItsEnd,
        Flaw::LeaseReportsAsAnotherBackend,
        Flaw::LostReplyLeavesGrant,
        Flaw::FailedReleaseLeftToTtl,
        Flaw::DroppedReleaseSentOnce,
        Flaw::BlocksTheRuntime,
        Flaw::WatchdogBlocksTheRuntime,
        Flaw::BlocksOnReconnect,
        Flaw::SessionLostByPolling,
        Flaw::CutGrantsTwoWaiters,
        Flaw::DeadlineHangsOnOneClient,
        Flaw::RegrantKeepsToken,
        Flaw::IntermittentRepeatedToken,
        Flaw::IntermittentOverstatedValidity,
        Flaw::IntermittentLostWakeup,
        Flaw::IntermittentSilentLoss,
        Flaw::TryAcquireJumpsQueue,
        Flaw::BrokenRenewExtendsSameClient,
        Flaw::CancelledWaiterKeepsItsPlace,
        Flaw::CancelledWaiterKeepsItsGrant,
        Flaw::BornLostHandedOut,
        Flaw::WaiterValidityFromReply,
        Flaw::AutoRenewValidityFromReply,
        Flaw::BackendKeyWithoutNamespace,
        Flaw::InspectShowsNewestToken,
        Flaw::RenewInDriftRevives,
        Flaw::BackendKeyTruncated,
        Flaw::LostSignalForgottenOnReconnect,
        Flaw::RestartForgetsLocks,
        Flaw::ExpiresByTimeOfDay,
        Flaw::ClockBehindKeepsLocks,
        Flaw::TokensFollowTheClock,
        Flaw::SharedIsExclusive,
        Flaw::HoldersShowsOne,
        Flaw::FamilyKeysSeparate,
        Flaw::ReadersJumpWriters,
        Flaw::FamilyNeverExpires,
        Flaw::StaleReleaseFreesAll,
        Flaw::CancelledFamilyWaiterStays,
        Flaw::TokensPerMode,
        Flaw::PermitTokensWrap,
        Flaw::FamilyWaiterPolls,
        Flaw::FamilyMissedWakeup,
        Flaw::PermitsOffByOne,
        Flaw::PermitCountIgnored,
        Flaw::MismatchOnlyWithHolders,
        Flaw::ModeServedExclusive,
        Flaw::CutGrantsPermitBeyondK,
        Flaw::ValueNotStored,
        Flaw::LeaderIsNewestCandidate,
        Flaw::ProclaimIgnored,
        Flaw::ProclaimUnchecked,
        Flaw::FeedSilent,
        Flaw::ObserverPolls,
        Flaw::ElectionUndeclared,
        Flaw::LeaderNeverGone,
    ];
}
