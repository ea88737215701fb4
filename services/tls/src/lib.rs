//! hl7gw-tls: TLS from PEM files for every hl7gw part (rustls, ring provider): listeners (optionally requiring client
//! certificates) and MLLP clients. Trust is explicit: only the CA file given, never the system store.

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::Path;
use std::sync::Arc;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Pem {
        path: String,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("no certificate in {0}")]
    NoCertificate(String),
    #[error("a certificate in {0} does not parse")]
    Unparsed(String),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    Verifier(String),
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
    #[error("--tls needs --ca (no system trust store is used)")]
    NoCa,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_err(path: &Path) -> impl FnOnce(rustls_pki_types::pem::Error) -> TlsError + '_ {
    move |source| TlsError::Pem {
        path: path.display().to_string(),
        source,
    }
}

/// Every certificate in a PEM file (a chain: leaf first); an error when there is none.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(pem_err(path))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.display().to_string()));
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(pem_err(path))
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in load_certs(path)? {
        store.add(cert)?;
    }
    Ok(store)
}

/// A client that trusts only `ca` and presents `identity` (certificate chain, key) when given: mutual TLS.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca)?);
    let config = match identity {
        Some((cert, key)) => builder.with_client_auth_cert(load_certs(cert)?, load_key(key)?)?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A server presenting `cert`/`key`; with `client_ca`, clients must present a certificate issued by it.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with(cert, key, client_ca, true)
}

/// [`server_config`], where with `client_ca` and `required` false a client may also come without a
/// certificate (one it presents must still be issued by `client_ca`): the gRPC listeners, where callers
/// without a certificate authenticate with a token and each method decides.
pub fn server_config_with(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    required: bool,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca) => {
            let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
            let b = if required {
                b
            } else {
                b.allow_unauthenticated()
            };
            let verifier = b.build().map_err(|e| TlsError::Verifier(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(
        builder.with_single_cert(load_certs(cert)?, load_key(key)?)?,
    ))
}

/// The subject of a certificate (e.g. `CN=lab-sender, O=Hospital`); `unparsed-certificate` when it does not
/// parse (the TLS layer already verified it).
pub fn subject(cert: &CertificateDer<'_>) -> String {
    match x509_parser::parse_x509_certificate(cert.as_ref()) {
        Ok((_, c)) => c.subject().to_string(),
        Err(_) => "unparsed-certificate".to_owned(),
    }
}

/// The earliest notAfter (unix seconds) of a certificate chain: when the chain a process presents stops being
/// valid (usually the leaf's, sooner when an intermediate expires first); `None` for an empty chain or a
/// certificate that does not parse.
pub fn not_after(chain: &[CertificateDer<'_>]) -> Option<i64> {
    chain
        .iter()
        .map(|c| {
            x509_parser::parse_x509_certificate(c.as_ref())
                .ok()
                .map(|(_, c)| c.validity().not_after.timestamp())
        })
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .min()
}

/// [`not_after`] of the chain in a PEM file.
pub fn file_not_after(path: &Path) -> Result<i64, TlsError> {
    not_after(&load_certs(path)?).ok_or_else(|| TlsError::Unparsed(path.display().to_string()))
}

/// The first common name (CN) of a certificate's subject, the identity callers are allow-listed by.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    c.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

/// Whether `host` (a URI's host: a name, an IP address, an IPv6 address in brackets) is this machine: a
/// loopback address (127.0.0.0/8, ::1) or `localhost`. The one rule for where a credential may go over
/// plaintext (the CLI's token over a `kubectl port-forward`, an HTTP destination's token endpoint): it does not
/// cross the network.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The name a server certificate is checked against (a DNS name or an IP address).
pub fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName(name.to_owned()))
}

/// The host part of `HOST:PORT` (`[v6]:port` too), the default server name.
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// The TLS flags of the MLLP clients (`hl7gw send`, `hl7gw-load`): one definition, one meaning.
#[cfg(feature = "clap")]
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientFlags {
    /// Connect with TLS (needs --ca).
    #[arg(long = "tls", requires = "ca")]
    pub enabled: bool,
    /// PEM file of the CA certificate(s) the server's certificate must chain to; nothing else is trusted.
    #[arg(long, value_name = "PEM", requires = "enabled")]
    pub ca: Option<std::path::PathBuf>,
    /// PEM certificate (chain) to present for mutual TLS.
    #[arg(long, value_name = "PEM", requires_all = ["enabled", "key"])]
    pub cert: Option<std::path::PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, value_name = "PEM", requires_all = ["enabled", "cert"])]
    pub key: Option<std::path::PathBuf>,
    /// Name the server's certificate is checked against, also sent as SNI [default: the host of --to].
    #[arg(long, value_name = "NAME", requires = "enabled")]
    pub server_name: Option<String>,
}

#[cfg(feature = "clap")]
impl ClientFlags {
    /// The client TLS config and server name for connecting to `to` (`HOST:PORT`); none without `--tls`.
    pub fn client(
        &self,
        to: &str,
    ) -> Result<Option<(Arc<ClientConfig>, ServerName<'static>)>, TlsError> {
        if !self.enabled {
            return Ok(None);
        }
        let ca = self.ca.as_deref().ok_or(TlsError::NoCa)?;
        let identity = self.cert.as_deref().zip(self.key.as_deref());
        let config = client_config(ca, identity)?;
        let name = server_name(self.server_name.as_deref().unwrap_or_else(|| host_of(to)))?;
        Ok(Some((config, name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one loopback rule the CLI and the HTTP destinations share: 127.0.0.0/8, ::1 and localhost.
    #[test]
    fn loopback_hosts_are_this_machine_only() {
        for h in [
            "127.0.0.1",
            "127.0.0.2",
            "localhost",
            "LOCALHOST",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "10.0.0.1",
            "example.org",
            "localhost.example.org",
            "[::2]",
            "",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn host_of_addresses() {
        assert_eq!(host_of("gw.example:2575"), "gw.example");
        assert_eq!(host_of("127.0.0.1:2575"), "127.0.0.1");
        assert_eq!(host_of("[::1]:2575"), "::1");
        assert_eq!(host_of("gw"), "gw");
    }

    #[test]
    fn missing_files_and_bad_names_are_errors() {
        assert!(client_config(Path::new("/nonexistent/ca.pem"), None).is_err());
        assert!(server_name("not a name!").is_err());
        assert!(server_name("127.0.0.1").is_ok());
    }
}
