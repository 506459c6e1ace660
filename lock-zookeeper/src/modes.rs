//! A contender's mode, written in its node's name — the only place other clients' recipes
//! look. Curator's `InterProcessReadWriteLock` names its readers `…__READ__<seq>` and its
//! writers `…__WRIT__<seq>`; kazoo's `ReadLock` names its readers `…__rlock__<seq>`; every
//! other contender (a mutex's `-lock-`, kazoo's `__lock__`, a `__WRIT__`) is exclusive.

use lock_core::Mode;

/// The mark of a distlock shared node: Curator's reader name.
pub(crate) const READ: &str = "-__READ__";

/// What a contender of `mode` puts between its unique prefix and the server's sequence:
/// `exclusive`'s mark for the exclusive mode (`-lock-` by default), Curator's reader mark for
/// shared, `-permit-<K>-` for a permit.
pub(crate) fn mark(mode: Mode, exclusive: &str) -> String {
    match mode {
        Mode::Shared => READ.to_string(),
        Mode::Permits(k) => format!("-permit-{k}-"),
        _ => exclusive.to_string(),
    }
}

/// The mode a contender's node name says: a reader of Curator's, kazoo's or distlock's, a
/// permit of distlock's, and otherwise exclusive — the mode that waits for and keeps out all.
pub(crate) fn mode_of(child: &str) -> Mode {
    if child.contains("__READ__") || child.contains("__rlock__") {
        return Mode::Shared;
    }
    let permits = child.split_once("-permit-").and_then(|(_, rest)| {
        let k: u32 = rest.split('-').next()?.parse().ok()?;
        (k > 0).then_some(Mode::Permits(k))
    });
    permits.unwrap_or(Mode::Exclusive)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sequence::sequence;

    #[test]
    fn names_say_their_mode_and_keep_their_sequence() {
        for mode in [
            Mode::Exclusive,
            Mode::Shared,
            Mode::Permits(1),
            Mode::Permits(12),
        ] {
            for seq in ["0000000042", "-000000042"] {
                let node = format!("_c_0123abcd{}{seq}", mark(mode, "-lock-"));
                assert_eq!(mode_of(&node), mode, "{node}");
                assert_eq!(sequence(&node).map(i32::abs), Some(42), "{node}");
            }
        }
        // Other clients' nodes.
        assert_eq!(mode_of("_c_ab-__WRIT__0000000001"), Mode::Exclusive);
        assert_eq!(mode_of("_c_ab-__READ__0000000001"), Mode::Shared);
        assert_eq!(mode_of("f00d__rlock__0000000001"), Mode::Shared);
        assert_eq!(mode_of("f00d__lock__0000000001"), Mode::Exclusive);
        assert_eq!(mode_of("x-72057594037927936-0000000009"), Mode::Exclusive);
        // A malformed permit mark counts as exclusive: it keeps everyone out.
        assert_eq!(mode_of("_c_ab-permit-0-0000000001"), Mode::Exclusive);
        assert_eq!(mode_of("_c_ab-permit-x-0000000001"), Mode::Exclusive);
    }
}
