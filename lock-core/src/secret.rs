//! [`Secret`]: a password that never shows, and the one [`scrub`] every driver uses on text
//! from its client library.

use std::fmt;

/// A password. `Debug` and `Display` print `***`, whatever characters it holds; only
/// [`expose`](Self::expose) gives it out, for the client library's login.
///
/// ```
/// use lock_core::driver::Secret;
/// let pw = Secret::new("p@ss/w:rd");
/// assert_eq!(format!("{pw} {pw:?}"), "*** Secret(***)");
/// assert_eq!(pw.expose(), "p@ss/w:rd");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Secret(password.into())
    }

    /// The password itself, for the client library's login and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of this password — as written and percent-encoded, the
    /// two ways a client library echoes it — replaced by `***`. An empty password changes
    /// nothing.
    ///
    /// ```
    /// use lock_core::driver::Secret;
    /// let pw = Secret::new("p@ss");
    /// assert_eq!(pw.scrub("auth p@ss failed for redis://u:p%40ss@h"), "auth *** failed for redis://u:***@h");
    /// assert_eq!(Secret::new("").scrub("text"), "text");
    /// ```
    pub fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_string();
        }
        let encoded = percent_encode(&self.0);
        let mut out = text.replace(&self.0, "***");
        if encoded != self.0 {
            out = out.replace(&encoded, "***");
        }
        out
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A client library's message about a connection that may carry `secret`, with the secret
/// scrubbed: what drivers put into their errors.
///
/// ```
/// use lock_core::driver::{scrub, Secret};
/// let pw = Secret::new("hunter2");
/// assert_eq!(scrub(&"WRONGPASS hunter2", Some(&pw)), "WRONGPASS ***");
/// assert_eq!(scrub(&"refused", None), "refused");
/// ```
pub fn scrub(message: &dyn fmt::Display, secret: Option<&Secret>) -> String {
    let text = message.to_string();
    match secret {
        Some(s) => s.scrub(&text),
        None => text,
    }
}

/// A client library's error as a driver reports it: shown scrubbed (the password replaced,
/// with the driver's context, such as the redacted URL), and kept whole for a caller who needs
/// to tell its kinds apart, through [`downcast_ref`](Self::downcast_ref).
///
/// `source()` deliberately does not expose it: error reporters print the whole chain, and the
/// client's own text may carry the password.
///
/// ```
/// use lock_core::driver::{ClientError, Secret};
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused by hunter2");
/// let e = ClientError::new(io, Some(&Secret::new("hunter2"))).context("redis://h:1");
/// assert_eq!(e.to_string(), "refused by *** (redis://h:1)");
/// let kind = e.downcast_ref::<std::io::Error>().map(|io| io.kind());
/// assert_eq!(kind, Some(std::io::ErrorKind::ConnectionRefused));
/// ```
pub struct ClientError {
    shown: String,
    inner: crate::BoxError,
}

impl ClientError {
    /// Wraps `error`, scrubbing `secret` from what it shows.
    pub fn new(error: impl Into<crate::BoxError>, secret: Option<&Secret>) -> Self {
        let inner = error.into();
        ClientError {
            shown: scrub(&chain(&*inner), secret),
            inner,
        }
    }

    /// Adds where it happened (never a secret: a redacted URL, an endpoint), shown in
    /// parentheses after the message.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.shown = format!("{} ({context})", self.shown);
        self
    }

    /// The client library's error, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.inner.downcast_ref::<T>()
    }
}

/// `error`'s message and its sources' after it, each once: the root cause ("Connection
/// refused") is shown even where a client's own message ("error connecting to server") leaves
/// it to `source()`, and not twice where the message already includes it.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    text
}

impl fmt::Debug for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ClientError").field(&self.shown).finish()
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::error::Error for ClientError {}

/// Everything but RFC 3986's unreserved characters, as URLs carry a password.
const USERINFO: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, USERINFO).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a cause, shown with or without it in its own message.
    #[derive(Debug)]
    struct Outer(std::io::Error, bool);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            if self.1 {
                write!(f, "error connecting to server: {}", self.0)
            } else {
                f.write_str("error connecting to server")
            }
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_root_cause_is_shown_once() {
        let pw = Secret::new("hunter2");
        for says_cause in [false, true] {
            let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused hunter2");
            let e = ClientError::new(Outer(io, says_cause), Some(&pw)).context("pg://h:1");
            assert_eq!(
                e.to_string(),
                "error connecting to server: refused *** (pg://h:1)"
            );
            assert!(e.downcast_ref::<Outer>().is_some());
        }
    }

    #[test]
    fn no_character_lets_the_secret_through() {
        for pw in ["%", "***", "a b", "ü", "\\", "\"", "{}", "p@ss/?#:"] {
            let s = Secret::new(pw);
            let text = format!("x{pw}y {} {s:?} {s}", percent_encode(pw));
            let scrubbed = s.scrub(&text);
            assert!(
                !scrubbed.contains(pw) || pw == "***",
                "{pw:?} survived in {scrubbed:?}"
            );
        }
    }
}
