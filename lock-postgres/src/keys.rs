//! A name's advisory keys: its own (the lock), its family's (readers' and permit holders',
//! `family.rs`), what a lease holds of them and how it lets go of exactly that, and what a
//! try came to.

use lock_core::LockName;
use sha2::{Digest, Sha256};

/// The advisory-lock key of a lock name: the first 8 bytes of the SHA-256 of its UTF-8 bytes,
/// read as a big-endian signed 64-bit integer. In SQL (PostgreSQL 11 and later):
/// `('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 16))::bit(64)::bigint`.
///
/// ```
/// use lock_core::LockName;
/// let key = lock_postgres::advisory_key(&LockName::new("reindex")?);
/// assert_eq!(key, lock_postgres::advisory_key(&LockName::new("reindex")?));
/// assert_ne!(key, lock_postgres::advisory_key(&LockName::new("reindex2")?));
/// # Ok::<(), lock_core::Error>(())
/// ```
pub fn advisory_key(name: &LockName) -> i64 {
    let digest = Sha256::digest(name.as_str().as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The keys of one name's family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FamilyKeys {
    /// The name's own key ([`advisory_key`]).
    pub(crate) name: i64,
    pub(crate) gate: i64,
    pub(crate) readers: i64,
    pub(crate) permits: i64,
    /// Slot `s` is `slots + s`.
    pub(crate) slots: i64,
    /// The first half of the marks' two-integer keys (non-negative).
    pub(crate) mark_class: i32,
}

impl FamilyKeys {
    pub(crate) fn of(name: &LockName) -> Self {
        let digest = Sha256::digest(name.as_str().as_bytes());
        let mut base = [0u8; 8];
        base.copy_from_slice(&digest[8..16]);
        // Below 2^62: `slots + s` stays a bigint for every `s` below 2^31.
        let base = i64::from_be_bytes(base) & 0x3fff_ffff_ffff_ffff;
        let mut class = [0u8; 4];
        class.copy_from_slice(&digest[16..20]);
        FamilyKeys {
            name: advisory_key(name),
            gate: base,
            readers: base + 1,
            permits: base + 2,
            slots: base + 3,
            mark_class: i32::from_be_bytes(class) & 0x7fff_ffff,
        }
    }
}

/// What a lease holds on its session: exactly the keys it lets go of, one unlock each (the
/// session may hold other names' locks, `shared_sessions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// The name's key, exclusive.
    Exclusive(i64),
    /// The name's key and the readers' key, shared.
    Reader(FamilyKeys),
    /// The name's key and the permits' key, shared; slot `slot` exclusive; the mark of `n`
    /// permits, shared.
    Permit { keys: FamilyKeys, slot: i64, n: i64 },
}

impl Held {
    /// The name's key: a shared session claims it for the whole family of the name (no other
    /// lease there holds or asks for any key of the name).
    pub(crate) fn key(&self) -> i64 {
        match self {
            Held::Exclusive(key) => *key,
            Held::Reader(k) | Held::Permit { keys: k, .. } => k.name,
        }
    }

    /// One statement that lets go of each key once, and announces it on the name's
    /// [`channel`] if `announce`; its first column says whether the name's key was held.
    pub(crate) fn unlock_sql(&self, announce: bool) -> String {
        let unlock = self.unlocks();
        match announce {
            true => format!("{unlock}, pg_notify('{}', '')", channel(self.key())),
            false => unlock,
        }
    }

    fn unlocks(&self) -> String {
        match *self {
            Held::Exclusive(key) => format!("SELECT pg_advisory_unlock({key})"),
            Held::Reader(k) => format!(
                "SELECT pg_advisory_unlock_shared({}), pg_advisory_unlock_shared({})",
                k.name, k.readers
            ),
            Held::Permit { keys: k, slot, n } => format!(
                "SELECT pg_advisory_unlock_shared({}), pg_advisory_unlock_shared({}), \
                 pg_advisory_unlock({} + {slot}), pg_advisory_unlock_shared({}, {n})",
                k.name, k.permits, k.slots, k.mark_class
            ),
        }
    }
}

/// The channel of the advisory key `key`, as `session::CHANNEL_OF` spells it in SQL: where
/// its releases (with `wait_sessions`) and an election's changes are announced.
pub(crate) fn channel(key: i64) -> String {
    format!("distlock_{:016x}", key as u64)
}

/// The advisory key whose [`channel`] `name` is, if it is one.
pub(crate) fn key_of_channel(name: &str) -> Option<i64> {
    let hex = name.strip_prefix("distlock_")?;
    u64::from_str_radix(hex, 16).ok().map(|k| k as i64)
}

/// SQL for a `false` that first lets go of `unlocks` (calls that return a boolean), for a
/// refusal that gives back what the statement took before it. `num_nulls` evaluates every
/// argument; `AND` need not: PostgreSQL plans `pg_advisory_unlock(k) AND false` as `false`
/// and never unlocks (seen: `tests/shared_family.rs` fails with it).
pub(crate) fn let_go(unlocks: &[&str]) -> String {
    format!("num_nulls({}) < 0", unlocks.join(", "))
}

/// What a try came to: granted (the token's row, what the lease holds), or nothing held.
pub(crate) enum Tried {
    Granted(tokio_postgres::Row, Held),
    Busy,
    Mismatch(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_names_its_key_back() {
        for key in [0, 1, -1, i64::MIN, i64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(key_of_channel(&channel(key)), Some(key));
        }
        assert_eq!(key_of_channel("distlock_xyz"), None);
        assert_eq!(key_of_channel("other_0000000000000001"), None);
    }

    #[test]
    fn keys_are_apart_and_in_range() {
        for name in ["a", "jobs", "reindex", "x".repeat(100).as_str()] {
            let k = FamilyKeys::of(&LockName::new(name).unwrap());
            assert!(k.gate >= 0 && k.slots.checked_add(i64::from(i32::MAX)).is_some());
            assert!(k.mark_class >= 0);
            let all = [k.name, k.gate, k.readers, k.permits, k.slots];
            for (i, a) in all.iter().enumerate() {
                assert!(!all[i + 1..].contains(a), "{name}: {all:?}");
            }
        }
        let (a, b) = (
            FamilyKeys::of(&LockName::new("a").unwrap()),
            FamilyKeys::of(&LockName::new("b").unwrap()),
        );
        assert_ne!(a.gate, b.gate);
        assert_ne!(a.mark_class, b.mark_class);
    }
}
