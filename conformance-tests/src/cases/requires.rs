//! What a case needs from a driver or its harness: `Err(reason)` skips the case, and the runner
//! prints the reason.

use lock_core::Fencing;

use super::Facts;

pub(super) fn always(_: &Facts) -> Result<(), &'static str> {
    Ok(())
}
pub(super) fn ttl(f: &Facts) -> Result<(), &'static str> {
    if f.caps.per_lock_ttl {
        Ok(())
    } else {
        Err("per_lock_ttl = false: locks do not expire on their own TTL")
    }
}
pub(super) fn fencing(f: &Facts) -> Result<(), &'static str> {
    if f.caps.fencing == Fencing::None {
        Err("fencing = None")
    } else {
        Ok(())
    }
}
pub(super) fn ttl_and_fencing(f: &Facts) -> Result<(), &'static str> {
    ttl(f).and(fencing(f))
}
pub(super) fn fifo(f: &Facts) -> Result<(), &'static str> {
    if f.caps.fifo {
        Ok(())
    } else {
        Err("fifo = false")
    }
}
pub(super) fn strict_and_restart(f: &Facts) -> Result<(), &'static str> {
    if f.caps.fencing != Fencing::Strict {
        return Err("fencing is not Strict: tokens may repeat after a restart");
    }
    if f.can_restart {
        Ok(())
    } else {
        Err("harness cannot restart the backend")
    }
}
pub(super) fn fifo_and_ttl(f: &Facts) -> Result<(), &'static str> {
    fifo(f).and(ttl(f))
}
pub(super) fn inspects_and_ttl(f: &Facts) -> Result<(), &'static str> {
    inspects(f).and(ttl(f))
}
pub(super) fn counts(f: &Facts) -> Result<(), &'static str> {
    if f.counts_requests {
        Ok(())
    } else {
        Err("harness cannot count backend requests")
    }
}
pub(super) fn lost_ttl(f: &Facts) -> Result<(), &'static str> {
    ttl(f)?;
    lost_notification(f)
}
pub(super) fn lost_notification(f: &Facts) -> Result<(), &'static str> {
    if f.caps.lost_notification {
        Ok(())
    } else {
        Err("lost_notification = false")
    }
}
pub(super) fn delays(f: &Facts) -> Result<(), &'static str> {
    if f.can_delay {
        Ok(())
    } else {
        Err("harness cannot delay a client's traffic")
    }
}
pub(super) fn inspects(f: &Facts) -> Result<(), &'static str> {
    if f.caps.inspect {
        Ok(())
    } else {
        Err("inspect = false")
    }
}
pub(super) fn breakable(f: &Facts) -> Result<(), &'static str> {
    lost_notification(f)?;
    if f.can_break {
        Ok(())
    } else {
        Err("harness cannot break a lock behind its holder's back")
    }
}
