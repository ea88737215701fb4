//! TLS settings for `send` and `receive`: rustls with the ring provider, certificates and keys from PEM files.
//!
//! Trust is explicit: a client trusts only the CA file it is given (no system store), and a receiver asks for
//! client certificates only when it is given a client CA (mutual TLS), and then requires one.

use anyhow::{Context, bail};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::Path;
use std::sync::Arc;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file (a chain: leaf first); an error when there is none.
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

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("reading a private key from {}", path.display()))
}

/// A root store holding exactly the certificates of `path`.
fn roots(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    for cert in load_certs(path)? {
        store.add(cert).with_context(|| {
            format!("using a certificate of {} as trust anchor", path.display())
        })?;
    }
    Ok(store)
}

/// The client side: trusts only `ca`; presents `identity` (certificate chain, key) when given, for mutual TLS.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> anyhow::Result<Arc<ClientConfig>> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots(ca)?);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .context("client certificate and key")?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The server side: presents `cert`/`key`; with `client_ca`, requires a client certificate issued by it.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<Arc<ServerConfig>> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .context("client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .context("server certificate and key")?;
    Ok(Arc::new(config))
}

/// The name the server's certificate is checked against (a DNS name or an IP address).
pub fn server_name(name: &str) -> anyhow::Result<ServerName<'static>> {
    ServerName::try_from(name.to_owned())
        .with_context(|| format!("invalid TLS server name {name:?}"))
}
