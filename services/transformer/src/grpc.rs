//! gRPC `hl7gw.v1.Transform`: dry-runs the live routes on a message (what matched, what each destination
//! would get); nothing is published. Plus `grpc.health.v1.Health`.

use crate::config::Config;
use crate::engine::PluginCaller;
use crate::source::LiveRoutes;
use hl7gw_runtime::envelope;
use hl7gw_runtime::proto::v1::transform_server::{Transform, TransformServer};
use hl7gw_runtime::proto::v1::{
    Envelope, RouteMiss, TransformOutput, TransformRequest, TransformResponse,
};
use hl7v2::{Charset, Message};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The dry-run service.
#[derive(Debug)]
pub struct DryRun<P> {
    /// The dry run runs the salted `hash` step: an admin method (nobody unless `grpc.allow.Transform` says).
    pub auth: hl7gw_runtime::grpc::Auth,
    pub cfg: Arc<Config>,
    pub live: Arc<LiveRoutes>,
    pub plugins: Arc<P>,
}

#[tonic::async_trait]
impl<P: PluginCaller + 'static> Transform for DryRun<P> {
    async fn transform(
        &self,
        req: Request<TransformRequest>,
    ) -> Result<Response<TransformResponse>, Status> {
        let what = format!(
            "route={:?} bytes={}",
            hl7gw_runtime::grpc::clip(&req.get_ref().route),
            req.get_ref().message.len()
        );
        let caller = self.auth.admin(&req, "Transform", &what).await?;
        let peer = hl7gw_runtime::grpc::peer(&req);
        let result = self.dry_run(req.into_inner()).await;
        hl7gw_runtime::grpc::audit_result(&caller, peer, "Transform", &what, &result, |r| {
            format!("{} outputs, {} misses", r.outputs.len(), r.misses.len())
        });
        result
    }
}

impl<P: PluginCaller + 'static> DryRun<P> {
    /// The Transform gRPC server (the dry run) over the live routes and the plugins, gzip and zstd both
    /// ways. The dry run runs the salted `hash` step: nobody may call it unless `grpc.allow.Transform` says.
    pub fn server(
        cfg: Arc<Config>,
        live: Arc<LiveRoutes>,
        plugins: Arc<P>,
    ) -> TransformServer<Self> {
        let service = Self {
            auth: hl7gw_runtime::grpc::Auth::new(&cfg.grpc, &[]),
            cfg,
            live,
            plugins,
        };
        hl7gw_runtime::compressed!(TransformServer::new(service))
    }

    async fn dry_run(&self, req: TransformRequest) -> Result<Response<TransformResponse>, Status> {
        let msg = Message::parse(&req.message)
            .map_err(|e| Status::invalid_argument(format!("not an HL7 v2 message: {e}")))?;
        let h = msg.header();
        let charset = Charset::from_msh18(h.charset).unwrap_or(Charset::Utf8);
        let env = req.envelope.clone().unwrap_or_else(|| Envelope {
            id: envelope::new_id(),
            raw: req.message.clone(),
            charset: charset.name().to_owned(),
            header: Some(envelope::header(h, charset)),
            ..Envelope::default()
        });
        let routes = self.live.get();
        let mut resp = TransformResponse::default();
        for route in &routes.routes {
            if !req.route.is_empty() && route.name != req.route {
                continue;
            }
            if let Err(reason) = route.matches(&env, &msg, charset) {
                resp.misses.push(RouteMiss {
                    route: route.name.clone(),
                    reason: reason.to_string(),
                });
                continue;
            }
            let result = route
                .apply(&env, &req.message, charset, self.plugins.as_ref())
                .await;
            for dest in &route.destinations {
                let mut o = TransformOutput {
                    route: route.name.clone(),
                    destination: dest.clone(),
                    topic: self.cfg.out_topic(dest),
                    ..TransformOutput::default()
                };
                match &result {
                    Ok((bytes, ct)) => {
                        o.message = bytes.clone().into();
                        o.content_type = (*ct).to_owned();
                    }
                    Err(e) => o.error = e.to_string(),
                }
                resp.outputs.push(o);
            }
        }
        Ok(Response::new(resp))
    }
}
