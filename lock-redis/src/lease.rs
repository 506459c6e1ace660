//! The backend half of a held Redis lock: renew and release, each one owner-checked script —
//! the lock key's for an exclusive holder, the group's member for a shared holder or a permit.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::{lease_end, LeaseOps};
use lock_core::{Error, Mode, Result};

use crate::client::RedisNode;
use crate::family::{self, Held};
use crate::renewals::{Enrolled, Found, Renewable};
use crate::scripts;

pub(crate) struct RedisLeaseOps {
    /// Behind sentinels: the node's count of failovers, as it was when the grant was asked
    /// for (see [`LeaseOps::doubts`]).
    pub(crate) doubts: Option<tokio::sync::watch::Receiver<u64>>,
    /// The keys, the owner token (exclusive) or the group member `<fence>:<token>`, the mode,
    /// the TTL, and whether an election's value key is renewed with the lock.
    pub(crate) what: Renewable,
    /// Its place among the leases that renew together (`renewals.rs`); `None` on a cluster.
    pub(crate) enrolled: Option<Enrolled>,
    pub(crate) timeout: Duration,
    pub(crate) node: RedisNode,
}

#[async_trait]
impl LeaseOps for RedisLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.what.keys.lock.clone())
    }

    fn doubts(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.doubts.clone()
    }

    async fn renew(&self) -> Result<Instant> {
        self.renewal(false).await
    }

    /// A confirmation that a request renewing other leases with this one got on its behalf
    /// since (`renewals.rs`), or a request of its own.
    async fn renew_due(&self) -> Result<Instant> {
        self.renewal(true).await
    }

    async fn proclaim(&self, value: &lock_core::LeaderValue) -> Result<()> {
        let mut conn = self.node.connection();
        let (keys, token) = (&self.what.keys, &self.what.token);
        let setting = scripts::proclaim(&mut conn, keys, token, value.as_bytes());
        match tokio::time::timeout(self.timeout, setting).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Error::not_held(&self.what.keys.name())),
            Ok(Err(e)) => Err(self.node.error(&e)),
            Err(_) => Err(self.node.unavailable("proclaim timed out")),
        }
    }

    async fn release(&self, _valid_until: Instant) -> Result<()> {
        // A release a deposed master answered (sent before the node moved) freed nothing on
        // the new one: sent again there (owner-checked, so once it did land nothing changes).
        if let Some(e) = &self.enrolled {
            e.leave(); // renewed on nobody's behalf from here
        }
        let mut tries = 0;
        loop {
            let switches = self.node.switches();
            let released = self.release_once().await;
            tries += 1;
            if self.node.switches() == switches || tries == 3 {
                return released;
            }
        }
    }
}

impl RedisLeaseOps {
    /// A renewal: the watchdog's (`due`) or one by hand. Where leases renew together, it
    /// takes a confirmation the book has for it, or sends one request for it and the leases
    /// that go with it; on a cluster, one for itself.
    async fn renewal(&self, due: bool) -> Result<Instant> {
        let Some(enrolled) = &self.enrolled else {
            let one = [(0, self.what.clone())];
            return self.send(&one, None).await;
        };
        let _one_at_a_time = enrolled.renewals().sending.lock().await;
        match enrolled.found(due, self.node.switches()) {
            Found::Confirmed(sent) => Ok(lease_end(sent, self.what.ttl)),
            Found::Refused => Err(Error::not_held(&self.what.keys.name())),
            Found::Ask => {
                let batch = enrolled.batch(&self.what, Instant::now());
                self.send(&batch, Some(enrolled)).await
            }
        }
    }

    /// One request renewing `batch` (this lease first), its answers recorded in the book.
    async fn send(&self, batch: &[(u64, Renewable)], book: Option<&Enrolled>) -> Result<Instant> {
        let start = Instant::now();
        let switches = self.node.switches();
        // The renewal and its WAIT (`wait_replicas`) in one pipeline, to one server: a
        // renewal a failover forgets would leave the lease's key to expire early on the new
        // master.
        let mut conn = self.node.acknowledged();
        let leases: Vec<_> = batch.iter().map(|(_, w)| w.renewing()).collect();
        let renewing = async {
            let renewed = crate::renewals::renew(&mut conn, &leases).await?;
            let replicated = conn.replicated();
            Ok::<_, redis::RedisError>((renewed, replicated))
        };
        let answer = tokio::time::timeout(self.timeout, renewing).await;
        let moved = self.node.switches() != switches;
        // A deposed master's answers say nothing of the new one's keys.
        if let (Some(book), Ok(Ok((renewed, replicated))), false) = (book, &answer, moved) {
            let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
            book.record(&ids, renewed, (start, switches), *replicated);
        }
        match answer {
            Ok(Ok(_)) if moved => Err(self.node.unavailable(
                "the master changed while the renewal was on its way: it confirms nothing",
            )),
            Ok(Ok((renewed, replicated))) => match (renewed.first(), replicated) {
                (Some(true), true) => Ok(lease_end(start, self.what.ttl)),
                (Some(true), false) => Err(self.node.unavailable(&format!(
                    "{} the renewal in time",
                    crate::acknowledged::short_of(self.node.config())
                ))),
                _ => Err(Error::not_held(&self.what.keys.name())),
            },
            Ok(Err(e)) => Err(self.node.error(&e)),
            Err(_) => Err(self.node.unavailable("renew timed out")),
        }
    }

    async fn release_once(&self) -> Result<()> {
        let mut conn = self.node.connection();
        let (keys, token) = (&self.what.keys, &self.what.token);
        let releasing = async {
            match self.what.mode {
                Mode::Exclusive => scripts::release(&mut conn, keys, token).await,
                mode => family::release(&mut conn, keys, &Held::Member(token), mode).await,
            }
        };
        match tokio::time::timeout(self.timeout, releasing).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Error::not_held(&self.what.keys.name())),
            Ok(Err(e)) => Err(self.node.error(&e)),
            Err(_) => Err(self.node.unavailable("release timed out")),
        }
    }
}
