//! The contenders' order: ZooKeeper's sequence suffix, which wraps.
//!
//! The server appends its parent's counter, a signed 32-bit number formatted `%010d`, to a
//! sequential node's name. After 2^31 creates under one parent (a busy name with
//! `parents=persistent`, whose parent is never deleted) it wraps to `-2147483648` and counts up
//! through the negative numbers: read as the last ten digits and sorted as numbers, the newest
//! node would sort before the holder, and two clients would hold the lock. So the suffix is
//! read with its sign, and the order is the counter's own: on a circle of 2^32, the live
//! contenders always lie on an arc much shorter than half of it, and the oldest is the one
//! just after the widest gap.

/// ZooKeeper's sequential suffix: the parent's counter, `%010d`.
const SEQ_DIGITS: usize = 10;

/// The signed sequence at the end of a child's name, if it ends in one: ten digits
/// (`0000000005`, `2147483647`), or a minus sign and nine or ten (`-000000005`,
/// `-2147483648`) after a recipe's separator (`-` or `_`, which the positive form never puts
/// right before its digits together with another separator).
pub(crate) fn sequence(name: &str) -> Option<i32> {
    let b = name.as_bytes();
    let n = b.len();
    let digits = b.iter().rev().take_while(|c| c.is_ascii_digit()).count();
    let at = |i: usize| n.checked_sub(i).and_then(|i| b.get(i)).copied();
    let separator = |c: Option<u8>| matches!(c, Some(b'-' | b'_'));
    let negative = |d: usize| at(d + 1) == Some(b'-') && separator(at(d + 2));
    let text = match digits {
        9 | 10 if negative(digits) => name.get(n - digits - 1..)?,
        d if d >= SEQ_DIGITS => name.get(n - SEQ_DIGITS..)?,
        _ => return None,
    };
    text.parse().ok()
}

/// Every contender among a lock node's children, oldest (the holder) first: any child whose
/// name ends in a ZooKeeper sequence suffix, whoever made it — distlock's `_c_<uuid>-lock-`,
/// Curator's, kazoo's `<id>__lock__`, the WriteLock recipe's `x-<session>-`. Ignoring a foreign
/// node would let two clients hold the lock at once.
pub(crate) fn contenders(children: Vec<String>) -> Vec<(i32, String)> {
    let mut queue: Vec<(i32, String)> = children
        .into_iter()
        .filter_map(|c| Some((sequence(&c)?, c)))
        .collect();
    queue.sort();
    // The widest gap between neighbours on the circle (the one from the last back round to
    // the first included): the oldest contender is just after it.
    let gap = |from: i32, to: i32| u64::from(to.wrapping_sub(from) as u32);
    let start = (0..queue.len())
        .max_by_key(|&i| {
            let before = queue[(i + queue.len() - 1) % queue.len()].0;
            let g = gap(before, queue[i].0);
            // A lone contender (a gap of zero to itself) and ties keep the numeric order.
            (if g == 0 { u64::MAX } else { g }, std::cmp::Reverse(i))
        })
        .unwrap_or(0);
    queue.rotate_left(start);
    queue
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(q: &[(i32, String)]) -> Vec<&str> {
        q.iter().map(|(_, c)| c.as_str()).collect()
    }

    #[test]
    fn reads_the_servers_suffix_with_its_sign() {
        assert_eq!(sequence("_c_ab-lock-0000000005"), Some(5));
        assert_eq!(sequence("_c_ab-lock-2147483647"), Some(i32::MAX));
        assert_eq!(sequence("_c_ab-lock--2147483648"), Some(i32::MIN));
        assert_eq!(sequence("_c_ab-lock--000000005"), Some(-5));
        assert_eq!(sequence("ab__lock__-999999999"), Some(-999_999_999));
        assert_eq!(sequence("ab__lock__0000000007"), Some(7));
        assert_eq!(sequence("x-72057594037927936-0000000009"), Some(9));
        assert_eq!(sequence("x-72057594037927936--000000009"), Some(-9));
        // Not a sequence: too few digits, no separator before a sign, nothing at all.
        assert_eq!(sequence("lock-123"), None);
        assert_eq!(sequence("a-123456789"), None);
        assert_eq!(sequence("a--12345678"), None);
        assert_eq!(sequence("config"), None);
        assert_eq!(sequence(""), None);
    }

    #[test]
    fn orders_by_the_counter_without_a_wrap() {
        let q = contenders(vec![
            "_c_b-lock-0000000012".into(),
            "kz__lock__0000000010".into(),
            "readme".into(),
            "_c_a-lock-0000000011".into(),
        ]);
        assert_eq!(
            names(&q),
            [
                "kz__lock__0000000010",
                "_c_a-lock-0000000011",
                "_c_b-lock-0000000012"
            ]
        );
    }

    /// The holder was created just before the counter wrapped; the contenders after it got
    /// negative numbers. Sorted as numbers, the newest would hold the lock with the old holder.
    #[test]
    fn the_holder_stays_first_across_the_wrap() {
        let q = contenders(vec![
            "_c_d-lock--2147483647".into(),
            "_c_a-lock-2147483646".into(),
            "_c_c-lock--2147483648".into(),
            "_c_b-lock-2147483647".into(),
        ]);
        assert_eq!(
            names(&q),
            [
                "_c_a-lock-2147483646",
                "_c_b-lock-2147483647",
                "_c_c-lock--2147483648",
                "_c_d-lock--2147483647"
            ]
        );
        // And across the second crossing, from -1 to 0.
        let q = contenders(vec![
            "_c_b-lock-0000000000".into(),
            "_c_a-lock--000000001".into(),
            "_c_c-lock-0000000001".into(),
        ]);
        assert_eq!(
            names(&q),
            [
                "_c_a-lock--000000001",
                "_c_b-lock-0000000000",
                "_c_c-lock-0000000001"
            ]
        );
        // One contender, and none.
        assert_eq!(
            names(&contenders(vec!["_c_a-lock--2147483648".into()])).len(),
            1
        );
        assert!(contenders(vec![]).is_empty());
    }
}
