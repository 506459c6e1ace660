//! Shared holders and permits in the one queue of a name: each contender's key says its mode
//! in its value (empty: exclusive, as `etcdctl lock` writes it; else [`Mode::code`]), and a
//! contender's turn is [`queue_turn`] over the keys before it in `create_revision` order —
//! readers behind a waiting writer wait behind it, and the first count of permits wins.

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use lock_core::driver::{queue_turn, Turn};
use lock_core::{LockName, Mode, Result};

use crate::client::{malformed, txn_call, Cluster};
use crate::queue::{contender, dir, Position};

/// The mode a contender's key says: its value's code; empty (`etcdctl lock`, distlock's
/// exclusive keys) or anything else is exclusive, the mode that waits for and keeps out all.
pub(crate) fn mode_of(value: &[u8]) -> Mode {
    std::str::from_utf8(value)
        .ok()
        .and_then(Mode::from_code)
        .unwrap_or(Mode::Exclusive)
}

/// What a contender of `mode` writes as its key's value.
pub(crate) fn value_of(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => String::new(),
        m => m.code(),
    }
}

/// The name's contenders, oldest first, with their modes.
pub(crate) fn contenders<'a>(dir: &str, kvs: &'a [KeyValue]) -> Vec<(&'a KeyValue, Mode)> {
    kvs.iter()
        .filter(|kv| contender(dir, kv.key()))
        .map(|kv| (kv, mode_of(kv.value())))
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
    fn modes_round_trip_through_values() {
        for mode in [Mode::Exclusive, Mode::Shared, Mode::Permits(3)] {
            assert_eq!(mode_of(value_of(mode).as_bytes()), mode);
        }
        assert_eq!(value_of(Mode::Exclusive), "", "etcdctl's layout");
        for other in [&b"whatever"[..], b"p0", b"\xff"] {
            assert_eq!(mode_of(other), Mode::Exclusive);
        }
    }
}
