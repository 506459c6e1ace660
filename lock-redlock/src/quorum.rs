//! Acquiring by majority: one attempt (a round on every master, decided at a majority, undone
//! everywhere if it failed), the waiting loop around it, and the quorum read behind `inspect`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lock_core::driver::{random_below, Acquisition, Backoff, Grant, ManagedLease};
use lock_core::{Deadline, Error, Lease, LockName, LockOptions, Mode, Result};
use lock_redis::raw::family;
use lock_redis::raw::scripts::{self, Acquired, LockKeys};
use lock_redis::raw::ReleaseOnDrop;

use crate::client::Masters;
use crate::config::BACKEND;
use crate::lease::RedlockLeaseOps;
use crate::round::{release_request, Round};

/// Every holder by a quorum read of each master's lock key and group (`family::list`): a
/// writer held on a majority, or each reader whose token is a member on a majority, with the
/// time until fewer than a majority keep it. Too few answers is `QuorumNotReached`.
pub(crate) async fn read_holders(
    m: &Masters,
    name: &LockName,
) -> Result<Vec<lock_core::HolderInfo>> {
    let quorum = m.config.quorum();
    let keys = m.keys(name);
    let mut round = Round::new(
        &m.nodes,
        m.config.node_timeout_for(Duration::MAX),
        |mut c| {
            let keys = keys.clone();
            async move { family::list(&mut c, &keys).await }
        },
    );
    let (mut answered, mut writers, mut readers) = (0, Holders::default(), Holders::default());
    while let Some((_, r)) = round.next().await {
        let Ok(Ok(listing)) = r else { continue };
        answered += 1;
        match listing.value.as_deref().map(|v| (v, family::group_mode(v))) {
            Some((_, Some(_))) => {
                for (member, left) in listing.members {
                    let token = member.split_once(':').map(|(_, t)| t.to_string());
                    readers.add(token, Some(left));
                }
            }
            // -1: no expiry (not ours to judge); -2: expired meanwhile.
            Some((v, None)) if listing.pttl != -2 => writers.add(
                Some(v.to_string()),
                u64::try_from(listing.pttl).ok().map(Duration::from_millis),
            ),
            _ => {}
        }
    }
    if answered < quorum {
        return Err(Error::QuorumNotReached {
            granted: answered,
            needed: quorum,
        });
    }
    if let Some(left) = writers.majority(quorum) {
        return Ok(vec![lock_core::HolderInfo::new(None, left)]);
    }
    Ok(readers
        .all_with(quorum)
        .into_iter()
        .map(|left| lock_core::HolderInfo::new(None, left).with_mode(Mode::Shared))
        .collect())
}

pub(crate) async fn contend(m: &Masters, req: Acquisition<'_>) -> Result<Option<Box<dyn Lease>>> {
    let (name, ttl, opts, deadline) = (req.name(), req.ttl(), req.opts(), req.deadline());
    let keys = m.keys(name);
    if deadline == Deadline::Now {
        return once(m, name, &keys, ttl, opts).await;
    }
    let mut watches = Vec::new();
    let mut subscribed = false;
    let mut pauses = Backoff::transient();
    loop {
        // Registered before the attempt, so a release during the attempt is not missed.
        let mut wakes: Vec<_> = watches
            .iter()
            .map(|w: &lock_redis::raw::ReleaseWatch| Box::pin(w.notify().notified()))
            .collect();
        for w in wakes.iter_mut() {
            w.as_mut().enable();
        }
        let remaining = match attempt(m, name, &keys, ttl, opts).await {
            Ok(Attempt::Granted(l)) => return Ok(Some(l)),
            Ok(Attempt::Held(r)) => {
                req.queued();
                pauses.reset();
                r
            }
            Ok(Attempt::Split) => None,
            Err(e) if e.is_retryable() => {
                let pause = pauses.pause();
                if deadline.at().is_some_and(|d| Instant::now() + pause >= d) {
                    return Err(e);
                }
                tracing::warn!(error = %e, "Redlock attempt failed; retrying while the wait allows");
                tokio::time::sleep(pause).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if deadline.passed() {
            return Ok(None);
        }
        if !subscribed {
            // Subscribe on every master that answers, then retry at once: a release
            // announcement from any of them wakes us from now on.
            subscribed = true;
            drop(wakes);
            let subs = join_all(m.nodes.iter().map(|n| {
                let keys = &keys;
                async move {
                    tokio::time::timeout(n.config().request_timeout(), n.watch_releases(keys)).await
                }
            }))
            .await;
            watches = subs
                .into_iter()
                .filter_map(|r| r.ok().and_then(|r| r.ok()))
                .collect();
            continue;
        }
        // Sleep until a release message, the holder's expiry, or (split vote, or no master
        // took a subscription) a random pause.
        let sleep_for = match remaining {
            Some(r) => r + jitter(m) / 10,
            None => jitter(m),
        };
        let wake = Instant::now() + sleep_for;
        let wake = deadline.at().map_or(wake, |d| wake.min(d));
        if wakes.is_empty() {
            tokio::time::sleep_until(wake.into()).await;
        } else {
            tokio::select! {
                _ = futures_util::future::select_all(wakes) => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }
}

pub(crate) async fn attempt(
    m: &Masters,
    name: &LockName,
    keys: &Arc<LockKeys>,
    ttl: Duration,
    opts: &LockOptions,
) -> Result<Attempt> {
    let cfg = &m.config;
    let nodes = &m.nodes;
    let quorum = cfg.quorum();
    let node_timeout = cfg.node_timeout_for(ttl);
    // Masters not checked since their connection dropped get no vote in this attempt.
    let unchecked = m.verify(node_timeout).await?;
    let token: Arc<str> = lock_redis::raw::scripts::new_token().into();
    let mode = opts.mode;
    // If this future is dropped between sending and deciding, the guard releases the token
    // everywhere in the background: a cancelled acquire leaves no ghost holder.
    let mut undo =
        ReleaseOnDrop::new(nodes.clone(), keys.clone(), token.clone(), node_timeout).of_mode(mode);
    let start = Instant::now();
    let mut round = Round::on(nodes, &unchecked, node_timeout, |_, mut c| {
        let (keys, token) = (keys.clone(), token.clone());
        async move {
            match mode {
                Mode::Exclusive => scripts::acquire_unfenced(&mut c, &keys, &token, ttl).await,
                // A reader joins each master's group of readers (`lock_redis::raw::family`).
                _ => family::acquire(&mut c, &keys, &token, ttl, mode).await,
            }
        }
    });
    let (mut granted, mut busy) = (0, 0);
    // A reader's member on each master that granted: `<that master's fence>:<token>`.
    let mut members: Vec<Option<String>> = vec![None; nodes.len()];
    // Refusals by holder: a lock is held elsewhere only if one holder has a majority.
    let mut holders = Holders::default();
    // Masters that answered "held by someone else", or were not asked, store nothing of
    // ours: no cleanup there.
    let mut refused = unchecked;
    while let Some((i, r)) = round.next().await {
        match r {
            Ok(Ok(Acquired::Granted { fence })) => {
                granted += 1;
                if mode != Mode::Exclusive {
                    members[i] = Some(family::member(fence, &token));
                }
            }
            Ok(Ok(Acquired::Busy {
                remaining, holder, ..
            })) => {
                busy += 1;
                refused[i] = true;
                holders.add(holder, remaining);
            }
            _ => {}
        }
        // A grant is decided once a majority granted: waiting for the slowest masters would
        // only add their latency. A refusal waits for every answer instead: each master
        // that refused needs no cleanup, which is cheaper than cleaning up after the
        // unanswered ones.
        if granted >= quorum {
            break;
        }
    }
    // The requests still in flight go on in the background rather than being dropped: a
    // dropped request may never be written (the connection skips requests nobody awaits),
    // and a lock held on a bare majority is lost when any one of those masters fails.
    // Should one grant after a failed attempt, the cleanup below (same connection, so
    // ordered after it) or the TTL removes it.
    round.finish_in_background();
    let drift = cfg.drift(ttl);
    let validity = ttl.checked_sub(start.elapsed() + drift).unwrap_or_default();
    if granted >= quorum && validity > cfg.min_validity() {
        undo.disarm(); // the lease owns the token from here
                       // The backend's detail of the grant, in the acquisition's span (docs/observability.md).
        tracing::debug!(
            lock.redlock.masters = granted,
            lock.redlock.quorum = quorum,
            "granted by a majority of the masters"
        );
        let valid_until = start + ttl.saturating_sub(drift);
        let ops = RedlockLeaseOps {
            nodes: nodes.clone(),
            keys: keys.clone(),
            token,
            mode,
            members: members.into(),
            ttl,
            drift,
            node_timeout,
            quorum,
        };
        return Ok(Attempt::Granted(Box::new(ManagedLease::new(
            name.clone(),
            Grant {
                token: None,
                ttl,
                valid_until,
            },
            opts.renewal,
            ops,
        ))));
    }
    // Failed: undo every grant, on every master that may hold one (one that timed out or
    // has not answered yet may have granted). Awaited, so the next attempt is not refused
    // by this one's leftovers.
    let release = release_request(keys, &token, mode);
    let mut cleanup = Round::on(nodes, &refused, node_timeout, |_, c| release(c));
    while cleanup.next().await.is_some() {}
    undo.disarm();
    if granted >= quorum {
        return Err(Error::unavailable(
            BACKEND,
            format!(
                "a majority granted, but only after {:?} of a {ttl:?} TTL: no validity left",
                start.elapsed()
            ),
        ));
    }
    if granted + busy >= quorum {
        // Enough masters answered: the lock is held elsewhere, or votes split. Refusals
        // from a majority are not enough to call it held: racers that each took a minority
        // refuse each other, and if each gave up, nobody would get the lock.
        return Ok(match holders.majority(quorum) {
            Some(until_minority) => Attempt::Held(until_minority),
            None => Attempt::Split,
        });
    }
    Err(Error::QuorumNotReached {
        granted,
        needed: quorum,
    })
}

/// One acquisition without waiting: a split vote (nobody won) is retried after a random
/// pause, up to `retry_count` times, as Redlock prescribes; a lock a majority reports held
/// is `Ok(None)` at once.
pub(crate) async fn once(
    m: &Masters,
    name: &LockName,
    keys: &Arc<LockKeys>,
    ttl: Duration,
    opts: &LockOptions,
) -> Result<Option<Box<dyn Lease>>> {
    for n in 1..=m.config.retry_count() {
        match attempt(m, name, keys, ttl, opts).await? {
            Attempt::Granted(l) => return Ok(Some(l)),
            Attempt::Held(_) => return Ok(None),
            Attempt::Split if n < m.config.retry_count() => {
                tokio::time::sleep(jitter(m)).await;
            }
            Attempt::Split => return Ok(None),
        }
    }
    Ok(None)
}

/// A random pause in `0..retry_delay`, so competing clients do not retry in lockstep.
pub(crate) fn jitter(m: &Masters) -> Duration {
    random_below(m.config.retry_delay())
}

pub(crate) enum Attempt {
    Granted(Box<dyn Lease>),
    /// A majority refused for one holder, which keeps that majority for at least this long
    /// (`None`: some of its keys have no expiry).
    Held(Option<Duration>),
    /// Votes split: no holder has a majority. Someone may win on a retry.
    Split,
}

/// The refusals of one attempt, by holder.
#[derive(Default)]
struct Holders(HashMap<String, Vec<Option<Duration>>>);

impl Holders {
    /// One master's holder and its remaining PTTL (`None`: no expiry). A holder gone before
    /// it could be read (`None`) counts for nobody.
    fn add(&mut self, holder: Option<String>, remaining: Option<Duration>) {
        if let Some(h) = holder {
            self.0.entry(h).or_default().push(remaining);
        }
    }

    /// If one holder refused on `quorum` masters or more: how long until it keeps fewer than
    /// `quorum` (the `quorum`-th longest expiry; `None` when that one has no expiry).
    fn majority(self, quorum: usize) -> Option<Option<Duration>> {
        self.all_with(quorum).into_iter().next()
    }

    /// For every holder on `quorum` masters or more, how long until it keeps fewer.
    fn all_with(self, quorum: usize) -> Vec<Option<Duration>> {
        self.0
            .into_values()
            .filter(|l| l.len() >= quorum)
            .map(|mut left| {
                // `None` (no expiry) sorts as the longest.
                left.sort_unstable_by(|a, b| match (a, b) {
                    (None, None) => std::cmp::Ordering::Equal,
                    (None, Some(_)) => std::cmp::Ordering::Less,
                    (Some(_), None) => std::cmp::Ordering::Greater,
                    (Some(a), Some(b)) => b.cmp(a),
                });
                left.get(quorum - 1).copied().flatten()
            })
            .collect()
    }
}
