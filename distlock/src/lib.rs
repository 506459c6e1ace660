//! distlock: one distributed-lock contract, many backends.
//!
//! Depend on this crate, enable the drivers you want as cargo features (`file` — the default —
//! `redis`, `redlock`, `zookeeper`, `etcd`, `postgres`, or `full`), and pick the backend at run time from a
//! URL:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! use std::time::Duration;
//! use distlock::{LockName, LockOptions};
//!
//! // The same code runs on redis://, zk://, etcd://, ... — only the URL changes.
//! let locks = distlock::connect("memory://docs").await?;
//! let lease = locks
//!     .acquire(&LockName::new("invoices")?, &LockOptions::new(Duration::from_secs(10)))
//!     .await?;
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! | scheme | feature | driver |
//! |---|---|---|
//! | `memory://[store]` | always | [`MemoryLock`]: one in-process store per name |
//! | `file:///dir` | `file` (default) | `lock_file::FileLock`: processes of one machine |
//! | `redis://` | `redis` | `lock_redis::RedisLock` |
//! | `rediss://…[?tls_ca_file=/ca.pem]`, `rediss+sentinel://…`, `rediss+cluster://…` | `redis-tls` | `lock_redis::RedisLock` over TLS |
//! | `redlock://h1,h2,h3` | `redlock` | `lock_redlock::RedlockLock` |
//! | `zk://h1,h2[/chroot]` | `zookeeper` | `lock_zookeeper::ZkLock` |
//! | `etcd://h1,h2[/prefix]` | `etcd` | `lock_etcd::EtcdLock` |
//! | `postgres://user:pw@h/db` (or `postgresql://`) | `postgres` | `lock_postgres::PgLock` |
//! | `postgres://…?sslmode=verify-full` | `postgres-tls` | `lock_postgres::PgLock` over TLS |
//!
//! A scheme whose feature is not compiled in is an [`Error::Config`] that names the feature.
//! Third-party drivers add their scheme with [`register`]. URLs are never echoed in errors:
//! drivers print them with the password replaced by `***`, and so does [`redact`].

// The README's and the book's Rust examples are compiled (and, unless `no_run`, run) as this
// crate's doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeGuide;

#[cfg(doctest)]
#[doc = include_str!("../../docs/getting-started.md")]
struct GettingStartedGuide;

#[cfg(doctest)]
#[doc = include_str!("../../docs/fencing.md")]
struct FencingGuide;

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};

pub use lock_core::driver::Driver;

pub use lock_core;
pub use lock_core::memory::MemoryLock;
pub use lock_core::{
    async_trait, while_held, Capabilities, DistributedLock, Election, Error, Fencing, FencingToken,
    HolderInfo, Leader, LeaderValue, Leadership, Lease, LeaseState, LockExt, LockName, LockOptions,
    LostSignal, Mode, Observation, Observer, Renewal, Result, Scope, StopOn, Wait,
};

pub mod blocking;
#[cfg(feature = "etcd")]
pub use lock_etcd;
#[cfg(feature = "file")]
pub use lock_file;
#[cfg(feature = "postgres")]
pub use lock_postgres;
#[cfg(feature = "redis")]
pub use lock_redis;
#[cfg(feature = "redlock")]
pub use lock_redlock;
#[cfg(feature = "zookeeper")]
pub use lock_zookeeper;

/// What a connector returns: a driver, behind the contract.
pub use lock_core::driver::ConnectFuture;

type Connector = Arc<dyn Fn(String) -> ConnectFuture + Send + Sync>;

/// distlock's optional drivers: the cargo feature that compiles each in, and the schemes it
/// brings. Only for saying which feature a scheme needs when it is off; the connectors and
/// their schemes come from the drivers' own `DRIVER` declarations ([`compiled_in`]), and a
/// test checks that the two agree.
const FEATURES: &[(&str, &[&str])] = &[
    ("file", &["file"]),
    ("redis", &["redis", "redis+sentinel", "redis+cluster"]),
    (
        "redis-tls",
        &["rediss", "rediss+sentinel", "rediss+cluster"],
    ),
    ("redlock", &["redlock"]),
    ("zookeeper", &["zk"]),
    ("etcd", &["etcd"]),
    ("postgres", &["postgres", "postgresql"]),
];

/// The drivers this build compiles in, each declaring its own schemes.
fn compiled_in() -> Vec<Driver> {
    vec![
        lock_core::memory::DRIVER,
        #[cfg(feature = "file")]
        lock_file::DRIVER,
        #[cfg(feature = "redis")]
        lock_redis::DRIVER,
        #[cfg(feature = "redlock")]
        lock_redlock::DRIVER,
        #[cfg(feature = "zookeeper")]
        lock_zookeeper::DRIVER,
        #[cfg(feature = "etcd")]
        lock_etcd::DRIVER,
        #[cfg(feature = "postgres")]
        lock_postgres::DRIVER,
    ]
}

fn registry() -> &'static RwLock<BTreeMap<String, Connector>> {
    static REGISTRY: OnceLock<RwLock<BTreeMap<String, Connector>>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut map = BTreeMap::new();
        for d in compiled_in() {
            for scheme in d.schemes {
                map.insert(scheme.to_string(), Arc::new(d.connect) as Connector);
            }
        }
        RwLock::new(map)
    })
}

/// The part before `://`, checked, in lower case: schemes are case-insensitive (RFC 3986,
/// 3.1). Never echoes the URL (it may hold a password).
fn scheme_of(url: &str) -> Result<String> {
    let (scheme, _) = url
        .split_once("://")
        .ok_or_else(|| Error::config("a lock URL looks like scheme://...; it has no \"://\""))?;
    let ok = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if ok {
        Ok(scheme.to_ascii_lowercase())
    } else {
        Err(Error::config(format!(
            "{:?} is not a URL scheme (letters, digits, + - .)",
            scheme.chars().take(32).collect::<String>()
        )))
    }
}

/// The schemes [`connect`] accepts in this build: the compiled-in drivers and registered ones.
///
/// ```
/// assert!(distlock::schemes().contains(&"memory".to_string()));
/// ```
pub fn schemes() -> Vec<String> {
    registry().read().keys().cloned().collect()
}

/// Connects the driver for `url`'s scheme, matched in any case (`Redis://` is `redis://`, as
/// RFC 3986 has it; the driver gets the URL with the scheme in lower case).
///
/// Errors: [`Error::Config`] for a URL without a scheme, an unknown scheme (listing the
/// available ones), or a scheme whose cargo feature is off (naming the feature); otherwise
/// whatever the driver's own `connect` returns (`Unavailable` when its servers do not answer).
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let scheme = scheme_of(url)?;
    let connector = registry().read().get(&scheme).cloned();
    match connector {
        // The scheme is ASCII: as long in lower case as it was.
        Some(c) => c(format!("{scheme}{}", &url[scheme.len()..])).await,
        None => Err(unavailable_scheme(&scheme)),
    }
}

fn unavailable_scheme(scheme: &str) -> Error {
    let available = schemes().join(", ");
    match FEATURES
        .iter()
        .find(|(_, schemes)| schemes.contains(&scheme))
    {
        Some((feature, _)) => Error::config(format!(
            "{scheme}:// needs distlock's cargo feature `{feature}` (this build has: {available})"
        )),
        None => Error::config(format!(
            "unknown lock URL scheme {scheme:?} (this build has: {available}; other drivers \
             add theirs with distlock::register)"
        )),
    }
}

/// [`connect`] to the URL in the `DISTLOCK_URL` environment variable.
pub async fn from_env() -> Result<Arc<dyn DistributedLock>> {
    match std::env::var("DISTLOCK_URL") {
        Ok(url) => connect(&url).await,
        Err(_) => Err(Error::config(
            "DISTLOCK_URL is not set (or not UTF-8); set it to e.g. redis://127.0.0.1:6379",
        )),
    }
}

/// Adds a driver for `scheme` (a third-party backend). `connect` receives the whole URL.
/// A scheme that is already registered (built in or not) is refused, never replaced.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use std::sync::Arc;
/// // A "driver" that hands out an in-memory store, under its own scheme.
/// distlock::register("mine", |_url| async {
///     Ok(Arc::new(distlock::MemoryLock::new()) as Arc<dyn distlock::DistributedLock>)
/// })?;
/// let locks = distlock::connect("mine://anything").await?;
/// assert_eq!(locks.backend(), "memory");
/// assert!(distlock::register("mine", |_url| async { distlock::connect("memory://").await }).is_err());
/// # Ok(()) }
/// ```
pub fn register<F, Fut>(scheme: &str, connect: F) -> Result<()>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<dyn DistributedLock>>> + Send + 'static,
{
    let connector: Connector = Arc::new(move |url| Box::pin(connect(url)) as ConnectFuture);
    add_schemes(&[scheme], &connector)
}

/// Registers a third-party driver by its own declaration ([`Driver`]): every scheme it serves,
/// as [`register`] would. Nothing is registered if one of its schemes is taken.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// use distlock::Driver;
/// fn connect(_url: String) -> distlock::ConnectFuture {
///     lock_core::driver::connecting(async { Ok(distlock::MemoryLock::new()) })
/// }
/// const TABLE: Driver = Driver { backend: "memory", schemes: &["table", "table+x"], connect };
/// distlock::register_driver(TABLE)?;
/// assert!(distlock::schemes().contains(&"table+x".to_string()));
/// assert!(distlock::register_driver(TABLE).is_err());
/// # Ok(()) }
/// ```
pub fn register_driver(driver: Driver) -> Result<()> {
    add_schemes(driver.schemes, &(Arc::new(driver.connect) as Connector))
}

/// Registers `connector` under every one of `schemes`, or none of them: each is checked (a
/// valid scheme, not distlock's own, not registered yet) under the registry's lock before any
/// is added.
fn add_schemes(schemes: &[&str], connector: &Connector) -> Result<()> {
    let mut reg = registry().write();
    let mut checked = Vec::with_capacity(schemes.len());
    for scheme in schemes {
        let probe = format!("{scheme}://");
        let s = scheme_of(&probe)?;
        let ours = FEATURES.iter().any(|(_, own)| own.contains(&s.as_str()));
        if ours || s == "memory" {
            return Err(Error::config(format!(
                "{s}:// is distlock's own scheme; enable its feature instead"
            )));
        }
        if reg.contains_key(&s) || checked.contains(&s) {
            return Err(Error::config(format!("{s}:// is already registered")));
        }
        checked.push(s);
    }
    for s in checked {
        reg.insert(s, connector.clone());
    }
    Ok(())
}

/// `url` with the password (if any) replaced by `***`, for logs and messages.
///
/// Everything between `scheme://` and the *last* `@` counts as credentials: a password may
/// contain `/`, `?`, `#`, `@` or `:` unescaped, and then nobody can tell where it ends, so this
/// hides too much rather than too little. The user name stays when it is plainly one.
///
/// ```
/// assert_eq!(distlock::redact("redis://app:s3cret@h:6379/0"), "redis://app:***@h:6379/0");
/// assert_eq!(distlock::redact("redis://app:p/w?x#y@z:q@h:1"), "redis://app:***@h:1");
/// assert_eq!(distlock::redact("redis://p/w?x#y:q@h:1"), "redis://***@h:1");
/// assert_eq!(distlock::redact("etcd://h1,h2"), "etcd://h1,h2");
/// ```
///
/// A query parameter that holds a password (`sentinel_password`, `password`) is hidden too,
/// its value up to the next `&` whatever characters it has:
///
/// ```
/// assert_eq!(
///     distlock::redact("redis+sentinel://s1/m?sentinel_password=p@w?x&prefix=a"),
///     "redis+sentinel://s1/m?sentinel_password=***&prefix=a"
/// );
/// ```
pub fn redact(url: &str) -> String {
    let url = mask_secret_params(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".into();
    };
    match lock_core::driver::split_userinfo(rest) {
        (Some(ui), after) => {
            let shown = if ui.user.contains(['/', '?', '#']) {
                "***".to_string()
            } else {
                format!("{}:***", ui.user)
            };
            format!("{scheme}://{shown}@{after}")
        }
        (None, _) => url.clone(),
    }
}

/// The query keys whose values are passwords, in any driver's URL.
const SECRET_PARAMS: [&str; 2] = ["sentinel_password", "password"];

/// `url` with the value of each [`SECRET_PARAMS`] parameter (a key right after `?` or `&`)
/// replaced by `***`, up to the next `&`: a raw password may hold `?`, `#` or `@`.
fn mask_secret_params(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    let mut at_param = false;
    while let Some(c) = rest.chars().next() {
        let secret = SECRET_PARAMS.iter().find(|k| {
            rest.strip_prefix(**k)
                .is_some_and(|after| after.starts_with('='))
        });
        if let (true, Some(key)) = (at_param, secret) {
            out.push_str(key);
            out.push_str("=***");
            rest = rest.find('&').map_or("", |end| &rest[end..]);
            at_param = false;
            continue;
        }
        out.push(c);
        at_param = matches!(c, '?' | '&');
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scheme a compiled-in driver declares is one this crate knows the feature of,
    /// and every compiled-in driver's backend is listed: the feature table cannot drift
    /// from the drivers' own declarations.
    #[test]
    fn the_feature_table_agrees_with_the_drivers() {
        for d in compiled_in() {
            for scheme in d.schemes {
                let known = *scheme == "memory" || FEATURES.iter().any(|(_, s)| s.contains(scheme));
                assert!(
                    known,
                    "{scheme}:// (driver {}) is missing from FEATURES",
                    d.backend
                );
            }
        }
    }

    /// Schemes are case-insensitive (RFC 3986, 3.1): `MEMORY://` and `File://` are the memory
    /// and file drivers, handed a URL with the scheme in lower case (their own parsers check
    /// it), and a registered scheme is stored in lower case. What is not a scheme in any case
    /// stays a Config error.
    #[tokio::test]
    async fn a_scheme_in_capitals_is_the_same_scheme() {
        let locks = connect("MEMORY://caps").await.unwrap();
        assert_eq!(locks.backend(), "memory");
        let dir = std::env::temp_dir().join(format!("distlock-caps-{}", std::process::id()));
        let locks = connect(&format!("File://{}", dir.display())).await.unwrap();
        assert_eq!(locks.backend(), "file");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(scheme_of("Redis+TLS://h").unwrap(), "redis+tls");
        for bad in ["1redis://h", "re dis://h", "://h", "rédis://h"] {
            assert!(matches!(scheme_of(bad), Err(Error::Config { .. })), "{bad}");
        }
    }
}
