//! Bad input: typed errors, no panics, no silently different keys, nothing acquired.

use std::time::Duration;

use lock_core::{Error, LockName, LockOptions, MAX_NAME_LEN, MAX_TTL};

use super::{client, held, long_opts, opts};
use crate::{ensure, fresh_name, Failure, Harness};

/// Names the contract rejects give `InvalidName`.
pub async fn rejects_bad_names(_h: &dyn Harness) -> Result<(), Failure> {
    let long = "n".repeat(MAX_NAME_LEN + 1);
    for bad in [
        "",
        long.as_str(),
        "a\nb",
        "nul\0",
        "a/b",
        "{tag}",
        "sp ace",
        "ümlaut",
        "..",
        "*",
    ] {
        match LockName::new(bad) {
            Err(Error::InvalidName { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "name {bad:?} gave {other:?}, expected InvalidName"
                )))
            }
        }
    }
    Ok(())
}

/// Every character the contract allows reaches the backend as its own key: names differing
/// in one such character are independent locks, and a name of the maximum length works.
pub async fn every_valid_name_is_its_own_key(h: &dyn Harness) -> Result<(), Failure> {
    let (a, b) = (client(h).await?, client(h).await?);
    let base = fresh_name("alpha");
    let mut names = Vec::new();
    for sep in lock_core::NAME_PUNCTUATION.chars().chain(['x', 'X', '0']) {
        names.push(LockName::new(format!("{base}{sep}k"))?);
    }
    let mut leases = Vec::new();
    for n in &names {
        leases.push(held(
            a.try_acquire(n, &long_opts(h)).await?,
            &format!("name {n}"),
        )?);
    }
    for n in &names {
        ensure!(
            b.try_acquire(n, &long_opts(h)).await?.is_none(),
            "name {n} was free while held"
        );
    }
    for l in leases {
        l.release().await?;
    }
    let max = LockName::new(format!(
        "{base}{}",
        "m".repeat(MAX_NAME_LEN - base.as_str().len())
    ))?;
    let l = held(
        a.try_acquire(&max, &opts(h)).await?,
        "a name of the maximum length",
    )?;
    ensure!(
        l.name() == &max,
        "lease reports name {} for {}",
        l.name(),
        max
    );
    l.release().await?;
    Ok(())
}

/// Zero and absurd TTLs and a zero `max_hold` give `InvalidOptions` from both `try_acquire`
/// and `acquire`, and nothing is acquired.
pub async fn rejects_bad_options_without_side_effects(h: &dyn Harness) -> Result<(), Failure> {
    let a = client(h).await?;
    let name = fresh_name("bad-opts");
    let mut bad = vec![
        LockOptions::new(Duration::ZERO),
        LockOptions::new(MAX_TTL + Duration::from_secs(1)),
        opts(h).auto_renew(Some(Duration::ZERO)),
    ];
    let min = a.capabilities().min_ttl;
    if min > Duration::from_nanos(1) {
        bad.push(LockOptions::new(min - Duration::from_nanos(1)));
    }
    for o in &bad {
        match a.try_acquire(&name, o).await {
            Err(Error::InvalidOptions(_)) => {}
            other => {
                return Err(Failure(format!(
                    "try_acquire with {o:?} gave {other:?}, expected InvalidOptions"
                )))
            }
        }
        match a.acquire(&name, &o.clone().no_wait()).await {
            Err(Error::InvalidOptions(_)) => {}
            other => {
                return Err(Failure(format!(
                    "acquire with {o:?} gave {other:?}, expected InvalidOptions"
                )))
            }
        }
    }
    let l = held(
        a.try_acquire(&name, &opts(h)).await?,
        "after rejected options (did one of them acquire?)",
    )?;
    l.release().await?;
    Ok(())
}

/// The granted TTL is never shorter than the requested one and respects the declared
/// granularity.
pub async fn effective_ttl_never_shorter(h: &dyn Harness) -> Result<(), Failure> {
    let a = client(h).await?;
    let caps = a.capabilities();
    let name = fresh_name("eff-ttl");
    let requested = h.timing().ttl + Duration::from_millis(7);
    let l = held(
        a.try_acquire(&name, &LockOptions::new(requested)).await?,
        "holder",
    )?;
    let granted = l.ttl();
    ensure!(
        granted >= requested,
        "granted TTL {granted:?} is shorter than requested {requested:?}"
    );
    let g = caps.ttl_granularity.as_nanos().max(1);
    ensure!(
        granted.as_nanos() % g == 0,
        "granted TTL {granted:?} is not a multiple of the granularity {:?}",
        caps.ttl_granularity
    );
    l.release().await?;
    Ok(())
}
