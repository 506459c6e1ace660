//! The lock-name value: what a valid name is and how it shows. Which strings are valid, and
//! the constructors that check them, are in `name_rules`.

use std::fmt;
use std::sync::Arc;

/// Longest accepted name, in bytes. Chosen so that every backend can carry it with its own
/// prefix and suffix: a file name (`<name>.lock`, 255-byte limit), a ZooKeeper node, a Redis key.
pub const MAX_NAME_LEN: usize = 128;

/// Characters besides ASCII letters and digits that a name may contain.
///
/// The set is what every backend carries without changing the key's meaning: no `/` (a path
/// separator for files, ZooKeeper and etcd prefixes), no `{`/`}` (Redis Cluster hash tags),
/// no whitespace, no `*`/`?`/`[` (Redis patterns), nothing outside ASCII (file systems differ).
pub const NAME_PUNCTUATION: &str = "-_.:@+=";

/// A lock name that every driver accepts and maps to exactly one backend key.
///
/// Names are case-sensitive, 1 to [`MAX_NAME_LEN`] bytes of ASCII letters, digits and
/// [`NAME_PUNCTUATION`], and neither `.` nor `..`. Anything else is an
/// [`Error::InvalidName`](crate::Error::InvalidName), never a silently different key.
///
/// ```
/// use lock_core::LockName;
/// let name = LockName::new("billing:nightly-report")?;
/// assert_eq!(name.as_str(), "billing:nightly-report");
/// assert!(LockName::new("a/b").is_err());
/// assert!(LockName::new("").is_err());
/// let parsed: LockName = "jobs.cleanup".parse()?;
/// assert_eq!(parsed.to_string(), "jobs.cleanup");
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Wraps a string that `name_rules` has checked; the only way to make one.
    pub(crate) fn checked(s: &str) -> Self {
        LockName(Arc::from(s))
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockName({:?})", &*self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
