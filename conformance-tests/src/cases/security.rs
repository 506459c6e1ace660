//! Credentials, secrets and certificates, through URLs the way users write them. Needs
//! [`Harness::secured`].

use std::net::SocketAddr;
use std::time::Duration;

use lock_core::{DistributedLock, Error};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use super::support::{held, long_opts, within};
use crate::secured::AuthServer;
use crate::tls_peer::{TestCa, TlsPeer};
use crate::{ensure, fresh_name, Failure, Harness, Secured, UrlParts};

/// Connecting may take a session timeout or a few retries; never longer than this.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);

/// Nothing listens on port 1 of loopback.
const NOWHERE: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1);

fn secured(h: &dyn Harness) -> Result<Secured, Failure> {
    h.secured()
        .ok_or_else(|| Failure("the harness names no secured servers".into()))
}

fn userinfo(user: &str, password: &str) -> String {
    format!(
        "{}:{}",
        utf8_percent_encode(user, NON_ALPHANUMERIC),
        utf8_percent_encode(password, NON_ALPHANUMERIC)
    )
}

/// The error that refuses a client for `url`: at `connect`, or at the first lock attempt for a
/// driver that connects lazily. A granted lock fails the case, saying that `granted` happened.
async fn refused(
    h: &dyn Harness,
    s: &Secured,
    url: String,
    granted: &str,
) -> Result<Error, Failure> {
    within(CONNECT_LIMIT, "connecting", async {
        let lock = match s.connect(url).await {
            Ok(lock) => lock,
            Err(e) => return Ok(e),
        };
        match lock.try_acquire(&fresh_name("sec"), &long_opts(h)).await {
            Ok(Some(l)) => {
                l.release().await?;
                Err(Failure(format!("{granted}: a lock was granted")))
            }
            Ok(None) => Err(Failure("a fresh name was busy".into())),
            Err(e) => Ok(e),
        }
    })
    .await?
}

/// Where `secret` shows in `text`: as given, or percent-encoded as the URL carried it.
fn shows(text: &str, secret: &str) -> bool {
    text.contains(secret)
        || text.contains(&utf8_percent_encode(secret, NON_ALPHANUMERIC).to_string())
}

fn auth_server(s: &Secured) -> Result<AuthServer, Failure> {
    s.auth
        .clone()
        .ok_or_else(|| Failure("the harness names no auth server".into()))
}

/// The right credentials in the URL lock, renew and release, for every account the harness
/// names, and the password shows neither in the client's `Debug` nor in the lease's, nor in
/// any span, event or metric label reported for the lock.
pub async fn right_credentials_lock_and_never_show(h: &dyn Harness) -> Result<(), Failure> {
    let capture = crate::telemetry::capture();
    let s = secured(h)?;
    let a = auth_server(&s)?;
    for (user, password) in &a.accounts {
        let info = userinfo(user, password);
        let url = s.url(&UrlParts::plain(a.server, Some(&info)));
        let lock = within(
            CONNECT_LIMIT,
            "connecting with the right credentials",
            s.connect(url),
        )
        .await?
        .map_err(|e| {
            Failure(format!(
                "connecting to {} as {user:?} with the right password failed: {e}",
                a.server
            ))
        })?;
        let shown = format!("{lock:?}");
        ensure!(
            !shows(&shown, password),
            "the password shows in the client's Debug: {shown}"
        );
        let name = fresh_name("auth");
        if let Some(c) = capture {
            c.watch(&name);
        }
        let lease = held(
            lock.try_acquire(&name, &long_opts(h)).await?,
            "a fresh name with the right credentials",
        )?;
        lease.renew().await?;
        let shown = format!("{lease:?}");
        ensure!(
            !shows(&shown, password),
            "the password shows in the lease's Debug: {shown}"
        );
        lease.release().await?;
        if let Some(c) = capture {
            let reported = c.dump(&name);
            ensure!(
                !shows(&reported, password),
                "the password shows in what was reported of the lock: {reported}"
            );
        }
    }
    Ok(())
}

/// A wrong password — for every account the harness names, and for a user nobody created —
/// is refused with `Unauthenticated` (never `Config`: the URL is fine, the server said no),
/// and the error does not contain it, whatever characters it has.
pub async fn wrong_password_is_unauthenticated(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let a = auth_server(&s)?;
    let wrong = format!("Wr0ng:p@ss/w%rd?#{}", fresh_name("pw").as_str());
    let users = a.accounts.iter().map(|(u, _)| u.as_str()).chain(["nobody"]);
    for user in users {
        let info = userinfo(user, &wrong);
        let url = s.url(&UrlParts::plain(a.server, Some(&info)));
        let accepted = format!("a wrong password for {user:?} was accepted");
        let e = refused(h, &s, url, &accepted).await?;
        let text = format!("{e} {e:?}");
        ensure!(
            !shows(&text, &wrong),
            "the wrong password shows in the error: {text}"
        );
        ensure!(
            matches!(e, Error::Unauthenticated { .. }),
            "a wrong password for {user:?} should be Unauthenticated, it was: {e:?}"
        );
    }
    Ok(())
}

/// A server that requires credentials refuses a client without any with `Unauthenticated`.
pub async fn missing_credentials_are_unauthenticated(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let a = auth_server(&s)?;
    let url = s.url(&UrlParts::plain(a.server, None));
    let e = refused(
        h,
        &s,
        url,
        "a client without credentials on a server that requires them",
    )
    .await?;
    ensure!(
        matches!(e, Error::Unauthenticated { .. }),
        "a client without credentials should be Unauthenticated, it was: {e:?}"
    );
    Ok(())
}

/// When the server cannot be reached, the error is `Unavailable` and retryable, names the
/// server, and never contains the URL's password — as given or percent-encoded, whatever
/// characters it has.
pub async fn password_never_shows_in_errors(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    for password in [
        "plain-secret-7",
        "p@ss:w/rd?#&=%25",
        "pässwörd-ü-€",
        "%2F%40",
    ] {
        let info = userinfo("locker", password);
        let url = s.url(&UrlParts::plain(NOWHERE, Some(&info)));
        let e = refused(h, &s, url, &format!("{NOWHERE}, where nothing listens")).await?;
        let text = format!("{e} {e:?}");
        ensure!(
            !shows(&text, password),
            "the password {password:?} shows in the error: {text}"
        );
        ensure!(
            matches!(e, Error::Unavailable { .. }) && e.is_retryable(),
            "an unreachable server should be a retryable Unavailable, it was: {e:?}"
        );
        ensure!(
            text.contains(&NOWHERE.to_string()),
            "the error does not name the unreachable server {NOWHERE}: {text}"
        );
    }
    Ok(())
}

/// A server that accepts the connection and never answers (a frozen process, a half-dead
/// proxy) is a retryable error within 30 s — the login is bounded too, not only the TCP
/// connect — and the error does not contain the URL's password.
pub async fn silent_server_is_a_retryable_error(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let silent = SilentServer::start().await?;
    let password = "silent-secret-pw";
    let url = s.url(&UrlParts::plain(
        silent.addr,
        Some(&userinfo("locker", password)),
    ));
    let e = refused(h, &s, url, "a server that never answers")
        .await
        .map_err(|f| {
            Failure(format!(
                "connecting to a server that accepts and never answers ({}): {} — a driver \
                 must bound its login and requests, not only the TCP connect",
                silent.addr, f.0
            ))
        })?;
    let text = format!("{e} {e:?}");
    ensure!(
        !shows(&text, password),
        "the password shows in the error: {text}"
    );
    ensure!(
        e.is_retryable(),
        "a server that never answers should be a retryable error, it was: {e:?}"
    );
    Ok(())
}

/// A TCP listener that accepts connections and keeps them open without a byte in reply, until
/// dropped.
struct SilentServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl SilentServer {
    async fn start() -> Result<Self, Failure> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Failure(format!("cannot listen on loopback: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Failure(format!("cannot read the listener's address: {e}")))?;
        let task = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        Ok(SilentServer { addr, task })
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Over TLS, trusting the server's private CA from the URL, clients lock, and exclude each
/// other.
pub async fn tls_with_the_ca_from_the_url_locks(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let Some(t) = s.tls.clone() else {
        return Err(Failure("no TLS server".into()));
    };
    let url = s.url(&UrlParts::tls(t.server, Some(&t.ca_file)));
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(
            within(CONNECT_LIMIT, "connecting over TLS", s.connect(url.clone()))
                .await?
                .map_err(|e| Failure(format!("connecting over TLS to {} failed: {e}", t.server)))?,
        );
    }
    let name = fresh_name("tls");
    let lease = held(
        clients[0].try_acquire(&name, &long_opts(h)).await?,
        "over TLS",
    )?;
    ensure!(
        clients[1]
            .try_acquire(&name, &long_opts(h))
            .await?
            .is_none(),
        "two clients over TLS both hold one lock"
    );
    lease.release().await?;
    Ok(())
}

/// A CA given as PEM bytes instead of a file works as well as the file.
pub async fn tls_with_the_ca_as_pem_locks(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let (Some(t), Some(pem_connect)) = (s.tls.clone(), s.pem.clone()) else {
        return Err(Failure("no TLS server, or no way to give it a PEM".into()));
    };
    let pem = tokio::fs::read(&t.ca_file)
        .await
        .map_err(|e| Failure(format!("cannot read the test CA {}: {e}", t.ca_file)))?;
    let lock = within(
        CONNECT_LIMIT,
        "connecting over TLS",
        pem_connect(t.server, pem),
    )
    .await?
    .map_err(|e| {
        Failure(format!(
            "connecting over TLS with the CA as PEM failed: {e}"
        ))
    })?;
    held(
        lock.try_acquire(&fresh_name("tls-pem"), &long_opts(h))
            .await?,
        "over TLS with the CA as PEM",
    )?
    .release()
    .await?;
    Ok(())
}

/// Without the private CA, the server's certificate is not trusted: no lock, and an error
/// (not a panic, not a hang).
pub async fn tls_refuses_an_untrusted_certificate(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let Some(t) = s.tls.clone() else {
        return Err(Failure("no TLS server".into()));
    };
    let url = s.url(&UrlParts::tls(t.server, None));
    let e = refused(h, &s, url, "a certificate from an unknown CA was trusted").await?;
    ensure!(
        matches!(e, Error::Unavailable { .. } | Error::Config { .. }),
        "an untrusted certificate should be Unavailable or Config, it was: {e:?}"
    );
    Ok(())
}

/// Which certificates a client trusting `ca` accepts from `peer`: the client connects and tries
/// to lock once through the URL and once through the PEM hook where the harness has one; each
/// path is listed with the handshakes it finished. The peer speaks no backend protocol, so no
/// lock can come of it, and a driver may take any error; what counts is the handshake.
async fn handshakes(
    h: &dyn Harness,
    s: &Secured,
    peer: &TlsPeer,
    ca: &TestCa,
) -> Result<Vec<(&'static str, usize)>, Failure> {
    let ca_file = ca.file();
    let mut paths = vec![(
        "with the CA file in the URL",
        s.connect(s.url(&UrlParts::tls(peer.addr(), Some(&ca_file)))),
    )];
    if let Some(pem) = &s.pem {
        paths.push(("with the CA as PEM", pem(peer.addr(), ca.pem())));
    }
    let mut finished = Vec::new();
    for (path, connecting) in paths {
        let before = peer.finished();
        within(
            CONNECT_LIMIT,
            "connecting to a TLS server that hangs up",
            async {
                let Ok(lock) = connecting.await else {
                    return Ok(());
                };
                match lock
                    .try_acquire(&fresh_name("tls-peer"), &long_opts(h))
                    .await
                {
                    Ok(Some(l)) => {
                        let _ = l.release().await;
                        Err(Failure(format!(
                        "{path}: a lock was granted by {} ({}), which speaks no backend's protocol",
                        peer.addr(),
                        peer.names()
                    )))
                    }
                    _ => Ok(()),
                }
            },
        )
        .await??;
        peer.settled(Duration::from_secs(5)).await;
        finished.push((path, peer.finished() - before));
    }
    Ok(finished)
}

/// The case's own CA, and a check that the driver finishes a handshake with a certificate from
/// it for the address it dials: without that, a refusal later would prove nothing.
async fn trusted_test_ca(h: &dyn Harness, s: &Secured) -> Result<TestCa, Failure> {
    let ca = TestCa::new("trusted")?;
    let peer = ca.serve(&["127.0.0.1"]).await?;
    for (path, finished) in handshakes(h, s, &peer, &ca).await? {
        ensure!(
            finished > 0,
            "{path}, the client finished no TLS handshake with {} (certificate for 127.0.0.1 \
             from that CA; {} connections, last handshake error: {}): it does not trust the \
             CA it is given, so the case cannot test what else it trusts",
            peer.addr(),
            peer.connections(),
            peer.last_failure()
        );
    }
    Ok(ca)
}

/// The certificate must be for the server the client dialled: one from the trusted CA, but
/// for another name, is refused during the handshake (libpq's `verify-full`, not
/// `verify-ca`).
pub async fn tls_refuses_a_certificate_for_another_name(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let ca = trusted_test_ca(h, &s).await?;
    let peer = ca.serve(&["wrong-name.invalid"]).await?;
    for (path, finished) in handshakes(h, &s, &peer, &ca).await? {
        ensure!(
            finished == 0,
            "{path}, the client accepted a certificate for {} from {}: it does not check the \
             server's name",
            peer.names(),
            peer.addr()
        );
    }
    Ok(())
}

/// Given a CA, a client trusts that CA: a certificate for the right name from another CA is
/// refused, even though the given CA signed nothing wrong.
pub async fn tls_trusts_only_the_ca_it_is_given(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let ca = trusted_test_ca(h, &s).await?;
    let other = TestCa::new("other")?;
    let peer = other.serve(&["127.0.0.1"]).await?;
    for (path, finished) in handshakes(h, &s, &peer, &ca).await? {
        ensure!(
            finished == 0,
            "{path}, the client accepted a certificate for 127.0.0.1 from a CA it was not given \
             ({})",
            peer.addr()
        );
    }
    Ok(())
}

/// A CA file that does not exist is a `Config` error at once, never a silent fall-back to the
/// system's roots; and so is a CA file on a URL that does not ask for TLS.
pub async fn bad_ca_file_is_a_config_error(h: &dyn Harness) -> Result<(), Failure> {
    let s = secured(h)?;
    let Some(t) = s.tls.clone() else {
        return Err(Failure("no TLS server".into()));
    };
    let missing = "/nonexistent/distlock-ca.pem";
    for (what, parts) in [
        ("a missing CA file", UrlParts::tls(t.server, Some(missing))),
        (
            "a CA file without TLS",
            UrlParts {
                ca_file: Some(&t.ca_file),
                ..UrlParts::plain(t.server, None)
            },
        ),
    ] {
        let r = within(CONNECT_LIMIT, "connecting", s.connect(s.url(&parts))).await?;
        ensure!(
            matches!(r, Err(Error::Config { .. })),
            "{what} should be a Config error, it was: {:?}",
            r.map(|_| "a client")
        );
    }
    Ok(())
}
