//! Waiting: prompt wake-ups without polling, timeouts, cancellation, FIFO.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, Error, LockName, LockOptions};

use super::support::{
    cancel_after, client, drop_after_idle, free_for_a_newcomer, handed_on_promptly, held,
    idle_baseline, in_flight_scene, long_opts, opts, scene, sleep, spawn_waiter, stays_idle,
    within, Scene,
};
use crate::{ensure, fresh_name, Failure, Harness};

/// A waiter is granted within the slack after the holder releases, long before the holder's
/// TTL would have run out; it is not granted before the release.
pub async fn waiter_wakes_promptly_after_release(h: &dyn Harness) -> Result<(), Failure> {
    wakes_on_release(h, None).await
}

/// The same for a bounded wait (`wait_for`), which many drivers serve by another code path:
/// a waiter with a long deadline wakes on the release, not at its deadline or on a poll.
pub async fn bounded_waiter_wakes_promptly_after_release(h: &dyn Harness) -> Result<(), Failure> {
    wakes_on_release(h, Some(h.timing().ttl * 30)).await
}

async fn wakes_on_release(h: &dyn Harness, bound: Option<Duration>) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "wake").await?;
    let holder = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    let o = match bound {
        Some(d) => long_opts(h).wait_for(d),
        None => long_opts(h),
    };
    let kind = match bound {
        Some(d) => format!("a waiter with wait_for({d:?})"),
        None => "a waiter with no deadline".to_string(),
    };
    let waiter = spawn_waiter(b, &name, o);
    sleep(t.ttl).await;
    ensure!(
        !waiter.is_finished(),
        "{kind} returned while the lock was held"
    );
    handed_on_promptly(h, holder, waiter, &kind, "it does not wake on a release").await
}

/// `try_acquire` on a held lock makes one attempt and returns `None` at once (within the
/// slack): it never waits for the holder.
pub async fn try_acquire_does_not_wait(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "try-fast").await?;
    let holder = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    // Warm the client up first: a first request may set up a connection.
    let warm = fresh_name("try-fast-warm");
    if let Some(l) = b.try_acquire(&warm, &opts(h)).await? {
        l.release().await?;
    }
    let start = Instant::now();
    let r = match tokio::time::timeout(t.ttl * 4, b.try_acquire(&name, &long_opts(h))).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Failure(format!(
                "try_acquire on a held lock had not returned after {:?}: try_acquire must not \
                 wait for the holder",
                t.ttl * 4
            )))
        }
    };
    let took = start.elapsed();
    if let Some(l) = r {
        l.release().await?;
        return Err(Failure(
            "try_acquire got a lock that another client holds".into(),
        ));
    }
    ensure!(
        took <= t.slack,
        "try_acquire on a held lock took {took:?} to say no (slack {:?}): it must make one \
         attempt, not wait",
        t.slack
    );
    holder.release().await?;
    Ok(())
}

/// While a waiter waits on a held lock, the backend serves (almost) no more requests than with
/// the holder alone: waiting is by notification, not polling. The counter is the server's,
/// which the holder's renewals, sessions' pings and any other client on it also move: the
/// holder alone (both clients connected) sets the baseline, one quiet window of three is proof
/// enough, and a poller is busy in all three.
pub async fn waiting_is_idle(h: &dyn Harness) -> Result<(), Failure> {
    idle_while_waiting(h, "idle", long_opts(h), long_opts(h)).await
}

/// [`waiting_is_idle`] for a holder and a waiter of any modes (the waiter's must conflict).
pub(crate) async fn idle_while_waiting(
    h: &dyn Harness,
    tag: &str,
    holder_opts: LockOptions,
    waiter_opts: LockOptions,
) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, tag).await?;
    let holder = held(a.try_acquire(&name, &holder_opts).await?, "holder")?;
    let window = t.ttl.max(Duration::from_millis(500));
    let alone = idle_baseline(h, window).await?;
    let (n, o) = (name.clone(), waiter_opts);
    let waiter = tokio::spawn(async move { b.acquire(&n, &o).await });
    sleep(t.ttl / 2).await; // let the waiter settle
    stays_idle(h, window, alone, "one waiter waited").await?;
    holder.release().await?;
    let l = within(t.ttl * 10, "waiter after release", waiter)
        .await?
        .map_err(|e| Failure(format!("waiter panicked: {e}")))??;
    l.release().await?;
    Ok(())
}

/// `acquire` with a bounded wait on a held lock returns `Timeout` after that wait, not earlier
/// and not much later.
pub async fn wait_timeout_is_respected(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "wait-timeout").await?;
    let holder = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    let wait = t.ttl;
    let start = Instant::now();
    let r = within(
        wait * 4 + t.slack,
        "acquire with a bounded wait (was the wait ignored?)",
        b.acquire(&name, &long_opts(h).wait_for(wait)),
    )
    .await?;
    let took = start.elapsed();
    match r {
        Err(Error::Timeout { .. }) => {}
        Ok(_) => return Err(Failure("acquired a lock that was held all along".into())),
        Err(e) => return Err(Failure(format!("expected Timeout, got {e:?}"))),
    }
    ensure!(
        took >= wait,
        "Timeout after {took:?}, before the requested wait {wait:?}"
    );
    ensure!(
        took <= wait + t.slack,
        "Timeout after {took:?}, requested {wait:?} (slack {:?})",
        t.slack
    );
    holder.release().await?;
    Ok(())
}

/// `acquire` with `Wait::No` on a held lock returns `Timeout` at once.
pub async fn no_wait_fails_fast(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "no-wait").await?;
    let holder = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    let no_wait = long_opts(h).no_wait();
    times_out_at_once(h, b.as_ref(), &name, &no_wait, "acquire(no_wait)").await?;
    holder.release().await?;
    Ok(())
}

/// `what` (an `acquire` with `opts` that must not wait) on the held `name`: `Timeout` within
/// the slack.
async fn times_out_at_once(
    h: &dyn Harness,
    client: &dyn DistributedLock,
    name: &LockName,
    opts: &LockOptions,
    what: &str,
) -> Result<(), Failure> {
    let t = h.timing();
    let start = Instant::now();
    let r = within(t.ttl * 4, what, client.acquire(name, opts)).await?;
    ensure!(
        matches!(r, Err(Error::Timeout { .. })),
        "{what} on a held lock gave {r:?}, expected Timeout"
    );
    ensure!(
        start.elapsed() <= t.slack,
        "{what} on a held lock took {:?}",
        start.elapsed()
    );
    Ok(())
}

/// A wait whose deadline has passed before the first request (`wait_for(Duration::ZERO)`)
/// still makes one attempt: a free lock is granted, a held one is `Timeout` at once, and the
/// attempt leaves nothing behind.
pub async fn spent_deadline_still_tries_once(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "zero-wait").await?;
    let zero = long_opts(h).wait_for(Duration::ZERO);
    let what = "acquire(wait_for(0))";
    let r = within(t.ttl * 4, what, a.acquire(&name, &zero)).await?;
    let lease = r.map_err(|e| {
        Failure(format!(
            "{what} on a free lock gave {e:?}: a deadline that passed before the first request \
             must still get one attempt"
        ))
    })?;
    times_out_at_once(h, b.as_ref(), &name, &zero, what).await?;
    lease.release().await?;
    free_for_a_newcomer(
        h,
        b.as_ref(),
        &name,
        "a zero wait that timed out left a waiter",
    )
    .await
}

/// A waiter that timed out leaves nothing behind: after release the lock is free at once for
/// a newcomer's `try_acquire`.
pub async fn timed_out_waiter_leaves_no_record(h: &dyn Harness) -> Result<(), Failure> {
    let (a, b, c) = (client(h).await?, client(h).await?, client(h).await?);
    let name = fresh_name("timeout-record");
    let holder = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    times_out_waiting(h, b.as_ref(), &name).await?;
    holder.release().await?;
    free_for_a_newcomer(
        h,
        c.as_ref(),
        &name,
        "a timed-out waiter left a record behind",
    )
    .await
}

/// A waiter that timed out does not hold up later *waiting* acquires either: one that starts
/// waiting after the timeout is granted within the slack of the release.
pub async fn timed_out_waiter_does_not_block_waiters(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let (a, b, c) = (client(h).await?, client(h).await?, client(h).await?);
    let name = fresh_name("timeout-queue");
    let holder = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    times_out_waiting(h, b.as_ref(), &name).await?;
    let next = spawn_waiter(c, &name, long_opts(h).wait_for(t.ttl * 30));
    sleep(t.ttl / 2).await;
    handed_on_promptly(
        h,
        holder,
        next,
        "a waiter behind one that had timed out",
        "the timed-out waiter stayed in the queue",
    )
    .await
}

/// A waiting `acquire` that is cancelled (its future dropped) does not delay the next waiter:
/// after release the next waiter is granted within the slack.
pub async fn cancelled_waiter_does_not_block_others(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let (a, b, c) = (client(h).await?, client(h).await?, client(h).await?);
    let name = fresh_name("cancel");
    let holder = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    let (n, o) = (name.clone(), long_opts(h));
    let cancelled = tokio::spawn(async move { b.acquire(&n, &o).await.map(|l| l.abandon()) });
    sleep(t.ttl / 2).await;
    cancelled.abort();
    let _ = cancelled.await;
    let next = spawn_waiter(c, &name, long_opts(h));
    sleep(t.ttl / 2).await;
    handed_on_promptly(
        h,
        holder,
        next,
        "the waiter behind a cancelled one",
        "the cancelled waiter held it up",
    )
    .await
}

/// A `try_acquire` or `acquire` on a free name, dropped part-way (after its first poll, after
/// 1 and 5 ms, and polled once then left unpolled for 100 ms), leaves no holder behind:
/// whatever it got is undone, so the lock is free for another client within the slack (the
/// TTL is long; expiry cannot pass for it). Unlike [`cancelled_in_flight_leaves_no_holder`]
/// this needs no faulty link: it cuts wherever the driver happens to be, between its own
/// steps too. The unpolled cut is the one a timer cannot place: a grant that reached the
/// caller's side (a channel from the driver's own task, say) while the caller was not
/// running, and was dropped there unread.
pub async fn cancelled_acquire_leaves_no_holder(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "cancel-acquire").await?;
    let cuts = [(0, false), (1, false), (5, false), (100, true)];
    for (after, idle) in cuts.map(|(ms, idle)| (Duration::from_millis(ms), idle)) {
        for waits in [false, true] {
            let what = match waits {
                false => "try_acquire",
                true => "acquire (waiting)",
            };
            let opts = long_opts(h).wait_for(h.timing().ttl * 10);
            let acquire = async {
                match waits {
                    false => a.try_acquire(&name, &opts).await,
                    true => a.acquire(&name, &opts).await.map(Some),
                }
            };
            let got = match idle {
                false => cancel_after(after, acquire).await,
                true => drop_after_idle(after, acquire).await,
            };
            // Finished in time: an ordinary grant, released as usual.
            if let Some(lease) = got.transpose()?.flatten() {
                lease.release().await?;
            }
            let cut = match idle {
                false => format!("cancelled after {after:?}"),
                true => format!("polled once, then dropped unpolled {after:?} later"),
            };
            let left = format!("a {what} {cut} left a holder behind");
            free_for_a_newcomer(h, b.as_ref(), &name, &left).await?;
        }
    }
    Ok(())
}

/// An acquisition cancelled while its request is on the way to the server leaves no holder
/// behind. The request still arrives and may be granted, so the driver must undo that grant
/// (in the background: the caller is gone); otherwise nobody holds the lock until its TTL — or,
/// where the lock lives as long as the client's session, until the client goes away. Needs
/// [`Harness::faulty_client`].
pub async fn cancelled_in_flight_leaves_no_holder(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let (delay, slow, other, name) = in_flight_scene(h, "in-flight").await?;
    // Cancelled halfway to the server; a grant would hold for 40 TTLs.
    let r = tokio::time::timeout(delay / 2, slow.lock.try_acquire(&name, &long_opts(h))).await;
    ensure!(
        r.is_err(),
        "try_acquire through a {delay:?} delay returned before it could be cancelled: {:?}",
        r.map(|r| r.map(|l| l.is_some()))
    );
    // Contend only once the cancelled request has surely landed (it arrives `delay` after it
    // was sent); contending earlier would simply win the race against it.
    sleep(delay * 2).await;
    let limit = delay * 4 + t.slack;
    let lease = other
        .acquire(&name, &long_opts(h).wait_for(limit))
        .await
        .map_err(|e| {
            Failure(format!(
                "a try_acquire cancelled in flight left a holder behind for over {limit:?}: {e}"
            ))
        })?;
    lease.release().await?;
    drop(slow); // only now: the undo travels through its proxies
    Ok(())
}

/// A waiting `acquire` over a slow link, cancelled while a request of it is on its way,
/// leaves nothing behind. Cancelled after the request that queued it landed, before its
/// reply: no place in the queue that the next release hands the lock to. Cancelled a half,
/// one and a half and two and a half delays after the release, with its grant (or its
/// granting request) on its way: no holder. Each time another client gets the lock within
/// four delays and the slack.
pub async fn cancelled_waiter_in_flight_leaves_nothing(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let (delay, slow, other, name) = in_flight_scene(h, "waiter-in-flight").await?;
    let third = client(h).await?;
    let limit = delay * 4 + t.slack;
    let holder = held(other.try_acquire(&name, &long_opts(h)).await?, "holder")?;
    let r = tokio::time::timeout(delay * 3 / 2, slow.lock.acquire(&name, &long_opts(h))).await;
    ensure!(
        r.is_err(),
        "a waiting acquire of a held lock through a {delay:?} delay returned: {:?}",
        r.map(|r| r.map(|l| l.name().clone()))
    );
    // The cancellation travels too; then the next waiter queues.
    sleep(delay * 2).await;
    let next = spawn_waiter(third.clone(), &name, long_opts(h).wait_for(limit));
    sleep(delay).await;
    holder.release().await?;
    let (_, lease) = within(limit * 2, "the waiter behind a cancelled one", next)
        .await?
        .map_err(|e| Failure(format!("waiter panicked: {e}")))?;
    lease
        .map_err(|e| {
            Failure(format!(
                "a waiting acquire cancelled before the reply to the request that queued it \
                 kept its place: the next waiter was not granted within {limit:?} of the \
                 release ({e})"
            ))
        })?
        .release()
        .await?;
    for after in [delay / 2, delay * 3 / 2, delay * 5 / 2] {
        // Waits, bounded as the next waiter is: the last round's cancelled grant may still be
        // held where its undo is on its way through the slow link (over several servers, on
        // a minority of them, beside the last release's slower ones).
        let holder = other
            .acquire(&name, &long_opts(h).wait_for(limit))
            .await
            .map_err(|e| {
                Failure(format!(
                    "holder: the lock was not free within {limit:?} of the last release: {e}"
                ))
            })?;
        let waiting = spawn_waiter(slow.lock.clone(), &name, long_opts(h));
        // Queued: its requests landed and their replies came back.
        sleep(delay * 3).await;
        ensure!(
            !waiting.is_finished(),
            "a waiting acquire through a {delay:?} delay returned while the lock was held"
        );
        holder.release().await?;
        sleep(after).await;
        waiting.abort();
        // Finished before the cancel: an ordinary grant, released as usual.
        if let Ok((_, Ok(l))) = waiting.await {
            l.release().await?;
        }
        let next = third
            .acquire(&name, &long_opts(h).wait_for(limit))
            .await
            .map_err(|e| {
                Failure(format!(
                    "a waiting acquire cancelled {after:?} after the release (its grant on its \
                     way, delay {delay:?}) left a holder behind for over {limit:?}: {e}"
                ))
            })?;
        next.release().await?;
    }
    drop(slow); // only now: the undo travels through its proxies
    Ok(())
}

/// Waiters that arrive one after another are granted in arrival order.
pub async fn waiters_served_fifo(h: &dyn Harness) -> Result<(), Failure> {
    fifo(h, false).await
}

/// Arrival order holds also when the holder expires instead of releasing: the first waiter
/// gets the expired lock, the others follow in turn.
pub async fn waiters_served_fifo_after_expiry(h: &dyn Harness) -> Result<(), Failure> {
    fifo(h, true).await
}

async fn fifo(h: &dyn Harness, expire: bool) -> Result<(), Failure> {
    const W: usize = 4;
    let t = h.timing();
    let a = client(h).await?;
    let name = fresh_name("fifo");
    let gap = (t.slack / 4).max(Duration::from_millis(50));
    // An expiring holder must outlast the waiters' arrival.
    let holder_opts = if expire {
        opts(h).ttl((gap * (W as u32 + 2)).max(t.ttl))
    } else {
        long_opts(h)
    };
    let holder = held(a.try_acquire(&name, &holder_opts).await?, "holder")?;
    let holder_vu = holder.valid_until();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..W {
        let c = client(h).await?;
        let (n, o, order) = (name.clone(), long_opts(h), order.clone());
        tasks.push(tokio::spawn(async move {
            let l = c.acquire(&n, &o).await?;
            order.lock().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            l.release().await?;
            Ok::<_, Failure>(())
        }));
        sleep(gap).await;
    }
    let how = if expire {
        ensure!(
            Instant::now() < holder_vu,
            "the holder expired before all waiters had arrived (arrivals took too long)"
        );
        holder.abandon();
        "expired"
    } else {
        holder.release().await?;
        "released"
    };
    for task in tasks {
        within(t.ttl * 20, "FIFO waiter", task)
            .await?
            .map_err(|e| Failure(format!("waiter panicked: {e}")))??;
    }
    let order = order.lock().clone();
    ensure!(
        order == (0..W).collect::<Vec<_>>(),
        "waiters granted in order {order:?} after the holder {how}, arrival order was 0..{W}"
    );
    Ok(())
}

/// On a FIFO driver a `try_acquire` never takes a lock that a waiter is queued for: right
/// after the holder releases, a third client's `try_acquire` is refused, and the waiter is
/// granted. Five rounds: the waiter's wake-up races the call, and may win a round by chance.
pub async fn try_acquire_never_jumps_the_queue(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "no-barging").await?;
    let c = client(h).await?;
    for round in 1..=5 {
        let holder = held(a.try_acquire(&name, &long_opts(h)).await?, "holder")?;
        let waiter = spawn_waiter(b.clone(), &name, long_opts(h));
        // Queueing takes a few round trips (PostgreSQL with shared sessions: two new
        // sessions, a try on each, then the wait): a slack, the room for a loaded
        // machine's scheduling, is many. 100 ms was not always: in a clean run the try took
        // the lock in round 1, where the waiter still had its two sessions to open.
        sleep(t.slack).await;
        ensure!(
            !waiter.is_finished(),
            "round {round}: the waiter returned while the lock was held"
        );
        holder.release().await?;
        let jumped = match c.try_acquire(&name, &long_opts(h)).await? {
            Some(l) => {
                l.release().await?;
                true
            }
            None => false,
        };
        let (_, lease) = within(t.slack * 4, "the queued waiter after the release", waiter)
            .await?
            .map_err(|e| Failure(format!("waiter panicked: {e}")))?;
        lease?.release().await?;
        ensure!(
            !jumped,
            "round {round}: a try_acquire right after the release took the lock while a \
             waiter was queued for it: on a FIFO driver the queue comes first"
        );
    }
    Ok(())
}

/// Five waiters on one name each get exactly one turn, never two at a time.
pub async fn every_waiter_gets_one_turn(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let name = fresh_name("turns");
    let inside = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let c = client(h).await?;
        let (n, o, inside, turns) = (name.clone(), long_opts(h), inside.clone(), turns.clone());
        tasks.push(tokio::spawn(async move {
            let l = c.acquire(&n, &o).await?;
            if inside.swap(true, Ordering::SeqCst) {
                return Err(Failure("two waiters held the lock at once".into()));
            }
            turns.lock().push(i);
            tokio::time::sleep(Duration::from_millis(10)).await;
            inside.store(false, Ordering::SeqCst);
            l.release().await?;
            Ok::<_, Failure>(())
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        within(t.ttl * 20, "waiter", task)
            .await
            .map_err(|_| {
                let had = turns.lock().clone();
                Failure(format!(
                    "waiter {i} of 5 never got a turn within {:?}; the waiters that did, in \
                     order: {had:?}",
                    t.ttl * 20
                ))
            })?
            .map_err(|e| Failure(format!("waiter panicked: {e}")))??;
    }
    Ok(())
}

/// A bounded `acquire` (half a TTL) of a held lock, which must end in `Timeout`.
async fn times_out_waiting(
    h: &dyn Harness,
    client: &dyn lock_core::DistributedLock,
    name: &lock_core::LockName,
) -> Result<(), Failure> {
    let t = h.timing();
    let r = within(
        t.ttl * 4,
        "bounded acquire",
        client.acquire(name, &long_opts(h).wait_for(t.ttl / 2)),
    )
    .await?;
    ensure!(
        matches!(r, Err(Error::Timeout { .. })),
        "a bounded acquire of a held lock: expected Timeout, got {r:?}"
    );
    Ok(())
}
