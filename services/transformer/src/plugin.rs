//! Calls external transform plugins over gRPC (`hl7gw.v1.Transform`), one lazily connected channel per
//! endpoint, each call bounded by the step's timeout.

use crate::engine::{Plugin, PluginCaller};
use hl7gw_runtime::proto::v1::TransformRequest;
use hl7gw_runtime::proto::v1::transform_client::TransformClient;
use std::collections::HashMap;
use std::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

/// The plugin client pool.
#[derive(Debug, Default)]
pub struct GrpcPlugins {
    channels: Mutex<HashMap<String, Channel>>,
}

impl GrpcPlugins {
    fn channel(&self, endpoint: &str) -> Result<Channel, String> {
        let mut map = self
            .channels
            .lock()
            .map_err(|_| "plugin pool poisoned".to_owned())?;
        if let Some(c) = map.get(endpoint) {
            return Ok(c.clone());
        }
        let c = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| format!("bad endpoint: {e}"))?
            .tcp_nodelay(true)
            .connect_lazy();
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
