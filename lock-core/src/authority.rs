//! The authority of a lock URL, split once for every driver and for redaction: credentials
//! (`user[:password]`, up to the *last* `@`) and a server (`host[:port]`, `[IPv6][:port]`).

/// The credentials part of a URL: everything between `scheme://` and the last `@`.
///
/// ```
/// use lock_core::driver::split_userinfo;
/// let (ui, rest) = split_userinfo("app:p@ss@h:1/0");
/// let ui = ui.unwrap();
/// assert_eq!((ui.raw, ui.user, ui.password, rest), ("app:p@ss", "app", Some("p@ss"), "h:1/0"));
/// assert!(split_userinfo("h:1").0.is_none());
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Userinfo<'a> {
    /// All of it, as written.
    pub raw: &'a str,
    /// Up to the first `:`.
    pub user: &'a str,
    /// After the first `:`, if there is one.
    pub password: Option<&'a str>,
}

impl std::fmt::Debug for Userinfo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Userinfo")
            .field("user", &self.user)
            .field("password", &self.password.map(|_| "***"))
            .finish_non_exhaustive()
    }
}

/// Splits `rest` (what follows `scheme://`) at its last `@`, so that a password holding an
/// unescaped `@`, `:` or `/` stays whole: the credentials, if any, and what follows them.
/// (A URL parser that must also find the path splits its authority first and passes that.)
pub fn split_userinfo(rest: &str) -> (Option<Userinfo<'_>>, &str) {
    match rest.rsplit_once('@') {
        Some((raw, after)) => {
            let (user, password) = match raw.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (raw, None),
            };
            let ui = Userinfo {
                raw,
                user,
                password,
            };
            (Some(ui), after)
        }
        None => (None, rest),
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` as host and port (`default_port` when absent);
/// `None` for an empty host, port 0 or one that is not a number, or a host with `/`, `:`,
/// `[` or `]` outside brackets.
///
/// ```
/// use lock_core::driver::host_port;
/// assert_eq!(host_port("db:6543", 5432), Some(("db", 6543)));
/// assert_eq!(host_port("[::1]", 5432), Some(("::1", 5432)));
/// assert_eq!(host_port("db:0", 5432), None);
/// assert_eq!(host_port("a:b:1", 5432), None);
/// ```
pub fn host_port(entry: &str, default_port: u16) -> Option<(&str, u16)> {
    let (host, port) = match entry.strip_prefix('[') {
        Some(rest) => {
            let (v6, after) = rest.split_once(']')?;
            match after.strip_prefix(':') {
                Some(p) => (v6, Some(p)),
                None if after.is_empty() => (v6, None),
                None => return None,
            }
        }
        None => {
            let (h, p) = match entry.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (entry, None),
            };
            if h.contains(['/', ':', '[', ']']) {
                return None;
            }
            (h, p)
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
        None => default_port,
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_takes_what_servers_accept_and_refuses_the_rest() {
        assert_eq!(host_port("h", 6379), Some(("h", 6379)));
        assert_eq!(host_port("h:1", 6379), Some(("h", 1)));
        assert_eq!(host_port("[::1]:7", 6379), Some(("::1", 7)));
        for bad in [
            "", ":1", "h:", "h:x", "h:70000", "[::1", "[::1]x", "[]:1", "a/b:1", "h:0",
        ] {
            assert_eq!(host_port(bad, 6379), None, "{bad:?}");
        }
    }

    #[test]
    fn userinfo_ends_at_the_last_at_and_its_debug_hides_the_password() {
        let (ui, rest) = split_userinfo("u:p/w?x#y@z:q@h:1");
        let ui = ui.unwrap_or_else(|| panic!("userinfo"));
        assert_eq!(
            (ui.user, ui.password, rest),
            ("u", Some("p/w?x#y@z:q"), "h:1")
        );
        assert!(!format!("{ui:?}").contains("p/w"));
        let (ui, _) = split_userinfo("only@h");
        assert_eq!(ui.map(|u| (u.user, u.password)), Some(("only", None)));
    }
}
