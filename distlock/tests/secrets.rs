//! A password, whatever characters it has, never appears in a config's `Debug`, an error's
//! `Display`/`Debug`, or [`distlock::redact`] — for every scheme, parsed and connected.
//! Run with `--features full` (scripts/test.sh does).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

/// A password with every URL delimiter, made of pieces that must not appear on their own either.
const RAW: &str = "pwA1/pwB2?pwC3#pwD4@pwE5:pwF6";
const ENCODED: &str = "pwA1%2FpwB2%3FpwC3%23pwD4%40pwE5%3ApwF6";
const PIECES: [&str; 6] = ["pwA1", "pwB2", "pwC3", "pwD4", "pwE5", "pwF6"];

fn check(what: &str, text: &str) {
    for p in PIECES {
        assert!(
            !text.contains(p),
            "password piece {p} shown by {what}: {text}"
        );
    }
}

/// URLs of every scheme with `{pw}` for the password; unreachable ports, so connecting fails
/// fast with the driver's own error.
const TEMPLATES: &[&str] = &[
    "redis://locker:{pw}@127.0.0.1:1",
    "redis://:{pw}@127.0.0.1:1/0?prefix=x",
    "redis+sentinel://127.0.0.1:1/m?sentinel_password={pw}",
    "redis+sentinel://127.0.0.1:1/m?prefix=x&sentinel_password={pw}&keys=plain",
    "redis+sentinel://:{pw}@127.0.0.1:1/m?sentinel_user=u&sentinel_password={pw}",
    "rediss://locker:{pw}@127.0.0.1:1",
    "rediss+sentinel://:{pw}@127.0.0.1:1/m?sentinel_password={pw}",
    "redlock://locker:{pw}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
    "zk://locker:{pw}@127.0.0.1:1/chroot",
    "etcd://locker:{pw}@127.0.0.1:1/prefix",
    "postgres://locker:{pw}@127.0.0.1:1/db?sslmode=disable",
    "file://u:{pw}@/tmp/x",
    "memory://u:{pw}@store",
    "nosuch://u:{pw}@h",
];

#[test]
fn redact_hides_every_piece() {
    for t in TEMPLATES {
        for pw in [RAW, ENCODED] {
            let url = t.replace("{pw}", pw);
            check(&format!("redact({t})"), &distlock::redact(&url));
        }
    }
}

#[tokio::test]
async fn connect_errors_never_show_the_password() {
    for t in TEMPLATES {
        for pw in [RAW, ENCODED] {
            let url = t.replace("{pw}", pw);
            if let Err(e) = distlock::connect(&url).await {
                check(&format!("connect({t}) Display"), &e.to_string());
                check(&format!("connect({t}) Debug"), &format!("{e:?}"));
            }
        }
    }
}

/// Every driver config type: parsed (`Debug` of the config) or refused (the error).
#[test]
fn config_types_never_show_the_password() {
    fn each<C: std::fmt::Debug>(t: &str, parse: impl Fn(&str) -> distlock::Result<C>) {
        for pw in [RAW, ENCODED, "simple-pwA1pwB2pwC3pwD4pwE5pwF6"] {
            let url = t.replace("{pw}", pw);
            match parse(&url) {
                Ok(c) => check(&format!("Debug of the config of {t}"), &format!("{c:?}")),
                Err(e) => {
                    check(&format!("error of {t}"), &e.to_string());
                    check(&format!("error of {t}"), &format!("{e:?}"));
                }
            }
        }
    }
    // The templates of one driver: those whose scheme starts so (`redis` takes `rediss` and
    // `redis+sentinel` too).
    #[allow(unused)]
    let of = |scheme: &'static str| TEMPLATES.iter().filter(move |t| t.starts_with(scheme));
    #[cfg(feature = "redis")]
    for t in of("redis") {
        each(t, distlock::lock_redis::RedisConfig::from_url);
    }
    #[cfg(feature = "redlock")]
    for t in of("redlock") {
        each(t, distlock::lock_redlock::RedlockConfig::from_url);
    }
    #[cfg(feature = "zookeeper")]
    for t in of("zk") {
        each(t, distlock::lock_zookeeper::ZkConfig::from_url);
    }
    #[cfg(feature = "etcd")]
    for t in of("etcd") {
        each(t, distlock::lock_etcd::EtcdConfig::from_url);
    }
    #[cfg(feature = "postgres")]
    for t in of("postgres") {
        each(t, distlock::lock_postgres::PgConfig::from_url);
    }
    // Without driver features only the facade is checked (the other tests).
    each("memory://u:{pw}@x", |_| Ok(()));
}
