//! The connection every admin command makes to a service's gRPC listener: TLS or mutual TLS, a bearer token
//! (a static token or a Kubernetes ServiceAccount token) sent over https, or over plaintext to a loopback
//! address only (what `kubectl port-forward` gives).

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How to reach a service's gRPC listener.
#[derive(Debug, clap::Args)]
pub struct Conn {
    /// gRPC address: `https://host:50051` (TLS) or `http://host:50051` (plaintext). Over plaintext a token
    /// is sent only to a loopback address (127.0.0.1, ::1, localhost): what `kubectl port-forward` gives, e.g.
    /// `kubectl port-forward svc/hl7gw-egress 50051` then `--to http://127.0.0.1:50051 --token-file ops.token`
    #[arg(long, value_name = "URL", verbatim_doc_comment)]
    to: String,
    /// PEM CA the server's certificate must chain to (https; default: the public CAs built in)
    #[arg(long, value_name = "PEM")]
    ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS
    #[arg(long, value_name = "PEM", requires = "key")]
    cert: Option<PathBuf>,
    /// PEM private key of --cert
    #[arg(long, value_name = "PEM", requires = "cert")]
    key: Option<PathBuf>,
    /// Name the server certificate is checked against (default: the host of --to)
    #[arg(long, value_name = "NAME")]
    server_name: Option<String>,
    /// File holding the bearer token (a static token, or `kubectl create token <sa> --audience hl7gw`); also
    /// HL7GW_TOKEN_FILE. The token itself is never taken from the command line (shell history, ps). Sent over
    /// https, or over plaintext to a loopback address only (a `kubectl port-forward`); refused for any other
    /// plaintext address.
    #[arg(long, value_name = "FILE", env = "HL7GW_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Seconds to wait for the connection and for the answer
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u64,
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Authed = InterceptedService<Channel, Bearer>;

impl Conn {
    pub(crate) async fn channel(&self) -> anyhow::Result<(Authed, Duration)> {
        let timeout = Duration::from_secs(self.timeout);
        let mut ep = Endpoint::from_shared(self.to.clone())
            .with_context(|| format!("--to {}", self.to))?
            .connect_timeout(timeout)
            .timeout(timeout);
        let https = self.to.to_ascii_lowercase().starts_with("https://");
        if !https && self.token_file.is_some() && !is_loopback(ep.uri()) {
            bail!(
                "refusing to send a token over plaintext to another machine: use an https:// address, or \
                 `kubectl port-forward` and http://127.0.0.1:<port>"
            );
        }
        if https {
            let mut tls = ClientTlsConfig::new();
            tls = match &self.ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(crate::files::read(ca)?)),
                None => tls.with_webpki_roots(),
            };
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                tls = tls.identity(Identity::from_pem(
                    crate::files::read(cert)?,
                    crate::files::read(key)?,
                ));
            }
            if let Some(name) = &self.server_name {
                tls = tls.domain_name(name.clone());
            }
            ep = ep.tls_config(tls).context("TLS settings")?;
        } else if self.ca.is_some() || self.cert.is_some() {
            bail!("--ca/--cert need an https:// address");
        }
        let token = match &self.token_file {
            Some(f) => {
                let t = String::from_utf8(crate::files::read(f)?)
                    .context("the token file is not text")?;
                let v = format!("Bearer {}", t.trim()).parse().map_err(|_| {
                    anyhow::anyhow!("the token file holds characters a header cannot")
                })?;
                Some(v)
            }
            None => None,
        };
        let ch = ep
            .connect()
            .await
            .with_context(|| format!("connecting to {}", self.to))?;
        Ok((InterceptedService::new(ch, Bearer(token)), timeout))
    }
}

/// Whether `uri` names this machine ([`hl7gw_tls::is_loopback_host`]), where a token sent over plaintext does
/// not cross the network (a `kubectl port-forward` listens there).
fn is_loopback(uri: &tonic::codegen::http::Uri) -> bool {
    uri.host().is_some_and(hl7gw_tls::is_loopback_host)
}

pub(crate) fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

/// The one-threaded runtime an admin command runs its calls on.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36, item 7: a token goes over plaintext to a loopback address (what `kubectl port-forward`
    /// gives), never to any other plaintext address.
    #[test]
    fn a_token_goes_over_plaintext_to_loopback_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "ops-token-0123456789abcdef\n").expect("write");
        let rt = runtime().expect("runtime");
        let refused = |to: &str| {
            let conn = Conn {
                to: to.to_owned(),
                ca: None,
                cert: None,
                key: None,
                server_name: None,
                token_file: Some(token.clone()),
                timeout: 2,
            };
            // Nothing listens on port 1: a loopback address gets as far as connecting, and fails there.
            match rt.block_on(conn.channel()) {
                Ok(_) => false,
                Err(e) => format!("{e:#}").contains("refusing to send a token"),
            }
        };
        for to in [
            "http://127.0.0.1:1",
            "http://127.3.4.5:1",
            "http://localhost:1",
            "http://LOCALHOST:1",
            "http://[::1]:1",
        ] {
            assert!(
                !refused(to),
                "{to}: a token to a loopback address was refused"
            );
        }
        for to in [
            "http://10.0.0.1:1",
            "http://192.0.2.1:1",
            "http://hl7gw-egress:1",
            "http://localhost.example.org:1",
            "http://127.0.0.1.nip.io:1",
            "http://[::ffff:10.0.0.1]:1",
            "http://0.0.0.0:1",
        ] {
            assert!(
                refused(to),
                "{to}: a token over plaintext to another machine"
            );
        }
    }
}
