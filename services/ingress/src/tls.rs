//! TLS and mutual TLS for the MLLP listener (rustls, PEM files).

use crate::config::TlsConfig;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {what}: {source}")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    Verifier(String),
}

/// Builds the acceptor; with `client_ca`, clients without a certificate signed by it are refused.
pub fn acceptor(cfg: &TlsConfig) -> Result<TlsAcceptor, TlsError> {
    let certs = CertificateDer::pem_file_iter(&cfg.cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Pem {
            what: "tls.cert",
            source,
        })?;
    let key = PrivateKeyDer::from_pem_file(&cfg.key).map_err(|source| TlsError::Pem {
        what: "tls.key",
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|source| TlsError::Pem {
                what: "tls.client_ca",
                source,
            })? {
                let c = c.map_err(|source| TlsError::Pem {
                    what: "tls.client_ca",
                    source,
                })?;
                roots.add(c)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(certs, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The subject of a client certificate (e.g. `CN=lab-sender, O=Hospital`), for the envelope's `tls_client`.
/// A certificate that does not parse gives `unparsed-certificate`; the TLS layer already verified it.
pub fn subject(cert: &CertificateDer<'_>) -> String {
    match x509_parser::parse_x509_certificate(cert.as_ref()) {
        Ok((_, c)) => c.subject().to_string(),
        Err(_) => "unparsed-certificate".to_owned(),
    }
}
