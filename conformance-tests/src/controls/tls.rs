//! The controls' TLS client, for servers that are not the fake's own: a real rustls handshake,
//! checking the certificate the way a driver with a given flaw would.

use std::net::SocketAddr;
use std::sync::Arc;

use lock_core::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct as Dss, RootCertStore, SignatureScheme};

use super::wire::REQUEST_TIMEOUT;
use super::Flaw;

const BACKEND: &str = "flawed-memory";

/// What a signature check answers.
type Signed = std::result::Result<HandshakeSignatureValid, rustls::Error>;

/// Finishes a TLS handshake with `server`, trusting the CA certificates in `ca` (PEM), as a
/// driver with `flaw` would: `Ok` means the certificate was accepted.
pub(super) async fn handshake(flaw: Flaw, server: SocketAddr, ca: Option<&[u8]>) -> Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in ca.map(CertificateDer::pem_slice_iter).into_iter().flatten() {
        let cert = cert.map_err(|e| Error::config(format!("the CA file is not PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| Error::config(format!("the CA file: {e}")))?;
    }
    let checks = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .ok();
    let trusts_anything = match flaw {
        Flaw::TrustsAnyCertificate => true,
        Flaw::GivenCaTrustsAnyCertificate => ca.is_some(),
        _ => false,
    };
    let verifier = Verifier {
        checks: (!trusts_anything).then_some(checks).flatten(),
        trusts_anything,
        ignores_names: flaw == Flaw::IgnoresServerName,
        provider: provider.clone(),
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config(format!("TLS set-up: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    let unavailable = |what: String| Error::unavailable(BACKEND, what);
    let stream = tokio::net::TcpStream::connect(server)
        .await
        .map_err(|e| unavailable(format!("cannot reach {server}: {e}")))?;
    let connecting = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::IpAddress(server.ip().into()), stream);
    match tokio::time::timeout(REQUEST_TIMEOUT, connecting).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(unavailable(format!("TLS handshake with {server}: {e}"))),
        Err(_) => Err(unavailable(format!("no TLS handshake from {server}"))),
    }
}

/// Checks certificates with webpki, unless a flaw skips the checks or their name part.
#[derive(Debug)]
struct Verifier {
    /// `None`: no CA to check against (refuses), unless `trusts_anything`.
    checks: Option<Arc<WebPkiServerVerifier>>,
    trusts_anything: bool,
    ignores_names: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        if self.trusts_anything {
            return Ok(ServerCertVerified::assertion());
        }
        let Some(checks) = &self.checks else {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ));
        };
        match checks.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) if self.ignores_names => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    // Signatures are checked for real whatever the flaw: only the certificate checks vary.
    fn verify_tls12_signature(&self, m: &[u8], c: &CertificateDer<'_>, d: &Dss) -> Signed {
        verify_tls12_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(&self, m: &[u8], c: &CertificateDer<'_>, d: &Dss) -> Signed {
        verify_tls13_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
