//! [`Mode`]: how one acquisition shares its lock name with other holders — the rule every
//! driver, the conformance suite and the history checker apply, written once.

/// How an acquisition shares its name with other holders: the lock family on one name.
///
/// - [`Exclusive`](Mode::Exclusive) (the default, and the only mode before the family): the
///   only holder.
/// - [`Shared`](Mode::Shared): any number of shared holders at once, and no exclusive one (a
///   read lock; the exclusive mode is its write lock).
/// - [`Permits(k)`](Mode::Permits): one of `k` permits, at most `k` holders at once (a
///   semaphore). Holders and waiters of one name must agree on `k`: asking with another `k`
///   is [`Error::PermitsMismatch`](crate::Error::PermitsMismatch), never a silently different
///   limit.
///
/// Holders of different modes never hold one name at once: an exclusive request waits for
/// shared holders and permit holders, a shared one for an exclusive holder or permit holders.
/// It is one lock: today's exclusive acquisitions of `db` conflict with shared holders of `db`.
/// Fencing tokens increase per name in grant order across all modes. Where the driver queues
/// ([`Capabilities::fifo`](crate::Capabilities::fifo)), a request that arrives after a waiting
/// one of another mode waits behind it, so writers are not starved by a stream of readers.
///
/// ```
/// use lock_core::Mode;
/// assert!(Mode::hold_together([Mode::Shared, Mode::Shared, Mode::Shared]));
/// assert!(!Mode::hold_together([Mode::Shared, Mode::Exclusive]));
/// assert!(Mode::hold_together([Mode::Permits(2), Mode::Permits(2)]));
/// assert!(!Mode::hold_together([Mode::Permits(2); 3]));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// The only holder of the name.
    #[default]
    Exclusive,
    /// One of any number of shared holders; excludes exclusive holders.
    Shared,
    /// One of this many permits (at least 1).
    Permits(u32),
}

/// Whether a request may join a name's holders now ([`Mode::admits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Compatible with every holder, and room is left.
    Yes,
    /// It must wait: an incompatible holder, or every permit taken.
    No,
    /// A holder or waiter uses the name with another number of permits: `held`.
    Mismatch {
        /// The number of permits the name's other users ask with.
        held: u32,
    },
}

impl Mode {
    /// The most holders this mode allows at once: 1, none (shared), or `k`.
    ///
    /// ```
    /// use lock_core::Mode;
    /// assert_eq!(Mode::Exclusive.limit(), Some(1));
    /// assert_eq!(Mode::Shared.limit(), None);
    /// assert_eq!(Mode::Permits(4).limit(), Some(4));
    /// ```
    pub const fn limit(self) -> Option<u32> {
        match self {
            Mode::Exclusive => Some(1),
            Mode::Shared => None,
            Mode::Permits(k) => Some(k),
        }
    }

    /// Whether a holder of mode `self` may join `holders` (the modes of the name's current
    /// holders) now; [`Admission::Mismatch`] where one of `users` — holders or waiters of the
    /// name — asks with another number of permits. Pass the waiters in `users` too on drivers
    /// that keep a queue.
    ///
    /// ```
    /// use lock_core::{driver::Admission, Mode};
    /// let held = [Mode::Permits(2)];
    /// assert_eq!(Mode::Permits(2).admits(held, held), Admission::Yes);
    /// assert_eq!(Mode::Permits(3).admits(held, held), Admission::Mismatch { held: 2 });
    /// assert_eq!(Mode::Exclusive.admits(held, held), Admission::No);
    /// assert_eq!(Mode::Shared.admits([], []), Admission::Yes);
    /// ```
    pub fn admits(
        self,
        holders: impl IntoIterator<Item = Mode>,
        users: impl IntoIterator<Item = Mode>,
    ) -> Admission {
        if let Mode::Permits(k) = self {
            let other = users.into_iter().find_map(|m| match m {
                Mode::Permits(j) if j != k => Some(j),
                _ => None,
            });
            if let Some(held) = other {
                return Admission::Mismatch { held };
            }
        }
        let mut count: u64 = 0;
        for h in holders {
            let compatible = match (self, h) {
                (Mode::Shared, Mode::Shared) => true,
                (Mode::Permits(k), Mode::Permits(j)) => k == j,
                _ => false,
            };
            if !compatible {
                return Admission::No;
            }
            count += 1;
        }
        match self.limit() {
            Some(limit) if count >= u64::from(limit) => Admission::No,
            _ => Admission::Yes,
        }
    }

    /// Whether holders of these modes may hold one name at the same instant: at most one
    /// exclusive holder alone, shared holders only, or at most `k` holders of `k` permits. The
    /// rule the history checker judges every instant by.
    pub fn hold_together(modes: impl IntoIterator<Item = Mode>) -> bool {
        let modes: Vec<Mode> = modes.into_iter().collect();
        let Some((&first, rest)) = modes.split_first() else {
            return true;
        };
        rest.iter().all(|&m| m == first)
            && first
                .limit()
                .map_or(true, |limit| modes.len() as u64 <= u64::from(limit))
    }

    /// How the mode reads in logs, `distlock status` and the checker's reports: `exclusive`,
    /// `shared`, `permit of K`.
    pub fn describe(self) -> String {
        match self {
            Mode::Exclusive => "exclusive".into(),
            Mode::Shared => "shared".into(),
            Mode::Permits(k) => format!("permit of {k}"),
        }
    }
}

/// Where a request stands in a FIFO queue of one name's holders and waiters ([`queue_turn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// It holds: it and every entry before it may hold together.
    Granted,
    /// It waits until the entry at this index goes (the newest one before it that it cannot
    /// hold beside); then it looks again.
    After(usize),
    /// It waits for a permit: every entry before it holds or waits for one of the same `k`,
    /// and `k` of them are before it. Any one of them going may give it its turn.
    AfterAny,
    /// An entry before it uses the name with another number of permits, `held`.
    Mismatch {
        /// The number of permits of the earlier entry.
        held: u32,
    },
}

/// The turn of entry `me` in `queue`, a FIFO queue of one name's requests in the order they
/// arrived (holders first, as they were granted in order): a request holds exactly when it and
/// every request before it may hold together ([`Mode::hold_together`]), so nobody overtakes an
/// earlier waiter — a reader that arrives behind a waiting writer waits behind it. The rule of
/// every driver whose backend keeps such a queue (etcd's revisions, ZooKeeper's sequence
/// numbers); the first of two counts of permits wins, and the later one is a mismatch.
///
/// ```
/// use lock_core::{driver::{queue_turn, Turn}, Mode::{Exclusive as X, Permits as P, Shared as S}};
/// assert_eq!(queue_turn(&[S, S, S], 2), Turn::Granted);
/// assert_eq!(queue_turn(&[S, X, S], 2), Turn::After(1)); // behind the waiting writer
/// assert_eq!(queue_turn(&[S, S, X], 2), Turn::After(1));
/// assert_eq!(queue_turn(&[P(2), P(2), P(2)], 2), Turn::AfterAny);
/// assert_eq!(queue_turn(&[P(2), P(3)], 1), Turn::Mismatch { held: 2 });
/// ```
///
/// # Panics
/// Never; an index past the queue's end is treated as the queue's last entry.
pub fn queue_turn(queue: &[Mode], me: usize) -> Turn {
    let me = me.min(queue.len().saturating_sub(1));
    let Some(&mode) = queue.get(me) else {
        return Turn::Granted;
    };
    let before = &queue[..me];
    if let Mode::Permits(k) = mode {
        let other = before.iter().find_map(|m| match m {
            Mode::Permits(j) if *j != k => Some(*j),
            _ => None,
        });
        if let Some(held) = other {
            return Turn::Mismatch { held };
        }
    }
    if Mode::hold_together(queue[..=me].iter().copied()) {
        return Turn::Granted;
    }
    let blocker = match mode {
        Mode::Exclusive => me.checked_sub(1),
        _ => before.iter().rposition(|m| *m != mode),
    };
    blocker.map_or(Turn::AfterAny, Turn::After)
}

impl Mode {
    /// `exclusive`, `shared` or `permits` (without K, a bounded set): the `lock.mode` of spans
    /// and metrics.
    ///
    /// ```
    /// assert_eq!(lock_core::Mode::Permits(4).kind(), "permits");
    /// ```
    pub fn kind(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Permits(_) => "permits",
        }
    }

    /// The mode as drivers write it beside a holder in the backend: `x`, `s`, `p<K>`.
    ///
    /// ```
    /// use lock_core::Mode;
    /// for m in [Mode::Exclusive, Mode::Shared, Mode::Permits(7)] {
    ///     assert_eq!(Mode::from_code(&m.code()), Some(m));
    /// }
    /// assert_eq!(Mode::Permits(7).code(), "p7");
    /// assert_eq!(Mode::from_code("p0"), None);
    /// ```
    pub fn code(self) -> String {
        match self {
            Mode::Exclusive => "x".into(),
            Mode::Shared => "s".into(),
            Mode::Permits(k) => format!("p{k}"),
        }
    }

    /// The mode [`code`](Mode::code) wrote; `None` for anything else (and for `p0`).
    pub fn from_code(code: &str) -> Option<Mode> {
        match code {
            "x" => Some(Mode::Exclusive),
            "s" => Some(Mode::Shared),
            p => {
                let k: u32 = p.strip_prefix('p')?.parse().ok()?;
                (k > 0 && p.len() == format!("p{k}").len()).then_some(Mode::Permits(k))
            }
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_follows_hold_together() {
        // For every small set of holders that may hold together, a request is admitted
        // exactly when the set with it may still hold together (the two rules agree).
        let modes = [
            Mode::Exclusive,
            Mode::Shared,
            Mode::Permits(1),
            Mode::Permits(2),
            Mode::Permits(3),
        ];
        let mut sets: Vec<Vec<Mode>> = vec![vec![]];
        for _ in 0..3 {
            let longer: Vec<Vec<Mode>> = sets
                .iter()
                .flat_map(|s| {
                    modes.iter().map(move |m| {
                        let mut s = s.clone();
                        s.push(*m);
                        s
                    })
                })
                .collect();
            sets.extend(longer);
        }
        for set in sets
            .iter()
            .filter(|s| Mode::hold_together(s.iter().copied()))
        {
            for m in modes {
                let joined = set.iter().copied().chain([m]);
                let together = Mode::hold_together(joined);
                match m.admits(set.iter().copied(), set.iter().copied()) {
                    Admission::Yes => assert!(together, "{m:?} admitted to {set:?}"),
                    Admission::No => assert!(!together, "{m:?} refused by {set:?}"),
                    Admission::Mismatch { held } => {
                        assert!(
                            !together && set.contains(&Mode::Permits(held)),
                            "{m:?} {set:?}"
                        )
                    }
                }
            }
        }
    }

    #[test]
    fn queue_turns_grant_prefixes_that_hold_together() {
        // Every queue of up to 4 entries: an entry is granted exactly when the queue up to it
        // may hold together; a waiter's blocker is before it and cannot hold beside it.
        let modes = [Mode::Exclusive, Mode::Shared, Mode::Permits(2)];
        let mut queues: Vec<Vec<Mode>> = vec![vec![]];
        for _ in 0..4 {
            let longer: Vec<Vec<Mode>> = (queues.iter())
                .flat_map(|q| {
                    modes.iter().map(move |m| {
                        let mut q = q.clone();
                        q.push(*m);
                        q
                    })
                })
                .collect();
            queues.extend(longer);
        }
        for q in queues.iter().filter(|q| !q.is_empty()) {
            for i in 0..q.len() {
                let together = Mode::hold_together(q[..=i].iter().copied());
                match queue_turn(q, i) {
                    Turn::Granted => assert!(together, "{q:?} {i}"),
                    Turn::After(j) => {
                        assert!(!together && j < i, "{q:?} {i}");
                        assert!(
                            q[i] == Mode::Exclusive && j + 1 == i || q[j] != q[i],
                            "{q:?} {i} waits for {j}"
                        );
                    }
                    Turn::AfterAny => {
                        assert!(q[..=i].iter().all(|m| *m == Mode::Permits(2)) && i >= 2)
                    }
                    Turn::Mismatch { .. } => panic!("one count of permits: {q:?}"),
                }
            }
        }
        assert_eq!(
            queue_turn(&[Mode::Permits(3), Mode::Permits(2)], 1),
            Turn::Mismatch { held: 3 }
        );
        // The earlier count wins: the later request is the mismatch, never the holder.
        assert_eq!(
            queue_turn(&[Mode::Permits(3), Mode::Permits(2)], 0),
            Turn::Granted
        );
    }

    #[test]
    fn a_waiter_with_other_permits_is_a_mismatch_even_when_nobody_holds() {
        assert_eq!(
            Mode::Permits(2).admits([], [Mode::Permits(5)]),
            Admission::Mismatch { held: 5 }
        );
        assert_eq!(
            Mode::Exclusive.admits([], [Mode::Permits(5)]),
            Admission::Yes
        );
    }
}
