//! Every driver's URL parser against random input: never a panic, an error is `Config`, a
//! valid URL round-trips (hosts, port, database, chroot, credentials), and the password —
//! whatever its characters — shows in no error, `Debug`, `Display` or [`distlock::redact`].
//! Parsing only: nothing connects. Run with `--features full` (scripts/test.sh does).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use proptest::prelude::*;

/// A password of any characters, marked so that a leak is unmistakable.
fn password() -> impl Strategy<Value = String> {
    any::<String>().prop_map(|s| format!("Pw9{s}Z"))
}

fn encode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

fn assert_hidden(what: &str, shown: &str, pw: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        !shown.contains(pw) && !shown.contains(&encode(pw)) && !shown.contains("Pw9"),
        "{what} shows the password: {shown}"
    );
    Ok(())
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,12}(\\.[a-z0-9-]{1,8}){0,2}",
        "127\\.0\\.0\\.[0-9]{1,2}"
    ]
}

/// Parses `url` with the parser of its scheme; `Some(shown)`: the `Debug` and `Display` of
/// the result or of the error.
fn parse_any(url: &str) -> Option<Result<String, lock_core::Error>> {
    let scheme = url.split("://").next().unwrap_or("");
    Some(match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" => lock_redis::RedisConfig::from_url(url).map(|c| format!("{c:?} {c}")),
        #[cfg(feature = "redlock")]
        "redlock" => lock_redlock::RedlockConfig::from_url(url).map(|c| format!("{c:?} {c}")),
        #[cfg(feature = "zookeeper")]
        "zk" => lock_zookeeper::ZkConfig::from_url(url).map(|c| format!("{c:?} {c}")),
        #[cfg(feature = "etcd")]
        "etcd" => lock_etcd::EtcdConfig::from_url(url).map(|c| format!("{c:?} {c}")),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            lock_postgres::PgConfig::from_url(url).map(|c| format!("{c:?} {c}"))
        }
        _ => return None,
    })
}

use distlock::lock_core;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random text after each scheme: no panic, a `Config` error or a config, no leak.
    #[test]
    fn random_urls_never_panic_or_leak(
        scheme in prop_oneof![
            Just("redis"), Just("rediss"), Just("redlock"), Just("zk"), Just("etcd"),
            Just("postgres"), Just("postgresql"), Just("redis+sentinel"), Just("redis+cluster"),
            Just("rediss+cluster"), Just("rediss+sentinel"),
        ],
        tail in any::<String>(),
        pw in password(),
    ) {
        for url in [
            format!("{scheme}://{tail}"),
            format!("{scheme}://user:{}@{tail}", encode(&pw)),
            format!("{scheme}://user:{pw}@{tail}"),
            format!("{scheme}://{tail}?sentinel_password={}", encode(&pw)),
            format!("{scheme}://h/m?sentinel_password={pw}&{tail}"),
        ] {
            match parse_any(&url) {
                None => {}
                Some(Ok(shown)) => assert_hidden(&url, &shown, &pw)?,
                Some(Err(e)) => {
                    prop_assert!(matches!(e, lock_core::Error::Config { .. }), "{url}: {e:?}");
                    assert_hidden(&url, &format!("{e} {e:?}"), &pw)?;
                }
            }
            assert_hidden("redact", &distlock::redact(&url), &pw)?;
        }
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_urls_round_trip(h in host(), port in 1u16.., db in 0i64..10_000, pw in password()) {
        let url = format!("redis://locker:{}@{h}:{port}/{db}?prefix=app:", encode(&pw));
        let c = lock_redis::RedisConfig::from_url(&url).unwrap();
        prop_assert_eq!((c.host(), c.port(), c.db(), c.prefix()), (h.as_str(), port, db, "app:"));
        prop_assert_eq!(c.user(), Some("locker"));
        assert_hidden("redis", &format!("{c:?} {c} {}", c.redacted_url()), &pw)?;
        // The redacted URL parses back to the same place.
        let again = lock_redis::RedisConfig::from_url(&c.redacted_url()).unwrap();
        prop_assert_eq!((again.host(), again.port(), again.db()), (c.host(), c.port(), c.db()));
    }

    #[cfg(feature = "redlock")]
    #[test]
    fn redlock_host_lists_round_trip(
        ports in proptest::collection::btree_set(1u16.., 1..6),
        h in host(),
        pw in password(),
    ) {
        let list: Vec<String> = ports.iter().map(|p| format!("{h}:{p}")).collect();
        let url = format!("redlock://:{}@{}/3", encode(&pw), list.join(","));
        let c = lock_redlock::RedlockConfig::from_url(&url).unwrap();
        let got: Vec<(String, u16, i64)> =
            c.masters().iter().map(|m| (m.host().to_string(), m.port(), m.db())).collect();
        let want: Vec<(String, u16, i64)> = ports.iter().map(|p| (h.clone(), *p, 3)).collect();
        prop_assert_eq!(got, want);
        assert_hidden("redlock", &format!("{c:?} {c}"), &pw)?;
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_urls_round_trip(h in host(), port in 1u16.., db in "[a-z][a-z0-9_]{0,8}", pw in password()) {
        let url = format!("postgresql://locker:{}@{h}:{port}/{db}?sslmode=disable", encode(&pw));
        let c = lock_postgres::PgConfig::from_url(&url).unwrap();
        prop_assert_eq!(c.hosts(), [format!("{h}:{port}")]);
        prop_assert_eq!(c.dbname(), Some(db.as_str()));
        prop_assert_eq!(c.user(), Some("locker"));
        assert_hidden("postgres", &format!("{c:?} {c} {}", c.redacted_url()), &pw)?;
        // The redacted URL parses back to the same place.
        let again = lock_postgres::PgConfig::from_url(&c.redacted_url()).unwrap();
        prop_assert_eq!((again.hosts(), again.dbname()), (c.hosts(), c.dbname()));
    }

    #[cfg(feature = "zookeeper")]
    #[test]
    fn zk_chroots_round_trip(
        hosts in proptest::collection::vec((host(), 1u16..), 1..4),
        chroot in proptest::collection::vec("[a-z0-9_-]{1,8}", 1..4),
        pw in password(),
    ) {
        let list: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        let path = format!("/{}", chroot.join("/"));
        let url = format!("zk://locker:{}@{}{path}", encode(&pw), list.join(","));
        let c = lock_zookeeper::ZkConfig::from_url(&url).unwrap();
        prop_assert_eq!(c.hosts(), list.join(","));
        prop_assert_eq!(c.chroot(), Some(path.as_str()));
        prop_assert_eq!(c.user(), Some("locker"));
        assert_hidden("zk", &format!("{c:?} {c}"), &pw)?;
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_endpoints_round_trip(
        hosts in proptest::collection::vec((host(), 1u16..), 1..4),
        pw in password(),
    ) {
        let list: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        let url = format!("etcd://locker:{}@{}", encode(&pw), list.join(","));
        let c = lock_etcd::EtcdConfig::from_url(&url).unwrap();
        prop_assert_eq!(c.endpoints().len(), list.len());
        prop_assert_eq!(c.user(), Some("locker"));
        assert_hidden("etcd", &format!("{c:?} {c}"), &pw)?;
    }
}
