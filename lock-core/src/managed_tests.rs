//! Unit tests of [`ManagedLease`](super::ManagedLease): the watchdog, the lost signal, release.

use super::*;
use parking_lot::Mutex;
use std::sync::atomic::AtomicU32;

/// Ops of a session-style lease (no TTL of its own) whose release records whether the
/// lease was already Lost at the moment the lock was freed on the backend.
#[derive(Debug, Default)]
struct SessionOps {
    signal: Mutex<Option<LostSignal>>,
    lost_when_freed: Mutex<Option<bool>>,
    /// Renewals hang (a server that cannot confirm the session) instead of answering.
    hang: bool,
}

#[async_trait]
impl LeaseOps for Arc<SessionOps> {
    fn backend(&self) -> &'static str {
        "test"
    }

    async fn renew(&self) -> Result<Instant> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok(Instant::now() + Duration::from_millis(300))
    }
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        let lost = self.signal.lock().as_ref().map(LostSignal::is_lost);
        *self.lost_when_freed.lock() = lost;
        Ok(())
    }
    fn lapses_without_renewal(&self) -> bool {
        false
    }
}

/// Ops whose renewal never answers (a frozen server, no request timeout).
#[derive(Debug)]
struct HangingOps;

#[async_trait]
impl LeaseOps for HangingOps {
    fn backend(&self) -> &'static str {
        "test"
    }

    async fn renew(&self) -> Result<Instant> {
        std::future::pending().await
    }
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        Ok(())
    }
}

/// A manual renewal that gets no answer ends at `valid_until` with `Lost`, and the lease is
/// Lost: it does not hang with the driver's request.
#[tokio::test]
async fn a_hanging_manual_renewal_ends_at_valid_until() -> std::result::Result<(), String> {
    let name = LockName::new("hanging-renew").map_err(|e| e.to_string())?;
    let valid_until = Instant::now() + Duration::from_millis(100);
    let lease = ManagedLease::new(
        name,
        Grant {
            token: None,
            ttl: Duration::from_millis(100),
            valid_until,
        },
        Renewal::Manual,
        HangingOps,
    );
    let r = tokio::time::timeout(Duration::from_secs(5), lease.renew())
        .await
        .map_err(|_| "a hanging renewal still unanswered 5 s after valid_until".to_string())?;
    if !matches!(r, Err(Error::Lost { .. })) {
        return Err(format!("a hanging renewal gave {r:?}, expected Lost"));
    }
    let late = Instant::now().saturating_duration_since(valid_until);
    if late > Duration::from_millis(50) {
        return Err(format!(
            "a hanging renewal ended {late:?} after valid_until"
        ));
    }
    if lease.state() != LeaseState::Lost {
        return Err(format!(
            "after a hanging renewal the lease is {:?}",
            lease.state()
        ));
    }
    Ok(())
}

/// Ops whose first `failures` releases fail as a dropped connection would.
#[derive(Debug, Default)]
struct FlakyRelease {
    failures: u32,
    attempts: Arc<AtomicU32>,
}

#[async_trait]
impl LeaseOps for FlakyRelease {
    fn backend(&self) -> &'static str {
        "test"
    }

    async fn renew(&self) -> Result<Instant> {
        Ok(Instant::now() + Duration::from_secs(1))
    }
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        let n = self.attempts.fetch_add(1, Ordering::SeqCst);
        if n < self.failures {
            return Err(Error::unavailable("test", "broken pipe"));
        }
        Ok(())
    }
}

/// A lease of 5 s over ops whose first three releases fail as a dropped connection would,
/// and the count of release attempts.
fn flaky_lease(
    name: &str,
) -> std::result::Result<(ManagedLease<FlakyRelease>, Arc<AtomicU32>), String> {
    let attempts = Arc::new(AtomicU32::new(0));
    let ops = FlakyRelease {
        failures: 3,
        attempts: attempts.clone(),
    };
    let name = LockName::new(name).map_err(|e| e.to_string())?;
    let grant = Grant {
        token: None,
        ttl: Duration::from_secs(5),
        valid_until: Instant::now() + Duration::from_secs(5),
    };
    Ok((
        ManagedLease::new(name, grant, Renewal::Manual, ops),
        attempts,
    ))
}

/// The release is sent again until the fourth attempt gets through (the second at once, the
/// third and fourth after 50 and 100 ms), and never after that.
async fn sent_again_until_through(
    attempts: &AtomicU32,
    what: &str,
) -> std::result::Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while attempts.load(Ordering::SeqCst) < 4 {
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: {} release attempts 2 s after the first failed; the fourth would get \
                 through",
                attempts.load(Ordering::SeqCst)
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = attempts.load(Ordering::SeqCst);
    if n != 4 {
        return Err(format!(
            "{what}: {n} release attempts: it went on after one got through"
        ));
    }
    Ok(())
}

/// A release that fails for a reason that may pass reports it, and is sent again in the
/// background until one gets through: the caller cannot, its lease is gone.
#[tokio::test]
async fn a_failed_release_is_sent_again_until_it_gets_through() -> std::result::Result<(), String> {
    let (lease, attempts) = flaky_lease("flaky-release")?;
    let r = Box::new(lease).release().await;
    if !matches!(r, Err(Error::Unavailable { .. })) {
        return Err(format!(
            "the failed release gave {r:?}, expected Unavailable"
        ));
    }
    sent_again_until_through(&attempts, "release").await
}

/// A dropped lease's background release is sent again the same way: nobody else can.
#[tokio::test]
async fn a_dropped_leases_failed_release_is_sent_again() -> std::result::Result<(), String> {
    let (lease, attempts) = flaky_lease("flaky-drop")?;
    drop(lease);
    sent_again_until_through(&attempts, "drop").await
}

/// A dropped lease's release that never gets through stops at the lease's `valid_until`: the
/// retry task must not outlive the lease it serves (after that the backend frees the lock).
#[tokio::test]
async fn release_retries_end_at_valid_until() -> std::result::Result<(), String> {
    let attempts = Arc::new(AtomicU32::new(0));
    let ops = FlakyRelease {
        failures: u32::MAX,
        attempts: attempts.clone(),
    };
    let name = LockName::new("never-through").map_err(|e| e.to_string())?;
    let valid_until = Instant::now() + Duration::from_millis(400);
    let grant = Grant {
        token: None,
        ttl: Duration::from_millis(400),
        valid_until,
    };
    drop(ManagedLease::new(name, grant, Renewal::Manual, ops));
    tokio::time::sleep_until((valid_until + Duration::from_millis(100)).into()).await;
    let at_end = attempts.load(Ordering::SeqCst);
    if at_end < 3 {
        return Err(format!(
            "{at_end} release attempts before valid_until; a failed one must be sent again"
        ));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = attempts.load(Ordering::SeqCst);
    if later != at_end {
        return Err(format!(
            "{} release attempts after valid_until: the retry outlived the lease",
            later - at_end
        ));
    }
    Ok(())
}

/// A session-scoped lease (its lock does not lapse) over `ops`, renewed by the watchdog with
/// `max_hold`: waits for its lost signal, and reports whether the lock was then freed, and
/// Lost first. `when` names the moment for the failure message.
async fn freed_after_loss(
    ops: SessionOps,
    max_hold: Option<Duration>,
    when: &str,
) -> std::result::Result<(), String> {
    let ops = Arc::new(ops);
    let name = LockName::new("lost-then-freed").map_err(|e| e.to_string())?;
    let lease = ManagedLease::new(
        name,
        Grant {
            token: None,
            ttl: Duration::from_millis(300),
            valid_until: Instant::now() + Duration::from_millis(300),
        },
        Renewal::Auto { max_hold },
        ops.clone(),
    );
    *ops.signal.lock() = Some(lease.lost());
    let lost = lease.lost();
    tokio::time::timeout(Duration::from_secs(5), lost.wait())
        .await
        .map_err(|_| format!("lease not lost within 5 s {when}"))?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let freed = *ops.lost_when_freed.lock();
    match freed {
        Some(true) => Ok(()),
        Some(false) => Err(format!(
            "the watchdog freed the lock {when} while the lease was still Held: a successor \
             could be granted before the holder's lost signal fired"
        )),
        None => Err(format!(
            "the watchdog never freed the lock {when}: a lock that lives as long as the \
             session stays held, by nobody who knows it, until the lease is dropped"
        )),
    }
}

/// The watchdog at `max_hold` must mark the lease Lost before it frees the lock: a
/// successor granted the instant the lock is freed must find the holder's signal fired.
#[tokio::test]
async fn max_hold_marks_lost_before_the_lock_is_freed() -> std::result::Result<(), String> {
    let max_hold = Some(Duration::from_millis(50));
    freed_after_loss(SessionOps::default(), max_hold, "at max_hold (50 ms)").await
}

/// A session-scoped lease whose renewals go unconfirmed turns Lost at `valid_until`, and its
/// lock is then freed: its session may live on (moved to another server), and with it the lock.
#[tokio::test]
async fn a_lost_session_lease_frees_its_lock() -> std::result::Result<(), String> {
    let ops = SessionOps {
        hang: true,
        ..SessionOps::default()
    };
    freed_after_loss(ops, None, "after its renewals went unconfirmed").await
}

/// Ops whose first `hanging` renewals never answer (sent to a server cut off by a partition)
/// and whose later ones answer after `slowness` with a fresh window of 600 ms: another server
/// would have answered.
#[derive(Debug, Default)]
struct RenewalsHang {
    hanging: usize,
    slowness: Duration,
    /// When each renewal was asked for.
    tries: Mutex<Vec<Instant>>,
    /// How long each answered renewal took, from its request to its answer.
    answers: Mutex<Vec<Duration>>,
}

#[async_trait]
impl LeaseOps for Arc<RenewalsHang> {
    fn backend(&self) -> &'static str {
        "test"
    }

    async fn renew(&self) -> Result<Instant> {
        let hangs = {
            let mut tries = self.tries.lock();
            tries.push(Instant::now());
            tries.len() <= self.hanging
        };
        if hangs {
            std::future::pending::<()>().await;
        }
        let start = Instant::now();
        tokio::time::sleep(self.slowness).await;
        self.answers.lock().push(start.elapsed());
        Ok(start + Duration::from_millis(600))
    }
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        Ok(())
    }
}

/// A lease renewed by the watchdog, its ops, and the instant it was granted.
type Watched = (ManagedLease<Arc<RenewalsHang>>, Arc<RenewalsHang>, Instant);

/// A 600 ms lease renewed by the watchdog over ops whose first `hanging` renewals hang and
/// whose others answer after `slowness`.
fn watched_lease(
    name: &str,
    hanging: usize,
    slowness: Duration,
) -> std::result::Result<Watched, String> {
    let ops = Arc::new(RenewalsHang {
        hanging,
        slowness,
        ..RenewalsHang::default()
    });
    let name = LockName::new(name).map_err(|e| e.to_string())?;
    let granted = Instant::now();
    let lease = ManagedLease::new(
        name,
        Grant {
            token: None,
            ttl: Duration::from_millis(600),
            valid_until: granted + Duration::from_millis(600),
        },
        Renewal::Auto { max_hold: None },
        ops.clone(),
    );
    Ok((lease, ops, granted))
}

/// When each renewal was asked for, counted from `granted`.
fn tries_since(ops: &RenewalsHang, granted: Instant) -> std::result::Result<Vec<Duration>, String> {
    Ok(ops
        .tries
        .lock()
        .iter()
        .map(|t| t.saturating_duration_since(granted))
        .collect())
}

/// A watchdog renewal that hangs is followed by another while the lease is still valid, so one
/// unanswered request (a partitioned server) does not cost the lease when a second try would
/// be answered: the lease goes AtRisk, then Held again, and is never Lost.
#[tokio::test]
async fn a_hanging_watchdog_renewal_is_tried_again_before_valid_until(
) -> std::result::Result<(), String> {
    let (lease, ops, granted) = watched_lease("hung-renewal-retried", 1, Duration::ZERO)?;
    let mut states = Vec::new();
    while granted.elapsed() < Duration::from_millis(1800) {
        let s = lease.state();
        if states.last() != Some(&s) {
            states.push(s);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let tries = tries_since(&ops, granted)?;
    if lease.lost().is_lost() || states.contains(&LeaseState::Lost) {
        return Err(format!(
            "the lease was Lost though only its first renewal hung: renewals asked at {tries:?} \
             after the grant (valid until 600 ms), states seen {states:?}"
        ));
    }
    if !tries
        .get(1)
        .is_some_and(|t| *t < Duration::from_millis(600))
    {
        return Err(format!(
            "no second renewal before valid_until (600 ms): renewals asked at {tries:?}"
        ));
    }
    if !states.contains(&LeaseState::AtRisk) || lease.state() != LeaseState::Held {
        return Err(format!(
            "expected Held → AtRisk → Held while the first renewal hung; states seen {states:?}"
        ));
    }
    Ok(())
}

/// Renewals that all hang are tried again, but the lease is Lost at `valid_until`: not
/// before (a try that hangs is no refusal) and not later (no try outlives the lease).
#[tokio::test]
async fn renewals_that_all_hang_end_in_lost_at_valid_until() -> std::result::Result<(), String> {
    let (lease, ops, granted) = watched_lease("hung-renewals", usize::MAX, Duration::ZERO)?;
    let lost = lease.lost();
    tokio::time::timeout(Duration::from_secs(5), lost.wait())
        .await
        .map_err(|_| "lease not Lost within 5 s though no renewal was answered".to_string())?;
    let at = granted.elapsed();
    let tries = tries_since(&ops, granted)?;
    if at < Duration::from_millis(600) || at > Duration::from_millis(700) {
        return Err(format!(
            "lease Lost {at:?} after the grant, valid until 600 ms; renewals asked at {tries:?}"
        ));
    }
    if tries.len() < 2 {
        return Err(format!(
            "a hanging renewal was not tried again before valid_until: renewals asked at {tries:?}"
        ));
    }
    Ok(())
}

/// A renewal that is slow but answers in time keeps the lease, however long it takes within
/// the validity: each answer here comes 270 ms after its request, with renewals due 200 ms
/// into a 600 ms window. (A watchdog that gave up a try after half of the validity left, and
/// sent a new one, would never see an answer and lose the lease.)
///
/// The answers are a tokio sleep: on a loaded machine a stalled runtime makes one come late,
/// and a lease whose renewal really answered past its window is rightly Lost. Such a trial
/// proves nothing either way and runs again (three at most); a loss with every answer within
/// 400 ms of its request fails at once.
#[tokio::test]
async fn a_slow_renewal_that_answers_in_time_keeps_the_lease() -> std::result::Result<(), String> {
    let mut stalls = Vec::new();
    for _ in 0..3 {
        let (lease, ops, granted) = watched_lease("slow-renewals", 0, Duration::from_millis(270))?;
        tokio::time::sleep(Duration::from_millis(1800)).await;
        if lease.state() != LeaseState::Lost && !lease.lost().is_lost() {
            return Ok(());
        }
        let tries = tries_since(&ops, granted)?;
        let slowest = ops.answers.lock().iter().max().copied().unwrap_or_default();
        if slowest <= Duration::from_millis(400) {
            return Err(format!(
                "a lease whose renewals all answered within {slowest:?} (270 ms asked), inside \
                 its 600 ms window, was Lost; renewals asked at {tries:?} after the grant"
            ));
        }
        stalls.push(slowest);
    }
    Err(format!(
        "every trial lost its lease with an answer that came late (the slowest of each: \
         {stalls:?}, 270 ms asked): the runtime stalled three times, or the driver's side \
         blocks it"
    ))
}

/// Ops whose server can change under the lease ([`LeaseOps::doubts`]): renewals are counted,
/// wait for `proceed` before answering, and are refused once `refuse` is set (the new server
/// does not have the lock).
struct DoubtedOps {
    doubts: tokio::sync::watch::Receiver<u64>,
    renewals: Arc<AtomicU32>,
    proceed: Arc<tokio::sync::Semaphore>,
    refuse: Arc<AtomicBool>,
}

#[async_trait]
impl LeaseOps for DoubtedOps {
    fn backend(&self) -> &'static str {
        "test"
    }
    async fn renew(&self) -> Result<Instant> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        let _ = self.proceed.acquire().await.map(|p| p.forget());
        if self.refuse.load(Ordering::SeqCst) {
            return Err(Error::not_held(
                &LockName::new("doubted").expect("a valid name"),
            ));
        }
        Ok(Instant::now() + Duration::from_secs(30))
    }
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        Ok(())
    }
    fn doubts(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.doubts.clone())
    }
}

/// Waits (1 s at most) until `lease` is in `want`.
async fn reaches(
    lease: &dyn Lease,
    want: LeaseState,
    when: &str,
) -> std::result::Result<(), String> {
    let until = Instant::now() + Duration::from_secs(1);
    while lease.state() != want {
        if Instant::now() > until {
            return Err(format!(
                "{when}: the lease is {:?}, not {want:?}",
                lease.state()
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// The promise of [`LeaseOps::doubts`]: at each change the lease turns AtRisk and an
/// automatically renewed one is renewed at once (not at a third of its 30 s validity), Held
/// again when the server confirms it and Lost when it refuses; a manually renewed one stays
/// AtRisk until its holder's renewal confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubt_puts_the_lease_at_risk_and_renews_it_at_once() -> std::result::Result<(), String> {
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let ops = |renewals: &Arc<AtomicU32>,
               proceed: &Arc<tokio::sync::Semaphore>,
               refuse: &Arc<AtomicBool>| DoubtedOps {
        doubts: rx.clone(),
        renewals: renewals.clone(),
        proceed: proceed.clone(),
        refuse: refuse.clone(),
    };
    let (renewals, proceed, refuse) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let grant = || Grant {
        token: None,
        ttl: Duration::from_secs(30),
        valid_until: Instant::now() + Duration::from_secs(30),
    };
    let name = LockName::new("doubted").map_err(|e| e.to_string())?;
    let auto = Renewal::Auto { max_hold: None };
    let lease = ManagedLease::new(
        name.clone(),
        grant(),
        auto,
        ops(&renewals, &proceed, &refuse),
    );
    let manual = ManagedLease::new(
        name,
        grant(),
        Renewal::Manual,
        ops(&renewals, &proceed, &refuse),
    );
    tx.send_modify(|n| *n += 1);
    // Held back by `proceed`, the renewal it started keeps the lease AtRisk.
    reaches(&lease, LeaseState::AtRisk, "after a doubt").await?;
    reaches(
        &manual,
        LeaseState::AtRisk,
        "after a doubt, renewed by hand",
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    if renewals.load(Ordering::SeqCst) != 1 {
        return Err(format!(
            "{} renewals after the doubt, expected the watchdog's one",
            renewals.load(Ordering::SeqCst)
        ));
    }
    proceed.add_permits(1);
    reaches(&lease, LeaseState::Held, "once the server confirmed it").await?;
    if manual.state() != LeaseState::AtRisk {
        return Err(format!(
            "a manual lease is {:?} before its holder renewed it",
            manual.state()
        ));
    }
    proceed.add_permits(1);
    manual.renew().await.map_err(|e| e.to_string())?;
    reaches(&manual, LeaseState::Held, "after its holder's renewal").await?;
    refuse.store(true, Ordering::SeqCst);
    proceed.add_permits(10);
    tx.send_modify(|n| *n += 1);
    reaches(&lease, LeaseState::Lost, "after a doubt the server refused").await?;
    Ok(())
}

/// Ops that count which renewal was asked: the watchdog's (`renew_due`) or one by hand.
#[derive(Debug, Default)]
struct CountedOps {
    by_hand: AtomicU32,
    due: AtomicU32,
}

#[async_trait]
impl LeaseOps for Arc<CountedOps> {
    fn backend(&self) -> &'static str {
        "test"
    }

    async fn renew(&self) -> Result<Instant> {
        self.by_hand.fetch_add(1, Ordering::SeqCst);
        Ok(Instant::now() + Duration::from_millis(300))
    }
    async fn renew_due(&self) -> Result<Instant> {
        self.due.fetch_add(1, Ordering::SeqCst);
        Ok(Instant::now() + Duration::from_millis(300))
    }
    async fn release(&self, _valid_until: Instant) -> Result<()> {
        Ok(())
    }
}

/// The watchdog asks `renew_due` (a driver may answer it from a renewal of many leases), and
/// `Lease::renew` asks `renew` (which always asks the backend): never the other way round.
#[tokio::test]
async fn the_watchdog_asks_renew_due_and_a_renewal_by_hand_asks_renew(
) -> std::result::Result<(), String> {
    let ops = Arc::new(CountedOps::default());
    let name: LockName = "due".parse().map_err(|e| format!("{e}"))?;
    let grant = |ms| Grant {
        token: None,
        ttl: Duration::from_millis(ms),
        valid_until: Instant::now() + Duration::from_millis(ms),
    };
    let auto = ManagedLease::new(
        name.clone(),
        grant(300),
        Renewal::Auto { max_hold: None },
        ops.clone(),
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    let (due, by_hand) = (
        ops.due.load(Ordering::SeqCst),
        ops.by_hand.load(Ordering::SeqCst),
    );
    if due < 2 || by_hand != 0 {
        return Err(format!(
            "over 350 ms of a 300 ms lease the watchdog asked renew_due {due} times and renew \
             {by_hand} times (expected about 3 and 0)"
        ));
    }
    Box::new(auto).release().await.map_err(|e| e.to_string())?;
    let manual = ManagedLease::new(name, grant(300), Renewal::Manual, ops.clone());
    let due = ops.due.load(Ordering::SeqCst);
    manual.renew().await.map_err(|e| e.to_string())?;
    if ops.by_hand.load(Ordering::SeqCst) != 1 || ops.due.load(Ordering::SeqCst) != due {
        return Err("Lease::renew did not ask renew (exactly once) and only it".into());
    }
    Box::new(manual).release().await.map_err(|e| e.to_string())
}

/// Ops whose renewal confirms until `renewed_until`; the release records the validity it was
/// given.
#[derive(Debug)]
struct ValidityOps {
    renewed_until: Instant,
    given: Arc<Mutex<Option<Instant>>>,
}

#[async_trait]
impl LeaseOps for ValidityOps {
    fn backend(&self) -> &'static str {
        "test"
    }

    async fn renew(&self) -> Result<Instant> {
        Ok(self.renewed_until)
    }
    async fn release(&self, valid_until: Instant) -> Result<()> {
        *self.given.lock() = Some(valid_until);
        Ok(())
    }
}

/// A release is given the lease's validity as its last confirmation left it: the latest
/// renewal's, not the grant's (Redlock judges a release short of a majority by it).
#[tokio::test]
async fn release_is_given_the_validity_of_the_last_renewal() -> std::result::Result<(), String> {
    let given = Arc::new(Mutex::new(None));
    let granted_until = Instant::now() + Duration::from_secs(5);
    let renewed_until = Instant::now() + Duration::from_secs(60);
    let ops = ValidityOps {
        renewed_until,
        given: given.clone(),
    };
    let name = LockName::new("validity-to-release").map_err(|e| e.to_string())?;
    let grant = Grant {
        token: None,
        ttl: Duration::from_secs(5),
        valid_until: granted_until,
    };
    let lease = ManagedLease::new(name, grant, Renewal::Manual, ops);
    lease.renew().await.map_err(|e| e.to_string())?;
    Box::new(lease).release().await.map_err(|e| e.to_string())?;
    let got = *given.lock();
    match got {
        Some(v) if v == renewed_until => Ok(()),
        Some(v) if v == granted_until => {
            Err("the release was given the grant's validity, not the renewal's".into())
        }
        other => Err(format!("the release was given {other:?}")),
    }
}
