//! ZooKeeper client errors mapped onto the contract's error variants, without the password,
//! and the retry of requests whose outcome is not yet known.

use std::time::Duration;

use lock_core::driver::scrub;
use lock_core::{Error, LockName};
use zookeeper_client::Client;

use crate::lock::{ZkLock, BACKEND};
use crate::ZkConfig;

impl ZkLock {
    pub(crate) fn error(&self, e: zookeeper_client::Error) -> Error {
        map_error(e, &self.inner.config)
    }
}

/// Whether a failed request may succeed on the same session once the connection is back.
pub(crate) fn transient(e: &zookeeper_client::Error) -> bool {
    use zookeeper_client::Error as Z;
    matches!(
        e,
        Z::ConnectionLoss | Z::Timeout | Z::Throttled | Z::SessionMoved | Z::Custom(_)
    )
}

/// Repeats `request` while it fails transiently and `client`'s session lives, with a back-off
/// from 20 ms to 1 s: a request that must have a definite answer (a delete that frees a lock,
/// a lookup that decides whether to create) must not give up on a connection loss, because
/// the session — and whatever it created — survives the reconnect.
pub(crate) async fn until_definite<T, F, Fut>(
    client: &Client,
    mut request: F,
) -> std::result::Result<T, zookeeper_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, zookeeper_client::Error>>,
{
    let mut pause = Duration::from_millis(20);
    loop {
        match request().await {
            Err(e) if transient(&e) && !client.state().is_terminated() => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            r => return r,
        }
    }
}

pub(crate) fn map_error(e: zookeeper_client::Error, config: &ZkConfig) -> Error {
    use zookeeper_client::Error as Z;
    let text = scrub(&e, config.secret());
    match e {
        Z::SessionExpired | Z::ClientClosed => Error::Lost {
            name: LockName::new("session").unwrap_or_else(|_| unreachable!()),
            reason: format!("ZooKeeper session ended: {text}"),
        },
        // `Custom` errors come from the connection layer ("no response from connection").
        Z::ConnectionLoss
        | Z::Timeout
        | Z::NoHosts
        | Z::Throttled
        | Z::SessionMoved
        | Z::Custom(_) => {
            Error::unavailable(BACKEND, format!("{text} ({})", config.redacted_url()))
        }
        Z::AuthFailed | Z::NoAuth | Z::InvalidAcl => Error::unauthenticated(
            BACKEND,
            format!(
                "ZooKeeper refused access for user {:?}: {text}",
                config.user().unwrap_or("")
            ),
        ),
        _ => Error::backend(BACKEND, format!("{text} ({})", config.redacted_url())),
    }
}
