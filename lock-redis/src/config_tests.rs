//! Unit tests of `config.rs`.
use super::*;

/// A zero timeout fails every request as if the server were down: a Config error at
/// connect, before any I/O.
#[tokio::test]
async fn connect_refuses_a_zero_timeout() {
    // Both timeouts are checked by `check_timeouts` (lock-core's `timeout_setters!`).
    let zero = RedisConfig::new("127.0.0.1", 1).with_request_timeout(Duration::ZERO);
    let bad = vec![(zero, "request timeout 0")];
    conformance_tests::assert_refused_at_connect(crate::RedisLock::connect, bad).await;
}

#[test]
fn a_sentinel_url_names_the_sentinels_the_master_and_the_database() {
    let c = RedisConfig::from_url(
        "redis+sentinel://u:p%40w@s1,s2:26380,[::1]:7/mymaster/2?prefix=app:&timeout_ms=300",
    )
    .unwrap();
    let s = c.sentinels().unwrap();
    assert_eq!(
        s.hosts,
        [
            ("s1".into(), 26379),
            ("s2".into(), 26380),
            ("::1".into(), 7)
        ]
    );
    assert_eq!(
        (s.master.as_str(), c.db(), c.prefix()),
        ("mymaster", 2, "app:")
    );
    assert_eq!(
        (c.user(), c.secret().map(Secret::expose)),
        (Some("u"), Some("p@w"))
    );
    assert_eq!(c.request_timeout, Duration::from_millis(300));
    let shown = c.redacted_url();
    assert_eq!(
        shown,
        "redis+sentinel://u:***@s1:26379,s2:26380,[::1]:7/mymaster/2"
    );
    assert!(!format!("{c:?}{c}").contains("p@w"));
    for bad in [
        "redis+sentinel://s1,s2",              // no master
        "redis+sentinel://s1/",                // empty master
        "redis+sentinel://s1/m/x",             // database not a number
        "redis+sentinel://s1/m/1/2",           // more path
        "redis+sentinel://s1/m?tls_ca_file=x", // a CA goes with rediss+sentinel://
        "redis+sentinel://s1:x/m",             // port
        "redis+sentinel://:secret@s1/m/x",     // never echoes the password
    ] {
        let e = RedisConfig::from_url(bad).unwrap_err().to_string();
        assert!(!e.contains("secret"), "{bad}: {e}");
        assert!(
            matches!(RedisConfig::from_url(bad), Err(Error::Config { .. })),
            "{bad}: {e}"
        );
    }
    assert!(RedisConfig::from_url("redis://h")
        .unwrap()
        .sentinels()
        .is_none());
    let waits = RedisConfig::from_url("redis+sentinel://s1/m?wait_replicas=2").unwrap();
    assert_eq!(waits.wait_replicas(), 2);
    assert_eq!(
        RedisConfig::from_url("redis://h").unwrap().wait_replicas(),
        0
    );
    assert!(RedisConfig::from_url("redis://h?wait_replicas=two").is_err());
}

/// The sentinels' own login comes from `sentinel_user`/`sentinel_password` (percent-decoded),
/// apart from the servers' user info; it never shows, and it goes with sentinels only.
#[test]
fn the_sentinels_login_is_their_own_and_never_shows() {
    let c = RedisConfig::from_url(
        "redis+sentinel://u:srv@s1/m?sentinel_user=watcher&sentinel_password=s%26nt%40pw",
    )
    .unwrap();
    let s = c.sentinels().unwrap();
    assert_eq!(
        (s.user.as_deref(), s.password.as_ref().map(Secret::expose)),
        (Some("watcher"), Some("s&nt@pw"))
    );
    assert_eq!(
        (c.user(), c.secret().map(Secret::expose)),
        (Some("u"), Some("srv")),
        "the servers' login is the user info's"
    );
    assert_eq!(
        c.redacted_url(),
        "redis+sentinel://u:***@s1:26379/m?sentinel_user=watcher&sentinel_password=***"
    );
    let shown = format!("{c:?}{c}");
    assert!(
        !shown.contains("s&nt") && !shown.contains("s%26nt"),
        "{shown}"
    );
    let plain = RedisConfig::from_url("redis+sentinel://s1/m").unwrap();
    let s = plain.sentinels().unwrap();
    assert_eq!((s.user.as_ref(), s.password.as_ref()), (None, None));
    for bad in [
        "redis://h?sentinel_password=secret",
        "redis+cluster://h?sentinel_password=secret",
        "redis+sentinel://s1/m?sentinel_password=a&sentinel_password=secret",
    ] {
        let e = RedisConfig::from_url(bad).unwrap_err();
        assert!(matches!(e, Error::Config { .. }), "{bad}: {e}");
        assert!(!e.to_string().contains("secret"), "{bad}: {e}");
    }
}

#[test]
fn wait_aof_is_off_unless_asked_and_zero_means_the_masters_fsync() {
    assert_eq!(RedisConfig::from_url("redis://h").unwrap().wait_aof(), None);
    assert_eq!(
        RedisConfig::from_url("redis://h?wait_aof=0")
            .unwrap()
            .wait_aof(),
        Some(0)
    );
    let both = RedisConfig::from_url("redis://h?wait_aof=1&wait_replicas=2").unwrap();
    assert_eq!((both.wait_aof(), both.wait_replicas()), (Some(1), 2));
    assert!(RedisConfig::from_url("redis://h?wait_aof=").is_err());
    assert!(RedisConfig::from_url("redis://h?wait_aof=-1").is_err());
    assert!(format!("{both:?}").contains("wait_aof: Some(1)"));
}

#[test]
fn a_cluster_url_names_its_nodes_and_nothing_else() {
    let c = RedisConfig::from_url(
        "redis+cluster://u:p%40w@n1,n2:7001,[::1]:7?prefix=app:&timeout_ms=300",
    )
    .unwrap();
    assert_eq!(
        c.cluster().unwrap(),
        [
            ("n1".to_string(), 6379),
            ("n2".to_string(), 7001),
            ("::1".to_string(), 7)
        ]
    );
    assert!(c.fails_over() && c.sentinels().is_none());
    assert_eq!((c.db(), c.prefix()), (0, "app:"));
    assert_eq!(
        (c.user(), c.secret().map(Secret::expose)),
        (Some("u"), Some("p@w"))
    );
    assert_eq!(c.request_timeout, Duration::from_millis(300));
    assert_eq!(
        c.redacted_url(),
        "redis+cluster://u:***@n1:6379,n2:7001,[::1]:7"
    );
    assert!(!format!("{c:?}{c}").contains("p@w"));
    for ok in ["redis+cluster://n1/", "redis+cluster://n1/0"] {
        assert!(
            RedisConfig::from_url(ok).unwrap().cluster().is_some(),
            "{ok}"
        );
    }
    for bad in [
        "redis+cluster://n1/1",             // a cluster has database 0 only
        "redis+cluster://n1/m",             // no master name either
        "redis+cluster://n1?tls_ca_file=x", // no TLS here
        "redis+cluster://n1:x",             // port
        "redis+cluster://:secret@n1/1",     // never echoes the password
    ] {
        let e = RedisConfig::from_url(bad).unwrap_err().to_string();
        assert!(!e.contains("secret"), "{bad}: {e}");
        assert!(
            matches!(RedisConfig::from_url(bad), Err(Error::Config { .. })),
            "{bad}: {e}"
        );
    }
    let waits = RedisConfig::from_url("redis+cluster://n1?wait_replicas=1").unwrap();
    assert_eq!(waits.wait_replicas(), 1);
    let one = RedisConfig::from_url("redis://h").unwrap();
    assert!(one.cluster().is_none() && !one.fails_over());
}

#[test]
fn parses_every_part() {
    let c = RedisConfig::from_url("redis://u%40x:p%3Aw@h.example:7000/3?prefix=p:").unwrap();
    assert_eq!((c.host(), c.port(), c.db()), ("h.example", 7000, 3));
    assert_eq!(c.user(), Some("u@x"));
    assert_eq!(c.secret().map(Secret::expose), Some("p:w"));
    assert_eq!(c.prefix(), "p:");
    let d = RedisConfig::from_url("redis://127.0.0.1").unwrap();
    assert_eq!((d.port(), d.db(), d.prefix()), (6379, 0, DEFAULT_PREFIX));
    let t = RedisConfig::from_url("redis://h?timeout_ms=250&connect_timeout_ms=750").unwrap();
    assert_eq!(t.request_timeout, Duration::from_millis(250));
    assert_eq!(t.connect_timeout, Duration::from_millis(750));
    assert!(RedisConfig::from_url("redis://h?timeout_ms=soon").is_err());
    assert!(RedisConfig::from_url("redis://h?tls_ca_file=/ca.pem").is_err());
    for (url, host, port) in [
        ("redis://[::1]:7000/1", "::1", 7000),
        ("redis://[fe80::1]", "fe80::1", 6379),
        ("redis://user@h", "h", 6379),
    ] {
        let c = RedisConfig::from_url(url).unwrap();
        assert_eq!((c.host(), c.port()), (host, port), "{url}");
    }
    assert_eq!(
        RedisConfig::from_url("redis://[::1]:7000")
            .unwrap()
            .redacted_url(),
        "redis://[::1]:7000"
    );
}

#[test]
fn rejects_bad_urls_without_leaking_the_password() {
    conformance_tests::assert_bad_urls_rejected(
        RedisConfig::from_url,
        &[
            "http://h:1",
            "redis://:hunter2@h:1/notanumber",
            "redis://:hunter2@h:1/-1",
            "redis://:hunter2@h:1/0?nope=1",
            "redis://:hunter2@h:1/0?prefix={x}",
            "redis://:hunter2@",
            "not a url hunter2@",
            "redis://:hunter2@a:1,b:2",
            "redis://:hunter2@h:port",
            "redis://:hunter2@h:99999",
            "redis://:hunter2@[::1",
            "redis://:hunter2@[::1]x",
            "redis://:hunter2@:1",
            "redis://:hunter2@h:1?keys=flat",
        ],
        "hunter2",
    );
}

#[test]
fn plain_keys_with_the_empty_prefix() {
    let c = RedisConfig::from_url("redis://h:1?keys=plain&prefix=").unwrap();
    assert!(c.plain_keys());
    assert_eq!(c.prefix(), "");
    assert!(!RedisConfig::from_url("redis://h:1").unwrap().plain_keys());
}

#[test]
fn debug_and_display_redact() {
    let c = RedisConfig::new("h", 1).with_credentials("u", "hunter2");
    for s in [format!("{c:?}"), c.to_string(), c.redacted_url()] {
        assert!(!s.contains("hunter2"), "{s}");
        assert!(s.contains("***"), "{s}");
    }
}

/// Every TLS scheme, in a build without TLS, is refused with the feature it needs (not taken
/// as plain TCP).
#[cfg(not(feature = "tls"))]
#[test]
fn rediss_schemes_name_the_feature() {
    for url in [
        "rediss://h:1",
        "rediss+sentinel://s1/m",
        "rediss+cluster://n1,n2",
    ] {
        let e = RedisConfig::from_url(url).unwrap_err();
        let scheme = url.split("://").next().unwrap_or_default();
        assert!(
            e.to_string().contains("`tls` feature") && e.to_string().contains(scheme),
            "{url}: {e}"
        );
    }
}

/// `rediss+sentinel://` is TLS to the sentinels and the servers, with one CA for both; it
/// keeps its scheme in what is shown.
#[cfg(feature = "tls")]
#[test]
fn rediss_sentinel_is_tls_to_both_with_one_ca() {
    let c = RedisConfig::from_url("rediss+sentinel://:pw@s1,s2:7/m/1?tls_ca_file=/ca.pem").unwrap();
    assert!(c.is_tls());
    let s = c.sentinels().unwrap();
    assert_eq!(s.hosts, [("s1".to_string(), 26379), ("s2".to_string(), 7)]);
    assert_eq!(s.master, "m");
    assert_eq!(c.db(), 1);
    assert_eq!(c.redacted_url(), "rediss+sentinel://:***@s1:26379,s2:7/m/1");
    let plain = RedisConfig::from_url("redis+sentinel://s1/m").unwrap();
    assert!(!plain.is_tls());
}
