//! The backend half of a held etcd lock: renew (keep-alive, then a key check; the key moves
//! to a new lease after a leader change), release (compare on `create_revision`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use lock_core::driver::{lease_end, retry_in_background, LeaseOps};
use lock_core::{Error, LockName, Result};

use crate::client::{call, malformed, txn_call, Cluster, Resend};
use crate::grant::rehome;
use crate::revoke::spawn_revoke;
use crate::shared::Read;
use crate::term::{Alive, Tenure};
use crate::waiting::keep_alive;

/// How long after a shared-lease lock's validity its reaper deletes the key: past it, so that
/// a renewal answered at the last instant is seen first.
const REAPER_MARGIN: Duration = Duration::from_millis(50);

/// Reads in one batched renewal transaction: etcd's default `--max-txn-ops`.
const MAX_READS: usize = 128;

pub(crate) struct EtcdLeaseOps {
    pub(crate) cluster: Arc<Cluster>,
    /// The lease the key is on now, the term its validity rests on, and that validity as last
    /// confirmed (for reuse as a spare after release; the reaper's clock on a shared lease).
    pub(crate) tenure: Arc<parking_lot::Mutex<Tenure>>,
    /// Set once released: the reaper has nothing left to do.
    released: Arc<AtomicBool>,
    /// Held while the key moves to a lease of a new term: renewals that land together move
    /// it once.
    pub(crate) moving: tokio::sync::Mutex<()>,
    pub(crate) ttl: Duration,
    pub(crate) key: String,
    pub(crate) rev: i64,
    pub(crate) name: LockName,
}

impl EtcdLeaseOps {
    /// The lease of the lock granted to `key` (created at `rev`) on `tenure`, of `ttl`. On a
    /// shared lease, with its reaper.
    pub(crate) fn new(
        cluster: &Arc<Cluster>,
        tenure: Tenure,
        ttl: Duration,
        key: String,
        rev: i64,
        name: &LockName,
    ) -> Self {
        let ops = EtcdLeaseOps {
            cluster: cluster.clone(),
            tenure: Arc::new(parking_lot::Mutex::new(tenure)),
            released: Arc::default(),
            moving: tokio::sync::Mutex::new(()),
            ttl,
            key,
            rev,
            name: name.clone(),
        };
        if cluster.config.shared_lease() {
            cluster.shared.enroll(&ops.key, tenure.id, ttl);
            ops.spawn_reaper();
        }
        ops
    }

    /// On a shared lease, which other locks keep alive, this lock's key would outlive the
    /// lock: once its validity has passed without a renewal (lost, abandoned, or released
    /// without an answer), a task deletes it, as its own lease's expiry would have. Lost is
    /// final by then (`LeaseTracker`: no renewal answered after `valid_until` brings a lease
    /// back), so the deletion never pulls the key from under a holder. The task ends with the
    /// deletion, or at the release.
    fn spawn_reaper(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime, no renewals either: as the lease's own expiry, later
        };
        let (c, tenure, released) = (
            self.cluster.clone(),
            self.tenure.clone(),
            self.released.clone(),
        );
        let (key, rev, ttl) = (self.key.clone(), self.rev, self.ttl);
        rt.spawn(async move {
            let mut until = tenure.lock().valid_until;
            loop {
                tokio::time::sleep_until((until + REAPER_MARGIN).into()).await;
                if released.load(Ordering::SeqCst) {
                    return;
                }
                let now = tenure.lock().valid_until;
                if now <= until {
                    break;
                }
                until = now;
            }
            tracing::debug!(key, "lock ended unreleased: its key is deleted");
            c.shared.leave(&key);
            // Sent again after a failure for a TTL (as a revoke is, until the lease would
            // have expired by itself).
            retry_in_background(Instant::now() + ttl, move || {
                let (c, key) = (c.clone(), key.clone());
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        rev,
                    )])
                    .and_then([TxnOp::delete(key.as_str(), None)]);
                async move { txn_call(&c.config, &c.client, txn).await.map(|_| ()) }
            });
        });
    }

    /// What a renewal of lease `held` (asked at `start`) concludes from a keep-alive `alive`
    /// and then a read of the key that found `found` (its `create_revision` and lease) in
    /// `term`.
    async fn confirm(
        &self,
        held: Tenure,
        start: Instant,
        alive: Alive,
        found: Option<(i64, i64)>,
        term: u64,
    ) -> Result<Instant> {
        let Some((_, lease)) = found.filter(|(rev, _)| *rev == self.rev) else {
            return Err(Error::not_held(&self.name));
        };
        if lease != held.id {
            // Moved by a renewal beside this one, or by someone else.
            let _moving = self.moving.lock().await;
            let now = self.tenure();
            return if now.id == lease {
                Ok(now.valid_until)
            } else {
                Err(Error::not_held(&self.name))
            };
        }
        if term == 0 || term != held.term {
            return self.move_key(held.id).await;
        }
        let until = lease_end(alive.since.min(start), alive.ttl);
        {
            let mut tenure = self.tenure.lock();
            if tenure.id == held.id {
                tenure.valid_until = until;
            }
        }
        if self.cluster.config.shared_lease() {
            // Confirmed in its term: what the next acquisition on the lease may count on.
            self.cluster.shared.confirmed(held.id, until);
            self.cluster
                .shared
                .renewed(&self.key, alive.since.min(start));
        }
        Ok(until)
    }

    fn tenure(&self) -> Tenure {
        *self.tenure.lock()
    }

    /// Moves the key onto a lease of the current term, unless a renewal beside this one did
    /// already (its lease is not `from` any more).
    async fn move_key(&self, from: i64) -> Result<Instant> {
        let _moving = self.moving.lock().await;
        let now = self.tenure();
        if now.id != from {
            return Ok(now.valid_until);
        }
        let moved = rehome(&self.cluster, &self.key, self.rev, from, self.ttl).await?;
        let tenure = moved.ok_or_else(|| Error::not_held(&self.name))?;
        *self.tenure.lock() = tenure;
        if self.cluster.config.shared_lease() {
            // Read with its new lease's keys from now on.
            self.cluster.shared.enroll(&self.key, tenure.id, self.ttl);
        }
        Ok(tenure.valid_until)
    }
}

#[async_trait]
impl LeaseOps for EtcdLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.key.clone())
    }

    /// A keep-alive, then a read of the key (after it, not beside it: the read's term says
    /// which leader answered the keep-alive, `term.rs`). In the lease's own term the validity
    /// moves on; after a leader change the key moves to a lease of the new term instead.
    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let held = self.tenure();
        let (config, client) = (&self.cluster.config, &self.cluster.client);
        let limit = config.request_timeout();
        let alive = keep_alive(&self.cluster, held.id, self.ttl, limit)
            .await?
            .ok_or_else(|| Error::not_held(&self.name))?;
        let key = self.key.as_str();
        let read = call(config, client, limit, Resend::Refused, |mut c| async move {
            c.get(key, Some(GetOptions::new().with_keys_only())).await
        })
        .await?;
        let term = self.cluster.observe(read.header());
        let found = read
            .kvs()
            .first()
            .map(|kv| (kv.create_revision(), kv.lease()));
        self.confirm(held, start, alive, found, term).await
    }

    /// The watchdog's renewal. On a shared lease, the reads of every lock's key on it go in
    /// one transaction (`shared.rs`): an answer such a read got for this key less than a
    /// quarter of the TTL ago, after a keep-alive of this key's lease, is taken as this
    /// renewal's, and nothing is sent; else this renewal sends the keep-alive and the read for
    /// them all.
    async fn renew_due(&self) -> Result<Instant> {
        let c = &self.cluster;
        if !c.config.shared_lease() {
            return self.renew().await;
        }
        let start = Instant::now();
        let held = self.tenure();
        let fresh = start.checked_sub(self.ttl / 4).unwrap_or(start);
        if let Some(r) = c.shared.read_since(&self.key, held.id, fresh) {
            return self.confirm(held, start, r.alive, r.found, r.term).await;
        }
        let limit = c.config.request_timeout();
        let batch = loop {
            let ended = c.shared.batch_ended();
            if let Some(batch) = c.shared.batch(held.id, &self.key, MAX_READS) {
                break batch;
            }
            // In a batch in flight: its answer, or its end (bounded by its own requests'
            // timeouts), then look again.
            let _ = tokio::time::timeout(limit * 2, ended).await;
            if let Some(r) = c.shared.read_since(&self.key, held.id, fresh) {
                return self.confirm(held, start, r.alive, r.found, r.term).await;
            }
        };
        let keys = &batch.keys;
        let alive = keep_alive(c, held.id, self.ttl, limit)
            .await?
            .ok_or_else(|| Error::not_held(&self.name))?;
        let sent = Instant::now();
        let ops: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(k.as_str(), Some(GetOptions::new().with_keys_only())))
            .collect();
        let read = call(&c.config, &c.client, limit, Resend::Refused, |mut cl| {
            let txn = Txn::new().and_then(ops.clone());
            async move { cl.txn(txn).await }
        })
        .await?;
        let term = c.observe(read.header());
        let mut mine = None;
        for (key, op) in keys.iter().zip(read.op_responses()) {
            let TxnOpResponse::Get(g) = op else {
                return Err(malformed("renew"));
            };
            let found = g.kvs().first().map(|kv| (kv.create_revision(), kv.lease()));
            let r = Read {
                found,
                term,
                sent,
                alive,
                kept: held.id,
            };
            c.shared.record(key, r);
            if *key == self.key {
                mine = Some(found);
            }
        }
        let found = mine.ok_or_else(|| malformed("renew"))?;
        self.confirm(held, start, alive, found, term).await
    }

    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        crate::election::proclaim(&self.cluster, &self.key, self.rev, &self.name, value).await
    }

    async fn release(&self, _valid_until: Instant) -> Result<()> {
        // Delete the key only if it is still this grant's; then drop the lease.
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::delete(self.key.as_str(), None)]);
        let inner = &self.cluster;
        let resp = txn_call(&inner.config, &inner.client, txn).await?;
        let tenure = self.tenure();
        // The lease now guards nothing: keep it for the next lock, or revoke it (sent again
        // after a failure, as every revoke of this driver, until it would have expired). A
        // shared lease stays: it holds other locks, or the next one.
        if inner.config.shared_lease() {
        } else if !(resp.succeeded() && inner.spares.put(self.ttl, tenure)) {
            spawn_revoke(self.cluster.clone(), tenure.id, tenure.valid_until);
        }
        self.released.store(true, Ordering::SeqCst);
        if inner.config.shared_lease() {
            inner.shared.leave(&self.key);
        }
        if resp.succeeded() {
            Ok(())
        } else {
            Err(Error::not_held(&self.name))
        }
    }
}
