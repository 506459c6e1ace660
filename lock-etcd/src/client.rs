//! Connecting to etcd (probing the server's minimum lease TTL), and every call to it: bounded,
//! retried only where the request was certainly not sent; etcd's errors mapped onto the
//! contract's variants, without the password.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, ResponseHeader, Txn};
use lock_core::driver::{scrub, Backoff, ClientError};
use lock_core::{Error, Result};

use crate::config::BACKEND;
use crate::keepers::Keepers;
use crate::shared::SharedLeases;
use crate::spares::Spares;
use crate::EtcdConfig;

/// The client's connection to the cluster, and what it learned there: the leader's highest
/// term seen, and the leases its released locks left (spares).
pub(crate) struct Cluster {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    pub(crate) spares: Spares,
    /// Keep-alive streams kept open, one per lease (`keepers.rs`).
    pub(crate) keepers: Keepers,
    /// The leases its locks share, with `shared_lease` (`shared.rs`).
    pub(crate) shared: SharedLeases,
    /// The highest leader term any response reported (`term.rs`).
    pub(crate) term: AtomicU64,
}

impl Cluster {
    /// Connects, authenticates if configured, and checks that the cluster answers a
    /// linearizable read (etcd-client's own `connect` does no I/O without credentials).
    /// Credentials given to a cluster with authentication off are not used (a warning is
    /// logged), as etcd's own clients do.
    /// Returns it with the server's minimum lease TTL, which it measures.
    pub(crate) async fn connect(config: EtcdConfig) -> Result<(Cluster, Duration)> {
        config.check()?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout())
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2))
            // Fail fast on a member cut off from its leader instead of hanging on it.
            .with_require_leader(true);
        let mut endpoints = config.endpoints().to_vec();
        if config.is_tls() {
            opts = with_tls(opts, &config).await?;
            endpoints = endpoints
                .into_iter()
                .map(|e| match e.split_once("://") {
                    Some((_, rest)) => format!("https://{rest}"),
                    None => format!("https://{e}"),
                })
                .collect();
        }
        let limit = config.connect_timeout();
        // The outer error: no answer in time; the inner: the client's own.
        let connect = |opts: ConnectOptions| {
            let endpoints = endpoints.clone();
            let url = config.redacted_url();
            async move {
                tokio::time::timeout(limit, Client::connect(endpoints, Some(opts)))
                    .await
                    .map_err(|_| {
                        Error::unavailable(
                            BACKEND,
                            format!("no answer from {url} within {limit:?}"),
                        )
                    })
            }
        };
        let client = match config.credentials() {
            None => connect(opts).await?,
            Some((u, p)) => {
                let authenticated = opts.clone().with_user(u, p).with_auto_token_refresh(true);
                match connect(authenticated).await? {
                    // etcd's own clients (etcdctl, clientv3) go on without a token when the
                    // cluster has auth off: the same URL serves a development cluster.
                    Err(e) if auth_not_enabled(&e) => {
                        tracing::warn!(
                            url = %config.redacted_url(),
                            "etcd has authentication off; the credentials are not used"
                        );
                        connect(opts).await?
                    }
                    other => other,
                }
            }
        }
        .map_err(|e| connect_error(e, &config))?;
        // Health: a linearizable read needs a leader and a quorum. The key is the prefix (its
        // readers' role covers it), or `/` without one: etcd has no empty key.
        let prefix = match config.prefix() {
            "" => "/",
            p => p,
        };
        let health = send(
            &config,
            &client,
            limit,
            Resend::Unsent,
            |mut c| async move {
                c.get(prefix, Some(GetOptions::new().with_count_only()))
                    .await
            },
        )
        .await
        .map_err(|e| unhealthy(e, &config, limit))?;
        let term = health.header().map_or(0, |h| h.raft_term());
        // The server raises short leases to its minimum TTL; measure it so that validation and
        // `ttl()` report what the server will actually enforce.
        let probe = call(
            &config,
            &client,
            limit,
            Resend::Unsent,
            |mut c| async move { c.lease_grant(1, None).await },
        )
        .await?;
        let probe_id = probe.id();
        let _ = call(
            &config,
            &client,
            limit,
            Resend::Unsent,
            |mut c| async move { c.lease_revoke(probe_id).await },
        )
        .await;
        let min_ttl = Duration::from_secs(u64::try_from(probe.ttl()).unwrap_or(1).max(1));
        Ok((
            Cluster {
                client,
                config,
                spares: Spares::default(),
                keepers: Keepers::default(),
                shared: SharedLeases::default(),
                term: AtomicU64::new(term),
            },
            min_ttl,
        ))
    }

    pub(crate) async fn call<T, Fut>(&self, f: impl FnMut(Client) -> Fut) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let config = &self.config;
        call(
            config,
            &self.client,
            config.request_timeout(),
            Resend::Unsent,
            f,
        )
        .await
    }

    /// Records the term a response reports and returns it (0 without a header).
    pub(crate) fn observe(&self, header: Option<&ResponseHeader>) -> u64 {
        let term = header.map_or(0, |h| h.raft_term());
        self.term.fetch_max(term, Ordering::Relaxed);
        term
    }
}

/// TLS for every member: the configured CA, or the public roots.
#[cfg(feature = "tls")]
pub(crate) async fn with_tls(opts: ConnectOptions, config: &EtcdConfig) -> Result<ConnectOptions> {
    use etcd_client::{Certificate, TlsOptions};
    let tls = match config.tls_ca() {
        Some(ca) => TlsOptions::new().ca_certificate(Certificate::from_pem(ca.load().await?)),
        None => TlsOptions::new().with_enabled_roots(),
    };
    Ok(opts.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
pub(crate) async fn with_tls(_: ConnectOptions, _: &EtcdConfig) -> Result<ConnectOptions> {
    Err(Error::config(
        "etcd over TLS needs the `tls` feature of lock-etcd",
    ))
}

/// Runs one request within `limit`, sending it again where `resend` allows (see [`Resend`]).
pub(crate) async fn call<T, Fut>(
    config: &EtcdConfig,
    client: &Client,
    limit: Duration,
    resend: Resend,
    f: impl FnMut(Client) -> Fut,
) -> Result<T>
where
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let sent = send(config, client, limit, resend, f).await;
    sent.map_err(|e| mapped(e, config, limit))
}

/// Which failed requests are sent again. The balanced channel may route the next try to
/// another member: it keeps a dead member's endpoint until a request fails on it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only a request that provably never left this process (the connection to a dead member
    /// was refused): any request, writes included.
    Unsent,
    /// Also one that a member refused for having no leader. A member cut off from the others
    /// refuses so once it notices (etcd's require-leader check), and the next try may reach
    /// one that has a leader, as etcd's own client retries reads. Only for requests that
    /// change nothing, or nothing twice (reads, keep-alives): for a write, a refusal is
    /// certain only where it came from that check, and a write resent after a doubtful
    /// failure could apply twice.
    Refused,
    /// Also any request whose failure may pass, answered or not (its connection closed under
    /// it, say): only for requests that do the same however often they land — undoing an
    /// acquisition, revoking a lease — so that one sent as its connection broke is sent again
    /// on the next at once, not a back-off later.
    Idempotent,
}

/// The first pause before a request is sent again (see [`send`]).
const RESEND_FIRST: Duration = Duration::from_millis(20);

/// Why [`send`] returned without an answer.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// The client's own error, not one `resend` covers (or no time was left to resend).
    Failed(etcd_client::Error),
    /// `limit` passed with a request in flight; `before`: the error of the try before it,
    /// if one was not taken (refused, no leader) — the likeliest reason, when the last try
    /// was cut short by the deadline rather than answered.
    Late { before: Option<etcd_client::Error> },
}

/// Sends `f`'s request until it is answered, fails in a way `resend` does not cover, or
/// `limit` has passed.
pub(crate) async fn send<T, Fut>(
    config: &EtcdConfig,
    client: &Client,
    limit: Duration,
    resend: Resend,
    mut f: impl FnMut(Client) -> Fut,
) -> std::result::Result<T, Unanswered>
where
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    // Short: a member without a leader gets one within an election timeout (1 s by default),
    // and the request is sent again as soon as it has.
    let mut pauses = Backoff::new(RESEND_FIRST, RESEND_FIRST * 2);
    let mut before = None;
    loop {
        let answer = tokio::time::timeout_at(deadline, f(client.clone())).await;
        let pause = pauses.pause();
        match answer {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e))
                if (never_sent(&e)
                    || (resend == Resend::Refused && no_leader(&e))
                    || (resend == Resend::Idempotent && transient(&e)))
                    && tokio::time::Instant::now() + pause < deadline =>
            {
                tracing::debug!(error = %scrub(&e, config.secret()), "etcd request not taken; sending it again");
                before = Some(e);
                tokio::time::sleep(pause).await;
            }
            Ok(Err(e)) => return Err(Unanswered::Failed(e)),
            Err(_) => return Err(Unanswered::Late { before }),
        }
    }
}

/// The contract's error for what [`send`] returned.
pub(crate) fn mapped(e: Unanswered, config: &EtcdConfig, limit: Duration) -> Error {
    let url = config.redacted_url();
    match e {
        Unanswered::Failed(e) => map_error(e, config),
        Unanswered::Late { before: None } => {
            Error::unavailable(BACKEND, format!("no answer from {url} within {limit:?}"))
        }
        Unanswered::Late { before: Some(e) } => Error::unavailable(
            BACKEND,
            format!(
                "no answer from {url} within {limit:?}; the try before was not taken: {}",
                scrub(&e, config.secret())
            ),
        ),
    }
}

/// One `Txn` through [`call`], within the request timeout.
pub(crate) async fn txn_call(
    config: &EtcdConfig,
    client: &Client,
    txn: Txn,
) -> Result<etcd_client::TxnResponse> {
    let sent = send_txn(config, client, txn).await;
    sent.map_err(|e| mapped(e, config, config.request_timeout()))
}

/// One `Txn` through [`send`], within the request timeout.
async fn send_txn(
    config: &EtcdConfig,
    client: &Client,
    txn: Txn,
) -> std::result::Result<etcd_client::TxnResponse, Unanswered> {
    send(
        config,
        client,
        config.request_timeout(),
        Resend::Unsent,
        |mut c| {
            let txn = txn.clone(); // a re-sent request needs its own copy
            async move { c.txn(txn).await }
        },
    )
    .await
}

/// One `Txn` that puts a key on lease `id`, granted for this request just before. Where the
/// lease expired on its way (a link slower than the lease's TTL), etcd refuses the whole `Txn`
/// with "requested lease not found": nothing was put, and the same request with a new lease
/// may succeed, so that is [`Error::Unavailable`], never a backend error.
pub(crate) async fn txn_on_lease(
    config: &EtcdConfig,
    client: &Client,
    txn: Txn,
    id: i64,
) -> Result<etcd_client::TxnResponse> {
    let sent = send_txn(config, client, txn).await;
    sent.map_err(|e| on_lease_error(e, config, id))
}

/// The contract's error for a request on lease `id` that [`send`] returned unanswered.
fn on_lease_error(e: Unanswered, config: &EtcdConfig, id: i64) -> Error {
    match e {
        Unanswered::Failed(e) if lease_not_found(&e) => expired_on_the_way(config, id),
        e => mapped(e, config, config.request_timeout()),
    }
}

/// etcd's answer to a request naming a lease it does not have (expired or revoked).
pub(crate) fn lease_not_found(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::NotFound && s.message().contains("requested lease not found"))
}

/// The error of a request whose lease `id` expired before the request arrived.
fn expired_on_the_way(config: &EtcdConfig, id: i64) -> Error {
    Error::unavailable(
        BACKEND,
        format!(
            "lease {id:x}, granted for this request, expired before {} received the request: \
             the link is slower than the TTL; nothing was written (a longer TTL may help)",
            config.redacted_url()
        ),
    )
}

/// The request failed before reaching any server (connection refused or not established).
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect error")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// The health check's error: why the cluster does not answer reads, saying so plainly where
/// every try that was answered was refused before reaching a server (the deadline may cut the
/// last try short: the refusal before it is still the reason).
fn unhealthy(e: Unanswered, config: &EtcdConfig, limit: Duration) -> Error {
    let url = config.redacted_url();
    let refusal = match &e {
        Unanswered::Failed(e) | Unanswered::Late { before: Some(e) } => refused(e),
        Unanswered::Late { before: None } => None,
    };
    if let Some(io) = refusal {
        return Error::unavailable(BACKEND, format!("cannot connect to {url}: {io}"));
    }
    match mapped(e, config, limit) {
        Error::Unavailable { cause, .. } => {
            Error::unavailable(BACKEND, format!("{url} does not answer reads: {cause}"))
        }
        e => e,
    }
}

/// The operating system's reason a request never reached a server ("Connection refused"),
/// where the client's error says so.
fn refused(e: &etcd_client::Error) -> Option<String> {
    if !never_sent(e) {
        return None;
    }
    // etcd-client's error does not chain to the gRPC status it wraps; the status does.
    let mut next: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => Some(status),
        other => Some(other),
    };
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.to_string());
        }
        next = err.source();
    }
    None
}

/// A member refused the request for having no leader (the require-leader check, or a
/// keep-alive it could not forward): nothing was done.
fn no_leader(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::Unavailable && s.message().contains("no leader"))
}

pub(crate) fn malformed(what: &str) -> Error {
    Error::backend(BACKEND, format!("unexpected {what} transaction response"))
}

/// Whether etcd refused to authenticate because the cluster has authentication off.
fn auth_not_enabled(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::FailedPrecondition
            && s.message().contains("authentication is not enabled"))
}

pub(crate) fn connect_error(e: etcd_client::Error, config: &EtcdConfig) -> Error {
    match map_error(e, config) {
        Error::Unavailable { .. } => Error::unavailable(
            BACKEND,
            format!("cannot connect to {}", config.redacted_url()),
        ),
        other => other,
    }
}

pub(crate) fn map_error(e: etcd_client::Error, config: &EtcdConfig) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    let text = scrub(&e, config.secret());
    if transient(&e) {
        return Error::unavailable(BACKEND, client(e, config));
    }
    match &e {
        E::GRpcStatus(s) => match s.code() {
            // etcd reports a wrong password, or none where auth is on, as InvalidArgument.
            Code::InvalidArgument
                if s.message().contains("authentication failed")
                    || s.message().contains("user name is empty") =>
            {
                Error::unauthenticated(
                    BACKEND,
                    format!(
                        "etcd rejected the credentials of user {:?}: {text}",
                        config.user().unwrap_or("")
                    ),
                )
            }
            Code::Unauthenticated | Code::PermissionDenied => Error::unauthenticated(
                BACKEND,
                format!(
                    "etcd refused access for user {:?}: {text}",
                    config.user().unwrap_or("")
                ),
            ),
            _ => Error::backend(BACKEND, client(e, config)),
        },
        _ => Error::backend(BACKEND, client(e, config)),
    }
}

/// Whether `e` may pass: the contract's [`Error::Unavailable`] (see [`map_error`]).
fn transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::ResourceExhausted
                | Code::Cancelled
                | Code::Unknown
        ),
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// The client's error kept whole (downcastable), shown scrubbed and with the redacted URL.
fn client(e: etcd_client::Error, config: &EtcdConfig) -> ClientError {
    ClientError::new(e, config.secret()).context(config.redacted_url())
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
