//! `EtcdLock`: a lease per lock, a revision-ordered queue, a watch on the predecessor.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use lock_core::driver::{drift, scrub, Grant, LeaseOps, ManagedLease};
use lock_core::{
    Capabilities, Deadline, DistributedLock, Error, Fencing, FencingToken, Lease, LockName,
    LockOptions, Result,
};

use crate::EtcdConfig;

const BACKEND: &str = "etcd";

/// An etcd lock client. Cheap to clone (one gRPC channel, shared).
///
/// Each acquisition grants its own lease (TTL rounded *up* to whole seconds, and at least the
/// server's minimum, which `connect` measures) and puts `<prefix>/<name>/<lease-hex>` with it,
/// only if that key does not exist. The key with the lowest `create_revision` under the name
/// holds the lock; every other contender watches the deletion of the key just before its own,
/// so a release wakes exactly one waiter and waiters are served in revision order (FIFO).
///
/// **Waiting keeps the lease alive**: a waiter sends one keep-alive every third of its TTL and
/// nothing else; if its lease cannot be kept alive (or its key vanished), `acquire` fails with
/// `Lost` — it is never granted a lock on an expired lease. A cancelled or timed-out `acquire`
/// revokes its lease, so no key of it stays in the queue.
///
/// **Renew** sends a keep-alive and reads the lock key in parallel (one round trip): a lock key
/// deleted behind the holder's back (an operator, a `break`) is `NotHeld`, not a silent renewal
/// of a lease that guards nothing. **Release** deletes the key only if it is still this
/// grant's (compare on `create_revision`); a bare `LeaseRevoke` could not say `NotHeld`, as it
/// succeeds even when the key is gone.
///
/// **Lease reuse**: a released lease guards nothing; instead of revoking it, the client keeps
/// it (up to 64) for its next acquisition with the same TTL. That saves a grant and a revoke
/// — two consensus writes — per lock; a lease still serves one lock at a time, and a spare
/// that expired is replaced by a new grant. A spare with ≥ 90 % of its TTL still ahead is used
/// as it is (the new lock's `valid_until` is what is left of it, never more); an older one is
/// kept alive in parallel with the put. Leases of failed releases and of cancelled
/// acquisitions are revoked.
///
/// **Fencing**: the key's `create_revision`, strictly increasing across the whole cluster.
#[derive(Clone)]
pub struct EtcdLock {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    spares: Arc<Spares>,
    config: EtcdConfig,
    caps: Capabilities,
}

impl EtcdLock {
    /// Connects, authenticates if configured, and checks that the cluster answers a
    /// linearizable read (etcd-client's own `connect` does no I/O without credentials).
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout())
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2))
            // Fail fast on a member cut off from its leader instead of hanging on it.
            .with_require_leader(true);
        if let Some((u, p)) = config.credentials() {
            opts = opts.with_user(u, p).with_auto_token_refresh(true);
        }
        let mut endpoints = config.endpoints().to_vec();
        if config.is_tls() {
            opts = with_tls(opts, &config).await?;
            endpoints = endpoints
                .into_iter()
                .map(|e| match e.split_once("://") {
                    Some((_, rest)) => format!("https://{rest}"),
                    None => format!("https://{e}"),
                })
                .collect();
        }
        let limit = config.connect_timeout();
        let client = tokio::time::timeout(limit, Client::connect(endpoints, Some(opts)))
            .await
            .map_err(|_| {
                Error::unavailable(
                    BACKEND,
                    format!("no answer from {} within {limit:?}", config.redacted_url()),
                )
            })?
            .map_err(|e| connect_error(e, &config))?;
        // Health: a linearizable read needs a leader and a quorum.
        let prefix = config.prefix();
        call(&config, &client, limit, |mut c| async move {
            c.get(prefix, Some(GetOptions::new().with_count_only()))
                .await
        })
        .await
        .map_err(|e| match e {
            Error::Unavailable { .. } => Error::unavailable(
                BACKEND,
                format!(
                    "{} does not answer reads (no leader or no quorum?)",
                    config.redacted_url()
                ),
            ),
            e => e,
        })?;
        // The server raises short leases to its minimum TTL; measure it so that validation and
        // `ttl()` report what the server will actually enforce.
        let probe = call(&config, &client, limit, |mut c| async move {
            c.lease_grant(1, None).await
        })
        .await?;
        let probe_id = probe.id();
        let _ = call(&config, &client, limit, |mut c| async move {
            c.lease_revoke(probe_id).await
        })
        .await;
        let min_ttl = Duration::from_secs(u64::try_from(probe.ttl()).unwrap_or(1).max(1));
        Ok(EtcdLock {
            inner: Arc::new(Inner {
                client,
                spares: Arc::default(),
                caps: Capabilities::new()
                    .with_fencing(Fencing::Strict)
                    .with_inspect(true)
                    .with_fifo(true)
                    .with_ttl_granularity(Duration::from_secs(1))
                    .with_min_ttl(min_ttl),
                config,
            }),
        })
    }

    /// [`connect`](Self::connect) from an `etcd://` URL.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(EtcdConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The underlying client (a clone: clients share one channel).
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// Runs `ops` in one etcd transaction **only while `lease` still holds its lock**: the
    /// transaction compares the lock key's `create_revision` with the lease's fencing token, so
    /// it is applied atomically with the ownership check — a holder that lost its lock (lease
    /// expired, key deleted, a successor granted) cannot write. Returns the transaction's
    /// response; [`Error::NotHeld`] (nothing applied) when the lock is no longer this lease's.
    ///
    /// Finding the lease's key costs one read before the transaction. `lease` must come from
    /// an `EtcdLock` with the same prefix; a lease without a fencing token (another backend's)
    /// is an [`Error::Unsupported`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_core::{DistributedLock, LockName, LockOptions, Deadline};
    /// use lock_etcd::{etcd_client::TxnOp, EtcdLock};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lock_core::Result<()> {
    /// let locks = EtcdLock::from_url("etcd://127.0.0.1:2379").await?;
    /// let lease = locks.acquire(&LockName::new("ledger")?, &LockOptions::new(Duration::from_secs(10))).await?;
    /// // Written only if `lease` still holds "ledger" at the moment etcd applies it.
    /// locks.guarded_txn(&*lease, [TxnOp::put("ledger/balance", "42", None)]).await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn guarded_txn(
        &self,
        lease: &dyn Lease,
        ops: impl IntoIterator<Item = TxnOp>,
    ) -> Result<etcd_client::TxnResponse> {
        let not_held = || Error::NotHeld {
            name: lease.name().clone(),
        };
        let rev = lease
            .fencing_token()
            .and_then(|t| i64::try_from(t.get()).ok())
            .ok_or(Error::Unsupported {
                backend: BACKEND,
                operation: "a guarded transaction for a lease without an etcd fencing token",
            })?;
        // The lock key of this grant: the key under the name created at revision `rev`.
        let found = self
            .keys_of(
                lease.name(),
                GetOptions::new()
                    .with_min_create_revision(rev)
                    .with_max_create_revision(rev),
            )
            .await?;
        let key = found
            .kvs()
            .iter()
            .find(|kv| kv.create_revision() == rev)
            .map(|kv| kv.key().to_vec())
            .ok_or_else(not_held)?;
        self.txn_if_owner(key, rev, ops.into_iter().collect(), lease.name())
            .await
    }

    /// `ops` if `key` still has `create_revision == rev`, else `NotHeld`: the check that makes
    /// [`guarded_txn`](Self::guarded_txn) safe even when the lock is lost after its key was
    /// looked up.
    async fn txn_if_owner(
        &self,
        key: Vec<u8>,
        rev: i64,
        ops: Vec<TxnOp>,
        name: &LockName,
    ) -> Result<etcd_client::TxnResponse> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then(ops);
        let resp = txn_call(&self.inner.config, &self.inner.client, txn).await?;
        if resp.succeeded() {
            Ok(resp)
        } else {
            Err(Error::NotHeld { name: name.clone() })
        }
    }

    /// The key a lease of `name` with lease id `lease` uses.
    fn key(&self, name: &LockName, lease: i64) -> String {
        format!("{}/{name}/{lease:016x}", self.inner.config.prefix())
    }

    fn dir(&self, name: &LockName) -> String {
        format!("{}/{name}/", self.inner.config.prefix())
    }

    /// The keys (no values) under `name`, narrowed by `opts`.
    async fn keys_of(&self, name: &LockName, opts: GetOptions) -> Result<etcd_client::GetResponse> {
        let (dir, opts) = (self.dir(name), opts.with_prefix().with_keys_only());
        self.call(|mut c| {
            let (dir, opts) = (dir.clone(), opts.clone());
            async move { c.get(dir, Some(opts)).await }
        })
        .await
    }

    async fn call<T, Fut>(&self, f: impl FnMut(Client) -> Fut) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let config = &self.inner.config;
        call(config, &self.inner.client, config.request_timeout(), f).await
    }

    /// The waiter's view after a wake-up: its own key, and the key just before it.
    async fn check(&self, name: &LockName, key: &str, rev: i64) -> Result<Position> {
        let txn = Txn::new().and_then([
            TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
            TxnOp::get(
                self.dir(name),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_max_create_revision(rev - 1)
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(1),
                ),
            ),
        ]);
        let resp = txn_call(&self.inner.config, &self.inner.client, txn).await?;
        let seen = resp.header().map_or(0, |h| h.revision());
        let ops = resp.op_responses();
        let mine = match ops.first() {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.create_revision()),
            _ => return Err(malformed("check")),
        };
        if mine != Some(rev) {
            return Ok(Position::Gone);
        }
        match ops.get(1) {
            Some(TxnOpResponse::Get(g)) => Ok(match g.kvs().first() {
                None => Position::Head,
                Some(kv) => Position::Behind {
                    pred: (kv.key().to_vec(), kv.create_revision()),
                    seen,
                },
            }),
            _ => Err(malformed("check")),
        }
    }

    /// Sleeps until the predecessor's key is deleted (or the watch breaks: the caller
    /// re-checks either way), keeping the waiter's lease alive meanwhile.
    async fn wait_for_delete(
        &self,
        (pred, pred_rev): (Vec<u8>, i64),
        seen: i64,
        lease: &mut WaitingLease,
        deadline: Deadline,
    ) -> Result<Woken> {
        // No start revision: the watch starts at the server's current one. Any start revision
        // in the past (even `seen + 1` once other keys changed) puts the watcher in etcd 3.4's
        // unsynced group, served only every 100 ms. A deletion between the check and the
        // watch's creation is caught below by looking at the predecessor once more.
        let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let watch = self.call(|mut c| {
            let (pred, opts) = (pred.clone(), opts.clone());
            async move { c.watch(pred, Some(opts)).await }
        });
        let mut stream = match watch.await {
            Ok(s) => s,
            Err(e) if e.is_retryable() => return Ok(Woken::Broken),
            Err(e) => return Err(e),
        };
        loop {
            let until_deadline = deadline.sleep();
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(resp)) if resp.created() => {
                        let at = resp.header().map_or(i64::MAX, |h| h.revision());
                        if at > seen {
                            // Deleted before the watch began? Only a definite answer counts:
                            // an unanswered re-check sends the caller round again (it looks at
                            // the whole queue), never to sleep until its deadline.
                            match self.still_there(&pred, pred_rev).await? {
                                Some(true) => {}
                                Some(false) => return Ok(Woken::Deleted),
                                None => return Ok(Woken::Broken),
                            }
                        }
                    }
                    Ok(Some(resp)) => {
                        if resp.canceled()
                            || resp.events().iter().any(|e| e.event_type() == EventType::Delete)
                        {
                            return Ok(Woken::Deleted);
                        }
                    }
                    Ok(None) | Err(_) => return Ok(Woken::Broken),
                },
                _ = tokio::time::sleep_until(lease.next_keep_alive.into()) => {
                    lease.keep_alive(self).await?;
                }
                _ = until_deadline => return Ok(Woken::Deadline),
            }
        }
    }

    /// Whether this incarnation of `key` still exists; `None` when the server did not answer
    /// (a transient error is no evidence either way).
    async fn still_there(&self, key: &[u8], rev: i64) -> Result<Option<bool>> {
        let r = self
            .call(|mut c| async move { c.get(key, Some(GetOptions::new().with_keys_only())).await })
            .await;
        match r {
            Ok(r) => Ok(Some(
                r.kvs().first().map(|kv| kv.create_revision()) == Some(rev),
            )),
            Err(e) if e.is_retryable() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Puts `key` with lease `id` if absent and reads the queue's head, in one round trip:
    /// `(create_revision, whether the key is the head)`.
    async fn put_key(&self, name: &LockName, key: &str, id: i64) -> Result<(i64, bool)> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, "", Some(PutOptions::new().with_lease(id))),
                TxnOp::get(
                    self.dir(name),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_limit(1),
                    ),
                ),
            ]);
        let resp = txn_call(&self.inner.config, &self.inner.client, txn).await?;
        if !resp.succeeded() {
            return Err(Error::backend(
                BACKEND,
                format!("key {key} already existed for a lease no lock uses"),
            ));
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        match resp.op_responses().get(1) {
            Some(TxnOpResponse::Get(g)) => Ok((
                rev,
                g.kvs().first().map(|kv| kv.key()) == Some(key.as_bytes()),
            )),
            _ => Err(malformed("acquire")),
        }
    }

    /// Enqueues a key for `name` under a lease of its own: a spare one (released by an earlier
    /// lock of this client, kept alive in the same round trip as the put) or a new grant.
    async fn enqueue(&self, name: &LockName, ttl: Duration) -> Result<Enqueued> {
        let config = &self.inner.config;
        if let Some((id, fresh_until)) = self.inner.spares.take(ttl) {
            let start = Instant::now();
            let guard = RevokeGuard {
                client: self.client(),
                id: Some(id),
            };
            let key = self.key(name, id);
            // Confirmed so recently that ≥ 90 % of its TTL is still ahead: put the key
            // without a keep-alive. The lock is then valid for what is left of the lease,
            // which `valid_until` reports exactly.
            let full = ttl.saturating_sub(drift(ttl));
            if fresh_until.saturating_duration_since(start) >= full.mul_f64(0.9) {
                if let Ok((rev, head)) = self.put_key(name, &key, id).await {
                    return Ok(Enqueued {
                        id,
                        ttl,
                        valid_until: fresh_until,
                        key,
                        rev,
                        head,
                        guard,
                    });
                }
                // Not what it seemed (it expired, or a request failed): start over below.
                drop(guard);
                return self.enqueue_new(name, ttl).await;
            }
            let (alive, put) = tokio::join!(
                keep_alive(
                    &self.inner.client,
                    config,
                    id,
                    ttl,
                    config.request_timeout()
                ),
                self.put_key(name, &key, id)
            );
            if let (Ok(Some(ttl)), Ok((rev, head))) = (alive, put) {
                return Ok(Enqueued {
                    id,
                    ttl,
                    valid_until: start + ttl.saturating_sub(drift(ttl)),
                    key,
                    rev,
                    head,
                    guard,
                });
            }
            // The spare had expired (or a request failed): the guard revokes it, which also
            // deletes a key put meanwhile; start over with a new lease.
        }
        self.enqueue_new(name, ttl).await
    }

    /// Enqueues a key for `name` under a newly granted lease.
    async fn enqueue_new(&self, name: &LockName, ttl: Duration) -> Result<Enqueued> {
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let start = Instant::now();
        let grant = self
            .call(|mut c| async move { c.lease_grant(secs, None).await })
            .await?;
        let id = grant.id();
        // Until granted, a dropped (cancelled) or failed acquisition revokes its lease, which
        // also deletes its key: no ghost stays in the queue.
        let guard = RevokeGuard {
            client: self.client(),
            id: Some(id),
        };
        let ttl = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(0)).max(ttl);
        let key = self.key(name, id);
        let (rev, head) = self.put_key(name, &key, id).await?;
        Ok(Enqueued {
            id,
            ttl,
            valid_until: start + ttl.saturating_sub(drift(ttl)),
            key,
            rev,
            head,
            guard,
        })
    }

    async fn contend(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        let Enqueued {
            id,
            ttl: granted_ttl,
            valid_until,
            key,
            rev,
            head: head_is_me,
            mut guard,
        } = self.enqueue(name, ttl).await?;
        let mut lease = WaitingLease {
            id,
            ttl: granted_ttl,
            valid_until,
            // A third of the TTL after the lease was last confirmed.
            next_keep_alive: valid_until
                .checked_sub(granted_ttl.saturating_sub(drift(granted_ttl)) * 2 / 3)
                .unwrap_or_else(Instant::now),
            name: name.clone(),
        };
        if !head_is_me {
            if deadline == Deadline::Now {
                guard.revoke_now(self).await;
                return Ok(None);
            }
            let mut woken = false;
            loop {
                if lease.valid_until <= Instant::now() {
                    return Err(lease.lost("its lease could not be kept alive while waiting"));
                }
                // After a wake-up, refresh the lease in the same round trip as the check, so
                // a waiter that is granted holds a lease with its whole TTL ahead, as an
                // uncontended grant does.
                let position = if std::mem::take(&mut woken) {
                    let (position, refreshed) =
                        tokio::join!(self.check(name, &key, rev), lease.keep_alive(self));
                    refreshed?;
                    position
                } else {
                    self.check(name, &key, rev).await
                };
                let (pred, seen) = match position {
                    Ok(Position::Head) => break,
                    Ok(Position::Gone) => {
                        return Err(lease.lost("its key vanished while waiting (lease expired?)"))
                    }
                    Ok(Position::Behind { pred, seen }) => (pred, seen),
                    Err(e) if e.is_retryable() => {
                        // Transient: keep the lease alive and try again shortly.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if Instant::now() >= lease.next_keep_alive {
                            lease.keep_alive(self).await?;
                        }
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if deadline.passed() {
                    guard.revoke_now(self).await;
                    return Ok(None);
                }
                match self
                    .wait_for_delete(pred, seen, &mut lease, deadline)
                    .await?
                {
                    Woken::Deleted => woken = true,
                    Woken::Broken => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        woken = true;
                    }
                    Woken::Deadline => {
                        guard.revoke_now(self).await;
                        return Ok(None);
                    }
                }
            }
        }
        guard.id = None;
        let ops = EtcdLeaseOps {
            client: self.client(),
            config: self.inner.config.clone(),
            spares: self.inner.spares.clone(),
            valid_until: std::sync::Mutex::new(lease.valid_until),
            id,
            ttl: granted_ttl,
            key,
            rev,
            name: name.clone(),
        };
        Ok(Some(Box::new(ManagedLease::new(
            name.clone(),
            Grant {
                token: Some(FencingToken::new(u64::try_from(rev).unwrap_or(0))),
                ttl: granted_ttl,
                valid_until: lease.valid_until,
            },
            opts.renewal,
            ops,
        ))))
    }
}

/// A contender's key in the queue.
struct Enqueued {
    id: i64,
    /// The lease's TTL.
    ttl: Duration,
    /// End of the lease's validity as last confirmed.
    valid_until: Instant,
    key: String,
    /// The key's `create_revision`.
    rev: i64,
    /// Whether the key is the oldest (holds the lock).
    head: bool,
    guard: RevokeGuard,
}

/// Leases whose lock was released, for the next acquisition of the same TTL: reusing one
/// saves a grant and a revoke (two consensus writes) per lock. A spare has no key; one that
/// expires in the pool costs nothing.
#[derive(Default)]
struct Spares(std::sync::Mutex<Vec<(i64, Duration, Instant)>>);

impl Spares {
    const MAX: usize = 64;

    /// A spare of this TTL that should still be alive, if any, and its validity.
    fn take(&self, ttl: Duration) -> Option<(i64, Instant)> {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let soon = Instant::now() + Duration::from_millis(200);
        v.retain(|(_, _, fresh_until)| *fresh_until > soon);
        let i = v.iter().rposition(|(_, t, _)| *t == ttl)?;
        let (id, _, fresh_until) = v.swap_remove(i);
        Some((id, fresh_until))
    }

    /// Keeps `id` for reuse; `false` if the pool is full (the caller revokes it).
    fn put(&self, id: i64, ttl: Duration, fresh_until: Instant) -> bool {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() >= Self::MAX {
            return false;
        }
        v.push((id, ttl, fresh_until));
        true
    }
}

enum Position {
    /// The contender's key is the oldest: it holds the lock.
    Head,
    /// Another key is older; `seen` is the revision the answer was read at.
    /// `pred` is the key just before (name and `create_revision`: a client that reuses a
    /// lease for the same name puts a key of the same name again, a different incarnation).
    Behind { pred: (Vec<u8>, i64), seen: i64 },
    /// The contender's key is gone (its lease expired or was revoked).
    Gone,
}

enum Woken {
    Deleted,
    Broken,
    Deadline,
}

/// A waiter's lease, kept alive while it waits.
struct WaitingLease {
    id: i64,
    ttl: Duration,
    valid_until: Instant,
    next_keep_alive: Instant,
    name: LockName,
}

impl WaitingLease {
    async fn keep_alive(&mut self, lock: &EtcdLock) -> Result<()> {
        let start = Instant::now();
        let left = self.valid_until.saturating_duration_since(start);
        match keep_alive(
            &lock.inner.client,
            &lock.inner.config,
            self.id,
            self.ttl,
            left,
        )
        .await
        {
            Ok(Some(ttl)) => {
                self.ttl = ttl;
                self.valid_until = start + ttl.saturating_sub(drift(ttl));
                self.next_keep_alive = start + ttl / 3;
                Ok(())
            }
            Ok(None) => Err(self.lost("its lease expired while waiting")),
            Err(e) if e.is_retryable() && Instant::now() < self.valid_until => {
                // Try again soon, but never past the lease's validity.
                self.next_keep_alive = Instant::now() + Duration::from_millis(100);
                Ok(())
            }
            Err(_) => Err(self.lost("its lease could not be kept alive while waiting")),
        }
    }

    fn lost(&self, why: &str) -> Error {
        Error::Lost {
            name: self.name.clone(),
            reason: format!("not granted: {why}"),
        }
    }
}

/// One keep-alive round trip: `Some(ttl)` if the lease lives (a keep-alive resets it to its
/// granted TTL), `None` if the server says it is gone.
///
/// etcd-client's `lease_keep_alive` opens the stream, sends one request and consumes its answer
/// itself (failing with "lease not found" when the TTL is ≤ 0), so opening it *is* the round
/// trip; the stream is then dropped.
async fn keep_alive(
    client: &Client,
    config: &EtcdConfig,
    id: i64,
    ttl: Duration,
    limit: Duration,
) -> Result<Option<Duration>> {
    let mut c = client.clone();
    let limit = limit.min(config.request_timeout());
    match tokio::time::timeout(limit, c.lease_keep_alive(id)).await {
        Ok(Ok(_)) => Ok(Some(ttl)),
        Ok(Err(etcd_client::Error::LeaseKeepAliveError(m))) if m.contains("not found") => Ok(None),
        Ok(Err(e)) => Err(map_error(e, config)),
        Err(_) => Err(Error::unavailable(
            BACKEND,
            format!(
                "no keep-alive answer from {} within {limit:?}",
                config.redacted_url()
            ),
        )),
    }
}

/// Revokes a contender's lease if the acquisition ends without a grant.
struct RevokeGuard {
    client: Client,
    id: Option<i64>,
}

impl RevokeGuard {
    async fn revoke_now(&mut self, lock: &EtcdLock) {
        if let Some(id) = self.id.take() {
            if let Err(e) = lock
                .call(|mut c| async move { c.lease_revoke(id).await })
                .await
            {
                // It expires by itself after its TTL; nothing else depends on it.
                tracing::debug!(error = %e, "revoking a waiter's lease failed");
            }
        }
    }
}

impl Drop for RevokeGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let mut c = self.client.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = c.lease_revoke(id).await;
                });
            }
        }
    }
}

#[async_trait]
impl DistributedLock for EtcdLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    async fn acquire_until(
        &self,
        name: &LockName,
        ttl: Duration,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Box<dyn Lease>>> {
        self.contend(name, ttl, opts, deadline).await
    }

    /// The oldest key under the name (the holder): its `create_revision`, and its lease's
    /// remaining TTL.
    async fn inspect(&self, name: &LockName) -> Result<Option<lock_core::HolderInfo>> {
        let head = self
            .keys_of(
                name,
                GetOptions::new()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            )
            .await?;
        let Some(kv) = head.kvs().first() else {
            return Ok(None);
        };
        let (rev, lease) = (kv.create_revision(), kv.lease());
        let ttl = self
            .call(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await
            .ok()
            .and_then(|r| u64::try_from(r.ttl()).ok())
            .map(Duration::from_secs);
        Ok(Some(lock_core::HolderInfo::new(
            u64::try_from(rev).ok().map(FencingToken::new),
            ttl,
        )))
    }
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("config", &self.inner.config)
            .field("min_ttl", &self.inner.caps.min_ttl)
            .finish()
    }
}

struct EtcdLeaseOps {
    client: Client,
    config: EtcdConfig,
    spares: Arc<Spares>,
    /// End of the lease's validity as last confirmed (for reuse as a spare after release).
    valid_until: std::sync::Mutex<Instant>,
    id: i64,
    ttl: Duration,
    key: String,
    rev: i64,
    name: LockName,
}

impl fmt::Debug for EtcdLeaseOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("key", &self.key)
            .field("lease", &format_args!("{:016x}", self.id))
            .finish()
    }
}

#[async_trait]
impl LeaseOps for EtcdLeaseOps {
    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let limit = self.config.request_timeout();
        let key = self.key.as_str();
        let key_check = call(&self.config, &self.client, limit, |mut c| async move {
            c.get(key, Some(GetOptions::new().with_keys_only())).await
        });
        let (alive, key) = tokio::join!(
            keep_alive(&self.client, &self.config, self.id, self.ttl, limit),
            key_check
        );
        let ttl = alive?.ok_or_else(|| Error::NotHeld {
            name: self.name.clone(),
        })?;
        if key?.kvs().first().map(|kv| kv.create_revision()) != Some(self.rev) {
            return Err(Error::NotHeld {
                name: self.name.clone(),
            });
        }
        let until = start + ttl.saturating_sub(drift(ttl));
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
        Ok(until)
    }

    async fn release(&self) -> Result<()> {
        // Delete the key only if it is still this grant's; then drop the lease.
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::delete(self.key.as_str(), None)]);
        let resp = txn_call(&self.config, &self.client, txn).await?;
        let valid_until = *self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        // The lease now guards nothing: keep it for the next lock, or drop it.
        if !(resp.succeeded() && self.spares.put(self.id, self.ttl, valid_until)) {
            let (mut c, id) = (self.client.clone(), self.id);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = c.lease_revoke(id).await;
                });
            }
        }
        if resp.succeeded() {
            Ok(())
        } else {
            Err(Error::NotHeld {
                name: self.name.clone(),
            })
        }
    }
}

/// TLS for every member: the configured CA, or the public roots.
#[cfg(feature = "tls")]
async fn with_tls(opts: ConnectOptions, config: &EtcdConfig) -> Result<ConnectOptions> {
    use etcd_client::{Certificate, TlsOptions};
    let tls = match config.tls_ca() {
        Some(ca) => TlsOptions::new().ca_certificate(Certificate::from_pem(ca.load().await?)),
        None => TlsOptions::new().with_enabled_roots(),
    };
    Ok(opts.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
async fn with_tls(_: ConnectOptions, _: &EtcdConfig) -> Result<ConnectOptions> {
    Err(Error::config(
        "etcd over TLS needs the `tls` feature of lock-etcd",
    ))
}

/// Runs one request within `limit`. A request that provably never left this process (the
/// connection to a dead member was refused) is sent again, which the balanced channel routes
/// to another member: it keeps a dead member's endpoint until a request fails on it.
async fn call<T, Fut>(
    config: &EtcdConfig,
    client: &Client,
    limit: Duration,
    mut f: impl FnMut(Client) -> Fut,
) -> Result<T>
where
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, f(client.clone())).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e))
                if never_sent(&e)
                    && tokio::time::Instant::now() + Duration::from_millis(20) < deadline =>
            {
                tracing::debug!(error = %scrub(&e, config.secret()), "etcd request not sent; retrying");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(Err(e)) => return Err(map_error(e, config)),
            Err(_) => {
                return Err(Error::unavailable(
                    BACKEND,
                    format!("no answer from {} within {limit:?}", config.redacted_url()),
                ))
            }
        }
    }
}

/// One `Txn` through [`call`], within the request timeout.
async fn txn_call(
    config: &EtcdConfig,
    client: &Client,
    txn: Txn,
) -> Result<etcd_client::TxnResponse> {
    call(config, client, config.request_timeout(), |mut c| {
        let txn = txn.clone(); // a re-sent request needs its own copy
        async move { c.txn(txn).await }
    })
    .await
}

/// The request failed before reaching any server (connection refused or not established).
fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect error")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

fn malformed(what: &str) -> Error {
    Error::backend(BACKEND, format!("unexpected {what} transaction response"))
}

fn connect_error(e: etcd_client::Error, config: &EtcdConfig) -> Error {
    match map_error(e, config) {
        Error::Unavailable { .. } => Error::unavailable(
            BACKEND,
            format!("cannot connect to {}", config.redacted_url()),
        ),
        other => other,
    }
}

fn map_error(e: etcd_client::Error, config: &EtcdConfig) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    let text = scrub(&e, config.secret());
    match &e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Cancelled
            | Code::Unknown => {
                Error::unavailable(BACKEND, format!("{text} ({})", config.redacted_url()))
            }
            // etcd reports a wrong password, or none where auth is on, as InvalidArgument.
            Code::InvalidArgument
                if s.message().contains("authentication failed")
                    || s.message().contains("user name is empty") =>
            {
                Error::unauthenticated(
                    BACKEND,
                    format!(
                        "etcd rejected the credentials of user {:?}: {text}",
                        config.user().unwrap_or("")
                    ),
                )
            }
            Code::Unauthenticated | Code::PermissionDenied => Error::unauthenticated(
                BACKEND,
                format!(
                    "etcd refused access for user {:?}: {text}",
                    config.user().unwrap_or("")
                ),
            ),
            _ => Error::backend(BACKEND, format!("{text} ({})", config.redacted_url())),
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            Error::unavailable(BACKEND, format!("{text} ({})", config.redacted_url()))
        }
        _ => Error::backend(BACKEND, format!("{text} ({})", config.redacted_url())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The lock is lost between `guarded_txn`'s look-up of the key and its transaction: the
    /// transaction's own compare must refuse the write (against the single etcd member of
    /// `scripts/services.sh`).
    #[tokio::test]
    async fn guarded_write_refused_when_lost_after_the_lookup() {
        let url = std::env::var("ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:12379".into());
        let locks = EtcdLock::from_url(&url)
            .await
            .expect("etcd (scripts/services.sh up etcd)");
        let name = LockName::new(format!(
            "guarded-race-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ))
        .unwrap();
        let lease = locks
            .try_acquire(&name, &LockOptions::new(Duration::from_secs(10)))
            .await
            .unwrap()
            .expect("free");
        let rev = i64::try_from(lease.fencing_token().unwrap().get()).unwrap();
        let found = locks
            .client()
            .get(locks.dir(&name), Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let key = found.kvs()[0].key().to_vec();
        // Lost right after the look-up: the key is deleted (as at lease expiry).
        locks.client().delete(key.clone(), None).await.unwrap();
        let data = format!("/distlock-guarded-data/{name}");
        let r = locks
            .txn_if_owner(
                key,
                rev,
                vec![TxnOp::put(data.as_str(), "late", None)],
                &name,
            )
            .await;
        assert!(matches!(r, Err(Error::NotHeld { .. })), "{r:?}");
        let written = locks.client().get(data.as_str(), None).await.unwrap();
        assert!(written.kvs().is_empty(), "a write after the loss landed");
        lease.abandon();
    }
}
