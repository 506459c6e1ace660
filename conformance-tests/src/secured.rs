//! Servers that require credentials or TLS, reached by URL: what the `security` cases get from
//! [`Harness::secured`](crate::Harness::secured).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use lock_core::driver::ConnectFuture;

/// The parts of a URL the `security` cases vary. The harness writes its driver's URL from them
/// (scheme, query options and all), the way a user would.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct UrlParts<'a> {
    /// The server.
    pub server: SocketAddr,
    /// `user:password`, each percent-encoded, as it goes before the `@`; `None`: no
    /// credentials.
    pub userinfo: Option<&'a str>,
    /// Speak TLS.
    pub tls: bool,
    /// The CA file to trust (the URL's CA-file option), if any.
    pub ca_file: Option<&'a str>,
}

type UrlWriter = dyn Fn(&UrlParts<'_>) -> String + Send + Sync;
type Connector = dyn Fn(String) -> ConnectFuture + Send + Sync;
type PemConnector = dyn Fn(SocketAddr, Vec<u8>) -> ConnectFuture + Send + Sync;

/// How to reach the backend's secured servers: a URL writer, the driver's `connect`, and which
/// servers exist. Servers that are absent skip their cases.
///
/// ```
/// use conformance_tests::Secured;
/// let secured = Secured::new(lock_core::memory::DRIVER.connect, |p| {
///     format!("memory://{}{}", p.userinfo_at(), p.server)
/// });
/// # let _ = secured;
/// ```
#[derive(Clone)]
pub struct Secured {
    pub(crate) connect: Arc<Connector>,
    pub(crate) url: Arc<UrlWriter>,
    pub(crate) auth: Option<AuthServer>,
    pub(crate) tls: Option<TlsServer>,
    pub(crate) pem: Option<Arc<PemConnector>>,
}

/// A server that requires a password.
#[derive(Clone, Debug)]
pub(crate) struct AuthServer {
    pub(crate) server: SocketAddr,
    /// `(user, password)` pairs that work; the first one is the one `with_auth` named.
    pub(crate) accounts: Vec<(String, String)>,
    /// `false` where a wrong password is simply another identity (ZooKeeper's digest scheme).
    pub(crate) checks_passwords: bool,
}

/// A server that speaks only TLS, with a certificate from a private CA.
#[derive(Clone, Debug)]
pub(crate) struct TlsServer {
    pub(crate) server: SocketAddr,
    pub(crate) ca_file: String,
}

impl Secured {
    /// `connect` makes a client from a URL (a driver's `DRIVER.connect`); `url` writes the
    /// driver's URL from [`UrlParts`].
    pub fn new(
        connect: impl Fn(String) -> ConnectFuture + Send + Sync + 'static,
        url: impl Fn(&UrlParts<'_>) -> String + Send + Sync + 'static,
    ) -> Self {
        Secured {
            connect: Arc::new(connect),
            url: Arc::new(url),
            auth: None,
            tls: None,
            pem: None,
        }
    }

    /// A server that refuses clients without `user` and `password`.
    pub fn with_auth(mut self, server: SocketAddr, user: &str, password: &str) -> Self {
        self.auth = Some(AuthServer {
            server,
            accounts: vec![(user.into(), password.into())],
            checks_passwords: true,
        });
        self
    }

    /// Another account on the auth server (say Redis's default user, an empty user name with
    /// the `requirepass` password). Needs [`with_auth`](Self::with_auth) first.
    pub fn with_account(mut self, user: &str, password: &str) -> Self {
        if let Some(a) = &mut self.auth {
            a.accounts.push((user.into(), password.into()));
        }
        self
    }

    /// The auth server takes any password as a different identity, which its ACLs then keep
    /// out (ZooKeeper's digest scheme): the wrong-password case is skipped.
    pub fn wrong_password_is_another_identity(mut self) -> Self {
        if let Some(a) = &mut self.auth {
            a.checks_passwords = false;
        }
        self
    }

    /// A TLS-only server whose certificate `ca_file` (PEM) signed.
    pub fn with_tls(mut self, server: SocketAddr, ca_file: impl Into<String>) -> Self {
        self.tls = Some(TlsServer {
            server,
            ca_file: ca_file.into(),
        });
        self
    }

    /// How to connect to a TLS server trusting a CA given as PEM bytes rather than a file (a
    /// config builder's `with_tls_ca_pem`, say): the TLS cases then cover that path too.
    pub fn with_tls_ca_pem(
        mut self,
        connect: impl Fn(SocketAddr, Vec<u8>) -> ConnectFuture + Send + Sync + 'static,
    ) -> Self {
        self.pem = Some(Arc::new(connect));
        self
    }

    pub(crate) fn url(&self, parts: &UrlParts<'_>) -> String {
        (self.url)(parts)
    }

    pub(crate) fn connect(&self, url: String) -> ConnectFuture {
        (self.connect)(url)
    }
}

impl<'a> UrlParts<'a> {
    /// `user:password@`, or nothing.
    pub fn userinfo_at(&self) -> String {
        self.userinfo.map(|u| format!("{u}@")).unwrap_or_default()
    }

    /// The query string: `extra` pairs, then `<tls_key>=true` when TLS is asked for and the
    /// driver says so by a query option (not by its scheme), then `<ca_key>=<file>`; empty,
    /// or starting with `?`.
    ///
    /// ```
    /// # use conformance_tests::UrlParts;
    /// fn url(p: &UrlParts<'_>) -> String {
    ///     let query = p.query(&["session_timeout_ms=2000"], Some("tls"), "tls_ca_file");
    ///     format!("mine://{}{}{query}", p.userinfo_at(), p.server)
    /// }
    /// # let _ = url;
    /// ```
    pub fn query(&self, extra: &[&str], tls_key: Option<&str>, ca_key: &str) -> String {
        let mut pairs: Vec<String> = extra.iter().map(|p| p.to_string()).collect();
        if let (true, Some(k)) = (self.tls, tls_key) {
            pairs.push(format!("{k}=true"));
        }
        if let Some(ca) = self.ca_file {
            pairs.push(format!("{ca_key}={ca}"));
        }
        if pairs.is_empty() {
            String::new()
        } else {
            format!("?{}", pairs.join("&"))
        }
    }

    pub(crate) fn plain(server: SocketAddr, userinfo: Option<&'a str>) -> Self {
        UrlParts {
            server,
            userinfo,
            tls: false,
            ca_file: None,
        }
    }

    pub(crate) fn tls(server: SocketAddr, ca_file: Option<&'a str>) -> Self {
        UrlParts {
            server,
            userinfo: None,
            tls: true,
            ca_file,
        }
    }
}

impl fmt::Debug for Secured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secured")
            .field("auth", &self.auth.as_ref().map(|a| a.server))
            .field("tls", &self.tls.as_ref().map(|t| t.server))
            .finish()
    }
}

/// Asserts that `parse` (a driver config's `from_url`) refuses every URL in `bad` with an
/// [`Error::Config`](lock_core::Error::Config) whose message does not show `secret`, the
/// password the URLs carry. For a driver's unit tests of its URL grammar.
///
/// ```
/// conformance_tests::assert_bad_urls_rejected(
///     |u: &str| u.parse::<u16>().map_err(|_| lock_core::Error::config("not a port")),
///     &["pw", "99999pw"],
///     "pw",
/// );
/// ```
///
/// # Panics
/// On the first URL that parses, fails with another error, or shows the secret.
#[track_caller]
pub fn assert_bad_urls_rejected<T: fmt::Debug>(
    parse: impl Fn(&str) -> lock_core::Result<T>,
    bad: &[&str],
    secret: &str,
) {
    for url in bad {
        match parse(url) {
            Ok(parsed) => panic!("{url} parsed, as {parsed:?}"),
            Err(e) => {
                assert!(
                    matches!(e, lock_core::Error::Config { .. }),
                    "{url}: not a Config error: {e:?}"
                );
                assert!(
                    !e.to_string().contains(secret),
                    "{url}: shows the secret: {e}"
                );
            }
        }
    }
}

/// Connects with each configuration of `bad` (each with why it is bad) and asserts a Config
/// error: a configuration no request could succeed with (no server, a zero timeout) is the
/// caller's mistake, to be reported as such, not as an unreachable server.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let connect = |timeout: Duration| async move {
///     if timeout.is_zero() {
///         Err(lock_core::Error::config("the timeout is zero"))
///     } else {
///         Ok(())
///     }
/// };
/// conformance_tests::assert_refused_at_connect(connect, vec![(Duration::ZERO, "timeout 0")]).await;
/// # }
/// ```
///
/// # Panics
/// On the first configuration that connects or fails with another error.
pub async fn assert_refused_at_connect<C, L, Fut>(connect: impl Fn(C) -> Fut, bad: Vec<(C, &str)>)
where
    Fut: std::future::Future<Output = lock_core::Result<L>>,
{
    for (config, why) in bad {
        let r = connect(config).await;
        assert!(
            matches!(r, Err(lock_core::Error::Config { .. })),
            "{why}: not a Config error: {:?}",
            r.err()
        );
    }
}
