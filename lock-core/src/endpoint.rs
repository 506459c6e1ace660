//! Multi-host lock URLs: `scheme://[user[:password]@]h1:p1,h2:p2[/path][?k=v&...]`.
//!
//! The `url` crate rejects a comma-separated host list (it is not one authority), and every
//! clustered backend (ZooKeeper, etcd, Redlock) uses one, so drivers share this small parser.
//! Its errors never contain the password.

use std::fmt;

use crate::{Error, Result};

/// The parts of a multi-host URL, each percent-decoded (user, password, path, query keys and
/// values; an escape that decodes to bytes that are not UTF-8 is refused).
///
/// ```
/// use lock_core::driver::MultiHostUrl;
/// let u = MultiHostUrl::parse("etcd://app:p%40ss@a:1,b:2/locks?timeout_ms=500", "etcd", "etcd")?;
/// assert_eq!(u.hosts, ["a:1", "b:2"]);
/// assert_eq!(u.user.as_deref(), Some("app"));
/// assert_eq!(u.password.as_deref(), Some("p@ss"));
/// assert_eq!(u.path.as_deref(), Some("/locks"));
/// assert_eq!(u.query, [("timeout_ms".to_string(), "500".to_string())]);
/// assert!(!format!("{u:?}").contains("p@ss"));
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct MultiHostUrl {
    /// `h:p` entries in the order given; never empty, no entry empty.
    pub hosts: Vec<String>,
    /// The user name, if the URL has userinfo.
    pub user: Option<String>,
    /// The password, if the userinfo has one.
    pub password: Option<String>,
    /// The path after the host list (starting with `/`), if any other than `/`.
    pub path: Option<String>,
    /// Query parameters in order; a key without `=` has an empty value.
    pub query: Vec<(String, String)>,
}

impl MultiHostUrl {
    /// Splits `url`, which must start with `scheme://`. `what` names the backend in errors
    /// ("ZooKeeper URL: ...").
    pub fn parse(url: &str, scheme: &str, what: &str) -> Result<Self> {
        let rest = url
            .strip_prefix(scheme)
            .and_then(|r| r.strip_prefix("://"))
            .ok_or_else(|| {
                Error::config(format!(
                    "a {what} URL starts with {scheme}://host:port[,host:port...]"
                ))
            })?;
        // RFC 3986: the authority ends at the first `/`, `?` or `#`. A password containing
        // one of them unescaped leaves an `@` behind that point; where that `@` belongs cannot
        // be known (a path or query may hold one too), so it is refused, not guessed: a wrong
        // guess would connect somewhere else or print a piece of the password.
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if tail.contains(['@', '#']) {
            return Err(Error::config(format!(
                "{what} URL: an '@' or '#' after the host list; percent-encode / ? # @ in a \
                 password (%2F %3F %23 %40) and in paths and query values"
            )));
        }
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let path = (!path.is_empty()).then_some(path);
        let (userinfo, hosts) = crate::authority::split_userinfo(authority);
        let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
        if hosts
            .iter()
            .any(|h| h.is_empty() || h.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(Error::config(format!(
                "{what} URL: empty or malformed host list"
            )));
        }
        let decode = |part: &str, which: &str| decode(part, what, which);
        let (user, password) = match userinfo {
            None => (None, None),
            Some(ui) => (
                Some(decode(ui.user, "the user name")?),
                ui.password.map(|p| decode(p, "the password")).transpose()?,
            ),
        };
        let query = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                Ok((decode(k, "a query key")?, decode(v, "a query value")?))
            })
            .collect::<Result<_>>()?;
        let path = match path.filter(|p| *p != "/") {
            Some(p) => Some(decode(p, "the path")?),
            None => None,
        };
        Ok(MultiHostUrl {
            hosts,
            user,
            password,
            path,
            query,
        })
    }

    /// `scheme://[user:***@]hosts[path]`: the URL without its password (and without the
    /// query), for logs and errors.
    pub fn redacted(&self, scheme: &str) -> String {
        redacted_url(
            scheme,
            self.user.as_deref(),
            &self.hosts,
            self.path.as_deref(),
        )
    }

    /// Each host entry as host and port, `default_port` where an entry names none; `Err`
    /// names the first entry that is not `host[:port]` or `[IPv6][:port]`.
    ///
    /// ```
    /// use lock_core::driver::MultiHostUrl;
    /// let u = MultiHostUrl::parse("redis+cluster://a:7000,[::1],b", "redis+cluster", "Redis Cluster")?;
    /// assert_eq!(
    ///     u.host_ports(6379).unwrap(),
    ///     [("a".into(), 7000), ("::1".into(), 6379), ("b".into(), 6379)]
    /// );
    /// let bad = MultiHostUrl::parse("redis+cluster://a:7000,b:x", "redis+cluster", "Redis Cluster")?;
    /// assert_eq!(bad.host_ports(6379).unwrap_err(), r#""b:x" is not host[:port] or [IPv6][:port]"#);
    /// # Ok::<(), lock_core::Error>(())
    /// ```
    pub fn host_ports(&self, default_port: u16) -> std::result::Result<Vec<(String, u16)>, String> {
        self.hosts
            .iter()
            .map(|h| {
                crate::authority::host_port(h, default_port)
                    .map(|(host, port)| (host.to_string(), port))
                    .ok_or_else(|| format!("{h:?} is not host[:port] or [IPv6][:port]"))
            })
            .collect()
    }
}

/// `scheme://[user:***@]h1,h2[path]` from parts: what drivers print instead of a URL.
///
/// ```
/// let hosts = ["a:1".to_string(), "b:2".to_string()];
/// assert_eq!(lock_core::driver::redacted_url("etcd", Some("app"), &hosts, None), "etcd://app:***@a:1,b:2");
/// ```
pub fn redacted_url(
    scheme: &str,
    user: Option<&str>,
    hosts: &[String],
    path: Option<&str>,
) -> String {
    let auth = user.map(|u| format!("{u}:***@")).unwrap_or_default();
    format!("{scheme}://{auth}{}{}", hosts.join(","), path.unwrap_or(""))
}

impl fmt::Debug for MultiHostUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiHostUrl")
            .field("hosts", &self.hosts)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("path", &self.path)
            .field("query", &self.query)
            .finish()
    }
}

/// One part of a URL, `%XX`-decoded (malformed escapes stay as they are), refused if the bytes
/// it decodes to are not UTF-8: a lossy decoding would silently name another prefix or path.
/// `which` names the part in the error, never its value (it may be the password).
fn decode(part: &str, what: &str, which: &str) -> Result<String> {
    percent_encoding::percent_decode_str(part)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|e| {
            Error::config_with(
                format!("{what} URL: {which} is not UTF-8 once its %XX escapes are decoded"),
                e,
            )
        })
}

/// `%XX` decoding; malformed escapes stay as they are (a password may contain `%`), and bytes
/// that are not UTF-8 become U+FFFD. Lossy on purpose: it is for finding a secret's decoded
/// form in text; reading a URL ([`MultiHostUrl::parse`]) refuses such bytes instead.
///
/// ```
/// assert_eq!(lock_core::driver::percent_decode("p%40ss%2F100%"), "p@ss/100%");
/// ```
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Encodes `s` for a URL's query value or user info: everything but ASCII letters, digits
/// and `-._~` becomes `%XX`, so that [`percent_decode`] gives `s` back.
///
/// ```
/// use lock_core::driver::{percent_decode, percent_encode};
/// assert_eq!(percent_encode("team/jobs a&b"), "team%2Fjobs%20a%26b");
/// assert_eq!(percent_decode(&percent_encode("p@ss/100%")), "p@ss/100%");
/// ```
pub fn percent_encode(s: &str) -> String {
    const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_at_the_end_and_keeps_malformed_ones() {
        assert_eq!(percent_decode("a%40"), "a@");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn rejects_bad_host_lists_without_the_password() {
        for bad in [
            "etcd://u:secretpw@a:1,,b:2",
            "etcd://u:secretpw@",
            "etcd://u:secretpw@a 1",
            "zk://u:secretpw@a:1",
            "etcd://u:secretpw/x@a:1",
            "etcd://u:secretpw?x@a:1",
            "etcd://u:secretpw#x@a:1",
            "etcd://u:secret@pw/x@a:1",
            "etcd://a:1/prefix@x",
            "etcd://a:1#frag",
        ] {
            refused(bad);
        }
    }

    /// `bad`'s error: a Config error that shows no piece of the password (`secretpw`).
    fn refused(bad: &str) -> String {
        let e = MultiHostUrl::parse(bad, "etcd", "etcd").unwrap_err();
        assert!(matches!(e, Error::Config { .. }), "{bad}: {e:?}");
        let text = e.to_string();
        assert!(!text.contains("secret") && !text.contains("pw"), "{text}");
        text
    }

    #[test]
    fn the_path_is_decoded_like_the_other_parts() {
        let u = MultiHostUrl::parse("etcd://h:1/team%2Flocks%2Dx", "etcd", "etcd")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.path.as_deref(), Some("/team/locks-x"));
        let u = MultiHostUrl::parse("zk://h:1/100%", "zk", "zk").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.path.as_deref(), Some("/100%"), "a malformed escape stays");
    }

    #[test]
    fn escapes_that_are_not_utf8_are_refused_in_every_part_without_the_password() {
        for bad in [
            "etcd://u%FF:secretpw@h:1",
            "etcd://u:secret%FFpw@h:1",
            "etcd://u:secretpw@h:1/p%FF",
            "etcd://u:secretpw@h:1?prefix=%C3",
            "etcd://u:secretpw@h:1?%FF=1",
        ] {
            let e = refused(bad);
            assert!(e.contains("UTF-8"), "{bad}: {e}");
        }
    }

    #[test]
    fn encoded_delimiters_in_a_password_are_decoded() {
        let u = MultiHostUrl::parse(
            "etcd://u:a%2Fb%3Fc%23d%40e%3Af@h:1/p?k=v%40w",
            "etcd",
            "etcd",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.password.as_deref(), Some("a/b?c#d@e:f"));
        assert_eq!(u.hosts, ["h:1"]);
        assert_eq!(u.path.as_deref(), Some("/p"));
        assert_eq!(u.query, [("k".to_string(), "v@w".to_string())]);
    }
}

/// The certificate authority a driver trusts for its server's TLS certificate, instead of the
/// public roots: a private CA, a managed service's own. Shared by the TLS-capable drivers.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let ca = lock_core::driver::TlsCa::Pem(b"-----BEGIN CERTIFICATE-----...".to_vec().into());
/// assert!(ca.load().await.unwrap().starts_with(b"-----BEGIN"));
/// let missing = lock_core::driver::TlsCa::File("/nonexistent/ca.pem".into());
/// let err = missing.load().await.unwrap_err();
/// assert!(matches!(err, lock_core::Error::Config { .. }));
/// // The cause is kept: the io::Error says why the file could not be read.
/// use std::error::Error as _;
/// assert!(err.source().is_some_and(|s| s.is::<std::io::Error>()));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsCa {
    /// The CA certificate(s), PEM.
    Pem(std::sync::Arc<[u8]>),
    /// A PEM file, read when connecting.
    File(std::path::PathBuf),
}

impl TlsCa {
    /// The PEM bytes; a file is read off the runtime's threads. An unreadable file is an
    /// [`Error::Config`] naming it.
    pub async fn load(&self) -> Result<Vec<u8>> {
        match self {
            TlsCa::Pem(p) => Ok(p.to_vec()),
            TlsCa::File(path) => tokio::fs::read(path)
                .await
                .map_err(|e| Error::config_with(format!("TLS CA file {}: {e}", path.display()), e)),
        }
    }
}
