//! The queue of contenders: one key per contender under the lock's name, ordered by
//! `create_revision`; putting a contender's key, and finding its place.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use lock_core::driver::{drift, lease_end, queue_turn, Acquisition, Grant, ManagedLease, Turn};
use lock_core::{Deadline, Error, FencingToken, Lease, LockName, Mode, Result};

use crate::client::{malformed, txn_call, txn_on_lease, Cluster};
use crate::config::BACKEND;
use crate::grant::{grant, rehome, shared_lease};
use crate::layout::{contender, contenders, dir, key, range_up_to, shared_key, tombstone};
use crate::lease::EtcdLeaseOps;
use crate::revoke::{RevokeGuard, Undo};
use crate::term::Tenure;
use crate::waiting::{keep_alive, wait_for_delete, WaitingLease, Watched, Woken};

/// The waiter's view after a wake-up: its own key, and the key just before it; and the
/// term it was read in (`term.rs`).
pub(crate) async fn check(
    c: &Cluster,
    name: &LockName,
    key: &str,
    rev: i64,
) -> Result<(Position, u64)> {
    match check_in(c, name, key, rev, Some(1)).await? {
        Some(found) => Ok(found),
        // The key just before belongs to a nested prefix: look through the whole range.
        None => check_in(c, name, key, rev, None)
            .await?
            .ok_or_else(|| malformed("check")),
    }
}

/// [`check`], reading at most `limit` keys before `key`; `None` when the
/// keys read were all a nested prefix's, which says nothing of the queue.
async fn check_in(
    c: &Cluster,
    name: &LockName,
    key: &str,
    rev: i64,
    limit: Option<i64>,
) -> Result<Option<(Position, u64)>> {
    let dir = dir(&c.config, name);
    let before = queue(SortOrder::Descend).with_max_create_revision(rev - 1);
    let txn = Txn::new().and_then([
        TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
        TxnOp::get(
            dir.as_str(),
            Some(limit.map_or(before.clone(), |n| before.with_limit(n))),
        ),
    ]);
    let resp = txn_call(&c.config, &c.client, txn).await?;
    let seen = resp.header().map_or(0, |h| h.revision());
    let term = c.observe(resp.header());
    let ops = resp.op_responses();
    let mine = match ops.first() {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.create_revision()),
        _ => return Err(malformed("check")),
    };
    if mine != Some(rev) {
        return Ok(Some((Position::Gone, term)));
    }
    let Some(TxnOpResponse::Get(g)) = ops.get(1) else {
        return Err(malformed("check"));
    };
    let position = match g.kvs().iter().find(|kv| contender(&dir, kv.key())) {
        Some(kv) => Position::Behind {
            pred: (kv.key().to_vec(), kv.create_revision()),
            seen,
        },
        None if limit.is_some() && !g.kvs().is_empty() => return Ok(None),
        None => Position::Head,
    };
    Ok(Some((position, term)))
}

/// Where the contender with `key` (put at `rev`) stands among `older_and_me` (the contenders
/// up to it, oldest first); `seen` is the revision they were read at.
pub(crate) fn position(older_and_me: &[(&KeyValue, Mode)], key: &str, seen: i64) -> Position {
    let Some(me) = older_and_me
        .iter()
        .position(|(kv, _)| kv.key() == key.as_bytes())
    else {
        return Position::Gone;
    };
    let modes: Vec<Mode> = older_and_me[..=me].iter().map(|(_, m)| *m).collect();
    let named = |kv: &KeyValue| (kv.key().to_vec(), kv.create_revision());
    match queue_turn(&modes, me) {
        Turn::Granted => Position::Head,
        Turn::After(j) => Position::Behind {
            pred: named(older_and_me[j].0),
            seen,
        },
        Turn::AfterAny => Position::BehindAny {
            older: older_and_me[..me].iter().map(|(kv, _)| named(kv)).collect(),
            seen,
        },
        Turn::Mismatch { held } => Position::Mismatch { held },
    }
}

/// [`check`] for the lock family's modes: the contender's own key and every key up to
/// it, with values, in one transaction; and the term it was read in.
pub(crate) async fn family_check(
    c: &Cluster,
    name: &LockName,
    key: &str,
    rev: i64,
) -> Result<(Position, u64)> {
    let dir = dir(&c.config, name);
    let txn = Txn::new().and_then([TxnOp::get(dir.as_str(), Some(range_up_to(rev)))]);
    let resp = txn_call(&c.config, &c.client, txn).await?;
    let seen = resp.header().map_or(0, |h| h.revision());
    let term = c.observe(resp.header());
    let Some(TxnOpResponse::Get(g)) = resp.op_responses().into_iter().next() else {
        return Err(malformed("check"));
    };
    let queue = contenders(&dir, g.kvs());
    // Mine must be this incarnation (a reused lease puts a key of the same name again).
    let mine = queue
        .iter()
        .any(|(kv, _)| kv.key() == key.as_bytes() && kv.create_revision() == rev);
    if !mine {
        return Ok((Position::Gone, term));
    }
    Ok((position(&queue, key, seen), term))
}

/// Puts `key` for `req` (its mode in the key's name, the holder's value as the key's, as
/// `etcdctl elect` puts a proposal) with lease `id` if absent and reads the queue's head (the
/// whole queue, for the lock family's modes), in one round trip: `(create_revision, whether
/// the key holds)`, and the term it was applied in. With `tomb`, only while that key is absent
/// too (a shared lease's acquisition that ended before this put was answered puts it, so that
/// the put cannot land after: `shared.rs`).
pub(crate) async fn put_key(
    c: &Cluster,
    req: &Acquisition<'_>,
    key: &str,
    id: i64,
    tomb: Option<&str>,
) -> Result<((i64, Standing), u64)> {
    let (name, mode) = (req.name(), req.mode());
    let value = req.value().map_or(&[][..], |v| v.as_bytes());
    let read = match mode {
        Mode::Exclusive => queue_end(SortOrder::Ascend),
        _ => range_up_to(0),
    };
    let absent = |k: &str| Compare::create_revision(k, CompareOp::Equal, 0);
    let txn = Txn::new()
        .when(
            std::iter::once(key)
                .chain(tomb)
                .map(absent)
                .collect::<Vec<_>>(),
        )
        .and_then([
            TxnOp::put(key, value, Some(PutOptions::new().with_lease(id))),
            TxnOp::get(dir(&c.config, name), Some(read)),
        ]);
    let resp = txn_on_lease(&c.config, &c.client, txn, id).await?;
    if !resp.succeeded() {
        return Err(Error::backend(
            BACKEND,
            format!("key {key} already existed for a lease no lock uses"),
        ));
    }
    let rev = resp.header().map_or(0, |h| h.revision());
    let term = c.observe(resp.header());
    let ops = resp.op_responses();
    let Some(TxnOpResponse::Get(g)) = ops.get(1) else {
        return Err(malformed("acquire"));
    };
    if mode != Mode::Exclusive {
        let dir = dir(&c.config, name);
        let standing = match position(&contenders(&dir, g.kvs()), key, rev) {
            Position::Head => Standing::Holds,
            Position::Mismatch { held } => Standing::Mismatch(held),
            _ => Standing::Waits,
        };
        return Ok(((rev, standing), term));
    }
    let head = match g.kvs().first() {
        Some(kv) if !contender(&dir(&c.config, name), kv.key()) => {
            // The oldest key is a nested prefix's: is any contender's older than this one?
            matches!(check(c, name, key, rev).await?.0, Position::Head)
        }
        kv => kv.map(|kv| kv.key()) == Some(key.as_bytes()),
    };
    let standing = if head {
        Standing::Holds
    } else {
        Standing::Waits
    };
    Ok(((rev, standing), term))
}

/// Enqueues a key for `name` under a lease of its own: a spare one (released by an earlier
/// lock of this client) or a new grant.
pub(crate) async fn enqueue(c: &Arc<Cluster>, req: &Acquisition<'_>) -> Result<Enqueued> {
    let (name, ttl, mode) = (req.name(), req.ttl(), req.mode());
    let config = &c.config;
    if config.shared_lease() {
        return enqueue_shared(c, req).await;
    }
    if let Some(spare) = c.spares.take(ttl) {
        let start = Instant::now();
        let guard = RevokeGuard::new(c, spare.id, ttl);
        let key = key(&c.config, name, spare.id, mode);
        // Confirmed so recently that ≥ 90 % of its TTL is still ahead: put the key
        // without a keep-alive. The lock is then valid for what is left of the lease,
        // which `valid_until` reports exactly.
        let full = ttl.saturating_sub(drift(ttl));
        if spare.valid_until.saturating_duration_since(start) >= full.mul_f64(0.9) {
            match put_key(c, req, &key, spare.id, None).await {
                Ok((put, _)) => {
                    let lease = WaitingLease::new(name, spare, ttl);
                    return Ok(Enqueued::new(lease, key, put, guard));
                }
                // Not what it seemed (it expired, or a request failed): start over below.
                Err(e) => return start_over(c, req, guard, e).await,
            }
        }
        // A keep-alive, then the put: the put's term says which leader answered the
        // keep-alive (`term.rs`).
        let alive = keep_alive(c, spare.id, ttl, config.request_timeout()).await;
        if let Ok(Some(alive)) = alive {
            let answered = Instant::now();
            match put_key(c, req, &key, spare.id, None).await {
                Ok((put, term)) => {
                    let mut lease = WaitingLease::new(name, spare, alive.ttl);
                    lease.kept_alive(lease_end(alive.since, alive.ttl), answered);
                    lease.observed(term, answered);
                    return Ok(Enqueued::new(lease, key, put, guard));
                }
                Err(e) => return start_over(c, req, guard, e).await,
            }
        }
        // The spare had expired (or its keep-alive failed): nothing was put on it, and the
        // guard revokes it as it goes; start over with a new lease.
    }
    enqueue_new(c, req).await
}

/// After a put that failed, enqueues again on a new lease, but only once the failed one's
/// key is known gone (its undo answered): a put whose answer was lost may have landed, and a
/// new key queued behind it would wait for its own ghost (a `try_acquire` would answer "held"
/// with nobody holding). Else `failed`, and the guard keeps undoing in the background.
async fn start_over(
    c: &Arc<Cluster>,
    req: &Acquisition<'_>,
    mut guard: RevokeGuard,
    failed: Error,
) -> Result<Enqueued> {
    if guard.undone().await {
        enqueue_new(c, req).await
    } else {
        Err(failed)
    }
}

/// Enqueues a key for `req` on the client's shared lease of its TTL (`shared.rs`). A lease
/// confirmed less than 90 % of its TTL ago gets a keep-alive first (the put's term then vouches
/// for it, as for a spare); a put that fails drops the lease from use, and the key is put once
/// more on another once the failed one is known gone (as in `start_over`).
async fn enqueue_shared(c: &Arc<Cluster>, req: &Acquisition<'_>) -> Result<Enqueued> {
    let (name, mode) = (req.name(), req.mode());
    let mut failure = None;
    for _ in 0..2 {
        let (tenure, ttl) = shared_lease(c, req.ttl()).await?;
        let seq = c.shared.next_seq();
        let key = shared_key(&c.config, name, tenure.id, seq, mode);
        let tomb = tombstone(&c.config, name, tenure.id, seq);
        let start = Instant::now();
        let mut lease = WaitingLease::new(name, tenure, ttl);
        let full = ttl.saturating_sub(drift(ttl));
        let mut answered = None;
        if tenure.valid_until.saturating_duration_since(start) < full.mul_f64(0.9) {
            match keep_alive(c, tenure.id, ttl, c.config.request_timeout()).await? {
                Some(alive) => {
                    let now = Instant::now();
                    lease.kept_alive(lease_end(alive.since, alive.ttl), now);
                    answered = Some(now);
                }
                None => continue, // gone (and forgotten): nothing was put on it
            }
        }
        let undo = Undo::Key {
            key: key.clone(),
            tomb: tomb.clone(),
            lease: tenure.id,
        };
        let mut guard = RevokeGuard::with(c, undo, ttl);
        match put_key(c, req, &key, tenure.id, Some(&tomb)).await {
            Ok((put, term)) => {
                if let Some(at) = answered {
                    lease.observed(term, at);
                    c.shared.confirmed(tenure.id, lease.trusted_until);
                }
                return Ok(Enqueued::new(lease, key, put, guard));
            }
            // The put may have landed with its answer lost: put once more only once its key
            // is known gone (`start_over`), else the guard keeps undoing in the background.
            Err(e) => {
                c.shared.forget(tenure.id);
                if !guard.undone().await {
                    return Err(e);
                }
                failure = Some(e);
            }
        }
    }
    Err(failure.unwrap_or_else(|| {
        Error::unavailable(
            BACKEND,
            format!("{name} not granted: the shared lease ended twice as its key was put"),
        )
    }))
}

/// Enqueues a key for `name` under a newly granted lease.
pub(crate) async fn enqueue_new(c: &Arc<Cluster>, req: &Acquisition<'_>) -> Result<Enqueued> {
    let (name, ttl, mode) = (req.name(), req.ttl(), req.mode());
    let granted = grant(c, ttl).await?;
    let id = granted.tenure.id;
    // Until granted, a dropped (cancelled) or failed acquisition revokes its lease, which
    // also deletes its key: no ghost stays in the queue.
    let guard = RevokeGuard::new(c, id, granted.ttl);
    let key = key(&c.config, name, id, mode);
    let (put, _) = put_key(c, req, &key, id, None).await?;
    let lease = WaitingLease::new(name, granted.tenure, granted.ttl);
    Ok(Enqueued::new(lease, key, put, guard))
}

/// A contender's key in the queue, and the lease it is put with.
pub(crate) struct Enqueued {
    pub(crate) lease: WaitingLease,
    pub(crate) key: String,
    /// The key's `create_revision`.
    pub(crate) rev: i64,
    /// Whether the key is the oldest (holds the lock).
    pub(crate) standing: Standing,
    pub(crate) guard: RevokeGuard,
}

impl Enqueued {
    /// `lease`'s `key`, put at revision `rev` (`head`: it holds the lock), revoked by `guard`
    /// unless granted. (A spare confirmed earlier brings its own end of validity: it must not
    /// be counted from the put again.)
    pub(crate) fn new(
        lease: WaitingLease,
        key: String,
        (rev, standing): (i64, Standing),
        guard: RevokeGuard,
    ) -> Self {
        Enqueued {
            lease,
            key,
            rev,
            standing,
            guard,
        }
    }
}

/// Where a key stands right after it was put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// It holds the lock.
    Holds,
    /// It waits its turn.
    Waits,
    /// A key before it asks with another number of permits.
    Mismatch(u32),
}

/// The error of a request whose permits differ from an earlier contender's `held`.
fn mismatch(req: &Acquisition<'_>, held: u32) -> Error {
    Error::PermitsMismatch {
        name: req.name().clone(),
        held,
        asked: req.mode().limit().unwrap_or(0),
    }
}

pub(crate) enum Position {
    /// The contender's key is the oldest: it holds the lock.
    Head,
    /// Another key is older; `seen` is the revision the answer was read at.
    /// `pred` is the key just before (name and `create_revision`: a client that reuses a
    /// lease for the same name puts a key of the same name again, a different incarnation).
    Behind { pred: (Vec<u8>, i64), seen: i64 },
    /// Any of the keys before it may give it its turn (a permit: `older`, names and
    /// `create_revision`s); `seen` as above.
    BehindAny {
        older: Vec<(Vec<u8>, i64)>,
        seen: i64,
    },
    /// A key before it asks for another number of permits, `held`.
    Mismatch { held: u32 },
    /// The contender's key is gone (its lease expired or was revoked).
    Gone,
}

pub(crate) async fn contend(
    c: &Arc<Cluster>,
    req: Acquisition<'_>,
) -> Result<Option<Box<dyn Lease>>> {
    let (name, opts, deadline) = (req.name(), req.opts(), req.deadline());
    let Enqueued {
        mut lease,
        key,
        rev,
        standing,
        mut guard,
    } = enqueue(c, &req).await?;
    if let Standing::Mismatch(held) = standing {
        guard.revoke_now().await;
        return Err(mismatch(&req, held));
    }
    let head_is_me = standing == Standing::Holds;
    // At the head already, on a lease confirmed in its term: granted. (A spare's
    // keep-alive may have been answered in a term after the spare's own.)
    if !(head_is_me && lease.trusted_until > Instant::now()) {
        if !head_is_me && deadline == Deadline::Now {
            guard.revoke_now().await;
            return Ok(None);
        }
        let mut woken = false;
        loop {
            // After a wake-up, refresh the lease first, so that a waiter that is granted
            // holds a lease with its whole TTL ahead, as an uncontended grant does; the
            // check after it says which leader answered (`term.rs`).
            if std::mem::take(&mut woken) {
                lease.keep_alive(c, deadline).await?;
            }
            let sent = Instant::now();
            let checked = match req.mode() {
                Mode::Exclusive => check(c, name, &key, rev).await,
                _ => family_check(c, name, &key, rev).await,
            };
            let (watched, seen) = match checked {
                Ok((Position::Head, term)) => {
                    lease.observed(term, sent);
                    // Granted only on a lease confirmed to live now, in the term it
                    // belongs to (its refresh above may have gone unanswered, through an
                    // election, say).
                    if lease.trusted_until > Instant::now() {
                        break;
                    }
                    if term != lease.term {
                        // A new leader: move the key onto a lease of its term.
                        match rehome(c, &key, rev, lease.id, lease.ttl).await {
                            Ok(Some(tenure)) => {
                                guard.switch(tenure.id, lease.ttl);
                                lease = WaitingLease::new(name, tenure, lease.ttl);
                            }
                            Ok(None) => return Err(lease.failed("its key vanished at its turn")),
                            Err(e) if e.is_retryable() && !deadline.passed() => {
                                tokio::time::sleep(RECHECK).await;
                            }
                            Err(e) => return Err(e),
                        }
                        continue;
                    }
                    if deadline.passed() {
                        guard.revoke_now().await;
                        return Err(Error::unavailable(
                            BACKEND,
                            format!(
                                "{name}'s turn came, but no member confirmed the waiter's \
                                 lease before the deadline"
                            ),
                        ));
                    }
                    // Confirm it in this term: a keep-alive, then the check again.
                    let pause = lease.next_keep_alive.min(Instant::now() + RECHECK);
                    tokio::time::sleep_until(pause.into()).await;
                    woken = true;
                    continue;
                }
                Ok((Position::Gone, _)) => {
                    return Err(lease.failed("its key vanished while waiting (lease expired?)"))
                }
                Ok((Position::Behind { pred, seen }, term)) => {
                    req.queued();
                    lease.observed(term, sent);
                    (Watched::Key(pred.0, pred.1), seen)
                }
                Ok((Position::BehindAny { older, seen }, term)) => {
                    req.queued();
                    lease.observed(term, sent);
                    let dir = dir(&c.config, name);
                    (Watched::Any { dir, older }, seen)
                }
                Ok((Position::Mismatch { held }, _)) => {
                    guard.revoke_now().await;
                    return Err(mismatch(&req, held));
                }
                Err(e) if e.is_retryable() => {
                    // Transient: keep the lease alive and try again shortly.
                    tokio::time::sleep(RECHECK).await;
                    if Instant::now() >= lease.next_keep_alive {
                        lease.keep_alive(c, deadline).await?;
                    }
                    if deadline.passed() {
                        // Not a busy lock: the backend did not answer.
                        guard.revoke_now().await;
                        return Err(e);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            if deadline.passed() {
                guard.revoke_now().await;
                return Ok(None);
            }
            match wait_for_delete(c, watched, seen, &mut lease, deadline).await? {
                Woken::Deleted => woken = true,
                Woken::Broken => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    woken = true;
                }
                Woken::Deadline => {
                    guard.revoke_now().await;
                    return Ok(None);
                }
            }
        }
    }
    guard.disarm();
    // The backend's detail of the grant, in the acquisition's span (docs/observability.md).
    tracing::debug!(
        lock.etcd.revision = rev,
        lock.etcd.lease = lease.id,
        "granted at the key's create revision"
    );
    let tenure = Tenure {
        id: lease.id,
        term: lease.term,
        valid_until: lease.trusted_until,
    };
    let ops = EtcdLeaseOps::new(c, tenure, lease.ttl, key, rev, name);
    Ok(Some(Box::new(ManagedLease::new(
        name.clone(),
        Grant {
            token: Some(FencingToken::new(u64::try_from(rev).unwrap_or(0))),
            ttl: lease.ttl,
            valid_until: lease.trusted_until,
        },
        opts.renewal,
        ops,
    ))))
}

/// How soon a waiter looks again after a transient failure, or at a turn it could not
/// confirm yet.
const RECHECK: Duration = Duration::from_millis(100);

/// A name's range in creation order, keys only.
fn queue(order: SortOrder) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Create, order)
}

/// One end of a name's range, by creation: its head (`Ascend`) or its tail (`Descend`).
fn queue_end(order: SortOrder) -> GetOptions {
    queue(order).with_limit(1)
}
