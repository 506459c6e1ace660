//! distlock: one distributed-lock contract, many backends.
//!
//! Depend on this crate, enable the drivers you want as cargo features (`file` — the default —
//! `redis`, `redlock`, `zookeeper`, `etcd`, or `full`), and pick the backend at run time from a
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
//! | `rediss://…[?tls_ca_file=/ca.pem]` | `redis-tls` | `lock_redis::RedisLock` over TLS |
//! | `redlock://h1,h2,h3` | `redlock` | `lock_redlock::RedlockLock` |
//! | `zk://h1,h2[/chroot]` | `zookeeper` | `lock_zookeeper::ZkLock` |
//! | `etcd://h1,h2[/prefix]` | `etcd` | `lock_etcd::EtcdLock` |
//!
//! A scheme whose feature is not compiled in is an [`Error::Config`] that names the feature.
//! Third-party drivers add their scheme with [`register`]. URLs are never echoed in errors:
//! drivers print them with the password replaced by `***`, and so does [`redact`].

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

pub use lock_core;
pub use lock_core::memory::MemoryLock;
pub use lock_core::{
    async_trait, Capabilities, DistributedLock, Error, Fencing, FencingToken, Lease, LeaseState,
    LockName, LockOptions, LostSignal, Renewal, Result, Wait,
};
#[cfg(feature = "etcd")]
pub use lock_etcd;
#[cfg(feature = "file")]
pub use lock_file;
#[cfg(feature = "redis")]
pub use lock_redis;
#[cfg(feature = "redlock")]
pub use lock_redlock;
#[cfg(feature = "zookeeper")]
pub use lock_zookeeper;

/// What a connector returns: a driver, behind the contract.
pub type ConnectFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send>>;

type Connector = Arc<dyn Fn(String) -> ConnectFuture + Send + Sync>;

/// Every scheme this crate knows, and the feature that compiles its driver in. Adding a driver:
/// one line here, one arm in [`builtin`].
const BUILTIN: &[(&str, &str)] = &[
    ("memory", "(always on)"),
    ("file", "file"),
    ("redis", "redis"),
    ("rediss", "redis-tls"),
    ("redlock", "redlock"),
    ("zk", "zookeeper"),
    ("etcd", "etcd"),
];

/// The connector of a built-in scheme, if its feature is compiled in.
fn builtin(scheme: &str) -> Option<Connector> {
    fn boxed<F, Fut, D>(f: F) -> Option<Connector>
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<D>> + Send + 'static,
        D: DistributedLock + 'static,
    {
        Some(Arc::new(move |url| {
            let fut = f(url);
            Box::pin(async move { Ok(Arc::new(fut.await?) as Arc<dyn DistributedLock>) })
        }))
    }
    match scheme {
        "memory" => boxed(|url: String| async move { memory_store(&url) }),
        #[cfg(feature = "file")]
        "file" => boxed(|url: String| async move { lock_file::FileLock::from_url(&url).await }),
        #[cfg(feature = "redis")]
        "redis" => boxed(|url: String| async move { lock_redis::RedisLock::from_url(&url).await }),
        #[cfg(feature = "redis-tls")]
        "rediss" => boxed(|url: String| async move { lock_redis::RedisLock::from_url(&url).await }),
        #[cfg(feature = "redlock")]
        "redlock" => {
            boxed(|url: String| async move { lock_redlock::RedlockLock::from_url(&url).await })
        }
        #[cfg(feature = "zookeeper")]
        "zk" => boxed(|url: String| async move { lock_zookeeper::ZkLock::from_url(&url).await }),
        #[cfg(feature = "etcd")]
        "etcd" => boxed(|url: String| async move { lock_etcd::EtcdLock::from_url(&url).await }),
        _ => None,
    }
}

/// `memory://NAME`: one store per name in this process, so two `connect`s see each other.
fn memory_store(url: &str) -> Result<MemoryLock> {
    static STORES: OnceLock<Mutex<HashMap<String, MemoryLock>>> = OnceLock::new();
    let name = url.strip_prefix("memory://").unwrap_or("");
    if name.contains(['/', '?', '@']) {
        return Err(Error::config(
            "a memory URL is memory:// or memory://STORE-NAME",
        ));
    }
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Ok(stores.entry(name.to_string()).or_default().clone())
}

fn registry() -> &'static RwLock<BTreeMap<String, Connector>> {
    static REGISTRY: OnceLock<RwLock<BTreeMap<String, Connector>>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        RwLock::new(
            BUILTIN
                .iter()
                .filter_map(|(s, _)| Some((s.to_string(), builtin(s)?)))
                .collect(),
        )
    })
}

/// The part before `://`, checked; never echoes the URL (it may hold a password).
fn scheme_of(url: &str) -> Result<&str> {
    let (scheme, _) = url
        .split_once("://")
        .ok_or_else(|| Error::config("a lock URL looks like scheme://...; it has no \"://\""))?;
    let ok = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase())
        && scheme
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
    if ok {
        Ok(scheme)
    } else {
        Err(Error::config(format!(
            "{:?} is not a URL scheme (lowercase letters, digits, + - .)",
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
    registry()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .cloned()
        .collect()
}

/// Connects the driver for `url`'s scheme.
///
/// Errors: [`Error::Config`] for a URL without a scheme, an unknown scheme (listing the
/// available ones), or a scheme whose cargo feature is off (naming the feature); otherwise
/// whatever the driver's own `connect` returns (`Unavailable` when its servers do not answer).
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let scheme = scheme_of(url)?;
    let connector = registry()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(scheme)
        .cloned();
    match connector {
        Some(c) => c(url.to_string()).await,
        None => Err(unavailable_scheme(scheme)),
    }
}

fn unavailable_scheme(scheme: &str) -> Error {
    let available = schemes().join(", ");
    match BUILTIN.iter().find(|(s, _)| *s == scheme) {
        Some((_, feature)) => Error::config(format!(
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
    let probe = format!("{scheme}://");
    let checked = scheme_of(&probe)?;
    if BUILTIN.iter().any(|(s, _)| *s == checked) {
        return Err(Error::config(format!(
            "{checked}:// is distlock's own scheme; enable its feature instead"
        )));
    }
    let mut reg = registry().write().unwrap_or_else(|p| p.into_inner());
    if reg.contains_key(checked) {
        return Err(Error::config(format!("{checked}:// is already registered")));
    }
    reg.insert(
        checked.to_string(),
        Arc::new(move |url| Box::pin(connect(url)) as ConnectFuture),
    );
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
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".into();
    };
    match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let shown = if user.contains(['/', '?', '#']) {
                "***".to_string()
            } else {
                format!("{user}:***")
            };
            format!("{scheme}://{shown}@{}", &rest[at + 1..])
        }
        None => url.to_string(),
    }
}
