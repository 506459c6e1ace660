//! The keys of a lock's queue: one per contender under `<prefix>/<name>/`, whose name says
//! its mode — `<lease-hex>` is exclusive, as `etcdctl lock` names its keys, and
//! `<lease-hex>-<code>` another mode of the lock family ([`Mode::code`]); with a shared lease
//! (`shared.rs`) the lease id is followed by `_<seq-hex>`, a number this client gives each of
//! its acquisitions, so that two of one name on one lease never share a key. The mode is in the
//! name, not the value, so that a value stays free for what a contender says of itself (an
//! election's proposal, as `etcdctl elect` writes it). A contender's turn over these keys is
//! `queue.rs`'s.

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};
use lock_core::{LockName, Mode};

use crate::EtcdConfig;

/// The key a lease of `name` with lease id `lease` uses for a request of `mode`:
/// `<dir><lease-hex>`, as `etcdctl lock` names its keys, and for the lock family's other modes
/// the mode's code after a dash.
pub(crate) fn key(config: &EtcdConfig, name: &LockName, lease: i64, mode: Mode) -> String {
    format!("{}{lease:016x}{}", config.name_dir(name), key_suffix(mode))
}

/// [`key`] for a client whose locks share lease `lease`: `<dir><lease-hex>_<seq-hex>`, then the
/// mode's suffix.
pub(crate) fn shared_key(
    config: &EtcdConfig,
    name: &LockName,
    lease: i64,
    seq: u64,
    mode: Mode,
) -> String {
    let dir = config.name_dir(name);
    format!("{dir}{lease:016x}_{seq:x}{}", key_suffix(mode))
}

/// Where an acquisition on a shared lease that ended before its key's put was answered leaves
/// a mark (`shared.rs`): beside the name's range, never in it (`#` is in no lock name, so this
/// is no lock's key and in no lock's range), on the shared lease, so it goes with it.
pub(crate) fn tombstone(config: &EtcdConfig, name: &LockName, lease: i64, seq: u64) -> String {
    let dir = config.name_dir(name);
    format!("{}#{lease:016x}_{seq:x}", dir.trim_end_matches('/'))
}

/// The range of `name`'s keys.
pub(crate) fn dir(config: &EtcdConfig, name: &LockName) -> String {
    config.name_dir(name)
}

/// Whether `key` is a contender's key of the name whose range is `dir` (`<dir><lease-hex>`,
/// as distlock and `etcdctl lock` put them), not a key of a client whose prefix nests inside
/// it (`<dir><other-name>/<lease-hex>`): that one belongs to another lock, which etcd's own
/// recipe would wait for.
pub(crate) fn contender(dir: &str, key: &[u8]) -> bool {
    key.strip_prefix(dir.as_bytes())
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
}

/// What a contender of `mode` puts after its lease id in its key's name.
pub(crate) fn key_suffix(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => String::new(),
        m => format!("-{}", m.code()),
    }
}

/// The mode a contender's key says (`leaf`: its name under the lock's range). Only distlock's
/// own form, 16 hex digits (then `_` and hex digits, on a shared lease), a dash and a code, is
/// read as another mode; every other key
/// (`etcdctl lock`'s, Go's `concurrency.Mutex`'s) is exclusive, the mode that waits for and
/// keeps out all.
pub(crate) fn mode_of(leaf: &[u8]) -> Mode {
    let Ok(leaf) = std::str::from_utf8(leaf) else {
        return Mode::Exclusive;
    };
    let parsed = leaf.split_once('-').and_then(|(lease, code)| {
        let (lease, seq) = lease.split_once('_').unwrap_or((lease, "0"));
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
        (lease.len() == 16 && hex(lease) && hex(seq)).then_some(())?;
        Mode::from_code(code).filter(|m| *m != Mode::Exclusive)
    });
    parsed.unwrap_or(Mode::Exclusive)
}

/// The name's contenders, oldest first, with their modes.
pub(crate) fn contenders<'a>(dir: &str, kvs: &'a [KeyValue]) -> Vec<(&'a KeyValue, Mode)> {
    kvs.iter()
        .filter(|kv| contender(dir, kv.key()))
        .map(|kv| (kv, mode_of(&kv.key()[dir.len()..])))
        .collect()
}

/// The contenders' range with values, oldest first, up to `rev` (0: all).
pub(crate) fn range_up_to(rev: i64) -> GetOptions {
    let opts = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    if rev > 0 {
        opts.with_max_create_revision(rev)
    } else {
        opts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_key_names() {
        for mode in [Mode::Exclusive, Mode::Shared, Mode::Permits(3)] {
            let leaf = format!("{:016x}{}", 0x694d_7a9b_3c1e_2f04_i64, key_suffix(mode));
            assert_eq!(mode_of(leaf.as_bytes()), mode, "{leaf}");
        }
        assert_eq!(key_suffix(Mode::Exclusive), "", "etcdctl's layout");
        // On a shared lease: the acquisition's number after the lease id.
        let config = EtcdConfig::new(["h:1"]);
        let name = LockName::new("db").unwrap();
        for mode in [Mode::Exclusive, Mode::Shared, Mode::Permits(3)] {
            let key = shared_key(&config, &name, 0x694d_7a9b_3c1e_2f04, 0x1f, mode);
            let leaf = key.strip_prefix("/distlock/db/").unwrap();
            assert!(leaf.starts_with("694d7a9b3c1e2f04_1f"), "{key}");
            assert_eq!(mode_of(leaf.as_bytes()), mode, "{leaf}");
            assert!(contender("/distlock/db/", key.as_bytes()));
        }
        let tomb = tombstone(&config, &name, 0x694d_7a9b_3c1e_2f04, 0x1f);
        assert_eq!(tomb, "/distlock/db#694d7a9b3c1e2f04_1f");
        assert!(
            !tomb.starts_with("/distlock/db/"),
            "outside the name's range"
        );
        // Go's Mutex does not pad its lease id; anything not of distlock's form is exclusive.
        for other in [
            &b"694d7a9b3c1e2f"[..],
            b"abc-s",
            b"694d7a9b3c1e2f04-p0",
            b"694d7a9b3c1e2f04_-s",
            b"694d7a9b3c1e2f04_xy-s",
            b"\xff-s",
        ] {
            assert_eq!(mode_of(other), Mode::Exclusive, "{other:?}");
        }
    }
}
