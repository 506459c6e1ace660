//! The controls' secured "servers": a URL scheme acted out in process, with an auth server and
//! a TLS-only server, so the `security` cases have flaws to catch.

use std::net::SocketAddr;
use std::sync::Arc;

use lock_core::driver::{connecting, percent_decode};
use lock_core::{DistributedLock, Error, Result};

use tokio::io::AsyncReadExt;

use super::wire::REQUEST_TIMEOUT;
use super::Flaw;
use crate::{Secured, UrlParts};

const AUTH: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7001);
const TLS: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7002);
const USER: &str = "locker";
const PASSWORD: &str = "right-pw";
const BACKEND: &str = "flawed-memory";

/// The fake TLS server's CA: a file that exists (the PEM case reads it), whose content only
/// stands for a certificate. One file for every run (a file per process piled up in the
/// temporary directory): written under a name of this process's, then renamed over it, so a
/// reader in another process sees the whole content or the same content before.
fn ca_file() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::temp_dir().join("distlock-controls-ca.pem");
        let mine = path.with_extension(format!("pem.{}", std::process::id()));
        let pem = "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n";
        if std::fs::write(&mine, pem).is_err() || std::fs::rename(&mine, &path).is_err() {
            let _ = std::fs::remove_file(&mine);
        }
        path.to_string_lossy().into_owned()
    })
}

/// `flawed://[user:password@]host:port[?tls=true][&ca=<file>]`.
fn url(p: &UrlParts<'_>) -> String {
    let query = p.query(&[], Some("tls"), "ca");
    format!("flawed://{}{}{query}", p.userinfo_at(), p.server)
}

/// The secured servers of a driver with `flaw`, whose clients `client` makes: it is given what
/// the client shows of its URL.
pub(super) fn fake_secured<L>(
    flaw: Flaw,
    client: impl Fn(String) -> L + Send + Sync + 'static,
) -> Secured
where
    L: DistributedLock + 'static,
{
    let client = Arc::new(client);
    let by_pem = client.clone();
    Secured::new(
        move |url| {
            let client = client.clone();
            connecting(async move {
                connect_trusting(flaw, &url, None)
                    .await
                    .map(|shown| client(shown))
            })
        },
        url,
    )
    .with_auth(AUTH, USER, PASSWORD)
    .with_tls(TLS, ca_file())
    .with_tls_ca_pem(move |server, pem| {
        let url = format!("flawed://{server}?tls=true");
        let pem = (flaw != Flaw::PemCaIgnored).then_some(pem);
        let client = by_pem.clone();
        connecting(async move {
            connect_trusting(flaw, &url, pem)
                .await
                .map(|shown| client(shown))
        })
    })
}

/// What a driver with `flaw` does with `url`, trusting the CA in `pem` if given (else the
/// URL's CA file): on success, what its client shows of the URL.
async fn connect_trusting(flaw: Flaw, url: &str, pem: Option<Vec<u8>>) -> Result<String> {
    let rest = url
        .strip_prefix("flawed://")
        .ok_or_else(|| Error::config("not a flawed:// URL"))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (userinfo, server) = match rest.rsplit_once('@') {
        Some((u, s)) => (Some(u), s),
        None => (None, rest),
    };
    let server: SocketAddr = server
        .parse()
        .map_err(|_| Error::config("the server must be host:port"))?;
    let (user, password) = match userinfo {
        Some(u) => {
            let (user, pw) = u.split_once(':').unwrap_or((u, ""));
            (Some(percent_decode(user)), Some(percent_decode(pw)))
        }
        None => (None, None),
    };
    let mut tls = false;
    let mut ca = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("tls", v)) => tls = v == "true",
            Some(("ca", v)) => ca = (flaw != Flaw::UrlCaIgnored).then(|| v.to_string()),
            _ => return Err(Error::config(format!("unknown option {pair:?}"))),
        }
    }
    // What this client shows of its URL: the password masked, or not at all.
    let shown = match (&password, flaw) {
        (Some(_), Flaw::SecretInDebug) => url.to_string(),
        (Some(pw), _) => url.replace(&utf8_encoded(pw), "***"),
        _ => url.to_string(),
    };
    if ca.is_some() && !tls {
        return Err(Error::config("a CA file needs tls=true"));
    }
    let trusted = match (pem, ca) {
        (Some(pem), _) => Some(pem),
        (None, Some(file)) => match std::fs::read(&file) {
            Ok(pem) => Some(pem),
            Err(_) if flaw == Flaw::MissingCaFileIgnored => None,
            Err(e) => return Err(Error::config(format!("cannot read the CA file: {e}"))),
        },
        (None, None) => None,
    };
    // The fake TLS server's certificate is the fictional CA file's.
    let fake_ca = std::fs::read(ca_file()).ok();
    let trusts_fake = match flaw {
        Flaw::TrustsAnyCertificate => true,
        Flaw::GivenCaTrustsAnyCertificate => trusted.is_some(),
        _ => trusted.is_some() && trusted == fake_ca,
    };
    let refuse = |what: &str| Error::unauthenticated(BACKEND, what.to_string());
    match server {
        TLS if !tls => Err(Error::unavailable(BACKEND, "the server speaks only TLS")),
        TLS if !trusts_fake => Err(Error::unavailable(
            BACKEND,
            "the server's certificate is not trusted",
        )),
        AUTH if flaw != Flaw::AnyPasswordAccepted && user.is_none() => {
            Err(refuse("credentials required"))
        }
        AUTH if flaw != Flaw::AnyPasswordAccepted
            && (user.as_deref(), password.as_deref()) != (Some(USER), Some(PASSWORD)) =>
        {
            Err(refuse("wrong user or password"))
        }
        TLS | AUTH => Ok(shown),
        // A real TLS server (a case's own): the handshake is real; nothing after it would be
        // understood.
        _ if tls => {
            super::tls::handshake(flaw, server, trusted.as_deref()).await?;
            Err(Error::unavailable(
                BACKEND,
                format!("{server} speaks no protocol the fake knows"),
            ))
        }
        _ => Err(Error::unavailable(
            BACKEND,
            match (flaw, &password, reach(flaw, server).await) {
                // Scrubs the decoded password, while the URL carries the encoded one.
                (Flaw::SecretInErrors, Some(pw), _) => {
                    format!("cannot reach {}", url.replace(pw.as_str(), "***"))
                }
                (_, _, Reached::Refused) => format!("cannot reach {server}"),
                (_, _, Reached::Silent) => format!("no answer from {server}"),
            },
        )),
    }
}

/// What became of trying a server that is not one of the fake's.
enum Reached {
    Refused,
    Silent,
}

/// Tries a server that is not one of the fake's for real, as a driver would: a refused
/// connection fails at once; where something accepts it, the fake waits the request timeout
/// for a first byte (nothing it says would be understood) — or, under
/// [`Flaw::HangsWhileUnreachable`], for as long as it takes.
async fn reach(flaw: Flaw, server: SocketAddr) -> Reached {
    let Ok(mut stream) = tokio::net::TcpStream::connect(server).await else {
        return Reached::Refused;
    };
    let mut first = [0u8; 1];
    let read = stream.read(&mut first);
    if flaw == Flaw::HangsWhileUnreachable {
        let _ = read.await;
    } else {
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, read).await;
    }
    Reached::Silent
}

fn utf8_encoded(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
