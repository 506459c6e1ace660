//! Every promise on every grant, not on one or two: a driver that breaks a promise on one
//! grant in twenty (a repeated token, an overstated validity, a lost wake-up, a silent loss)
//! passes every case that checks it once. This case checks them on each of many grants.

use std::time::{Duration, Instant};

use lock_core::{Fencing, FencingToken, Lease, LeaseState};

use super::support::*;
use crate::{ensure, fresh_name, Failure, Harness};

/// Hand-offs between the two clients. Each client gets 50 grants, 25 by `try_acquire` and 25
/// after a wait, so a flaw that strikes one grant in twenty, counted per client or over all
/// clients, of every kind or of waiting grants only, strikes here at least once.
const HANDOFFS: usize = 50;
/// Leases one client holds until they expire: any twenty grants in a row include the twentieth.
const EXPIRING: usize = 24;
/// How long a waiter is given to queue before the holder releases.
const QUEUE: Duration = Duration::from_millis(20);

/// On each of 100 grants of one name, handed between two clients by `release` to a waiter:
/// the lease is Held with its lost signal pending, `valid_until` lies after the call's return
/// and no further than its TTL from it, the token (where the driver fences) is greater than
/// every earlier one, the waiter is granted within the slack of the release, and the release
/// resolves the lost signal. Then (where locks expire and the driver signals a loss) each of
/// 24 unrenewed leases turns Lost, its signal fired, by its `valid_until` and the slack.
pub async fn every_grant_keeps_its_promises(h: &dyn Harness) -> Result<(), Failure> {
    let Scene { t, a, b, name } = scene(h, "every-grant").await?;
    let caps = a.capabilities();
    let fencing = caps.fencing != Fencing::None;
    let mut last = None;
    let clients = [a.clone(), b];
    for i in 0..HANDOFFS {
        let (first, second) = (2 * i + 1, 2 * i + 2);
        let holder = clients[i % 2].try_acquire(&name, &long_opts(h)).await?;
        let holder = held(
            holder,
            &format!("grant {first}, a try_acquire of a free lock"),
        )?;
        check(&*holder, first, Instant::now(), fencing, &mut last)?;
        let waiter = spawn_waiter(clients[(i + 1) % 2].clone(), &name, long_opts(h));
        sleep(QUEUE).await;
        let lost = holder.lost();
        let released = Instant::now();
        holder.release().await?;
        within(
            t.slack,
            &format!("grant {first}: its lost signal after its release"),
            lost.wait(),
        )
        .await?;
        let limit = t.slack * 4;
        let (at, lease) = tokio::time::timeout(limit, waiter)
            .await
            .map_err(|_| {
                Failure(format!(
                    "grant {second}: the waiter was not granted within {limit:?} of the \
                     release (slack {:?}): a lost wake-up",
                    t.slack
                ))
            })?
            .map_err(|e| Failure(format!("grant {second}: the waiter panicked: {e}")))?;
        let lease = lease.map_err(|e| {
            Failure(format!(
                "grant {second}: the waiter failed after the release: {e:?}"
            ))
        })?;
        let waited = at.saturating_duration_since(released);
        ensure!(
            waited <= t.slack,
            "grant {second}: the waiter was granted {waited:?} after the release (slack {:?}): \
             a lost wake-up, caught by a later poll or timer",
            t.slack
        );
        check(&*lease, second, at, fencing, &mut last)?;
        lease.release().await?;
    }
    if !(caps.per_lock_ttl && caps.lost_notification) {
        return Ok(());
    }
    let mut leases = Vec::with_capacity(EXPIRING);
    for k in 0..EXPIRING {
        let n = fresh_name(&format!("every-grant-expiring-{k}"));
        let lease = held(
            clients[0].try_acquire(&n, &opts(h)).await?,
            &format!("expiring lease {k}"),
        )?;
        check(
            &*lease,
            2 * HANDOFFS + k + 1,
            Instant::now(),
            false,
            &mut None,
        )?;
        leases.push(lease);
    }
    let latest = leases.iter().map(|l| l.valid_until()).max();
    sleep_until(latest.unwrap_or_else(Instant::now) + t.slack).await;
    for (k, l) in leases.iter().enumerate() {
        let late = l.valid_until().elapsed();
        ensure!(
            l.state() == LeaseState::Lost && l.lost().is_lost(),
            "expiring lease {k} (of {EXPIRING}, unrenewed) was {:?}, its lost signal {}, \
             {late:?} after its valid_until (slack {:?}): a lease must turn Lost at \
             valid_until on every grant",
            l.state(),
            if l.lost().is_lost() {
                "fired"
            } else {
                "pending"
            },
            t.slack
        );
    }
    Ok(())
}

/// The promises of a lease just handed out as grant number `grant`, whose call returned at
/// `returned`; `last` is the token of the grant before it.
fn check(
    lease: &dyn Lease,
    grant: usize,
    returned: Instant,
    fencing: bool,
    last: &mut Option<FencingToken>,
) -> Result<(), Failure> {
    let (state, vu) = (lease.state(), lease.valid_until());
    ensure!(
        state == LeaseState::Held && !lease.lost().is_lost(),
        "grant {grant} was handed out {state:?}, its lost signal {}",
        if lease.lost().is_lost() {
            "fired"
        } else {
            "pending"
        }
    );
    ensure!(
        vu > returned,
        "grant {grant} was handed out with its valid_until already past"
    );
    ensure!(
        vu <= returned + lease.ttl(),
        "grant {grant}: valid_until is {:?} after its call returned, beyond its TTL {:?}: it \
         claims time the server did not grant",
        vu - returned,
        lease.ttl()
    );
    if fencing {
        let Some(tok) = lease.fencing_token() else {
            return Err(Failure(format!(
                "grant {grant} has no fencing token, though the driver declares fencing"
            )));
        };
        if let Some(prev) = *last {
            ensure!(
                tok > prev,
                "grant {grant} got token {} after {}: tokens must strictly increase on every \
                 grant of a name",
                tok.get(),
                prev.get()
            );
        }
        *last = Some(tok);
    }
    Ok(())
}
