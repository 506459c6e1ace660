//! Keep-alive streams kept open, one per lease, for the lease's next keep-alive.
//!
//! etcd-client binds a keep-alive stream to one lease, and opening one costs a gRPC stream.
//! Opened and dropped at every renewal, the streams are reset by the client at a rate of one
//! per renewal: at a few thousand held locks the client's HTTP/2 layer counted a thousand of
//! those resets as its own errors and closed the connection, failing every request on it
//! (BENCHMARKS.md, "Holding many locks: every backend"). Kept open, a lease's keep-alives after
//! its first one open no stream.
//!
//! A kept stream is taken out of the table for an exchange (a request and its answer) and put
//! back only once the answer is read: an exchange cut short (cancelled, timed out, failed)
//! drops the stream with it, so an answer is never read as that of a later request.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

/// The streams kept, by lease id.
#[derive(Default)]
pub(crate) struct Keepers(parking_lot::Mutex<HashMap<i64, Kept>>);

struct Kept {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
    /// The lease's TTL, and when the stream was last used: one unused for two TTLs belongs
    /// to a lease that ended without a revoke (abandoned, lost) and is dropped.
    ttl: Duration,
    used: Instant,
}

/// What a kept stream said of one keep-alive.
pub(crate) enum Exchange {
    /// No stream is kept for the lease (or it had ended): open one.
    None,
    /// The lease lives (its TTL starts again).
    Alive,
    /// The lease is gone (expired or revoked).
    Gone,
    /// The stream failed (the connection broke, the member lost its leader): open another.
    Failed(etcd_client::Error),
}

impl Keepers {
    /// One keep-alive of lease `id` on its kept stream. Cancel-safe: the stream is out of the
    /// table while the exchange runs, and goes back only after its answer.
    pub(crate) async fn exchange(&self, id: i64) -> Exchange {
        let Some(mut kept) = self.0.lock().remove(&id) else {
            return Exchange::None;
        };
        if let Err(e) = kept.keeper.keep_alive().await {
            return Exchange::Failed(e);
        }
        match kept.stream.message().await {
            Ok(Some(answer)) if answer.ttl() > 0 => {
                kept.used = Instant::now();
                self.0.lock().insert(id, kept);
                Exchange::Alive
            }
            Ok(Some(_)) => Exchange::Gone,
            Ok(None) => Exchange::None,
            Err(e) => Exchange::Failed(e),
        }
    }

    /// Keeps the stream etcd-client opened for lease `id` (of `ttl`), its first answer read,
    /// for the lease's next keep-alive; drops the streams of leases that stopped being kept
    /// alive.
    pub(crate) fn keep(
        &self,
        id: i64,
        ttl: Duration,
        keeper: LeaseKeeper,
        stream: LeaseKeepAliveStream,
    ) {
        let now = Instant::now();
        let mut kept = self.0.lock();
        kept.retain(|_, k| now.saturating_duration_since(k.used) < k.ttl * 2);
        kept.insert(
            id,
            Kept {
                keeper,
                stream,
                ttl,
                used: now,
            },
        );
    }

    /// The lease `id` is revoked (or about to be): its stream goes.
    pub(crate) fn forget(&self, id: i64) {
        self.0.lock().remove(&id);
    }
}
