//! A lock URL's query parameters as data. Each driver lists the keys its URL accepts in one
//! table of [`Param`]s — key, other spellings, what it sets — and [`Query::apply`] checks the
//! URL's pairs against the table and applies them. What drivers share is spelled alike:
//! `timeout_ms`, `connect_timeout_ms`, `session_timeout_ms`, `tls`, `tls_ca_file`, `prefix`;
//! a backend's own spelling is an alias (PostgreSQL's `sslrootcert` for `tls_ca_file`).

use std::time::Duration;

use crate::{Error, Result};

/// A URL parameter that is a switch: `true`/`1` or `false`/`0`; anything else is an
/// [`Error::Config`] naming `what` (the URL kind), the key and the value.
///
/// ```
/// assert!(lock_core::driver::parse_bool_param("etcd URL", "tls", "1")?);
/// assert!(lock_core::driver::parse_bool_param("etcd URL", "tls", "yes").is_err());
/// # Ok::<(), lock_core::Error>(())
/// ```
pub fn parse_bool_param(what: &str, key: &str, value: &str) -> Result<bool> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        v => Err(Error::config(format!(
            "{what}: {key}={v:?} is not true or false"
        ))),
    }
}

/// One query parameter a driver's URL accepts: its key, the other spellings it answers to, and
/// what it sets on the driver's config `C`.
///
/// ```
/// use std::time::Duration;
/// use lock_core::driver::{Param, Query};
///
/// #[derive(Default)]
/// struct Cfg { timeout: Option<Duration>, ca: Option<String> }
/// const PARAMS: &[Param<Cfg>] = &[
///     Param::new("timeout_ms", |c, v| Ok(Cfg { timeout: Some(v.millis()?), ..c })),
///     Param::new("tls_ca_file", |c, v| Ok(Cfg { ca: Some(v.raw().into()), ..c }))
///         .alias(&["sslrootcert"]),
/// ];
/// let pairs = vec![("sslrootcert".to_string(), "/ca.pem".to_string())];
/// let cfg = Query::apply("my URL", pairs, PARAMS, Cfg::default())?;
/// assert_eq!(cfg.ca.as_deref(), Some("/ca.pem"));
///
/// let both = vec![("sslrootcert".into(), "/a".into()), ("tls_ca_file".into(), "/b".into())];
/// assert!(Query::apply("my URL", both, PARAMS, Cfg::default()).is_err());
/// let unknown = vec![("tiemout_ms".to_string(), "5".to_string())];
/// assert!(Query::apply("my URL", unknown, PARAMS, Cfg::default()).is_err());
/// # Ok::<(), lock_core::Error>(())
/// ```
pub struct Param<C> {
    /// The key.
    pub key: &'static str,
    /// Other spellings of the same key (a backend's own convention).
    pub aliases: &'static [&'static str],
    /// Reads the value and sets it on the config.
    pub apply: fn(C, Value<'_>) -> Result<C>,
}

impl<C> Param<C> {
    /// The parameter `key`, which `apply` reads and sets.
    pub const fn new(key: &'static str, apply: fn(C, Value<'_>) -> Result<C>) -> Self {
        Param {
            key,
            aliases: &[],
            apply,
        }
    }

    /// The same parameter, also under `aliases`.
    pub const fn alias(mut self, aliases: &'static [&'static str]) -> Self {
        self.aliases = aliases;
        self
    }

    fn spellings(&self) -> impl Iterator<Item = &'static str> + '_ {
        std::iter::once(self.key).chain(self.aliases.iter().copied())
    }
}

impl<C> std::fmt::Debug for Param<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Param")
            .field("key", &self.key)
            .field("aliases", &self.aliases)
            .finish_non_exhaustive()
    }
}

/// A query parameter's value, read as the type its [`Param`] needs; errors name the URL kind,
/// the key as given and the value.
#[derive(Clone, Copy, Debug)]
pub struct Value<'a> {
    what: &'a str,
    key: &'a str,
    raw: &'a str,
}

impl<'a> Value<'a> {
    /// The key as the URL spelled it (the parameter's key or one of its aliases).
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The value as given (percent-decoded).
    pub fn raw(&self) -> &'a str {
        self.raw
    }

    /// A number (`u32`, `f64`, ...).
    pub fn number<T: std::str::FromStr>(&self) -> Result<T> {
        self.raw.parse().map_err(|_| {
            Error::config(format!(
                "{}: {}={:?} is not a number",
                self.what, self.key, self.raw
            ))
        })
    }

    /// A whole number of milliseconds.
    pub fn millis(&self) -> Result<Duration> {
        self.raw.parse().map(Duration::from_millis).map_err(|_| {
            Error::config(format!(
                "{}: {}={:?} is not a number of milliseconds",
                self.what, self.key, self.raw
            ))
        })
    }

    /// A whole number of seconds.
    pub fn secs(&self) -> Result<Duration> {
        self.raw.parse().map(Duration::from_secs).map_err(|_| {
            Error::config(format!(
                "{}: {}={:?} is not a number of seconds",
                self.what, self.key, self.raw
            ))
        })
    }

    /// A switch (see [`parse_bool_param`]).
    pub fn flag(&self) -> Result<bool> {
        parse_bool_param(self.what, self.key, self.raw)
    }

    /// One of `choices`; any other value is an [`Error::Config`] that lists them.
    pub fn choice(&self, choices: &[&'static str]) -> Result<&'static str> {
        choices
            .iter()
            .find(|c| **c == self.raw)
            .copied()
            .ok_or_else(|| {
                Error::config(format!(
                    "{}: {}={:?} is not one of {}",
                    self.what,
                    self.key,
                    self.raw.escape_debug().to_string(),
                    choices.join(", ")
                ))
            })
    }
}

/// The known parameter `key` was most likely meant as: the nearest by edit distance, to the
/// name itself or to it without its unit (`timeout` for `timeout_ms`), if near enough to be a
/// typo (a third of its length, at least 1) and nearer than any other.
fn nearest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let key = key.to_ascii_lowercase();
    let distance = |k: &str| {
        let bare = k.strip_suffix("_ms").unwrap_or(k);
        strsim::levenshtein(&key, k).min(strsim::levenshtein(&key, bare))
    };
    let mut ranked: Vec<(usize, &'k str)> = known.iter().map(|k| (distance(k), *k)).collect();
    ranked.sort();
    match ranked.as_slice() {
        [(d, k), rest @ ..]
            if *d <= (key.len() / 3).max(1) && rest.first().map_or(true, |(d2, _)| d2 > d) =>
        {
            Some(k)
        }
        _ => None,
    }
}

/// The query parameters of a lock URL, checked once against the keys the driver knows: an
/// unknown key is an [`Error::Config`] that lists the known ones, a repeated key one that says
/// so (which of two values was meant cannot be known). Values are read by key, typed; or a
/// driver's table of [`Param`]s applies them all ([`Query::apply`]).
///
/// ```
/// use std::time::Duration;
/// use lock_core::driver::Query;
/// let pairs = vec![("timeout_ms".to_string(), "500".to_string()), ("tls".into(), "1".into())];
/// let q = Query::new("etcd URL", pairs, &["timeout_ms", "tls", "tls_ca_file"])?;
/// assert_eq!(q.millis("timeout_ms")?, Some(Duration::from_millis(500)));
/// assert_eq!(q.flag("tls")?, Some(true));
/// assert_eq!(q.get("tls_ca_file"), None);
/// let unknown = Query::new("etcd URL", vec![("tiemout_ms".into(), "5".into())], &["timeout_ms"]);
/// assert!(unknown.unwrap_err().to_string().contains("known: timeout_ms"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Query {
    what: String,
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Checks `pairs` against `known`; `what` names the URL kind in errors ("etcd URL").
    pub fn new(what: &str, pairs: Vec<(String, String)>, known: &[&str]) -> Result<Self> {
        for (i, (k, _)) in pairs.iter().enumerate() {
            if !known.contains(&k.as_str()) {
                let hint =
                    nearest(k, known).map_or(String::new(), |n| format!("did you mean {n:?}? "));
                return Err(Error::config(format!(
                    "{what}: unknown parameter {k:?} ({hint}known: {})",
                    known.join(", ")
                )));
            }
            if pairs[..i].iter().any(|(seen, _)| seen == k) {
                return Err(Error::config(format!(
                    "{what}: parameter {k:?} given more than once"
                )));
            }
        }
        Ok(Query {
            what: what.to_string(),
            pairs,
        })
    }

    /// Checks `pairs` against `params` (their keys and aliases; one parameter given under two
    /// spellings is refused as a repeat) and applies each one given to `cfg`, in the table's
    /// order.
    pub fn apply<C>(
        what: &str,
        pairs: Vec<(String, String)>,
        params: &[Param<C>],
        mut cfg: C,
    ) -> Result<C> {
        let known: Vec<&str> = params.iter().flat_map(Param::spellings).collect();
        let q = Query::new(what, pairs, &known)?;
        for p in params {
            let mut given = p.spellings().filter_map(|k| q.get(k).map(|v| (k, v)));
            let Some((key, raw)) = given.next() else {
                continue;
            };
            if let Some((other, _)) = given.next() {
                return Err(Error::config(format!(
                    "{what}: {key} and {other} are one parameter; give it once"
                )));
            }
            cfg = (p.apply)(cfg, Value { what, key, raw })?;
        }
        Ok(cfg)
    }

    fn value<'a>(&'a self, key: &'a str) -> Option<Value<'a>> {
        self.get(key).map(|raw| Value {
            what: &self.what,
            key,
            raw,
        })
    }

    /// The raw value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `key` as a number (`u32`, `f64`, ...).
    pub fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>> {
        self.value(key).map(|v| v.number()).transpose()
    }

    /// `key` as a whole number of milliseconds.
    pub fn millis(&self, key: &str) -> Result<Option<Duration>> {
        self.value(key).map(|v| v.millis()).transpose()
    }

    /// `key` as a switch (see [`parse_bool_param`]).
    pub fn flag(&self, key: &str) -> Result<Option<bool>> {
        self.value(key).map(|v| v.flag()).transpose()
    }

    /// `key` as one of `choices`; any other value is an [`Error::Config`] that lists them.
    ///
    /// ```
    /// use lock_core::driver::Query;
    /// let q = Query::new("my URL", vec![("keys".into(), "plain".into())], &["keys"])?;
    /// assert_eq!(q.choice("keys", &["tagged", "plain"])?, Some("plain"));
    /// let q = Query::new("my URL", vec![("keys".into(), "flat".into())], &["keys"])?;
    /// assert!(q.choice("keys", &["tagged", "plain"]).is_err());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn choice(&self, key: &str, choices: &[&'static str]) -> Result<Option<&'static str>> {
        self.value(key).map(|v| v.choice(choices)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIS: &[&str] = &[
        "keys",
        "prefix",
        "allow_eviction",
        "timeout_ms",
        "connect_timeout_ms",
    ];

    fn said(key: &str, known: &[&str]) -> String {
        match Query::new("Redis URL", vec![(key.into(), "1".into())], known) {
            Err(e) => e.to_string(),
            Ok(_) => format!("{key} was accepted"),
        }
    }

    /// A typo gets the parameter it most likely meant, then the list; a key near none of them,
    /// or as near to two, gets only the list (a wrong guess would mislead).
    #[test]
    fn a_misspelt_parameter_is_named_with_what_was_meant() {
        assert_eq!(
            said("timeot", REDIS),
            "configuration error: Redis URL: unknown parameter \"timeot\" (did you mean \
             \"timeout_ms\"? known: keys, prefix, allow_eviction, timeout_ms, connect_timeout_ms)"
        );
        assert!(said("prefx", REDIS).contains("did you mean \"prefix\"?"));
        assert!(said("Timeout_MS", REDIS).contains("did you mean \"timeout_ms\"?"));
        assert!(said("connect_timeout", REDIS).contains("did you mean \"connect_timeout_ms\"?"));
        for far in ["password", "db", "x"] {
            assert!(
                !said(far, REDIS).contains("did you mean"),
                "{far}: {}",
                said(far, REDIS)
            );
        }
        // As near to "key" as to "kez": no guess.
        assert!(!said("keq", &["key", "kez"]).contains("did you mean"));
    }
}
