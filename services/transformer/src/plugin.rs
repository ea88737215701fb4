//! Calls external transform plugins over gRPC (`hl7gw.v1.Transform`), one lazily connected channel per
//! endpoint, each call bounded by the step's timeout. `https://` endpoints use TLS (`plugin_tls`: the CA, and a
//! client certificate for mutual TLS).

use crate::config::PluginTls;
use crate::engine::{Plugin, PluginCaller};
use hl7gw_runtime::proto::v1::TransformRequest;
use hl7gw_runtime::proto::v1::transform_client::TransformClient;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A `plugin_tls` file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("plugin_tls.{what} {path}: {source}")]
pub struct PluginTlsError {
    pub what: &'static str,
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

/// The plugin client pool.
#[derive(Debug, Default)]
pub struct GrpcPlugins {
    channels: Mutex<HashMap<String, Channel>>,
    /// For `https://` endpoints; None: no CA configured, so `https://` calls fail with a reason.
    tls: Option<ClientTlsConfig>,
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, PluginTlsError> {
    std::fs::read(path).map_err(|source| PluginTlsError {
        what,
        path: path.display().to_string(),
        source,
    })
}

impl GrpcPlugins {
    /// A pool whose `https://` channels use `tls` (files read now, so a bad path stops the start).
    pub fn new(tls: &PluginTls) -> Result<Self, PluginTlsError> {
        let Some(ca) = &tls.ca else {
            return Ok(Self::default());
        };
        let mut config =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem("ca", ca)?));
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            config = config.identity(Identity::from_pem(
                read_pem("cert", cert)?,
                read_pem("key", key)?,
            ));
            hl7gw_runtime::certs::record("grpc-client", None, cert);
        }
        Ok(Self {
            channels: Mutex::default(),
            tls: Some(config),
        })
    }

    fn channel(&self, endpoint: &str) -> Result<Channel, String> {
        let mut map = self
            .channels
            .lock()
            .map_err(|_| "plugin pool poisoned".to_owned())?;
        if let Some(c) = map.get(endpoint) {
            return Ok(c.clone());
        }
        let mut ep = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| format!("bad endpoint: {e}"))?
            .tcp_nodelay(true);
        if endpoint.starts_with("https://") {
            let Some(tls) = &self.tls else {
                tracing::warn!(
                    endpoint,
                    "https plugin endpoint but no plugin_tls.ca configured: the call fails"
                );
                return Err("https endpoint but no plugin_tls.ca configured".into());
            };
            ep = ep
                .tls_config(tls.clone())
                .map_err(|e| format!("plugin TLS: {e}"))?;
        }
        let c = ep.connect_lazy();
        map.insert(endpoint.to_owned(), c.clone());
        Ok(c)
    }
}

impl PluginCaller for GrpcPlugins {
    async fn call(&self, p: &Plugin, req: TransformRequest) -> Result<(Vec<u8>, String), String> {
        let mut client = TransformClient::new(self.channel(&p.endpoint)?);
        let mut request = tonic::Request::new(req);
        request.set_timeout(p.timeout);
        match tokio::time::timeout(p.timeout, client.transform(request)).await {
            Err(_) => Err("plugin_timeout".into()),
            Ok(Err(status))
                if matches!(
                    status.code(),
                    tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
                ) =>
            {
                Err("plugin_timeout".into())
            }
            Ok(Err(status)) => Err(format!("plugin_error: {}", status.code())),
            Ok(Ok(resp)) => {
                let r = resp.into_inner();
                Ok((r.message.to_vec(), r.content_type))
            }
        }
    }
}
