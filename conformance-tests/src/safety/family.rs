//! Which modes of the lock family a run's names are taken in ([`Family`]).

use lock_core::{Capabilities, Mode};

use super::nemesis::Rng;

/// Which [`Mode`]s a run's names are taken in, as far as the driver declares them
/// (`Capabilities::shared`, `Capabilities::permits`; an undeclared mode is taken exclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Family {
    /// Every name exclusive.
    Exclusive,
    /// A third of the names each: exclusive; read-write (shared 3 times in 5, else
    /// exclusive); semaphores of 2 permits. Shared holders and permit holders only read: the
    /// fenced store is written by exclusive holders.
    Mixed,
    /// Every name a semaphore of this many permits.
    Permits(u32),
    /// Every name read-write: shared 3 times in 5, else exclusive (a soak of the shared
    /// mode: 100,000 shared grants are about 167,000 in all).
    ReadWrite,
}

impl Family {
    /// A family by its name in `DISTLOCK_SOAK_FAMILY` (`scripts/soak.sh`): `mixed`,
    /// `exclusive`, `read-write`, or `permits` (semaphores of 2 permits).
    ///
    /// ```
    /// use conformance_tests::safety::Family;
    /// assert_eq!(Family::named("read-write"), Some(Family::ReadWrite));
    /// assert_eq!(Family::named("permits"), Some(Family::Permits(2)));
    /// assert_eq!(Family::named("shared"), None);
    /// ```
    pub fn named(name: &str) -> Option<Family> {
        match name {
            "mixed" => Some(Family::Mixed),
            "exclusive" => Some(Family::Exclusive),
            "read-write" => Some(Family::ReadWrite),
            "permits" => Some(Family::Permits(2)),
            _ => None,
        }
    }

    /// The mode of one acquisition of name number `n`, drawing from `rng` only for a
    /// read-write name of a driver that declares shared mode (so a seed's schedule on a driver
    /// without the family is what it was before it).
    pub(super) fn mode(self, n: usize, caps: &Capabilities, rng: &mut Rng) -> Mode {
        match self {
            Family::Mixed if n % 3 == 1 && caps.shared && rng.chance(60) => Mode::Shared,
            Family::Mixed if n % 3 == 2 && caps.permits => Mode::Permits(2),
            Family::Permits(k) if caps.permits => Mode::Permits(k),
            Family::ReadWrite if caps.shared && rng.chance(60) => Mode::Shared,
            _ => Mode::Exclusive,
        }
    }
}
