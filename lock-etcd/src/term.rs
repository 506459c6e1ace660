//! Leader terms: which leader's keep-alives a lease's validity rests on, and moving a lock key
//! onto a lease of the current term after a leader change.
//!
//! etcd does not replicate keep-alives: only the leader's lessor knows when a lease ends. A
//! leader that stalls (a frozen process) and resumes still holding that view can revoke a
//! lease the next leader has renewed since, on etcd older than the fix of etcd-io/etcd#15247
//! (3.4.31 and 3.5.13; Debian's 3.4.23 has the bug). The deletion is applied by the cluster, so
//! the key goes while its holder believes. A grant is replicated, and a deposed leader's
//! lessor is demoted before its member applies any entry of a later term; so:
//! - a validity counted from a grant, or from a keep-alive answered while the term that the
//!   lease was granted in still leads, is one every lessor that knows the lease agrees with;
//! - a keep-alive answered in a later term is not, and extends nothing: the holder moves its
//!   key onto a lease granted in the new term (one grant and one transaction, with the same
//!   `create_revision`, so the fencing token does not change) and revokes the old one.
//!
//! A response header's `raft_term` is the term of the last entry its member applied; a
//! linearizable read's is the term of the leader that confirmed it. So a keep-alive followed
//! by such a read that reports the lease's term was answered while that term led.

use std::time::{Duration, Instant};

/// A lease, the term its validity rests on (0: none, so the next renewal moves the key), and
/// that validity.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tenure {
    pub(crate) id: i64,
    pub(crate) term: u64,
    pub(crate) valid_until: Instant,
}

/// A lease just granted: its id and TTL, the term it is known to belong to (0 when another
/// term was seen first), and its validity counted from before the request.
pub(crate) struct Granted {
    pub(crate) ttl: Duration,
    pub(crate) tenure: Tenure,
}

/// A lease kept alive: its TTL starts again from `since`, when the keep-alive that says so was
/// sent (earlier than the caller's own request, when a shared lease's answer is reused).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Alive {
    pub(crate) ttl: Duration,
    pub(crate) since: Instant,
}
