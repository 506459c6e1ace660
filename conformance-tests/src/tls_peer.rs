//! TLS servers made up for one case: a fresh CA of the case's own, and listeners that present
//! a certificate from it for names of the case's choosing and count the clients that finish a
//! handshake. They speak no backend's protocol: a finished handshake is the evidence that a
//! client accepted the certificate (in TLS 1.2 and 1.3 a client sends its `Finished` only after
//! it has checked the server's), and nothing after it matters.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::Failure;

/// PostgreSQL's `SSLRequest`: its clients ask for TLS in plain text first and wait for `S`.
/// The one such upgrade among the backends here; every other client starts with the TLS
/// `ClientHello` (first byte 0x16).
const PG_SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

fn failed(what: &str) -> impl Fn(rcgen::Error) -> Failure + '_ {
    move |e| Failure(format!("making the test certificates ({what}): {e}"))
}

/// A CA that exists for one case, with its certificate in a temporary PEM file.
pub(crate) struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    file: PathBuf,
}

impl TestCa {
    /// A new CA, its certificate written to a file named after `label` and this process.
    pub(crate) fn new(label: &str) -> Result<Self, Failure> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed("CA"))?;
        params.distinguished_name.push(
            DnType::CommonName,
            format!("distlock conformance {label} CA"),
        );
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(failed("CA key"))?;
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(failed("CA"))?;
        let file = std::env::temp_dir().join(format!(
            "distlock-conformance-{label}-{}-{}.pem",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&file, issuer.pem())
            .map_err(|e| Failure(format!("cannot write {}: {e}", file.display())))?;
        Ok(Self { issuer, file })
    }

    /// The CA certificate's file, for URLs.
    pub(crate) fn file(&self) -> String {
        self.file.to_string_lossy().into_owned()
    }

    /// The CA certificate as PEM bytes.
    pub(crate) fn pem(&self) -> Vec<u8> {
        self.issuer.pem().into_bytes()
    }

    /// A listener on loopback presenting a server certificate from this CA for `names` (IP
    /// addresses or DNS names) only.
    pub(crate) async fn serve(&self, names: &[&str]) -> Result<TlsPeer, Failure> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).map_err(failed("server"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, names.join(" "));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(failed("server key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(failed("server"))?;
        let chain = vec![cert.der().clone(), self.issuer.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        TlsPeer::start(chain, key, names.join(", ")).await
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// A loopback TLS listener that counts finished handshakes, then hangs up.
pub(crate) struct TlsPeer {
    addr: SocketAddr,
    names: String,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Counts {
    /// Connections accepted.
    connections: AtomicUsize,
    /// Handshakes the client finished: it accepted the certificate.
    finished: AtomicUsize,
    /// Connections whose handshake ended, one way or the other.
    ended: AtomicUsize,
    /// Why the last handshake that did not finish ended, as the server saw it.
    last_failure: parking_lot::Mutex<Option<String>>,
}

impl TlsPeer {
    async fn start(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        names: String,
    ) -> Result<Self, Failure> {
        // An explicit provider: a process where two crates enabled two providers has no
        // default one.
        let config = rustls::ServerConfig::builder_with_provider(
            rustls::crypto::ring::default_provider().into(),
        )
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| Failure(format!("TLS server set-up: {e}")))?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| Failure(format!("cannot listen on loopback: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Failure(format!("listener address: {e}")))?;
        let counts = Arc::new(Counts::default());
        let seen = counts.clone();
        let task = tokio::spawn(async move {
            // Owned by this task, so ending it ends every connection too.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                seen.connections.fetch_add(1, Ordering::SeqCst);
                while connections.try_join_next().is_some() {}
                let (acceptor, seen) = (acceptor.clone(), seen.clone());
                connections.spawn(async move {
                    let _ended = Ended(&seen.ended);
                    let Some(stream) = past_ssl_request(stream).await else {
                        return;
                    };
                    match acceptor.accept(stream).await {
                        Ok(mut tls) => {
                            seen.finished.fetch_add(1, Ordering::SeqCst);
                            let _ = tls.shutdown().await;
                        }
                        Err(e) => {
                            let mut last = seen.last_failure.lock();
                            *last = Some(e.to_string());
                        }
                    }
                });
            }
        });
        Ok(Self {
            addr,
            names,
            counts,
            task,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The names its certificate is for, for messages.
    pub(crate) fn names(&self) -> &str {
        &self.names
    }

    /// Waits (at most `limit`) until every connection accepted so far has ended its
    /// handshake: a client may give up on its side before the server has read its `Finished`.
    pub(crate) async fn settled(&self, limit: std::time::Duration) {
        let until = tokio::time::Instant::now() + limit;
        while self.counts.ended.load(Ordering::SeqCst) < self.connections()
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> usize {
        self.counts.connections.load(Ordering::SeqCst)
    }

    /// How the last handshake that did not finish ended (say, the client's alert), for
    /// messages.
    pub(crate) fn last_failure(&self) -> String {
        self.counts
            .last_failure
            .lock()
            .clone()
            .unwrap_or_else(|| "none failed".into())
    }

    /// Handshakes clients finished so far: each one accepted the certificate.
    pub(crate) fn finished(&self) -> usize {
        self.counts.finished.load(Ordering::SeqCst)
    }
}

impl Drop for TlsPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Counts a connection's handshake as ended when dropped, however its task ends.
struct Ended<'a>(&'a AtomicUsize);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The stream where the TLS handshake starts: at once, or after answering PostgreSQL's
/// `SSLRequest` with `S`. `None` for anything else.
async fn past_ssl_request(mut stream: TcpStream) -> Option<TcpStream> {
    let mut first = [0u8; 1];
    if stream.peek(&mut first).await.ok()? == 0 {
        return None;
    }
    if first[0] == 0x16 {
        return Some(stream);
    }
    let mut request = [0u8; 8];
    stream.read_exact(&mut request).await.ok()?;
    if request != PG_SSL_REQUEST {
        return None;
    }
    stream.write_all(b"S").await.ok()?;
    Some(stream)
}
