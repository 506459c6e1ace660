//! `distlock status`: is the lock held, by whom (every holder: shared ones, permits), with
//! which token, for how long.

use std::io::Write;
use std::time::Duration;

use distlock::{DistributedLock, Error, HolderInfo, LockName, LockOptions, Mode};

use crate::cli::StatusArgs;
use crate::exit::{say, Failure, EX_FREE, EX_IOERR};
use crate::target::Secrets;

pub(crate) async fn status(a: StatusArgs, secrets: &Secrets) -> u8 {
    let (locks, name) = match crate::connect(&a.target).await {
        Ok(x) => x,
        Err(f) => return f.report(secrets),
    };
    let holders = match locks.holders(&name).await {
        Ok(holders) => holders,
        // Backends that cannot inspect (third-party drivers may not): probe with a non-waiting
        // acquisition.
        Err(Error::Unsupported { .. }) => match probe(locks.as_ref(), &name).await {
            Ok(true) => vec![HolderInfo::new(None, None)],
            Ok(false) => vec![],
            Err(error) => return query_failed(error).report(secrets),
        },
        Err(error) => return query_failed(error).report(secrets),
    };
    let answer = if a.json {
        json(&name, locks.backend(), &holders)
    } else {
        sentence(&name, locks.backend(), &holders)
    };
    // A closed stdout is a status nobody read: say so in the exit status, not by a panic.
    let mut out = std::io::stdout();
    match out.write_all(answer.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) if a.exit_code && holders.is_empty() => EX_FREE,
        Ok(()) => 0,
        Err(e) => {
            say(secrets, &format!("cannot write the answer: {e}"));
            EX_IOERR
        }
    }
}

/// One JSON object: the newest holder's fields at the top (as before the lock family), and
/// every holder in `holders`.
fn json(name: &LockName, backend: &str, holders: &[HolderInfo]) -> String {
    let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let newest = holders.last();
    let each: Vec<serde_json::Value> = (holders.iter())
        .map(|h| {
            serde_json::json!({
                "mode": mode_name(h.mode),
                "permits": h.mode.limit().filter(|_| matches!(h.mode, Mode::Permits(_))),
                "fencing_token": h.fencing_token.map(|t| t.get()),
                "foreign_holder": h.foreign,
                "remaining_ms": ms(h.remaining),
            })
        })
        .collect();
    let value = serde_json::json!({
        "name": name.as_str(),
        "backend": backend,
        "state": if holders.is_empty() { "free" } else { "held" },
        "fencing_token": newest.and_then(|h| h.fencing_token).map(|t| t.get()),
        "foreign_holder": newest.is_some_and(|h| h.foreign),
        "remaining_ms": ms(newest.and_then(|h| h.remaining)),
        "holders": each,
    });
    format!("{value}\n")
}

/// `exclusive`, `shared` or `permit`.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Shared => "shared",
        Mode::Permits(_) => "permit",
        _ => "exclusive",
    }
}

/// `NAME: held (BACKEND backend, DETAILS)`, or `free`; one holder's details as before the lock
/// family, several holders' each after its mode.
fn sentence(name: &LockName, backend: &str, holders: &[HolderInfo]) -> String {
    let details = |h: &HolderInfo| {
        let mut d = Vec::new();
        if h.foreign {
            d.push("held by another client".to_string());
        }
        if let Some(t) = h.fencing_token {
            d.push(format!("fencing token {t}"));
        }
        if let Some(r) = h.remaining {
            d.push(format!(
                "{} left",
                humantime::format_duration(crate::round_ms(r))
            ));
        }
        d
    };
    let said = match holders {
        [] => format!("free ({backend} backend)"),
        [h] if h.mode == Mode::Exclusive => {
            let d = details(h);
            if d.is_empty() {
                format!("held ({backend} backend)")
            } else {
                format!("held ({backend} backend, {})", d.join(", "))
            }
        }
        many => {
            let each: Vec<String> = (many.iter())
                .map(|h| [vec![h.mode.to_string()], details(h)].concat().join(", "))
                .collect();
            format!(
                "held ({backend} backend, {} holder{}: {})",
                many.len(),
                if many.len() == 1 { "" } else { "s" },
                each.join("; ")
            )
        }
    };
    format!("{name}: {said}\n")
}

/// Held (`true`) or free, by trying to take the lock without waiting and letting go at once.
async fn probe(locks: &dyn DistributedLock, name: &LockName) -> distlock::Result<bool> {
    let ttl = locks.capabilities().min_ttl.max(Duration::from_secs(1));
    match locks.try_acquire(name, &LockOptions::new(ttl)).await? {
        Some(lease) => {
            if let Err(e) = lease.release().await {
                tracing::warn!(error = %e, "releasing the status probe failed");
            }
            Ok(false)
        }
        None => Ok(true),
    }
}

fn query_failed(error: Error) -> Failure {
    Failure::Lock {
        what: "cannot query the lock".into(),
        error,
    }
}
