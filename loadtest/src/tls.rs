//! TLS for the client connections: the shared hl7gw TLS setup (only the CA file given is trusted; a client
//! certificate is presented only when given, for mutual TLS).

use anyhow::Context;
use std::path::Path;
use tokio_rustls::TlsConnector;

pub use hl7gw_tls::{host_of, server_name as parse_server_name};

/// A connector trusting exactly the certificates of `ca`, presenting `identity` (chain, key) when given.
pub fn connector(ca: &Path, identity: Option<(&Path, &Path)>) -> anyhow::Result<TlsConnector> {
    let config = hl7gw_tls::client_config(ca, identity).context("client TLS")?;
    Ok(TlsConnector::from(config))
}

/// The name the server certificate is checked against (a DNS name or an IP address).
pub fn server_name(name: &str) -> anyhow::Result<rustls_pki_types::ServerName<'static>> {
    Ok(parse_server_name(name)?)
}
