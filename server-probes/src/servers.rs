//! The test servers of `scripts/services.sh`, from the one table that it and the Rust tests
//! both read: `scripts/servers.tsv` (name, kind, port, user, password, TLS-only).

use std::net::SocketAddr;

const TABLE: &str = include_str!("../../scripts/servers.tsv");

/// One server of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Server {
    /// Its name in `scripts/services.sh` (`up`, `restart`, `pid` ...).
    pub name: &'static str,
    /// `redis`, `zk`, `etcd`, `pg` or `pgbouncer`.
    pub kind: &'static str,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// The account the tests log in with, if it has one.
    pub user: Option<&'static str>,
    /// That account's password (test-only, loopback-only).
    pub password: Option<&'static str>,
    /// Whether it speaks only TLS (its CA: `$DISTLOCK_SERVICES_DIR/NAME/ca.crt`).
    pub tls: bool,
}

impl Server {
    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The same, as a socket address.
    pub fn socket(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

fn parse(line: &'static str) -> Option<Server> {
    let mut f = line.split('\t');
    let name = f.next()?;
    let kind = f.next()?;
    let port = f.next()?.parse().ok()?;
    let given = |v: &'static str| (v != "-").then_some(v);
    let user = given(f.next()?);
    let password = given(f.next()?);
    let tls = f.next()? == "tls";
    Some(Server {
        name,
        kind,
        port,
        user,
        password,
        tls,
    })
}

/// Every server, in the table's order.
pub fn all() -> Vec<Server> {
    TABLE
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(parse)
        .collect()
}

/// The server called `name`.
///
/// # Panics
/// For a name the table lacks (test code: the panic is the failure report).
pub fn server(name: &str) -> Server {
    all()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no server {name:?} in scripts/servers.tsv"))
}

/// The client port of the server called `name` (see [`server`]).
pub fn port(name: &str) -> u16 {
    server(name).port
}

/// `127.0.0.1:PORT` of the server called `name` (see [`server`]).
pub fn addr(name: &str) -> String {
    server(name).addr()
}

/// The ports of the servers `STEM1` to `STEMN`, in order: `numbered::<5>("redlock")` is the
/// five Redlock masters', `numbered::<3>("zk-ens")` the ZooKeeper ensemble's.
///
/// # Panics
/// If one of them is not in the table (test code).
pub fn numbered<const N: usize>(stem: &str) -> [u16; N] {
    std::array::from_fn(|i| port(&format!("{stem}{}", i + 1)))
}

/// `template` with each `{NAME}` of a server replaced by its `127.0.0.1:PORT`:
/// `url("redis://{redis}/0")` is `redis://127.0.0.1:16379/0`.
///
/// # Panics
/// For a `{...}` that names no server, or an unclosed `{` (test code).
pub fn url(template: &str) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .unwrap_or_else(|| panic!("unclosed {{ in {template:?}"));
        out.push_str(&addr(&after[..close]));
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line that is not a comment is a server, and no two share a name or a port.
    #[test]
    fn every_line_is_a_server_and_names_and_ports_are_unique() {
        let lines = TABLE
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count();
        let all = all();
        assert_eq!(
            all.len(),
            lines,
            "a line of scripts/servers.tsv does not parse"
        );
        for (i, s) in all.iter().enumerate() {
            for t in &all[..i] {
                assert!(s.name != t.name && s.port != t.port, "{s:?} and {t:?}");
            }
            assert!(
                [
                    "redis",
                    "sentinel",
                    "cluster",
                    "zk",
                    "etcd",
                    "pg",
                    "pgbouncer"
                ]
                .contains(&s.kind),
                "{s:?}"
            );
            assert_eq!(s.user.is_some(), s.password.is_some(), "{s:?}");
        }
        assert_eq!(port("redis"), 16379);
        assert_eq!(addr("pg"), "127.0.0.1:15432");
        assert!(server("etcd-tls").tls && !server("etcd").tls);
        assert_eq!(
            url("redlock://{redlock1},{redlock2}/0?x=1"),
            "redlock://127.0.0.1:16380,127.0.0.1:16381/0?x=1"
        );
    }
}
