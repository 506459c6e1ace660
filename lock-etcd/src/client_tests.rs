use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;

/// A refused connection, as tonic reports it: the OS error under the status.
fn refusal() -> etcd_client::Error {
    let mut status = tonic::Status::unavailable("tcp connect error");
    status.set_source(Arc::new(std::io::Error::from(
        std::io::ErrorKind::ConnectionRefused,
    )));
    etcd_client::Error::GRpcStatus(status)
}

/// A server that refuses the first try, then takes the second and never answers it: the
/// deadline cuts the second try short.
async fn refused_then_silent(config: &EtcdConfig) -> std::result::Result<(), Unanswered> {
    // etcd-client connects lazily: no server is needed to build one.
    let client = Client::connect(["http://127.0.0.1:1"], None)
        .await
        .map_err(Unanswered::Failed)?;
    let tries = AtomicUsize::new(0);
    send(
        config,
        &client,
        Duration::from_millis(300),
        Resend::Unsent,
        |_| {
            let first = tries.fetch_add(1, Ordering::Relaxed) == 0;
            async move {
                if first {
                    Err(refusal())
                } else {
                    std::future::pending().await
                }
            }
        },
    )
    .await
}

/// Reproduces a red of the connect test under load: the health check's last try was cut short
/// by its deadline, and the error said "no answer" instead of the refusal every try had met.
#[tokio::test]
async fn a_try_cut_short_by_the_deadline_reports_the_refusal_before_it() {
    let config = EtcdConfig::from_url("etcd://127.0.0.1:1").expect("a valid URL");
    let sent = refused_then_silent(&config).await;
    let Err(e @ Unanswered::Late { before: Some(_) }) = sent else {
        panic!("expected a late answer after a refusal, got {sent:?}");
    };
    assert_eq!(
        unhealthy(e, &config, Duration::from_millis(300)).to_string(),
        "etcd backend unavailable: cannot connect to etcd://127.0.0.1:1: connection refused"
    );
    // Any other request says both: no answer in time, and what the try before met.
    let Err(e) = refused_then_silent(&config).await else {
        panic!("a silent server answered");
    };
    let text = mapped(e, &config, Duration::from_millis(300)).to_string();
    assert!(
        text.starts_with("etcd backend unavailable: no answer from etcd://127.0.0.1:1 within 300ms; the try before was not taken: ")
            && text.contains("tcp connect error"),
        "{text}"
    );
}

/// A server that never answers, with no try refused: the health check says no answer, not a
/// refusal it never saw.
#[tokio::test]
async fn a_silent_server_is_not_called_refused() {
    let config = EtcdConfig::from_url("etcd://127.0.0.1:1").expect("a valid URL");
    let client = Client::connect(["http://127.0.0.1:1"], None)
        .await
        .expect("a lazy client");
    let sent = send(
        &config,
        &client,
        Duration::from_millis(100),
        Resend::Unsent,
        |_| std::future::pending::<std::result::Result<(), etcd_client::Error>>(),
    )
    .await;
    let Err(e @ Unanswered::Late { before: None }) = sent else {
        panic!("expected a late answer, got {sent:?}");
    };
    assert_eq!(
        unhealthy(e, &config, Duration::from_millis(100)).to_string(),
        "etcd backend unavailable: etcd://127.0.0.1:1 does not answer reads: no answer from etcd://127.0.0.1:1 within 100ms"
    );
}

/// Reproduces CI's red of `single::slow::a_slow_link_is_never_busy`: through a link whose round
/// trip was the TTL, the lease granted for a `try_acquire` expired before the put that used it
/// arrived, and etcd's "requested lease not found" became a backend error (not retryable),
/// though nothing was put and the same request with a new lease may succeed.
#[tokio::test]
async fn a_lease_expired_on_its_way_is_a_transient_failure() {
    let config = EtcdConfig::from_url("etcd://127.0.0.1:1").expect("a valid URL");
    let client = Client::connect(["http://127.0.0.1:1"], None)
        .await
        .expect("a lazy client");
    let expired = || {
        etcd_client::Error::GRpcStatus(tonic::Status::not_found(
            "etcdserver: requested lease not found",
        ))
    };
    let e = on_lease_error(answered(&config, &client, expired()).await, &config, 0x1f);
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(
        e.to_string(),
        "etcd backend unavailable: lease 1f, granted for this request, expired before \
         etcd://127.0.0.1:1 received the request: the link is slower than the TTL; nothing was \
         written (a longer TTL may help)"
    );
    // Only that refusal: another NotFound, or the same words under another code, is not it.
    for other in [
        tonic::Status::not_found("etcdserver: key not found"),
        tonic::Status::unknown("etcdserver: requested lease not found"),
    ] {
        let e = answered(&config, &client, etcd_client::Error::GRpcStatus(other)).await;
        let e = on_lease_error(e, &config, 0x1f);
        assert!(!e.to_string().contains("expired before"), "{e}");
    }
    // Elsewhere (a renewal, a release) the same answer stays what it was: not retryable.
    assert!(!map_error(expired(), &config).is_retryable());
}

/// What [`send`] returns for a request the server answers with `e`.
async fn answered(config: &EtcdConfig, client: &Client, e: etcd_client::Error) -> Unanswered {
    let mut e = Some(e);
    let sent = send(
        config,
        client,
        Duration::from_secs(1),
        Resend::Unsent,
        |_| {
            let e = e.take();
            async move { Err::<(), _>(e.expect("sent once")) }
        },
    )
    .await;
    sent.expect_err("the server refused")
}
