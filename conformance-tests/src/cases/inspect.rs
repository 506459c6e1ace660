//! `inspect`: who holds a lock, read without acquiring it.

use super::{client, held, long_opts};
use crate::{ensure, fresh_name, Failure, Harness};

/// `inspect` says free before and after, and while held reports the holder's fencing token
/// (where it reports one) and a remaining time no longer than the TTL; it never takes the
/// lock itself.
pub async fn inspect_reports_the_holder(h: &dyn Harness) -> Result<(), Failure> {
    let (a, b) = (client(h).await?, client(h).await?);
    let name = fresh_name("inspect");
    let opts = long_opts(h);
    ensure!(
        b.inspect(&name).await?.is_none(),
        "inspect reported a holder for a name never locked"
    );
    let probe = held(b.try_acquire(&name, &opts).await?, "after inspect")
        .map_err(|_| Failure("inspect left the lock taken".into()))?;
    probe.release().await?;
    let lease = held(a.try_acquire(&name, &opts).await?, "holder")?;
    let info = b
        .inspect(&name)
        .await?
        .ok_or_else(|| Failure("inspect said free while the lock is held".into()))?;
    if let (Some(seen), Some(mine)) = (info.fencing_token, lease.fencing_token()) {
        ensure!(
            seen == mine,
            "inspect reported token {seen:?}, the holder has {mine:?}"
        );
    }
    if let Some(left) = info.remaining {
        ensure!(
            left <= opts.ttl + h.timing().slack,
            "inspect reported {left:?} remaining on a {:?} lease",
            opts.ttl
        );
    }
    lease.release().await?;
    ensure!(
        b.inspect(&name).await?.is_none(),
        "inspect reported a holder after the release"
    );
    Ok(())
}
