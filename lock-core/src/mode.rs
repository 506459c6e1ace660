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
