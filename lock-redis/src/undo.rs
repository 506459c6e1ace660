//! Undoing a grant nobody will use: [`ReleaseOnDrop`] for an acquisition cancelled on its
//! way, [`release_any`] for one whose reply never came.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::Mode;

use crate::client::RedisNode;
use crate::scripts::LockKeys;

/// An acquisition whose request is on its way: if it is dropped before
/// [`disarm`](Self::disarm) — the caller's future was cancelled after the request went out —
/// it releases `token` on every node in background tasks (each bounded by `timeout`), so a
/// grant nobody will ever use does not hold the lock until its TTL.
///
/// The release goes out on the same connection as the acquire, after it, so it finds the grant
/// if there was one; a release of a token that was never granted does nothing.
pub struct ReleaseOnDrop {
    nodes: Arc<[RedisNode]>,
    keys: Arc<LockKeys>,
    token: Arc<str>,
    timeout: Duration,
    mode: Mode,
    armed: bool,
}

impl ReleaseOnDrop {
    /// Armed: dropping it releases `token` on `nodes`.
    pub fn new(
        nodes: Arc<[RedisNode]>,
        keys: Arc<LockKeys>,
        token: Arc<str>,
        timeout: Duration,
    ) -> Self {
        ReleaseOnDrop {
            nodes,
            keys,
            token,
            timeout,
            mode: Mode::Exclusive,
            armed: true,
        }
    }

    /// For a request of `mode`: a shared holder or a permit is released from its group.
    pub fn of_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The outcome is settled (granted and owned by a lease, refused, or cleaned up): dropping
    /// it does nothing.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime to send it on: the key expires by its TTL
        };
        for node in self.nodes.iter() {
            let (mut conn, keys, token) =
                (node.connection(), self.keys.clone(), self.token.clone());
            let (timeout, mode) = (self.timeout, self.mode);
            rt.spawn(async move {
                let _ = tokio::time::timeout(timeout, release_any(&mut conn, &keys, &token, mode))
                    .await;
            });
        }
    }
}

/// Releases `token`'s hold of `mode` on `keys`, whatever its fence: the release after a grant
/// whose reply never came.
pub async fn release_any<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    token: &str,
    mode: Mode,
) -> redis::RedisResult<bool> {
    match mode {
        Mode::Exclusive => crate::scripts::release(conn, keys, token).await,
        _ => crate::family::release(conn, keys, &crate::family::Held::Token(token), mode).await,
    }
}

impl fmt::Debug for ReleaseOnDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseOnDrop")
            .field("key", &self.keys.lock)
            .field("nodes", &self.nodes.len())
            .field("armed", &self.armed)
            .finish()
    }
}
