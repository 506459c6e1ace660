//! The backend half of a held Redlock lock: renew and release, each a round decided at a
//! majority; the masters that have not answered yet still get the request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::driver::LeaseOps;
use lock_core::{Error, Mode, Result};
use lock_redis::raw::renewals;
use lock_redis::raw::scripts::LockKeys;
use lock_redis::raw::RedisNode;

use crate::round::{release_request, until_quorum, Round};

pub(crate) struct RedlockLeaseOps {
    pub(crate) nodes: Arc<[RedisNode]>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) token: Arc<str>,
    pub(crate) mode: Mode,
    /// A reader's member on each master that granted (`None` for a writer, and where a master
    /// did not grant): renewed there by that name.
    pub(crate) members: Arc<[Option<String>]>,
    pub(crate) ttl: Duration,
    /// The clock-drift allowance for `ttl` (see [`RedlockConfig::drift`]).
    pub(crate) drift: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) quorum: usize,
}

#[async_trait]
impl LeaseOps for RedlockLeaseOps {
    fn backend(&self) -> &'static str {
        crate::config::BACKEND
    }

    fn backend_key(&self) -> Option<String> {
        Some(self.keys.lock.clone())
    }

    async fn renew(&self) -> Result<Instant> {
        let start = Instant::now();
        let (keys, token, ttl, mode) = (self.keys.clone(), self.token.clone(), self.ttl, self.mode);
        let members = self.members.clone();
        let all = vec![false; self.nodes.len()];
        let round = Round::on(&self.nodes, &all, self.node_timeout, move |i, mut c| {
            let (keys, token) = (keys.clone(), token.clone());
            let member = members.get(i).cloned().flatten();
            async move {
                let token = match (mode, &member) {
                    (Mode::Exclusive, _) => &*token,
                    (_, Some(m)) => m.as_str(),
                    (_, None) => return Ok(false),
                };
                let lease = renewals::Renewing {
                    keys: &keys,
                    token,
                    mode,
                    ttl,
                    valued: false,
                };
                Ok(renewals::renew(&mut c, &[lease]).await?.first() == Some(&true))
            }
        });
        let ((extended, not_held, _), rest) = until_quorum(round, self.quorum).await;
        // Slower masters are extended too, in the background: a majority is enough to hold.
        rest.finish_in_background();
        let validity = self
            .ttl
            .checked_sub(start.elapsed() + self.drift)
            .unwrap_or_default();
        if extended >= self.quorum && !validity.is_zero() {
            return Ok(start + self.ttl.saturating_sub(self.drift));
        }
        // Masters that were extended stay extended: undoing them would only shorten a lease
        // that a later renewal may still save.
        if not_held > self.nodes.len() - self.quorum {
            return Err(Error::not_held(&self.keys.name()));
        }
        Err(Error::QuorumNotReached {
            granted: extended,
            needed: self.quorum,
        })
    }

    async fn release(&self, valid_until: Instant) -> Result<()> {
        let round = Round::new(
            &self.nodes,
            self.node_timeout,
            release_request(&self.keys, &self.token, self.mode),
        );
        let ((released, not_held, _), rest) = until_quorum(round, self.quorum).await;
        // The lock is free once a majority released it; the slower masters are released in
        // the background (or their keys expire).
        rest.finish_in_background();
        let lapsed = Instant::now() >= valid_until;
        if released >= self.quorum {
            Ok(())
        } else if not_held > self.nodes.len() - self.quorum {
            // Fewer than a majority can have held the token: lost (expired, broken, taken).
            Err(Error::not_held(&self.keys.name()))
        } else if released + not_held >= self.quorum {
            // The token is off a majority now, and the silent masters may have held it to the
            // end. While the lease was valid a majority held it, so this was a release; past
            // its validity the lease may have lapsed before it.
            if lapsed {
                Err(Error::not_held(&self.keys.name()))
            } else {
                Ok(())
            }
        } else {
            Err(Error::QuorumNotReached {
                granted: released,
                needed: self.quorum,
            })
        }
    }
}
