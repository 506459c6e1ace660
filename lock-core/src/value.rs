//! What a leader says of itself ([`LeaderValue`]) and who leads ([`Leader`]): the data an
//! election stores and reads, apart from the machinery that does.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{Error, FencingToken, Result};

/// The largest [`LeaderValue`], in bytes: an identity (`host:port`, a URL, a small JSON
/// object), small enough for every backend's key or node value.
pub const MAX_VALUE_LEN: usize = 4096;

/// What a leader says of itself: bytes, usually UTF-8 (`host:port`), at most
/// [`MAX_VALUE_LEN`]. A longer value is an error, never a cut one.
///
/// ```
/// use lock_core::LeaderValue;
/// let v = LeaderValue::new("10.0.0.7:8080")?;
/// assert_eq!(v.as_str(), Some("10.0.0.7:8080"));
/// assert_eq!(v.to_string(), "10.0.0.7:8080");
/// assert!(LeaderValue::new(vec![b'x'; lock_core::MAX_VALUE_LEN + 1]).is_err());
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct LeaderValue(Arc<[u8]>);

impl LeaderValue {
    /// A value of these bytes; [`Error::InvalidOptions`] beyond [`MAX_VALUE_LEN`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let bytes = bytes.into();
        if bytes.len() > MAX_VALUE_LEN {
            return Err(Error::InvalidOptions(format!(
                "a leader's value is at most {MAX_VALUE_LEN} bytes, not {}",
                bytes.len()
            )));
        }
        Ok(LeaderValue(bytes.into()))
    }
    /// A value as a backend holds it, whoever wrote it (a foreign client's proposal may be
    /// longer than [`MAX_VALUE_LEN`]): for drivers reading a leader, never for input.
    pub fn read(bytes: &[u8]) -> Self {
        LeaderValue(bytes.into())
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// The value as text, if it is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }
}

impl fmt::Debug for LeaderValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_str() {
            Some(s) => f.debug_tuple("LeaderValue").field(&s).finish(),
            None => write!(f, "LeaderValue({} bytes)", self.0.len()),
        }
    }
}

/// Lossy UTF-8: for logs and the CLI.
impl fmt::Display for LeaderValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

/// Who leads a name: what [`DistributedLock::leader`](crate::DistributedLock::leader) reads.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// What the leader said of itself when elected, or proclaimed since (empty for a holder of
    /// the lock that was not a candidate: an exclusive acquisition without a value).
    pub value: LeaderValue,
    /// The fencing token of the leader's grant: strictly greater than every earlier leader's.
    pub term: FencingToken,
    /// How long the leadership lasts if its holder stops renewing, where the backend can tell.
    pub remaining: Option<Duration>,
}

impl Leader {
    /// A leader description.
    pub const fn new(value: LeaderValue, term: FencingToken, remaining: Option<Duration>) -> Self {
        Leader {
            value,
            term,
            remaining,
        }
    }
}
