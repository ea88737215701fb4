//! TLS and mutual TLS for the MLLP listener (rustls, PEM files).

use crate::config::TlsConfig;
use tokio_rustls::TlsAcceptor;

use hl7gw_tls::TlsError;

/// Builds the acceptor; with `client_ca`, clients without a certificate signed by it are refused.
pub fn acceptor(cfg: &TlsConfig) -> Result<TlsAcceptor, TlsError> {
    let config = hl7gw_tls::server_config(&cfg.cert, &cfg.key, cfg.client_ca.as_deref())?;
    hl7gw_runtime::certs::record("mllp-server", None, &cfg.cert);
    Ok(TlsAcceptor::from(config))
}
