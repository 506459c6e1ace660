//! Leader election ([`lock_core::Election`]): the name's exclusive lock with the leader's
//! value beside it and a feed of its changes. Needs `Capabilities::election` and fencing (the
//! term is the fencing token).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{
    DistributedLock, Election, FencingToken, Leader, LeaderValue, Leadership, LockName,
    LockOptions, Observation, Observer,
};

use super::support::{
    cancel_after, client, idle_baseline, long_opts, opts, scene, sleep, stays_idle, within, Scene,
};
use crate::{ensure, fresh_name, Failure, Harness};

fn election(c: &Arc<dyn DistributedLock>) -> Result<Election, Failure> {
    Election::new(c.clone()).map_err(|e| {
        Failure(format!(
            "the driver declares election and fencing, but Election::new refused it: {e}"
        ))
    })
}

fn value(s: &str) -> Result<LeaderValue, Failure> {
    LeaderValue::new(s).map_err(|e| Failure(format!("value {s:?}: {e}")))
}

/// What `leader` reads, as (value, term), for messages and comparisons.
fn shown(l: &Option<Leader>) -> Option<(String, FencingToken)> {
    l.as_ref().map(|l| (l.value.to_string(), l.term))
}

/// `leader(name)` reads `want` (value, term), else `broken`.
async fn leads(
    e: &Election,
    name: &LockName,
    want: Option<(&str, FencingToken)>,
    broken: &str,
) -> Result<(), Failure> {
    let read = shown(&e.leader(name).await?);
    let want = want.map(|(v, t)| (v.to_string(), t));
    ensure!(
        read == want,
        "{broken}: leader() read {read:?}, expected {want:?}"
    );
    Ok(())
}

/// A campaign of `c` for `name` with `v`, in a task of its own; the time it was elected.
type Candidate = tokio::task::JoinHandle<(Instant, lock_core::Result<Leadership>)>;

fn campaign(e: &Election, name: &LockName, v: LeaderValue, o: LockOptions) -> Candidate {
    let (e, name) = (e.clone(), name.clone());
    tokio::spawn(async move {
        let r = e.campaign(&name, v, &o).await;
        (Instant::now(), r)
    })
}

/// Three candidates campaign at once: one is elected, and `leader` names it and its term;
/// each resignation elects exactly one of those still campaigning, within the slack, with a
/// higher term; after the last, nobody leads.
pub async fn one_leader_at_a_time(h: &dyn Harness) -> Result<(), Failure> {
    let t = h.timing();
    let name = fresh_name("elect-one");
    let mut pending = Vec::new();
    let mut reader = None;
    for i in 0..3 {
        let e = election(&client(h).await?)?;
        let o = long_opts(h).wait_for(t.ttl * 40);
        pending.push((i, campaign(&e, &name, value(&format!("candidate-{i}"))?, o)));
        reader.get_or_insert(e);
    }
    let reader = reader.ok_or_else(|| Failure("no candidate".into()))?;
    let mut last: Option<FencingToken> = None;
    let mut resigned = Instant::now();
    while !pending.is_empty() {
        // Wait for one to be elected, then give the others the slack to (wrongly) follow.
        let deadline = Instant::now() + t.slack * 4;
        let mut elected = Vec::new();
        while elected.is_empty() && Instant::now() < deadline {
            sleep(Duration::from_millis(5)).await;
            let (done, rest): (Vec<_>, Vec<_>) =
                pending.into_iter().partition(|(_, c)| c.is_finished());
            pending = rest;
            elected = done;
        }
        sleep(t.slack / 2).await;
        let (late, rest): (Vec<_>, Vec<_>) =
            pending.into_iter().partition(|(_, c)| c.is_finished());
        pending = rest;
        elected.extend(late);
        ensure!(
            elected.len() == 1,
            "{} candidates were elected at once (expected one; {} still campaigning)",
            elected.len(),
            pending.len()
        );
        let Some((i, c)) = elected.pop() else {
            return Err(Failure("no candidate was elected within the slack".into()));
        };
        let (at, leader) = c
            .await
            .map_err(|e| Failure(format!("candidate {i} panicked: {e}")))?;
        let leader = leader.map_err(|e| Failure(format!("candidate {i}'s campaign: {e}")))?;
        if last.is_some() {
            let delay = at.saturating_duration_since(resigned);
            ensure!(
                delay <= t.slack,
                "candidate {i} was elected {delay:?} after the leader resigned (slack {:?}): \
                 a resignation hands leadership on like a release",
                t.slack
            );
        }
        ensure!(
            last.map_or(true, |l| leader.term() > l),
            "candidate {i} was elected with term {:?}, not above the last leader's {last:?}",
            leader.term()
        );
        last = Some(leader.term());
        leads(
            &reader,
            &name,
            Some((&format!("candidate-{i}"), leader.term())),
            &format!("candidate {i} leads"),
        )
        .await?;
        resigned = Instant::now();
        leader.resign().await?;
    }
    leads(&reader, &name, None, "every candidate resigned").await
}

/// `leader` reads nobody on a free name; the elected candidate's value and term; the value it
/// proclaims, in the same term; a holder of the plain lock as a leader with an empty value
/// (it is the same lock); and nobody once it resigned.
pub async fn leader_reports_value_and_term(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { a, b, name, .. } = scene(h, "elect-read").await?;
    let (ea, eb) = (election(&a)?, election(&b)?);
    leads(&eb, &name, None, "a name nobody campaigned for").await?;
    let me = ea
        .campaign(&name, value("10.0.0.1:80")?, &long_opts(h))
        .await?;
    let term = me.term();
    ensure!(
        me.fencing_token() == Some(term),
        "the leadership's term {term:?} is not its lease's fencing token {:?}",
        me.fencing_token()
    );
    leads(&eb, &name, Some(("10.0.0.1:80", term)), "just elected").await?;
    me.proclaim(value("10.0.0.1:81")?).await?;
    leads(&eb, &name, Some(("10.0.0.1:81", term)), "after a proclaim").await?;
    ensure!(
        me.term() == term,
        "a proclaim changed the term: {term:?} to {:?}",
        me.term()
    );
    me.resign().await?;
    leads(&eb, &name, None, "after the leader resigned").await?;
    let plain = a.try_acquire(&name, &long_opts(h)).await?;
    let plain = plain.ok_or_else(|| Failure("the plain lock was refused on a free name".into()))?;
    let token = plain
        .fencing_token()
        .ok_or_else(|| Failure("no token".into()))?;
    leads(
        &eb,
        &name,
        Some(("", token)),
        "a plain exclusive holder (no value)",
    )
    .await?;
    plain.release().await?;
    Ok(())
}

/// A leadership that ended behind its holder's back — its lease expired unrenewed, or (where
/// locks have no TTL of their own) an operator deleted it — and whose successor was elected
/// cannot proclaim: refused, and the successor's value stays what observers read.
pub async fn proclaim_after_the_end_changes_nothing(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "elect-stale").await?;
    let (ea, eb) = (election(&a)?, election(&b)?);
    if a.capabilities().per_lock_ttl {
        let old = ea.campaign(&name, value("old")?, &opts(h)).await?;
        // Past the server's own expiry too, not only the conservative valid_until.
        sleep(old.ttl() + t.slack).await;
        return stale_proclaim(h, &ea, &eb, &name, old).await;
    }
    let old = ea.campaign(&name, value("old")?, &long_opts(h)).await?;
    match h.break_lock(&name).await {
        Some(r) => r?,
        None => return Err(Failure("harness stopped supporting break_lock".into())),
    }
    stale_proclaim(h, &ea, &eb, &name, old).await
}

async fn stale_proclaim(
    h: &dyn Harness,
    ea: &Election,
    eb: &Election,
    name: &LockName,
    old: Leadership,
) -> Result<(), Failure> {
    let t = h.timing();
    let new = eb
        .campaign(name, value("new")?, &long_opts(h).wait_for(t.slack * 4))
        .await?;
    let r = old.proclaim(value("stale")?).await;
    ensure!(
        r.is_err(),
        "a leadership that had ended proclaimed (a successor of term {:?} leads)",
        new.term()
    );
    leads(
        ea,
        name,
        Some(("new", new.term())),
        "after a stale proclaim",
    )
    .await?;
    new.resign().await?;
    Ok(())
}

/// A deposed leader learns it first: an unrenewed leadership's lost signal has fired, and it
/// is Lost, by the time the next candidate is elected.
pub async fn deposed_leader_knows_before_a_successor(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "elect-deposed").await?;
    let (ea, eb) = (election(&a)?, election(&b)?);
    let old = ea.campaign(&name, value("old")?, &opts(h)).await?;
    let lost = old.lost();
    let fired = tokio::spawn(async move {
        lost.wait().await;
        Instant::now()
    });
    let wait = opts(h).wait_for(old.ttl() * 2 + t.slack);
    let new = within(
        old.ttl() * 4,
        "the successor",
        eb.campaign(&name, value("new")?, &wait),
    )
    .await??;
    let elected = Instant::now();
    ensure!(
        old.valid_until() <= elected,
        "the deposed leader's valid_until is {:?} after its successor was elected",
        old.valid_until() - elected
    );
    let fired = within(t.slack, "the deposed leader's lost signal", fired)
        .await?
        .map_err(|e| Failure(format!("watcher panicked: {e}")))?;
    ensure!(
        fired <= elected + Duration::from_millis(50),
        "the deposed leader's lost signal fired {:?} after its successor was elected",
        fired - elected
    );
    new.resign().await?;
    Ok(())
}

/// A campaign cancelled while another leads leaves no candidate: when the leader resigns,
/// nobody is elected in its place, and a newcomer is elected at once.
pub async fn cancelled_campaign_leaves_no_candidate(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "elect-cancel").await?;
    let (ea, eb) = (election(&a)?, election(&b)?);
    let leader = ea.campaign(&name, value("leader")?, &long_opts(h)).await?;
    let gone = cancel_after(
        t.slack / 2,
        eb.campaign(&name, value("cancelled")?, &long_opts(h)),
    )
    .await;
    ensure!(gone.is_none(), "a campaign was elected beside a leader");
    leader.resign().await?;
    sleep(t.slack / 2).await;
    leads(
        &ea,
        &name,
        None,
        "the leader resigned, its only rival had left",
    )
    .await?;
    let c = election(&client(h).await?)?;
    let next = c.try_campaign(&name, value("next")?, &long_opts(h)).await?;
    let next = next.ok_or_else(|| {
        Failure("a newcomer was refused after the leader resigned and its rival left".into())
    })?;
    next.resign().await?;
    Ok(())
}

/// `want` on `observer` within `limit`: the next observation, checked against every earlier
/// one (`seen`): terms never go back, and a term that ended never comes back.
async fn observed(
    observer: &mut Observer,
    seen: &mut Vec<Observation>,
    limit: Duration,
    what: &str,
) -> Result<Option<Leader>, Failure> {
    let o = within(limit, what, observer.next()).await??;
    let top = seen
        .iter()
        .filter_map(|o| o.leader.as_ref().map(|l| l.term))
        .max();
    if let (Some(l), Some(top)) = (&o.leader, top) {
        let ended = seen.last().is_some_and(|o| o.leader.is_none());
        ensure!(
            l.term > top || (l.term == top && !ended),
            "{what}: the observer showed term {:?} after it had shown {top:?}{}",
            l.term,
            if ended { " end" } else { "" }
        );
    }
    seen.push(o.clone());
    Ok(o.leader)
}

/// An observer sees, each within the slack: nobody; the elected leader's value and term; its
/// proclaimed value; the next leader once it resigned (perhaps after a moment of nobody);
/// nobody once that leader's lease lapsed. Terms never go back.
pub async fn observer_sees_each_leader_in_order(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "elect-observe").await?;
    let (ea, eb) = (election(&a)?, election(&b)?);
    let eo = election(&client(h).await?)?;
    let mut obs = eo.observe(&name).await?;
    let mut seen = Vec::new();
    let lim = t.slack * 2;
    let first = observed(&mut obs, &mut seen, lim, "the first observation").await?;
    ensure!(
        first.is_none(),
        "nobody leads, but the observer showed {first:?}"
    );
    let one = ea.campaign(&name, value("one")?, &long_opts(h)).await?;
    let got = observed(&mut obs, &mut seen, lim, "the first leader").await?;
    ensure!(
        shown(&got) == Some(("one".into(), one.term())),
        "the observer showed {:?} for the first leader (\"one\", {:?})",
        shown(&got),
        one.term()
    );
    one.proclaim(value("one-b")?).await?;
    let got = observed(&mut obs, &mut seen, lim, "a proclaimed value").await?;
    ensure!(
        shown(&got) == Some(("one-b".into(), one.term())),
        "after a proclaim the observer showed {:?}, expected (\"one-b\", {:?})",
        shown(&got),
        one.term()
    );
    let two = campaign(&eb, &name, value("two")?, opts(h).wait_for(t.slack * 4));
    sleep(t.slack / 2).await;
    one.resign().await?;
    let (_, two) = within(t.slack * 4, "the second candidate", two)
        .await?
        .map_err(|e| Failure(format!("candidate panicked: {e}")))?;
    let two = two?;
    let mut got = observed(&mut obs, &mut seen, lim, "the second leader").await?;
    if got.is_none() {
        got = observed(&mut obs, &mut seen, lim, "the second leader").await?;
    }
    ensure!(
        shown(&got) == Some(("two".into(), two.term())),
        "after a hand-off the observer showed {:?}, expected (\"two\", {:?})",
        shown(&got),
        two.term()
    );
    // A lapse where leases have a TTL of their own (no one says it ended: the observer must
    // hear of it from the backend, or read again when it was due); else a resignation.
    let (end, limit) = if a.capabilities().per_lock_ttl {
        let lapse = two.valid_until() + t.slack;
        two.abandon();
        (
            "lapsed",
            lapse.saturating_duration_since(Instant::now()) + lim,
        )
    } else {
        two.resign().await?;
        ("resigned", lim)
    };
    let got = observed(&mut obs, &mut seen, limit, "the end of the last leader").await?;
    ensure!(
        got.is_none(),
        "the last leader {end}, but the observer showed {:?}",
        shown(&got)
    );
    Ok(())
}

/// An observer waiting on a leader that stays costs the backend (almost) nothing: it waits on
/// the backend's notifications, it does not poll. Measured as `waiting::waiting_is_idle`
/// measures a waiter: requests in a window with the observer waiting, against one without.
pub async fn observing_is_idle(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, name, .. } = scene(h, "elect-idle").await?;
    let leader = election(&a)?
        .campaign(&name, value("steady")?, &long_opts(h))
        .await?;
    let window = t.ttl.max(Duration::from_millis(500));
    // The observer's client first: the baseline counts its session's keep-alives (as the
    // waiting cases' baseline counts the waiter's), so what is measured is the observing.
    // Made after it, a ZooKeeper ensemble client's pings alone came to 7-8 more requests a
    // window than the baseline, under the lanes' load (a clean run of `068144c`).
    let observer = client(h).await?;
    let alone = idle_baseline(h, window).await?;
    let mut obs = election(&observer)?.observe(&name).await?;
    let first = within(t.slack * 2, "the first observation", obs.next()).await??;
    ensure!(
        first.leader.is_some(),
        "the observer showed nobody while a leader held the name"
    );
    let watching = tokio::spawn(async move { obs.next().await.map(|o| o.leader) });
    sleep(t.slack / 2).await;
    let idle = stays_idle(h, window, alone, "an observer watched a steady leader").await;
    ensure!(
        !watching.is_finished(),
        "the observer reported a change while nothing changed"
    );
    watching.abort();
    leader.resign().await?;
    idle.map(|_| ())
}
