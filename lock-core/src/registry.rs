//! [`Driver`]: how a driver declares its URL schemes, so that `distlock::connect` finds it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{DistributedLock, Result};

/// What connecting from a URL returns: a driver behind the contract.
pub type ConnectFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send>>;

/// A driver as `distlock::connect` finds it: the URL schemes it serves and how it connects from
/// a URL. Every driver crate exports one as `DRIVER`; the facade registers the ones its cargo
/// features compile in, and a third-party driver registers its own with `distlock::register`.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::driver::{connecting, ConnectFuture, Driver};
/// use lock_core::memory::MemoryLock;
///
/// fn connect(_url: String) -> ConnectFuture {
///     connecting(async { Ok(MemoryLock::new()) })
/// }
/// /// This driver for `distlock::connect`.
/// pub const DRIVER: Driver = Driver { backend: "mine", schemes: &["mine"], connect };
/// # let _ = DRIVER;
/// ```
#[derive(Clone, Copy)]
pub struct Driver {
    /// The backend name its locks report ([`DistributedLock::backend`]).
    pub backend: &'static str,
    /// The URL schemes it serves, without `://`.
    pub schemes: &'static [&'static str],
    /// Connects from a whole URL (`scheme://...`).
    pub connect: fn(String) -> ConnectFuture,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("backend", &self.backend)
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

/// Boxes a driver's `connect` future into a [`ConnectFuture`].
pub fn connecting<D, F>(connect: F) -> ConnectFuture
where
    D: DistributedLock + 'static,
    F: Future<Output = Result<D>> + Send + 'static,
{
    Box::pin(async move { Ok(Arc::new(connect.await?) as Arc<dyn DistributedLock>) })
}
