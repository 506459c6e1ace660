//! What the checker reports: a broken promise ([`Kind`]) with its evidence ([`Violation`]).

use std::fmt;
use std::time::Instant;

use super::history::{LeaseId, NOBODY};

/// Which promise a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// (a) Two clients believed they held one name at the same instant in modes that exclude
    /// each other, or more believed it than their mode allows (K + 1 holders of K permits).
    Overlap,
    /// (b) Tokens did not strictly increase in grant order, or the store accepted a write with
    /// a token lower than one it had accepted.
    Fencing,
    /// (c) A holder that had not released was still believing it held (no lost signal, its
    /// `valid_until` ahead) when the next holder's grant returned.
    LossNotSeen,
    /// (d) After the last fault healed (and the servers served again, where they say so), a
    /// name was not granted within the bound, or a client was never answered by its backend
    /// again; or an acquisition never finished, or overstayed its bounded wait by the
    /// workload's whole margin.
    Liveness,
    /// (e) An election's observer showed a term below one it had shown, or again a term it
    /// had seen end; or it failed; or, once every lease of the run had ended, it still showed
    /// a leader when the run stopped watching (the recovery bound after the clients stopped).
    Observer,
}

/// One broken promise, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which promise.
    pub kind: Kind,
    /// The name (index into the run's names; [`NOBODY`] for a violation of one client's).
    pub name: usize,
    /// The leases involved, earlier first.
    pub leases: Vec<LeaseId>,
    /// When it happened.
    pub at: Instant,
    /// What happened, in words (times relative to the start of the history).
    pub detail: String,
}

impl Violation {
    /// A violation of (d): no lease is involved.
    pub(super) fn liveness(name: usize, at: Instant, detail: String) -> Self {
        Violation {
            kind: Kind::Liveness,
            name,
            leases: vec![],
            at,
            detail,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name == NOBODY {
            write!(f, "{:?}: {}", self.kind, self.detail)
        } else {
            write!(f, "{:?} on name {}: {}", self.kind, self.name, self.detail)
        }
    }
}
