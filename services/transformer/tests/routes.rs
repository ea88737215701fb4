//! Routes outside Kafka: hot reload from a file (a bad route refused while the others keep running) and a
//! plugin step against a real gRPC plugin server.
#![allow(clippy::unwrap_used)]

use hl7gw_runtime::proto::v1::transform_server::{Transform, TransformServer};
use hl7gw_runtime::proto::v1::{Envelope, TransformRequest, TransformResponse};
use hl7gw_testkit as support;
use hl7gw_transformer::engine::Route;
use hl7gw_transformer::metrics::TransformerMetrics;
use hl7gw_transformer::plugin::GrpcPlugins;
use hl7gw_transformer::route::HL7RouteSpec;
use hl7gw_transformer::source::{self, LiveRoutes};
use hl7v2::Charset;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

fn route_doc(name: &str, dest: &str) -> String {
    format!(
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: {name}}}\nspec:\n  destinations: [{dest}]\n"
    )
}

async fn wait_for(live: &LiveRoutes, what: &str, ok: impl Fn(&LiveRoutes) -> bool) {
    for _ in 0..100 {
        if ok(live) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("routes never reached: {what}: {:?}", names(live));
}

fn names(live: &LiveRoutes) -> Vec<(String, Vec<String>)> {
    live.get()
        .routes
        .iter()
        .map(|r| (r.name.clone(), r.destinations.clone()))
        .collect()
}

#[tokio::test]
async fn a_routes_file_reloads_on_change_and_a_bad_route_keeps_the_old_one() {
    let (_dir, path) = support::temp_file(
        "routes.yaml",
        format!(
            "{}---\n{}",
            route_doc("a", "lab"),
            route_doc("b", "archive")
        ),
    );
    let (_reg, metrics) = TransformerMetrics::registered();
    let live = Arc::new(LiveRoutes::default());
    source::load_file(&path, &live, &metrics).unwrap();
    assert_eq!(names(&live).len(), 2);
    let stop = CancellationToken::new();
    tokio::spawn(source::watch_file(
        path.clone(),
        std::fs::read(&path).ok(),
        Duration::from_millis(50),
        live.clone(),
        metrics.clone(),
        stop.clone(),
    ));

    // A change: route b now goes elsewhere, route c appears.
    std::fs::write(
        &path,
        format!(
            "{}---\n{}---\n{}",
            route_doc("a", "lab"),
            route_doc("b", "billing"),
            route_doc("c", "x")
        ),
    )
    .unwrap();
    wait_for(&live, "b to billing and c", |l| {
        names(l).contains(&("b".into(), vec!["billing".into()])) && names(l).len() == 3
    })
    .await;

    // Route a broken: refused, its previous version keeps routing; b and c unaffected.
    std::fs::write(
        &path,
        format!(
            "{}---\n{}---\n{}",
            route_doc("a", "'bad name'"),
            route_doc("b", "billing"),
            route_doc("c", "x")
        ),
    )
    .unwrap();
    wait_for(&live, "a refused", |_| metrics.routes_refused.get() == 1).await;
    assert!(
        names(&live).contains(&("a".into(), vec!["lab".into()])),
        "{:?}",
        names(&live)
    );

    // Not YAML at all: nothing changes.
    std::fs::write(&path, "{{{{ not yaml").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(names(&live).len(), 3);

    // A route removed from the file stops routing.
    std::fs::write(&path, route_doc("a", "lab")).unwrap();
    wait_for(&live, "only a", |l| {
        names(l) == vec![("a".to_owned(), vec!["lab".to_owned()])]
    })
    .await;
    stop.cancel();
}

/// A plugin that appends a ZPL segment carrying its `tag` parameter, or sleeps when asked to.
struct TagPlugin;

#[tonic::async_trait]
impl Transform for TagPlugin {
    async fn transform(
        &self,
        req: Request<TransformRequest>,
    ) -> Result<Response<TransformResponse>, Status> {
        let r = req.into_inner();
        if r.params.contains_key("sleep") {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        if r.params.contains_key("fail") {
            return Err(Status::internal("plugin broke"));
        }
        let mut m = r.message.to_vec();
        let tag = r.params.get("tag").cloned().unwrap_or_default();
        m.extend_from_slice(format!("ZPL|{tag}|{}\r", r.route).as_bytes());
        Ok(Response::new(TransformResponse {
            message: m.into(),
            ..TransformResponse::default()
        }))
    }
}

#[tokio::test]
async fn plugin_steps_call_a_grpc_service_with_timeout_and_failure_policy() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TransformServer::new(TagPlugin))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let raw = b"MSH|^~\\&|A|F|B|G|20260101||ADT^A01|C9|P|2.5\rPID|1||P1\r";
    let env = Envelope {
        raw: raw.to_vec().into(),
        ..Envelope::default()
    };
    let plugins = GrpcPlugins::default();
    let spec = |params: &str, policy: &str| -> HL7RouteSpec {
        serde_saphyr::from_str(&format!(
            "{{transforms: [{{plugin: {{endpoint: 'http://{addr}', timeoutMs: 500, onFailure: {policy}, params: {params}}}}}], destinations: [d]}}"
        ))
        .unwrap()
    };

    let route = Route::compile("tagging", &spec("{tag: hello}", "deadLetter")).unwrap();
    let (out, _) = route
        .apply(&env, raw, Charset::Utf8, &plugins)
        .await
        .unwrap();
    assert!(
        out.ends_with(b"ZPL|hello|tagging\r"),
        "{}",
        String::from_utf8_lossy(&out)
    );

    let slow = Route::compile("slow", &spec("{sleep: y}", "deadLetter")).unwrap();
    let e = slow
        .apply(&env, raw, Charset::Utf8, &plugins)
        .await
        .unwrap_err();
    assert_eq!(e.kind, "plugin_failed");
    assert!(e.detail.contains("timeout"), "{e}");

    let broken = Route::compile("broken", &spec("{fail: y}", "skip")).unwrap();
    let (out, _) = broken
        .apply(&env, raw, Charset::Utf8, &plugins)
        .await
        .unwrap();
    assert_eq!(out, raw, "skip leaves the message as it was");
}
