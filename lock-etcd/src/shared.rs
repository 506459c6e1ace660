//! One lease for many locks ([`EtcdConfig::with_shared_lease`](crate::EtcdConfig)): the locks of
//! one client and TTL put their keys on one etcd lease, as Go's `concurrency.Session` does,
//! so N held locks cost one keep-alive per renewal period, not N, and no grant or revoke each.
//!
//! What changes against a lease per lock, and why it stays safe:
//! This file keeps the client's shared leases and coalesces their keep-alives; the steps that
//! use them are where the per-lock ones are: enqueueing in `queue.rs`, moving a key after a
//! leader change in `grant.rs`, undoing an acquisition in `revoke.rs`, the reaper in `lease.rs`.
//!
//! - **Keys**: `<lease-hex>_<seq-hex>` (`layout.rs`): one lease serves many acquisitions of one
//!   name, so the lease id alone would collide (Go's `Mutex` has that hole: two of its mutexes
//!   of one name in one session share a key, and both "hold").
//! - **Keep-alives** are coalesced: one answered less than a quarter of the TTL ago answers the
//!   next ask too, with the validity it gave (counted from when it was sent), never more. A
//!   renewal still reads its key after it, whose term vouches for the answer (`term.rs`); the
//!   watchdog's renewals (`renew_due`) read the lease's keys due soon in one transaction (up to
//!   128; several side by side over disjoint keys), and a renewal that finds such a read of its
//!   key, sent less than a quarter of the TTL ago after a keep-alive of its lease, takes it as
//!   its own; one whose key is in a batch in flight waits for that batch.
//! - **A leader change** moves each key, at its holder's next renewal, onto the client's lease
//!   of the new term (granted once, for all of them); the old lease is not revoked (other keys
//!   may still be on it) and expires once nothing keeps it alive.
//! - **An acquisition that ends without a grant** deletes its key instead of revoking the
//!   lease. A key whose put is still in flight cannot be deleted before it lands, so the undo
//!   puts a tombstone beside the name's range (on the shared lease, so it goes with it) in the
//!   same transaction that would otherwise delete the key, and every put requires its own
//!   tombstone absent: whichever lands first, no key is left behind.
//! - **A lock lost or abandoned** is deleted by its own reaper at the end of its validity, as
//!   its lease would have expired (`lease.rs`): other locks keep the shared lease alive.
//! - **What is lost together**: a shared lease that cannot be kept alive ends every lock on it;
//!   each says so with its own `Lost`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{Error, Result};

use crate::config::BACKEND;
use crate::term::{Alive, Granted, Tenure};

/// The client's shared leases, one per TTL, and what coalesces their keep-alives.
#[derive(Default)]
pub(crate) struct SharedLeases {
    by_ttl: parking_lot::Mutex<HashMap<Duration, Shared>>,
    /// One grant at a time: acquisitions that find no usable lease wait for the one granted.
    granting: tokio::sync::Mutex<()>,
    /// Numbers the acquisitions' keys.
    seq: AtomicU64,
    /// Per lease: the last keep-alive answered (one keep-alive in flight at a time).
    confirmations: parking_lot::Mutex<HashMap<i64, Slot>>,
    /// The keys of the locks held on shared leases, by key: the lease each is on, and what
    /// the last batched renewal read found of it.
    keys: parking_lot::Mutex<HashMap<String, Member>>,
    /// Told when a batched read ends: renewals whose key it was reading wait for it.
    batched: tokio::sync::Notify,
}

struct Member {
    lease: i64,
    /// When its validity was last counted from (a keep-alive's sending), and its TTL: when
    /// its watchdog will ask for the next renewal.
    confirmed: Instant,
    ttl: Duration,
    read: Option<Read>,
    /// In a batched read in flight: no other batch reads it meanwhile.
    in_batch: bool,
}

/// The keys of a batched read in flight; when it ends (answered, failed or cancelled) they are
/// free for the next, and the renewals waiting for it are told.
pub(crate) struct Batch<'a> {
    shared: &'a SharedLeases,
    pub(crate) keys: Vec<String>,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let mut keys = self.shared.keys.lock();
        for k in &self.keys {
            if let Some(m) = keys.get_mut(k) {
                m.in_batch = false;
            }
        }
        drop(keys);
        self.shared.batched.notify_waiters();
    }
}

/// What a batched renewal read found of one key (`lease.rs`, `renew_due`).
#[derive(Clone, Copy)]
pub(crate) struct Read {
    /// Its `create_revision` and lease (`None`: no such key).
    pub(crate) found: Option<(i64, i64)>,
    /// The term the read was answered in.
    pub(crate) term: u64,
    /// When the read was sent.
    pub(crate) sent: Instant,
    /// The keep-alive answered before it was sent, and of which lease.
    pub(crate) alive: Alive,
    pub(crate) kept: i64,
}

/// A shared lease: its id, term and validity as last confirmed, and its granted TTL.
#[derive(Clone, Copy)]
struct Shared {
    tenure: Tenure,
    ttl: Duration,
}

struct Slot {
    last: Arc<tokio::sync::Mutex<Option<Alive>>>,
    /// When it was last asked, and for what TTL: unused for two TTLs, it goes.
    used: Instant,
    ttl: Duration,
}

impl SharedLeases {
    /// Held while a shared lease is found or granted: acquisitions that find none usable wait
    /// for the one granted (`grant.rs`, `shared_lease`).
    pub(crate) async fn granting(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.granting.lock().await
    }

    /// The lease the locks of `ttl` share now, if it belongs to `term` (the newest this client
    /// has seen) and has half its TTL or more ahead as last confirmed: a lock put on it, or
    /// moved to it, starts with that much (a lease nobody renewed for longer is replaced).
    pub(crate) fn usable(&self, ttl: Duration, term: u64) -> Option<(Tenure, Duration)> {
        let s = self.by_ttl.lock().get(&ttl).copied()?;
        let alive = s.tenure.valid_until > Instant::now() + s.ttl / 2;
        (alive && s.tenure.term != 0 && s.tenure.term == term).then_some((s.tenure, s.ttl))
    }

    /// `granted` is the lease the locks of `ttl` share from now on.
    pub(crate) fn install(&self, ttl: Duration, granted: &Granted) -> (Tenure, Duration) {
        let shared = Shared {
            tenure: granted.tenure,
            ttl: granted.ttl,
        };
        self.by_ttl.lock().insert(ttl, shared);
        tracing::debug!(lease = granted.tenure.id, ?ttl, "shared lease granted");
        (shared.tenure, shared.ttl)
    }

    /// Lease `id` was confirmed alive, in its term, until `until`.
    pub(crate) fn confirmed(&self, id: i64, until: Instant) {
        for s in self.by_ttl.lock().values_mut() {
            if s.tenure.id == id && s.tenure.valid_until < until {
                s.tenure.valid_until = until;
            }
        }
    }

    /// Lease `id` is gone (or doubtful): the next acquisition gets another.
    pub(crate) fn forget(&self, id: i64) {
        self.by_ttl.lock().retain(|_, s| s.tenure.id != id);
    }

    /// The lock of `key`, of `ttl`, is held on lease `lease` (granted on it, or moved to it).
    pub(crate) fn enroll(&self, key: &str, lease: i64, ttl: Duration) {
        let member = Member {
            lease,
            confirmed: Instant::now(),
            ttl,
            read: None,
            in_batch: false,
        };
        self.keys.lock().insert(key.to_string(), member);
    }

    /// The lock of `key` was renewed, its validity counted from `since`.
    pub(crate) fn renewed(&self, key: &str, since: Instant) {
        if let Some(m) = self.keys.lock().get_mut(key) {
            m.confirmed = m.confirmed.max(since);
        }
    }

    /// Resolves when a batched read in flight now has ended (created before looking, so that
    /// none ends unseen).
    pub(crate) fn batch_ended(&self) -> tokio::sync::futures::Notified<'_> {
        self.batched.notified()
    }

    /// The lock of `key` ended: no batched read asks for it any more.
    pub(crate) fn leave(&self, key: &str) {
        self.keys.lock().remove(key);
    }

    /// Keys to read in one renewal of `key` on `lease`: `key` and up to `max - 1` others on
    /// that lease whose watchdogs will ask within a quarter of their TTL (while this read
    /// still answers them: a third of the TTL after their last confirmation), the most
    /// overdue first, none in another batch in flight (batches go side by side over disjoint
    /// keys). Reading the others would be wasted: their turn comes after this read is too old
    /// for them. `None` when `key` is in a batch in flight already: wait for it
    /// ([`batch_ended`](Self::batch_ended)).
    pub(crate) fn batch(&self, lease: i64, key: &str, max: usize) -> Option<Batch<'_>> {
        let mut keys = self.keys.lock();
        if keys.get(key).is_some_and(|m| m.in_batch) {
            return None;
        }
        let now = Instant::now();
        let mut others: Vec<(Instant, String)> = keys
            .iter()
            .filter(|(k, m)| m.lease == lease && !m.in_batch && k.as_str() != key)
            .filter(|(_, m)| m.confirmed + m.ttl / 3 <= now + m.ttl / 4)
            .map(|(k, m)| (m.confirmed, k.clone()))
            .collect();
        others.sort();
        let mut batch = vec![key.to_string()];
        batch.extend(
            others
                .into_iter()
                .take(max.saturating_sub(1))
                .map(|(_, k)| k),
        );
        for k in &batch {
            if let Some(m) = keys.get_mut(k) {
                m.in_batch = true;
            }
        }
        Some(Batch {
            shared: self,
            keys: batch,
        })
    }

    /// A batched read found `read` of `key`.
    pub(crate) fn record(&self, key: &str, read: Read) {
        if let Some(m) = self.keys.lock().get_mut(key) {
            m.read = Some(read);
        }
    }

    /// What a batched read found of `key` after a keep-alive of `lease`, if it was sent at
    /// `since` or later.
    pub(crate) fn read_since(&self, key: &str, lease: i64, since: Instant) -> Option<Read> {
        let keys = self.keys.lock();
        let r = keys.get(key)?.read?;
        (r.kept == lease && r.sent >= since && r.alive.since >= since).then_some(r)
    }

    /// A number for an acquisition's key, unique for this client.
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// A keep-alive of lease `id` (of `ttl`) within `limit`: the answer of one sent less than a
    /// quarter of the TTL ago, or `once`'s (given the time left), which the next asks reuse.
    /// Cancel-safe: an ask cut short leaves the last answer as it was.
    pub(crate) async fn keep_alive<F, Fut>(
        &self,
        id: i64,
        ttl: Duration,
        limit: Duration,
        once: F,
    ) -> Result<Option<Alive>>
    where
        F: FnOnce(Duration) -> Fut,
        Fut: Future<Output = Result<Option<Alive>>>,
    {
        let start = Instant::now();
        let last = {
            let mut slots = self.confirmations.lock();
            slots.retain(|_, s| {
                Arc::strong_count(&s.last) > 1
                    || start.saturating_duration_since(s.used) < s.ttl * 2
            });
            let slot = slots.entry(id).or_insert_with(|| Slot {
                last: Arc::default(),
                used: start,
                ttl,
            });
            slot.used = start;
            slot.last.clone()
        };
        let Ok(mut last) = tokio::time::timeout(limit, last.lock()).await else {
            return Err(Error::unavailable(
                BACKEND,
                format!("no keep-alive answer for a shared lease within {limit:?}"),
            ));
        };
        if let Some(alive) = *last {
            if alive.since.elapsed() < alive.ttl / 4 {
                return Ok(Some(alive));
            }
        }
        let answer = once(limit.saturating_sub(start.elapsed())).await;
        match &answer {
            Ok(Some(alive)) => *last = Some(*alive),
            Ok(None) => {
                *last = None;
                self.forget(id);
            }
            Err(_) => {}
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report
    use super::*;
    use crate::client::Resend;
    use crate::grant::shared_lease;
    use crate::layout::{shared_key, tombstone};
    use crate::revoke::undo_put;
    use crate::{EtcdConfig, EtcdLock};
    use etcd_client::PutOptions;

    /// The undo of an acquisition cut short, both ways (against the single etcd member of
    /// `scripts/services.sh`): with its key there, the key goes and no tombstone is left; with
    /// no key yet (its put still in flight), the tombstone is put, on the shared lease.
    #[tokio::test]
    async fn an_undo_deletes_the_key_or_leaves_the_tombstone() {
        let url = std::env::var("ETCD_URL")
            .unwrap_or_else(|_| test_support::servers::url("etcd://{etcd}"));
        let locks = EtcdLock::connect(EtcdConfig::from_url(&url).unwrap().with_shared_lease(true))
            .await
            .expect("etcd (scripts/services.sh up etcd)");
        let c = &locks.inner.cluster;
        let mut admin = locks.client();
        let (tenure, _) = shared_lease(c, Duration::from_secs(10)).await.unwrap();
        let name = lock_core::LockName::new(format!("undo-{}", std::process::id())).unwrap();
        let on_lease = || Some(PutOptions::new().with_lease(tenure.id));
        let exists = |got: etcd_client::GetResponse| !got.kvs().is_empty();
        for (seq, put_first) in [(1, true), (2, false)] {
            let key = shared_key(&c.config, &name, tenure.id, seq, lock_core::Mode::Exclusive);
            let tomb = tombstone(&c.config, &name, tenure.id, seq);
            if put_first {
                admin.put(key.as_str(), "", on_lease()).await.unwrap();
            }
            undo_put(c, &key, &tomb, tenure.id, Resend::Unsent)
                .await
                .unwrap();
            let key_left = exists(admin.get(key.as_str(), None).await.unwrap());
            let tomb_left = exists(admin.get(tomb.as_str(), None).await.unwrap());
            assert!(!key_left, "the undo left the key (put first: {put_first})");
            assert_eq!(tomb_left, !put_first, "tombstone (put first: {put_first})");
            let lease = admin.get(tomb.as_str(), None).await.unwrap();
            if let Some(kv) = lease.kvs().first() {
                assert_eq!(
                    kv.lease(),
                    tenure.id,
                    "the tombstone goes with the shared lease"
                );
            }
        }
        admin.lease_revoke(tenure.id).await.unwrap();
    }
}
