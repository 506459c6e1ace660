//! Fencing tokens.

use std::fmt;

/// A number that strictly increases with every grant of one lock name.
///
/// Pass it with every write to the protected resource and have the resource reject a token
/// lower than the highest it has seen: a holder that paused past its lease (GC, swap, a stopped
/// VM) is then refused instead of corrupting data. How far the order holds depends on
/// [`Capabilities::fencing`](crate::Capabilities::fencing).
///
/// ```
/// use lock_core::FencingToken;
/// let old = FencingToken::new(7);
/// let new = FencingToken::new(8);
/// assert!(new > old);
/// assert_eq!(new.get(), 8);
/// assert_eq!(new.to_string(), "8");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a backend's counter value.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }
    /// The number, for sending along with a write.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}
