//! What the failover tests of a Sentinel deployment (`tests/sentinel.rs`) and of a Cluster
//! (`tests/cluster.rs`) share: waiting until a master's replicas
//! acknowledge its writes, killing a master until its deployment names another (with a
//! request on its way to it), and what a renewal or a release in flight must come to.

use std::future::Future;
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use lock_core::{DistributedLock, Lease, LeaseState, LockName, LockOptions};
use test_support::{kill, services};

/// A failover takes the deployment's 1 s to call the master down (the sentinels', or the
/// cluster's node timeout), a vote and a promotion: a few seconds here. Longer is a failure of
/// the deployment or of the driver to follow it.
pub(crate) const FAILOVER: Duration = Duration::from_secs(20);

/// Waits until the master `master()` names (a `redis://` URL) has `n` replicas acknowledging
/// its writes, and returns its URL: the failover tests are about following the deployment, not
/// about what asynchronous replication loses. The write (to `probe`, a key the master serves)
/// matters: `WAIT` on a connection that wrote nothing counts replicas merely attached, and one
/// just through a full resynchronisation may not acknowledge a write for a while.
pub(crate) async fn replicated<F, Fut>(master: F, probe: &str, n: i64) -> Result<String, Failed>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<String, Failed>>,
{
    let asked = Instant::now();
    loop {
        let master = master().await?;
        let patient = redis::AsyncConnectionConfig::new().set_response_timeout(Some(FAILOVER));
        let mut conn = redis::Client::open(master.as_str())?
            .get_multiplexed_async_connection_with_config(&patient)
            .await?;
        redis::cmd("INCR").arg(probe).exec_async(&mut conn).await?;
        let acked: i64 = redis::cmd("WAIT")
            .arg(n)
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if acked >= n {
            return Ok(master);
        }
        if asked.elapsed() > FAILOVER {
            return Err(format!(
                "only {acked} of {n} replicas of {master} acknowledge its writes, {FAILOVER:?} on"
            )
            .into());
        }
    }
}

/// Kills the services.sh server `name`, the master at `master` (SIGKILL, by pid), and waits
/// until `named()` (the master its deployment names now) is another.
pub(crate) async fn kill_until_replaced<F, Fut>(
    name: &str,
    master: &str,
    named: F,
) -> Result<(), Failed>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<String>>,
{
    kill("KILL", services(&["pid", name]));
    let died = Instant::now();
    while named().await.as_deref() == Some(master) {
        if died.elapsed() > FAILOVER {
            return Err(
                format!("{master} is still named master {FAILOVER:?} after its death").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// How long a request is given to leave this process before its server is killed.
const IN_FLIGHT: Duration = Duration::from_millis(300);

/// Freezes the services.sh server `name` (SIGSTOP) and starts `op` on it: after
/// [`IN_FLIGHT`], `op`'s request is on its way to a server that will not answer (the caller
/// then kills it). The freeze ends with the kill.
pub(crate) async fn sent_to_frozen<T: Send + 'static>(
    name: &str,
    op: impl Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    kill("STOP", services(&["pid", name]));
    let op = tokio::spawn(op);
    tokio::time::sleep(IN_FLIGHT).await;
    op
}

/// A lease whose renewal was in flight when its master died: that renewal may fail, but
/// only as a retryable error (nothing answered it), never as "not held"; the lease is then
/// renewed on the new master within [`FAILOVER`] and is Held.
pub(crate) async fn renewed_after_failover(
    lease: &dyn Lease,
    in_flight: lock_core::Result<()>,
) -> Result<(), Failed> {
    if let Err(e) = &in_flight {
        if !e.is_retryable() {
            return Err(
                format!("a renewal in flight when the master died failed for good: {e:?}").into(),
            );
        }
    }
    let killed = Instant::now();
    loop {
        match lease.renew().await {
            Ok(()) if lease.state() == LeaseState::Held => return Ok(()),
            Ok(()) => {}
            Err(e) if e.is_retryable() && killed.elapsed() < FAILOVER => {}
            Err(e) => {
                return Err(format!(
                    "the lease was not renewed on the new master {:?} after the failover: {e:?}",
                    killed.elapsed()
                )
                .into())
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A release that was in flight when its master died answered (an error is fine: it is sent
/// again in the background) and reached the new master: `other` is granted `name` within
/// [`FAILOVER`] of the moment the new master was `named`, long before the lease's `ttl` has
/// run out.
pub(crate) async fn released_after_failover(
    named: Instant,
    released: lock_core::Result<()>,
    other: &dyn DistributedLock,
    name: &LockName,
    ttl: Duration,
) -> Result<(), Failed> {
    if let Err(e) = &released {
        if !e.is_retryable() {
            return Err(format!("a release in flight when the master died: {e:?}").into());
        }
    }
    let opts = LockOptions::new(ttl).wait_for(ttl);
    let next = other.acquire(name, &opts).await?;
    if named.elapsed() > FAILOVER {
        return Err(format!(
            "another client was granted the lock {:?} after the new master was named (TTL \
             {ttl:?}): the release in flight was not sent again to the new master",
            named.elapsed()
        )
        .into());
    }
    next.release().await?;
    Ok(())
}
