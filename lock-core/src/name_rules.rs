//! Which strings are lock names, and the constructors of [`LockName`] that check them: a bad
//! name is an [`Error::InvalidName`], never a silently different key.

use std::str::FromStr;

use crate::name::{LockName, MAX_NAME_LEN, NAME_PUNCTUATION};
use crate::{Error, Result};

impl LockName {
    /// Validates `name` and wraps it.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let s = name.as_ref();
        validate(s)?;
        Ok(LockName::checked(s))
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

/// Which bytes a name may hold: ASCII letters, digits and [`NAME_PUNCTUATION`] (any other
/// byte, a UTF-8 one included, is not allowed).
static ALLOWED: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let p = NAME_PUNCTUATION.as_bytes();
    let mut i = 0;
    while i < p.len() {
        t[p[i] as usize] = true;
        i += 1;
    }
    t
};

/// Whether every byte of `b` is [`ALLOWED`].
fn all_allowed(b: &[u8]) -> bool {
    let allowed = |b: &u8| ALLOWED[usize::from(*b)];
    let chunks = b.chunks_exact(8);
    let rest = chunks.remainder().iter().all(allowed);
    rest && chunks.fold(true, |ok, c| {
        ok & c.iter().fold(true, |all, b| all & allowed(b))
    })
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
    // The common case by a table look-up per byte, eight at a time without a branch each;
    // the walk below finds what to say.
    if all_allowed(s.as_bytes()) {
        return if s == "." || s == ".." {
            Err(invalid(s, "`.` and `..` are reserved"))
        } else {
            Ok(())
        };
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

    /// The byte table says what the rule says, for every character up to U+07FF (two-byte
    /// UTF-8 included) in every position.
    #[test]
    fn the_fast_path_agrees_with_the_rule() {
        for c in (0..0x800u32).filter_map(char::from_u32) {
            let allowed = c.is_ascii_alphanumeric() || NAME_PUNCTUATION.contains(c);
            for name in [format!("a{c}"), format!("{c}b"), format!("x{c}y")] {
                assert_eq!(LockName::new(&name).is_ok(), allowed, "{name:?}");
            }
        }
    }

    /// The check goes eight bytes at a time and the rest one by one: a bad byte is found in
    /// a chunk and in the rest, at any place.
    #[test]
    fn a_bad_byte_is_found_wherever_it_is() {
        for len in 1..=40 {
            for at in 0..len {
                for bad in [b'/', b' ', 0x80, 0xff] {
                    let mut name = vec![b'a'; len];
                    name[at] = bad;
                    assert!(!all_allowed(&name), "len {len}, {bad:#x} at {at}");
                }
            }
            assert!(all_allowed(&vec![b'z'; len]), "len {len}");
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
