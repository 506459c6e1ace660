//! Validated lock names.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::{Error, Result};

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
/// [`Error::InvalidName`], never a silently different key.
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
    /// Validates `name` and wraps it.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let s = name.as_ref();
        validate(s)?;
        Ok(LockName(Arc::from(s)))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn invalid(name: &str, reason: impl Into<String>) -> Error {
    // Escaped and shortened: a hostile or binary name must not flood a log line.
    let mut shown: String = name.chars().take(64).flat_map(char::escape_debug).collect();
    if name.chars().count() > 64 {
        shown.push('…');
    }
    Error::InvalidName {
        name: format!("\"{shown}\""),
        reason: reason.into(),
    }
}

fn validate(s: &str) -> Result<()> {
    if s.is_empty() {
        return Err(invalid(s, "must not be empty"));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(invalid(
            s,
            format!("is {} bytes long; the limit is {MAX_NAME_LEN}", s.len()),
        ));
    }
    for (i, c) in s.chars().enumerate() {
        if c.is_control() {
            return Err(invalid(s, format!("control character at position {i}")));
        }
        if !(c.is_ascii_alphanumeric() || NAME_PUNCTUATION.contains(c)) {
            return Err(invalid(
                s,
                format!(
                    "character {c:?} at position {i} is not allowed \
                     (use ASCII letters, digits and {NAME_PUNCTUATION})"
                ),
            ));
        }
    }
    if s == "." || s == ".." {
        return Err(invalid(s, "`.` and `..` are reserved"));
    }
    Ok(())
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

impl FromStr for LockName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        LockName::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        for ok in [
            "a",
            "A-b_c.d:e@f+g=h",
            "0",
            &"x".repeat(MAX_NAME_LEN),
            "...",
        ] {
            assert!(LockName::new(ok).is_ok(), "{ok:?} should be accepted");
        }
    }

    #[test]
    fn rejects_with_typed_errors() {
        let long = "x".repeat(MAX_NAME_LEN + 1);
        for bad in [
            "",
            &long,
            "a\nb",
            "a\0b",
            "tab\there",
            "a/b",
            "{tag}",
            "a b",
            "ü",
            "*",
            ".",
            "..",
        ] {
            match LockName::new(bad) {
                Err(Error::InvalidName { name, reason }) => {
                    assert!(!reason.is_empty());
                    assert!(!name.contains('\n') && !name.contains('\0'), "{name}");
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn error_text_is_bounded() {
        let huge = "\u{1}".repeat(10_000);
        let msg = LockName::new(huge).unwrap_err().to_string();
        assert!(msg.len() < 600, "{}", msg.len());
    }
}
