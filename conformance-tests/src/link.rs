//! A client whose link to the backend the suite can break: what the `faults` cases (and the
//! delayed-request cases) get from [`Harness::faulty_client`](crate::Harness::faulty_client).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::DistributedLock;

use crate::{FaultProxy, Witness};

/// What a client's link to its backend does to its traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Plain forwarding.
    Healed,
    /// Every chunk of data arrives this much late, in both directions.
    Delay(Duration),
    /// A partition: nothing flows either way and connections stay open; what was sent
    /// meanwhile flows after the link heals, as TCP retransmissions would.
    Blackhole,
    /// Every open connection is closed once (the client sees it drop); new connections work.
    Cut,
}

/// The switch on a [`Faulty`] client's link: for a networked driver, the [`FaultProxy`]s in
/// front of its servers (`Vec<FaultProxy>` implements it).
pub trait Link: Send + Sync + fmt::Debug {
    /// Applies `fault` from now on ([`Fault::Cut`] once, leaving the link as it was).
    fn set(&self, fault: Fault);

    /// A plain connection over this link that tells when this process saw the next cut
    /// ([`FaultProxy::witness`]); `None` (the default) where the link has no such thing.
    fn witness(&self) -> Option<Witness> {
        None
    }

    /// When the first request sent over this link at or after `since` reached the link (the
    /// proxy read its first bytes), if the link records it (`None`, the default: it does not,
    /// or nothing was sent since). A driver reads its clock before it sends, so a validity
    /// counted from before its request is at most this plus the TTL: a bound that does not
    /// move when the caller's thread stalls between its own clock reading and the driver's.
    fn first_sent_since(&self, since: Instant) -> Option<Instant> {
        let _ = since;
        None
    }
}

impl Link for FaultProxy {
    fn set(&self, fault: Fault) {
        match fault {
            Fault::Healed => self.heal(),
            Fault::Delay(d) => self.delay(d),
            Fault::Blackhole => self.blackhole(),
            Fault::Cut => self.cut(),
        }
    }

    fn witness(&self) -> Option<Witness> {
        Some(FaultProxy::witness(self))
    }

    fn first_sent_since(&self, since: Instant) -> Option<Instant> {
        FaultProxy::first_sent_since(self, since)
    }
}

impl Link for Vec<FaultProxy> {
    fn set(&self, fault: Fault) {
        for proxy in self {
            proxy.set(fault);
        }
    }

    /// Through the first proxy: a cut closes every proxy's connections at once.
    fn witness(&self) -> Option<Witness> {
        self.first().map(FaultProxy::witness)
    }

    /// The earliest over every proxy.
    fn first_sent_since(&self, since: Instant) -> Option<Instant> {
        self.iter().filter_map(|p| p.first_sent_since(since)).min()
    }
}

/// A client behind a breakable link, from [`Harness::faulty_client`](crate::Harness::faulty_client).
/// The link (its proxies) lives as long as this value.
pub struct Faulty {
    /// The client.
    pub lock: Arc<dyn DistributedLock>,
    /// Its link to the backend.
    pub link: Box<dyn Link>,
}

impl Faulty {
    /// A client and the switch on its link.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use std::sync::Arc;
    /// use conformance_tests::{Fault, FaultProxy, Faulty};
    /// let proxy = FaultProxy::start("127.0.0.1:6379".parse()?)?;
    /// let lock = lock_core::memory::MemoryLock::new(); // a driver connected to proxy.addr()
    /// let faulty = Faulty::new(Arc::new(lock), vec![proxy]);
    /// faulty.link.set(Fault::Blackhole);
    /// # Ok(()) }
    /// ```
    pub fn new(lock: Arc<dyn DistributedLock>, link: impl Link + 'static) -> Self {
        Faulty {
            lock,
            link: Box::new(link),
        }
    }
}

impl fmt::Debug for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faulty")
            .field("backend", &self.lock.backend())
            .field("link", &self.link)
            .finish()
    }
}
