//! Bad input, systematically: random names, option values and multi-host URLs never panic; a
//! valid input round-trips; a password never shows in an error, `Debug` or `Display`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use lock_core::driver::MultiHostUrl;
use lock_core::{Capabilities, Error, LockName, LockOptions, MAX_NAME_LEN, NAME_PUNCTUATION};
use proptest::prelude::*;

fn valid_name() -> impl Strategy<Value = String> {
    let chars: Vec<char> = ('a'..='z')
        .chain('A'..='Z')
        .chain('0'..='9')
        .chain(NAME_PUNCTUATION.chars())
        .collect();
    proptest::collection::vec(proptest::sample::select(chars), 1..=MAX_NAME_LEN)
        .prop_map(|v| v.into_iter().collect::<String>())
        .prop_filter("not . or ..", |s| s != "." && s != "..")
}

/// A password of any characters, marked so that a leak is unmistakable.
fn password() -> impl Strategy<Value = String> {
    any::<String>().prop_map(|s| format!("Pw9{s}Z"))
}

fn encode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

fn leaks(shown: &str, pw: &str) -> bool {
    shown.contains(pw) || shown.contains(&encode(pw)) || shown.contains("Pw9")
}

proptest! {
    #[test]
    fn any_string_is_a_name_or_an_invalid_name_error(s in any::<String>()) {
        match LockName::new(&s) {
            Ok(n) => prop_assert_eq!(n.as_str(), s.as_str()),
            Err(Error::InvalidName { .. }) => {}
            Err(e) => prop_assert!(false, "wrong error kind for {s:?}: {e:?}"),
        }
    }

    #[test]
    fn valid_names_round_trip(s in valid_name()) {
        let n = LockName::new(&s).unwrap();
        prop_assert_eq!(n.as_str(), s.as_str());
        prop_assert_eq!(n.to_string(), s.clone());
        let parsed: LockName = s.parse().unwrap();
        prop_assert_eq!(parsed, n);
    }

    #[test]
    fn names_longer_than_the_maximum_are_refused(s in valid_name(), extra in 1usize..64) {
        let long = format!("{s}{}", "x".repeat(MAX_NAME_LEN + extra - s.len().min(MAX_NAME_LEN)));
        prop_assert!(long.len() > MAX_NAME_LEN);
        prop_assert!(LockName::new(&long).is_err());
    }

    #[test]
    fn option_validation_never_panics(
        ttl_ms in any::<u64>(),
        wait_ms in proptest::option::of(any::<u64>()),
        hold_ms in proptest::option::of(any::<u64>()),
        min_ms in 0u64..10_000,
        max_ms in proptest::option::of(1u64..u64::MAX),
    ) {
        let mut caps = Capabilities::new().with_min_ttl(Duration::from_millis(min_ms));
        if let Some(m) = max_ms {
            caps = caps.with_max_ttl(Duration::from_millis(m));
        }
        let mut opts = LockOptions::new(Duration::from_millis(ttl_ms));
        if let Some(w) = wait_ms {
            opts = opts.wait_for(Duration::from_millis(w));
        }
        if let Some(h) = hold_ms {
            opts = opts.auto_renew(Some(Duration::from_millis(h)));
        }
        match opts.validate(&caps) {
            Ok(effective) => {
                prop_assert!(effective >= opts.ttl, "effective TTL shorter than asked");
                prop_assert!(effective >= caps.min_ttl);
                prop_assert!(effective <= caps.max_ttl);
            }
            Err(Error::InvalidOptions(_)) => {}
            Err(e) => prop_assert!(false, "wrong error kind: {e:?}"),
        }
    }

    #[test]
    fn multi_host_urls_never_panic_or_leak(tail in any::<String>(), pw in password()) {
        let url = format!("redlock://u:{}@{tail}", encode(&pw));
        match MultiHostUrl::parse(&url, "redlock", "Redlock") {
            Ok(u) => {
                // With an `@` in the tail, everything up to the last one is userinfo (the
                // documented rule); otherwise the password is exactly ours.
                if !tail.contains('@') {
                    prop_assert_eq!(u.password.as_deref(), Some(pw.as_str()));
                }
                prop_assert!(!u.hosts.is_empty());
                prop_assert!(!leaks(&u.hosts.join(","), &pw), "password in hosts {:?}", u.hosts);
            }
            Err(e) => {
                prop_assert!(matches!(e, Error::Config { .. }), "{e:?}");
                prop_assert!(!leaks(&format!("{e} {e:?}"), &pw), "{e}");
            }
        }
        let _ = MultiHostUrl::parse(&tail, "redlock", "Redlock");
    }

    #[test]
    fn multi_host_urls_round_trip(
        hosts in proptest::collection::vec(("[a-z][a-z0-9.-]{0,20}", 1u16..), 1..6),
        pw in password(),
    ) {
        let list: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        let url = format!("redlock://user:{}@{}/2?prefix=x", encode(&pw), list.join(","));
        let u = MultiHostUrl::parse(&url, "redlock", "Redlock").unwrap();
        prop_assert_eq!(&u.hosts, &list);
        prop_assert_eq!(u.user.as_deref(), Some("user"));
        prop_assert_eq!(u.password.as_deref(), Some(pw.as_str()));
        prop_assert_eq!(u.path.as_deref(), Some("/2"));
        let shown = lock_core::driver::redacted_url("redlock", u.user.as_deref(), &u.hosts, u.path.as_deref());
        prop_assert!(!leaks(&shown, &pw), "{shown}");
    }
}
