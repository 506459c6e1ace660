//! What a case needs from a driver or its harness: `Err(reason)` skips the case, and the runner
//! prints the reason.

use lock_core::{ExpiryClock, Fencing};

use super::Facts;

type Need = Result<(), &'static str>;

/// `Ok` if `holds`, else skipped for `reason`.
fn need(holds: bool, reason: &'static str) -> Need {
    if holds {
        Ok(())
    } else {
        Err(reason)
    }
}

pub(super) fn always(_: &Facts) -> Need {
    Ok(())
}
pub(super) fn ttl(f: &Facts) -> Need {
    need(
        f.caps.per_lock_ttl,
        "per_lock_ttl = false: locks do not expire on their own TTL",
    )
}
pub(super) fn fencing(f: &Facts) -> Need {
    need(f.caps.fencing != Fencing::None, "fencing = None")
}
pub(super) fn ttl_and_fencing(f: &Facts) -> Need {
    ttl(f).and(fencing(f))
}
pub(super) fn fifo(f: &Facts) -> Need {
    need(f.caps.fifo, "fifo = false")
}
pub(super) fn strict_and_restart(f: &Facts) -> Need {
    need(
        f.caps.fencing == Fencing::Strict,
        "fencing is not Strict: tokens may repeat after a restart",
    )?;
    need(f.can_restart, "harness cannot restart the backend")
}
pub(super) fn survives_restart(f: &Facts) -> Need {
    need(
        f.caps.survives_restart,
        "survives_restart = false: a restart may free or forget held locks",
    )?;
    need(f.can_restart, "harness cannot restart the backend")?;
    need(
        f.lease_window
            .is_some_and(|w| w >= super::server::RESTART_WINDOW),
        "a lease is vouched for less than a restart takes (8 s; a short session): give \
         the harness a longer session",
    )
}
fn steps_clock(f: &Facts) -> Need {
    need(f.can_step_clock, "harness cannot step the servers' clocks")
}
pub(super) fn elapsed_expiry_and_clock(f: &Facts) -> Need {
    need(
        f.caps.expires_by == ExpiryClock::Elapsed,
        "expires_by = TimeOfDay: a step of the server's clock moves expiry (declared)",
    )?;
    steps_clock(f)
}
pub(super) fn fencing_and_clock(f: &Facts) -> Need {
    fencing(f).and(steps_clock(f))
}
pub(super) fn fifo_and_ttl(f: &Facts) -> Need {
    fifo(f).and(ttl(f))
}
pub(super) fn inspects_and_ttl(f: &Facts) -> Need {
    inspects(f).and(ttl(f))
}
pub(super) fn counts(f: &Facts) -> Need {
    need(f.counts_requests, "harness cannot count backend requests")
}
pub(super) fn lost_ttl(f: &Facts) -> Need {
    ttl(f).and(lost_notification(f))
}
pub(super) fn lost_notification(f: &Facts) -> Need {
    need(f.caps.lost_notification, "lost_notification = false")
}
pub(super) fn delays(f: &Facts) -> Need {
    need(
        f.can_fault,
        "harness gives no client behind a breakable link",
    )
}
pub(super) fn delays_and_outlives(f: &Facts) -> Need {
    delays(f)?;
    need(
        f.caps.outlives_connection,
        "outlives_connection = false: the lock is the connection's session",
    )
}
pub(super) fn reconnects_and_breakable(f: &Facts) -> Need {
    delays_and_outlives(f)?;
    breakable(f)
}
pub(super) fn delays_and_connection_bound(f: &Facts) -> Need {
    delays(f)?;
    need(
        !f.caps.outlives_connection,
        "outlives_connection = true: a dropped connection does not free the lock",
    )
}
pub(super) fn partitions(f: &Facts) -> Need {
    delays(f).and(lost_notification(f))
}
pub(super) fn inspects(f: &Facts) -> Need {
    need(f.caps.inspect, "inspect = false")
}
pub(super) fn breakable(f: &Facts) -> Need {
    lost_notification(f)?;
    need(
        f.can_break,
        "harness cannot break a lock behind its holder's back",
    )
}
pub(super) fn delays_and_ttl(f: &Facts) -> Need {
    delays(f).and(ttl(f))
}
pub(super) fn sees_keys(f: &Facts) -> Need {
    need(f.sees_keys, "harness cannot look a key up on the backend")
}
pub(super) fn by_url(f: &Facts) -> Need {
    need(f.by_url, "harness names no secured servers")
}
pub(super) fn auth(f: &Facts) -> Need {
    need(
        f.auth.is_some(),
        "harness names no server that requires a password",
    )
}
pub(super) fn checks_passwords(f: &Facts) -> Need {
    auth(f)?;
    need(
        f.auth == Some(true),
        "a wrong password is another identity on this backend",
    )
}
pub(super) fn tls(f: &Facts) -> Need {
    need(f.tls, "harness names no TLS server")
}
pub(super) fn tls_pem(f: &Facts) -> Need {
    tls(f)?;
    need(f.tls_pem, "harness gives no way to pass the CA as PEM")
}
pub(super) fn shared(f: &Facts) -> Need {
    need(
        f.caps.shared,
        "shared = false: the driver grants the exclusive mode only",
    )
}
pub(super) fn shared_and_fifo(f: &Facts) -> Need {
    shared(f).and(fifo(f))
}
pub(super) fn shared_and_ttl(f: &Facts) -> Need {
    shared(f).and(ttl(f))
}
pub(super) fn shared_and_fencing(f: &Facts) -> Need {
    shared(f).and(fencing(f))
}
pub(super) fn shared_and_counts(f: &Facts) -> Need {
    shared(f).and(counts(f))
}
pub(super) fn permits(f: &Facts) -> Need {
    need(
        f.caps.permits,
        "permits = false: the driver has no semaphores",
    )
}
pub(super) fn permits_and_fifo(f: &Facts) -> Need {
    permits(f).and(fifo(f))
}
pub(super) fn permits_and_ttl(f: &Facts) -> Need {
    permits(f).and(ttl(f))
}
pub(super) fn permits_and_fencing(f: &Facts) -> Need {
    permits(f).and(fencing(f))
}
pub(super) fn permits_and_counts(f: &Facts) -> Need {
    permits(f).and(counts(f))
}
pub(super) fn elects(f: &Facts) -> Need {
    need(
        f.caps.election,
        "election = false: the driver stores no holder's value and watches no name",
    )?;
    fencing(f)
}
pub(super) fn elects_and_lost_ttl(f: &Facts) -> Need {
    elects(f).and(lost_ttl(f))
}
pub(super) fn elects_and_counts(f: &Facts) -> Need {
    elects(f).and(counts(f))
}
pub(super) fn elects_and_ends(f: &Facts) -> Need {
    elects(f)?;
    need(
        f.caps.per_lock_ttl || f.can_break,
        "locks have no TTL of their own and the harness cannot break one",
    )
}
