//! `distlock status`: is the lock held, by which token, for how long.

use std::io::Write;
use std::time::Duration;

use distlock::{DistributedLock, Error, LockName, LockOptions};

use crate::cli::StatusArgs;
use crate::exit::{say, Failure, EX_IOERR};
use crate::target::Secrets;

pub(crate) async fn status(a: StatusArgs, secrets: &Secrets) -> u8 {
    let (locks, name) = match crate::connect(&a.target).await {
        Ok(x) => x,
        Err(f) => return f.report(secrets),
    };
    let info = match locks.inspect(&name).await {
        Ok(info) => info.map(|h| (h.fencing_token.map(|t| t.get()), h.remaining, h.foreign)),
        // Backends that cannot inspect (third-party drivers may not): probe with a non-waiting
        // acquisition.
        Err(Error::Unsupported { .. }) => match probe(locks.as_ref(), &name).await {
            Ok(true) => Some((None, None, false)),
            Ok(false) => None,
            Err(error) => return query_failed(error).report(secrets),
        },
        Err(error) => return query_failed(error).report(secrets),
    };
    let state = if info.is_some() { "held" } else { "free" };
    let (token, remaining, foreign) = info.unwrap_or((None, None, false));
    let answer = if a.json {
        format!(
            "{}\n",
            serde_json::json!({
                "name": name.as_str(),
                "backend": locks.backend(),
                "state": state,
                "fencing_token": token,
                "foreign_holder": foreign,
                "remaining_ms": remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            })
        )
    } else {
        let mut details = Vec::new();
        if foreign {
            details.push("held by another client".to_string());
        }
        if let Some(t) = token {
            details.push(format!("fencing token {t}"));
        }
        if let Some(r) = remaining {
            details.push(format!(
                "{} left",
                humantime::format_duration(crate::round_ms(r))
            ));
        }
        let details = if details.is_empty() {
            String::new()
        } else {
            format!(", {}", details.join(", "))
        };
        format!("{name}: {state} ({} backend{details})\n", locks.backend())
    };
    // A closed stdout is a status nobody read: say so in the exit status, not by a panic.
    let mut out = std::io::stdout();
    match out.write_all(answer.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            say(secrets, &format!("cannot write the answer: {e}"));
            EX_IOERR
        }
    }
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
