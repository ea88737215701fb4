//! TLS for the client connections: rustls with the ring provider, trust and identity from PEM files.
//!
//! Trust is explicit: the harness trusts only the CA file it is given (no system store) and presents a client
//! certificate only when given one (mutual TLS).

use anyhow::{Context, bail};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsConnector;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading certificates from {}", path.display()))?;
    if certs.is_empty() {
        bail!("no certificate in {}", path.display());
    }
    Ok(certs)
}

fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("reading a private key from {}", path.display()))
}

/// A connector trusting exactly the certificates of `ca`, presenting `identity` (chain, key) when given.
pub fn connector(ca: &Path, identity: Option<(&Path, &Path)>) -> anyhow::Result<TlsConnector> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots
            .add(cert)
            .with_context(|| format!("using a certificate of {} as trust anchor", ca.display()))?;
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .context("client certificate and key")?,
        None => builder.with_no_client_auth(),
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The name the server certificate is checked against (a DNS name or an IP address).
pub fn server_name(name: &str) -> anyhow::Result<ServerName<'static>> {
    ServerName::try_from(name.to_owned())
        .with_context(|| format!("invalid TLS server name {name:?}"))
}

/// The host part of `HOST:PORT` (`[v6]:port` too), the default server name.
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_addresses() {
        assert_eq!(host_of("gw.example:2575"), "gw.example");
        assert_eq!(host_of("127.0.0.1:2575"), "127.0.0.1");
        assert_eq!(host_of("[::1]:2575"), "::1");
        assert_eq!(host_of("gw"), "gw");
    }

    #[test]
    fn missing_files_are_errors() {
        assert!(connector(Path::new("/nonexistent/ca.pem"), None).is_err());
        assert!(server_name("not a name!").is_err());
        assert!(server_name("127.0.0.1").is_ok());
    }
}
