//! The client's ZooKeeper session: opening it (with digest credentials), replacing it once it
//! expired, the ACLs of the nodes it creates; ZooKeeper errors mapped onto the contract's
//! variants without the password, and the retry of requests whose outcome is not yet known.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use lock_core::driver::{scrub, Backoff, ClientError};
use lock_core::{Error, LockName, Result};
use zookeeper_client::{Acls, Client, CreateMode};

use crate::config::BACKEND;
use crate::confirm::{is_ensemble, Pace};
use crate::ZkConfig;

/// The client's session with the servers, and what every request on it needs: the
/// configuration, the ACLs of the nodes it creates, how its confirmations vouch.
pub(crate) struct Session {
    pub(crate) config: ZkConfig,
    /// The current session; replaced by a new one once it has ended (expired or closed).
    current: parking_lot::Mutex<Client>,
    /// Serializes the re-creation of an ended session.
    reopen: tokio::sync::Mutex<()>,
    secured: bool,
    /// The servers form an ensemble: confirmations go through the leader and vouch for less
    /// (see [`Pace`]).
    ensemble: bool,
    /// How many times a waiter was woken by its predecessor's watch.
    pub(crate) wakeups: AtomicU64,
}

impl Session {
    /// Opens a session (authenticating with digest credentials if configured) and makes sure
    /// the base path exists.
    pub(crate) async fn open(config: ZkConfig) -> Result<Session> {
        config.check()?;
        let client = open_session(&config).await?;
        let session = Session {
            secured: config.digest().is_some(),
            ensemble: is_ensemble(&client).await,
            config,
            current: parking_lot::Mutex::new(client.clone()),
            reopen: tokio::sync::Mutex::new(()),
            wakeups: AtomicU64::new(0),
        };
        let config = &session.config;
        let opts = CreateMode::Persistent.with_acls(session.acls());
        // The base path, made if missing. `/` is the session's root: the server's root, which
        // always exists (and cannot be made), or the chroot, which may be missing.
        let base = config.base_path();
        let make_base = || async {
            if base == "/" {
                match client.check_stat("/").await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err(zookeeper_client::Error::NoNode),
                    Err(e) => Err(e),
                }
            } else {
                client.mkdir(base, &opts).await
            }
        };
        let mut made = make_base().await;
        if let (Err(zookeeper_client::Error::NoNode), Some(chroot)) = (&made, config.chroot()) {
            // The chroot itself is missing: create it from a session without one.
            let root = open_session(&config.without_chroot()).await?;
            match root.mkdir(chroot, &opts).await {
                Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
                Err(e) => return Err(session.error(e, None)),
            }
            made = make_base().await;
        }
        match made {
            Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => return Err(session.error(e, None)),
        }
        Ok(session)
    }

    /// The client of the current session (it may have ended).
    pub(crate) fn current(&self) -> Client {
        self.current.lock().clone()
    }

    /// A live session: the current one, or a new one if it has expired or been closed. Leases
    /// of the ended session stay Lost; only new acquisitions use the new session.
    pub(crate) async fn live(&self) -> Result<Client> {
        let client = self.current();
        if !client.state().is_terminated() {
            return Ok(client);
        }
        let _one_at_a_time = self.reopen.lock().await;
        let client = self.current();
        if !client.state().is_terminated() {
            return Ok(client); // another task re-opened it meanwhile
        }
        let fresh = open_session(&self.config).await?;
        tracing::info!(
            url = %self.config.redacted_url(),
            "ZooKeeper session ended; opened a new one for new acquisitions"
        );
        *self.current.lock() = fresh.clone();
        Ok(fresh)
    }

    pub(crate) fn acls(&self) -> Acls<'static> {
        // With credentials, only this user may delete (or create under) the nodes.
        if self.secured {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    /// How confirmations on `client`'s session vouch: on the timeout that session was granted
    /// (a re-opened session may have been granted another one than the first).
    pub(crate) fn pace(&self, client: &Client) -> Pace {
        Pace {
            session_timeout: client.session_timeout(),
            ensemble: self.ensemble,
        }
    }

    /// `e` as the driver's error; `name`: the lock the request was for, if any.
    pub(crate) fn error(&self, e: zookeeper_client::Error, name: Option<&LockName>) -> Error {
        map_error(e, &self.config, name)
    }
}

/// Opens a session, authenticating with the digest credentials if configured.
pub(crate) async fn open_session(config: &ZkConfig) -> Result<Client> {
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout())
        .with_fail_eagerly();
    if let Some(d) = config.digest() {
        connector = connector.with_auth("digest", d.as_bytes());
    }
    let limit = config.session_timeout() + Duration::from_secs(2);
    let client = tokio::time::timeout(limit, connector.connect(&config.connect_string()))
        .await
        .map_err(|_| {
            Error::unavailable(
                BACKEND,
                format!("no session with {} within {limit:?}", config.redacted_url()),
            )
        })?
        .map_err(|e| match e {
            zookeeper_client::Error::AuthFailed | zookeeper_client::Error::NoAuth => {
                Error::unauthenticated(
                    BACKEND,
                    format!(
                        "ZooKeeper at {} rejected the digest credentials of user {:?}",
                        config.hosts(),
                        config.user().unwrap_or("")
                    ),
                )
            }
            e => Error::unavailable(
                BACKEND,
                format!(
                    "cannot connect to {}: {}",
                    config.redacted_url(),
                    scrub(&e, config.secret())
                ),
            ),
        })?;
    Ok(client)
}

/// Whether a failed request may succeed on the same session once the connection is back.
pub(crate) fn transient(e: &zookeeper_client::Error) -> bool {
    use zookeeper_client::Error as Z;
    matches!(
        e,
        Z::ConnectionLoss | Z::Timeout | Z::Throttled | Z::SessionMoved | Z::Custom(_)
    )
}

/// Repeats `request` while it fails transiently and `client`'s session lives, pausing by
/// [`Backoff::transient`]: a request that must have a definite answer (a delete that frees a lock,
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
    let mut pauses = Backoff::transient();
    loop {
        match request().await {
            Err(e) if transient(&e) && !client.state().is_terminated() => {
                tokio::time::sleep(pauses.pause()).await;
            }
            r => return r,
        }
    }
}

/// `e` as the driver's error. A session that ended loses the lock `name` (the one a lease holds
/// or an acquisition waits for); without one (connecting, inspecting) it is `Unavailable`: the
/// next request opens a new session.
pub(crate) fn map_error(
    e: zookeeper_client::Error,
    config: &ZkConfig,
    name: Option<&LockName>,
) -> Error {
    use zookeeper_client::Error as Z;
    let text = scrub(&e, config.secret());
    match &e {
        Z::SessionExpired | Z::ClientClosed => match name {
            Some(name) => Error::Lost {
                name: name.clone(),
                reason: format!("ZooKeeper session ended: {text}"),
            },
            None => Error::unavailable(BACKEND, format!("ZooKeeper session ended: {text}")),
        },
        // `Custom` errors come from the connection layer ("no response from connection").
        Z::ConnectionLoss
        | Z::Timeout
        | Z::NoHosts
        | Z::Throttled
        | Z::SessionMoved
        | Z::Custom(_) => Error::unavailable(BACKEND, client(e, config)),
        Z::AuthFailed | Z::NoAuth | Z::InvalidAcl => Error::unauthenticated(
            BACKEND,
            format!(
                "ZooKeeper refused access for user {:?}: {text}",
                config.user().unwrap_or("")
            ),
        ),
        _ => Error::backend(BACKEND, client(e, config)),
    }
}

/// The client's error kept whole (downcastable), shown scrubbed and with the redacted URL.
fn client(e: zookeeper_client::Error, config: &ZkConfig) -> ClientError {
    ClientError::new(e, config.secret()).context(config.redacted_url())
}
