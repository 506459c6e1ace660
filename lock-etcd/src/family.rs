//! Shared holders and permits in the one queue of a name: each contender's key says its mode
//! in its name (`<lease-hex>` is exclusive, as `etcdctl lock` names its keys;
//! `<lease-hex>-<code>` another mode, [`Mode::code`]), and a contender's turn is
//! [`queue_turn`] over the keys before it in `create_revision` order — readers behind a
//! waiting writer wait behind it, and the first count of permits wins. The mode is in the
//! name, not the value, so that a value stays free for what a contender says of itself (an
//! election's proposal, as `etcdctl elect` writes it).

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use lock_core::driver::{queue_turn, Turn};
use lock_core::{LockName, Mode, Result};

use crate::client::{malformed, txn_call, Cluster};
use crate::queue::{contender, dir, Position};

/// What a contender of `mode` puts after its lease id in its key's name.
pub(crate) fn key_suffix(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => String::new(),
        m => format!("-{}", m.code()),
    }
}

/// The mode a contender's key says (`leaf`: its name under the lock's range). Only distlock's
/// own form, 16 hex digits, a dash and a code, is read as another mode; every other key
/// (`etcdctl lock`'s, Go's `concurrency.Mutex`'s) is exclusive, the mode that waits for and
/// keeps out all.
pub(crate) fn mode_of(leaf: &[u8]) -> Mode {
    let Ok(leaf) = std::str::from_utf8(leaf) else {
        return Mode::Exclusive;
    };
    let parsed = leaf.split_once('-').and_then(|(lease, code)| {
        (lease.len() == 16 && lease.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())?;
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

/// Where the contender with `key` (put at `rev`) stands among `older_and_me` (the contenders
/// up to it, oldest first); `seen` is the revision they were read at.
pub(crate) fn position(older_and_me: &[(&KeyValue, Mode)], key: &str, seen: i64) -> Position {
    let Some(me) = older_and_me
        .iter()
        .position(|(kv, _)| kv.key() == key.as_bytes())
    else {
        return Position::Gone;
    };
    let modes: Vec<Mode> = older_and_me[..=me].iter().map(|(_, m)| *m).collect();
    let named = |kv: &KeyValue| (kv.key().to_vec(), kv.create_revision());
    match queue_turn(&modes, me) {
        Turn::Granted => Position::Head,
        Turn::After(j) => Position::Behind {
            pred: named(older_and_me[j].0),
            seen,
        },
        Turn::AfterAny => Position::BehindAny {
            older: older_and_me[..me].iter().map(|(kv, _)| named(kv)).collect(),
            seen,
        },
        Turn::Mismatch { held } => Position::Mismatch { held },
    }
}

/// The family's [`check`](crate::queue::check): the contender's own key and every key up to
/// it, with values, in one transaction; and the term it was read in.
pub(crate) async fn check(
    c: &Cluster,
    name: &LockName,
    key: &str,
    rev: i64,
) -> Result<(Position, u64)> {
    let dir = dir(&c.config, name);
    let txn = Txn::new().and_then([TxnOp::get(dir.as_str(), Some(range_up_to(rev)))]);
    let resp = txn_call(&c.config, &c.client, txn).await?;
    let seen = resp.header().map_or(0, |h| h.revision());
    let term = c.observe(resp.header());
    let Some(TxnOpResponse::Get(g)) = resp.op_responses().into_iter().next() else {
        return Err(malformed("check"));
    };
    let queue = contenders(&dir, g.kvs());
    // Mine must be this incarnation (a reused lease puts a key of the same name again).
    let mine = queue
        .iter()
        .any(|(kv, _)| kv.key() == key.as_bytes() && kv.create_revision() == rev);
    if !mine {
        return Ok((Position::Gone, term));
    }
    Ok((position(&queue, key, seen), term))
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
        // Go's Mutex does not pad its lease id; anything not of distlock's form is exclusive.
        for other in [
            &b"694d7a9b3c1e2f"[..],
            b"abc-s",
            b"694d7a9b3c1e2f04-p0",
            b"\xff-s",
        ] {
            assert_eq!(mode_of(other), Mode::Exclusive, "{other:?}");
        }
    }
}
