//! `ZkConfig`: ensemble, session timeout, base path, digest credentials.

use std::time::Duration;

use lock_core::driver::{redacted_url, MultiHostUrl, Param, Query, Secret};
use lock_core::{Error, Result};

/// The backend's name, as [`DistributedLock::backend`](lock_core::DistributedLock::backend)
/// and errors give it.
pub(crate) const BACKEND: &str = "zookeeper";

/// Where the ensemble is and how this client's session behaves.
///
/// ```
/// use std::time::Duration;
/// use lock_zookeeper::ZkConfig;
/// let cfg = ZkConfig::from_url("zk://locker:s3cret@10.0.0.1:2181,10.0.0.2:2181/app?session_timeout_ms=4000")?;
/// assert_eq!(cfg.hosts(), "10.0.0.1:2181,10.0.0.2:2181");
/// assert_eq!(cfg.chroot(), Some("/app"));
/// assert_eq!(cfg.session_timeout(), Duration::from_secs(4));
/// assert!(!format!("{cfg:?} {cfg}").contains("s3cret"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone)]
pub struct ZkConfig {
    hosts: String,
    chroot: Option<String>,
    user: Option<String>,
    password: Option<Secret>,
    session_timeout: Duration,
    base_path: String,
    persistent_parents: bool,
    /// Exclusive nodes are named as Curator's `InterProcessReadWriteLock` names its writers.
    rwlock_nodes: bool,
}

impl ZkConfig {
    /// `hosts` is `h1:p1,h2:p2`. Session timeout 6 s, base path `/distlock`, no credentials.
    pub fn new(hosts: impl Into<String>) -> Self {
        ZkConfig {
            hosts: hosts.into(),
            chroot: None,
            user: None,
            password: None,
            session_timeout: Duration::from_secs(6),
            base_path: "/distlock".into(),
            persistent_parents: false,
            rwlock_nodes: false,
        }
    }

    /// Parses `zk://[user:password@]h1:p1,h2:p2[/chroot][?session_timeout_ms=N&base=/path&parents=persistent&nodes=mutex|rwlock]`.
    ///
    /// ```
    /// use lock_core::LockName;
    /// use lock_zookeeper::ZkConfig;
    /// let name = LockName::new("mylock")?;
    /// let c = ZkConfig::from_url("zk://h:1?base=/")?;
    /// assert_eq!(c.lock_path(&name), "/mylock");
    /// let c = ZkConfig::from_url("zk://h:1?base=/locks&parents=persistent")?;
    /// assert_eq!(c.lock_path(&name), "/locks/mylock");
    /// assert!(c.persistent_parents());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let u = MultiHostUrl::parse(url, "zk", "ZooKeeper")?;
        let mut cfg = ZkConfig::new(u.hosts.join(","));
        match (u.user, u.password) {
            (None, _) => {}
            (Some(user), _) if user.is_empty() => {
                return Err(Error::config("ZooKeeper URL: empty user name"))
            }
            (Some(user), Some(password)) => cfg = cfg.with_credentials(user, password),
            (Some(_), None) => {
                return Err(Error::config(
                    "ZooKeeper URL: digest credentials are user:password",
                ))
            }
        }
        if let Some(c) = u.path {
            cfg = cfg.with_chroot(&c)?;
        }
        Query::apply("ZooKeeper URL", u.query, Self::URL_PARAMS, cfg)
    }

    /// The query parameters of a ZooKeeper URL (lock-core's `Query::apply` reads them).
    pub const URL_PARAMS: &'static [Param<ZkConfig>] = &[
        Param::new("parents", |c: Self, v| {
            Ok(c.with_persistent_parents(v.choice(&["container", "persistent"])? == "persistent"))
        }),
        Param::new("session_timeout_ms", |c: Self, v| {
            Ok(c.with_session_timeout(v.millis()?))
        }),
        Param::new("base", |c: Self, v| c.with_base_path(v.raw())),
        Param::new("nodes", |c: Self, v| {
            Ok(c.with_rwlock_nodes(v.choice(&["mutex", "rwlock"])? == "rwlock"))
        }),
    ];

    // Digest credentials (`addauth digest user:password`), with_credentials and user: lock
    // nodes then get ACLs that only this user can delete.
    lock_core::driver::credential_setters!();
    /// The session timeout: the lease of every lock of this client (the server fits it to
    /// its own bounds). Zero, or above a day, is refused at connect.
    pub fn with_session_timeout(mut self, d: Duration) -> Self {
        self.session_timeout = d;
        self
    }
    /// A chroot for the whole client (`/app`).
    pub fn with_chroot(mut self, chroot: &str) -> Result<Self> {
        self.chroot = Some(valid_path(chroot, "chroot")?);
        Ok(self)
    }
    /// Parent of every lock's node (default `/distlock`); `/` puts lock `name` at `/name`,
    /// where Curator's and kazoo's lock recipes put a lock path of one segment.
    pub fn with_base_path(mut self, base: &str) -> Result<Self> {
        self.base_path = if base == "/" {
            base.to_string()
        } else {
            valid_path(base, "base path")?
        };
        Ok(self)
    }
    /// Creates each lock's node as a persistent node instead of a container (URL:
    /// `parents=persistent`). ZooKeeper removes an empty container after a while; a kazoo
    /// `Lock` object that is reused then fails with `NoNodeError`. Persistent nodes stay, one
    /// per name ever locked.
    pub fn with_persistent_parents(mut self, on: bool) -> Self {
        self.persistent_parents = on;
        self
    }
    /// Names exclusive contenders' nodes `_c_<uuid>-__WRIT__<seq>`, as Curator's
    /// `InterProcessReadWriteLock` names its writers, instead of `_c_<uuid>-lock-<seq>`, as
    /// its `InterProcessMutex` names its holders (URL: `nodes=rwlock`; default `nodes=mutex`).
    /// Each Curator recipe orders only the nodes it names itself: Curator's readers wait only
    /// for `__WRIT__` nodes, and its mutex sorts a `__WRIT__` node after its own. Share a lock
    /// with one of the two. (distlock itself reads every recipe's nodes either way.)
    ///
    /// ```
    /// let c = lock_zookeeper::ZkConfig::from_url("zk://h:1?nodes=rwlock")?;
    /// assert!(c.rwlock_nodes());
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn with_rwlock_nodes(mut self, on: bool) -> Self {
        self.rwlock_nodes = on;
        self
    }
    /// Whether exclusive nodes are named as Curator's read-write lock's writers.
    pub fn rwlock_nodes(&self) -> bool {
        self.rwlock_nodes
    }
    /// What separates an exclusive node's unique prefix from its sequence.
    pub(crate) fn exclusive_mark(&self) -> &'static str {
        if self.rwlock_nodes {
            "-__WRIT__"
        } else {
            "-lock-"
        }
    }
    /// Whether lock nodes are persistent rather than containers.
    pub fn persistent_parents(&self) -> bool {
        self.persistent_parents
    }
    /// The node of lock `name`, whose sequential children are its contenders:
    /// `<base>/<name>` (relative to the chroot, if any).
    pub fn lock_path(&self, name: &lock_core::LockName) -> String {
        if self.base_path == "/" {
            format!("/{name}")
        } else {
            format!("{}/{name}", self.base_path)
        }
    }

    /// `h1:p1,h2:p2`.
    pub fn hosts(&self) -> &str {
        &self.hosts
    }
    /// The chroot, if any.
    pub fn chroot(&self) -> Option<&str> {
        self.chroot.as_deref()
    }
    /// Session timeout asked for (the server may clamp it; the driver uses the negotiated one).
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }
    /// Base path.
    pub fn base_path(&self) -> &str {
        &self.base_path
    }
    pub(crate) fn digest(&self) -> Option<String> {
        Some(format!(
            "{}:{}",
            self.user.as_ref()?,
            self.password.as_ref()?.expose()
        ))
    }
    pub(crate) fn secret(&self) -> Option<&Secret> {
        self.password.as_ref()
    }
    pub(crate) fn without_chroot(&self) -> ZkConfig {
        ZkConfig {
            chroot: None,
            ..self.clone()
        }
    }
    /// What no session could be opened with: no server, or an empty entry in the list (the
    /// caller's mistake, not an unreachable ensemble); lock nodes in the tree the server
    /// reserves (`/zookeeper`); a session timeout of zero or above a day. Checked once, at
    /// connect.
    pub(crate) fn check(&self) -> Result<()> {
        lock_core::driver::check_timeout("ZooKeeper session timeout", self.session_timeout)?;
        if self.hosts.split(',').any(|h| h.trim().is_empty()) {
            return Err(Error::config(format!(
                "ZooKeeper: the server list {:?} is empty or has an empty entry",
                self.hosts
            )));
        }
        if let Some(root) = self.reserved(&self.base_path) {
            return Err(Error::config(format!(
                "ZooKeeper: {root} is in the tree the server reserves (/zookeeper); use another \
                 chroot or base path"
            )));
        }
        Ok(())
    }

    /// `path` (below the chroot) as seen from the server's root, if it is in the tree the
    /// server reserves (`/zookeeper`): no lock node may go there.
    pub(crate) fn reserved(&self, path: &str) -> Option<String> {
        let root = match (self.chroot.as_deref(), path) {
            (Some(chroot), "/") => chroot.to_string(),
            (chroot, path) => format!("{}{path}", chroot.unwrap_or("")),
        };
        (root == "/zookeeper" || root.starts_with("/zookeeper/")).then_some(root)
    }

    pub(crate) fn connect_string(&self) -> String {
        format!("{}{}", self.hosts, self.chroot.as_deref().unwrap_or(""))
    }

    /// The URL without the password.
    pub fn redacted_url(&self) -> String {
        let hosts = [self.hosts.clone()];
        redacted_url("zk", self.user.as_deref(), &hosts, self.chroot.as_deref())
    }
}

fn valid_path(p: &str, what: &str) -> Result<String> {
    let ok = p.starts_with('/')
        && p.len() > 1
        && !p.ends_with('/')
        && !p.contains("//")
        && p.split('/')
            .skip(1)
            .all(|seg| seg != "." && seg != ".." && !seg.is_empty())
        && !p.chars().any(|c| c.is_control());
    if ok {
        Ok(p.to_string())
    } else {
        Err(Error::config(format!(
            "ZooKeeper {what} {:?} must be an absolute path like /distlock",
            p.escape_debug().to_string()
        )))
    }
}

lock_core::driver::redacted_config!(ZkConfig {
    session_timeout,
    base_path,
    persistent_parents,
    rwlock_nodes
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_urls_without_the_password() {
        conformance_tests::assert_bad_urls_rejected(
            ZkConfig::from_url,
            &[
                "redis://h:1",
                "zk://u:topsecret@",
                "zk://u:topsecret@h:1/bad//chroot",
                "zk://u:topsecret@h:1?session_timeout_ms=soon",
                "zk://u:topsecret@h:1?x=1",
                "zk://nocolon@h:1",
                "zk://u:topsecret@h:1?base=relative",
                "zk://u:topsecret@h:1?parents=maybe",
            ],
            "topsecret",
        );
    }

    /// No server to ask (or an empty entry in the list) is a Config error at connect, not an
    /// unreachable ensemble.
    #[tokio::test]
    async fn connect_refuses_an_empty_host_list() {
        let bad = ["", " ", ",", "127.0.0.1:1,,127.0.0.1:2"].map(|h| (ZkConfig::new(h), h));
        conformance_tests::assert_refused_at_connect(crate::ZkLock::connect, bad.to_vec()).await;
    }

    /// ZooKeeper reserves `/zookeeper` (quotas, the ensemble's config): lock nodes there are a
    /// Config error at connect, by chroot or base path, not nodes made among the server's own.
    /// A chroot of `/zookeeperx`, or a base of `/zookeeper` below another chroot, is fine.
    #[tokio::test]
    async fn connect_refuses_the_reserved_zookeeper_tree() {
        let url = |u: &str| ZkConfig::from_url(u).unwrap();
        let bad = vec![
            (url("zk://127.0.0.1:1/zookeeper"), "chroot /zookeeper"),
            (url("zk://127.0.0.1:1/zookeeper/quota"), "chroot below it"),
            (url("zk://127.0.0.1:1?base=/zookeeper"), "base /zookeeper"),
            (url("zk://127.0.0.1:1?base=/zookeeper/x"), "base below it"),
        ];
        conformance_tests::assert_refused_at_connect(crate::ZkLock::connect, bad).await;
        for fine in ["zk://h:1/zookeeperx", "zk://h:1/app?base=/zookeeper"] {
            assert!(url(fine).check().is_ok(), "{fine}");
        }
    }

    #[test]
    fn parses_credentials_and_base() {
        let c = ZkConfig::from_url("zk://a%3Ab:p%40w@h:1,h:2?base=/locks").unwrap();
        assert_eq!(c.user(), Some("a:b"));
        assert_eq!(c.secret().map(Secret::expose), Some("p@w"));
        assert_eq!(c.base_path(), "/locks");
        assert_eq!(c.connect_string(), "h:1,h:2");
    }
}
