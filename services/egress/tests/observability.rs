//! Observability of the running pipeline, all real processes against the test broker:
//! - one trace covers ingress → transformer → egress: a small OTLP/gRPC trace receiver in this test takes the
//!   three services' span exports (`OTEL_EXPORTER_OTLP_ENDPOINT`), and the ADT message sent over MLLP has one
//!   trace id with the ingress's span an ancestor of the transformer's `transform` span, whose `publish` span is
//!   the parent of the egress's `deliver` span; no span carries patient data;
//! - the spans that write to or read from Kafka follow OpenTelemetry's messaging conventions (span kind
//!   producer or consumer, `messaging.*` attributes, never the Kafka key), with `hl7.*` attributes; the
//!   resource has `service.version`; the egress's JSON log lines inside a span carry its trace id;
//! - every metric the Grafana dashboard, the alerts and the autoscalers query is in a real `/metrics` scrape
//!   of the three services after that traffic (`scripts/chart/check-metrics.py --scrape`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline as common;

use common::{Pipeline, wait_delivered};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Mllp, ack_code, free_port, http_get, repo_root};

/// A span as received, with the `service.name` and `service.version` of its resource.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    version: String,
    span: Span,
}

/// The OTLP/gRPC trace receiver: keeps every exported span.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let resource = |key: &str| {
                rs.resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|a| a.key == key))
                    .map(|a| text(a.value.as_ref()))
                    .unwrap_or_default()
            };
            let (service, version) = (resource("service.name"), resource("service.version"));
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push(Received {
                        service: service.clone(),
                        version: version.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    fn spans(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }
}

/// An attribute value as text (arrays and maps flattened).
fn text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::ArrayValue(a)) => a
            .values
            .iter()
            .map(|v| text(Some(v)))
            .collect::<Vec<_>>()
            .join(","),
        Some(Value::KvlistValue(l)) => l
            .values
            .iter()
            .map(|kv| format!("{}={}", kv.key, text(kv.value.as_ref())))
            .collect::<Vec<_>>()
            .join(","),
        #[allow(unreachable_patterns)]
        Some(other) => format!("{other:?}"),
    }
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs
        .iter()
        .find(|a| a.key == key)
        .map(|a| text(a.value.as_ref()))
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts the receiver on an ephemeral port of 127.0.0.1, over TLS with the test PKI's server certificate
/// (the services export to `https://`: issue 11).
fn start_collector(rt: &tokio::runtime::Runtime, pki: &support::Pki) -> (Collector, SocketAddr) {
    let collector = Collector::default();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = TraceServiceServer::new(collector.clone());
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(pki.path("server.pem")).unwrap(),
        std::fs::read(pki.path("server.key")).unwrap(),
    );
    rt.spawn(async move {
        tonic::transport::Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .unwrap()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("OTLP receiver");
    });
    (collector, addr)
}

/// A message whose PID values appear nowhere else: none of them may show up in a span.
fn hl7(message_type: &str, control_id: &str, version: &str, patient: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|TESTAPP|TESTFAC|HL7GW|HL7GW|20261122120000||{message_type}|{control_id}|P|{version}\r\
         EVN|A01|20261122120000\r\
         PID|1||{patient}^^^TESTFAC^MR||ZYXWOBBLE^QUENTINA||19431207|F|||17 Quarry Lane^^Springfield^^99123||555-0142\r"
    )
    .into_bytes()
}

/// The test's routes: ADT to `lab` (the receiver); ORU to `flaky` (nothing listens: the egress retries, gives
/// up and dead-letters it); SIU through a plugin that does not answer (the transformer dead-letters it).
fn routes(plugin_port: u16) -> String {
    format!(
        "{}---
{}---
apiVersion: hl7gw.io/v1alpha1
kind: HL7Route
metadata: {{name: siu-through-a-dead-plugin}}
spec:
  match: {{messageTypes: ['SIU^S12']}}
  transforms:
    - plugin: {{endpoint: 'http://127.0.0.1:{plugin_port}', timeoutMs: 300, onFailure: deadLetter}}
  destinations: [lab]
",
        common::ROUTES,
        common::ORU_TO_FLAKY
    )
}

/// The trace of the message `control_id`: (trace id, the ingress ancestor's name), or why the spans received so
/// far do not make it: `deliver` (egress) is the child of `publish` (transformer), the child of `transform`,
/// below a span of the ingress.
fn find_chain(spans: &[Received], control_id: &str) -> Result<(String, String), String> {
    let delivers: Vec<&Received> = spans
        .iter()
        .filter(|r| {
            r.service == "hl7gw-egress"
                && r.span.name == "deliver"
                && attr(&r.span.attributes, "hl7.control_id").as_deref() == Some(control_id)
        })
        .collect();
    let [deliver] = delivers[..] else {
        return Err(format!(
            "{} egress `deliver` spans for {control_id}",
            delivers.len()
        ));
    };
    let trace = &deliver.span.trace_id;
    let in_trace: Vec<&Received> = spans.iter().filter(|r| &r.span.trace_id == trace).collect();
    let by_id = |id: &[u8]| in_trace.iter().copied().find(|r| r.span.span_id == id);
    if deliver.span.parent_span_id.is_empty() {
        return Err("the egress `deliver` span has no parent".into());
    }
    let Some(publish) = by_id(&deliver.span.parent_span_id) else {
        return Err(format!(
            "the parent {} of `deliver` (trace {}) was not received",
            hex(&deliver.span.parent_span_id),
            hex(trace)
        ));
    };
    if publish.service != "hl7gw-transformer" || publish.span.name != "publish" {
        return Err(format!(
            "the parent of `deliver` is {}'s {:?}, not the transformer's `publish`",
            publish.service, publish.span.name
        ));
    }
    let Some(transform) = by_id(&publish.span.parent_span_id) else {
        return Err(format!(
            "the parent {} of `publish` (trace {}) was not received",
            hex(&publish.span.parent_span_id),
            hex(trace)
        ));
    };
    if transform.service != "hl7gw-transformer" || transform.span.name != "transform" {
        return Err(format!(
            "the parent of `publish` is {}'s {:?}, not `transform`",
            transform.service, transform.span.name
        ));
    }
    // Up from `transform` to a span of the ingress.
    let mut at = transform;
    let mut path = Vec::new();
    loop {
        if at.span.parent_span_id.is_empty() {
            return Err(format!(
                "no ingress span above `transform` (path up: {path:?}, root {}'s {:?})",
                at.service, at.span.name
            ));
        }
        let Some(parent) = by_id(&at.span.parent_span_id) else {
            return Err(format!(
                "span {} above `transform` was not received (path up: {path:?})",
                hex(&at.span.parent_span_id)
            ));
        };
        path.push(format!("{}:{}", parent.service, parent.span.name));
        if parent.service == "hl7gw-ingress" {
            return Ok((hex(trace), parent.span.name.clone()));
        }
        at = parent;
    }
}

/// The span of `service` named `name` in trace `trace_id` (hex), with its `hl7.control_id`.
fn span_named<'a>(
    spans: &'a [Received],
    trace_id: &str,
    service: &str,
    name: &str,
) -> &'a Received {
    spans
        .iter()
        .find(|r| r.service == service && r.span.name == name && hex(&r.span.trace_id) == trace_id)
        .unwrap_or_else(|| panic!("no {service} `{name}` span in trace {trace_id}"))
}

/// OpenTelemetry messaging conventions on a span that writes to or reads from Kafka: its kind, `messaging.*`
/// as given (`None`: present, any value), `hl7.*` as given.
fn assert_messaging(r: &Received, kind: SpanKind, expect: &[(&str, Option<&str>)]) {
    let what = format!("{} `{}`", r.service, r.span.name);
    assert_eq!(r.span.kind, kind as i32, "{what}: span kind");
    assert_eq!(
        attr(&r.span.attributes, "messaging.system").as_deref(),
        Some("kafka"),
        "{what}"
    );
    for (key, value) in expect {
        let got = attr(&r.span.attributes, key);
        match value {
            Some(v) => assert_eq!(got.as_deref(), Some(*v), "{what}: {key}"),
            None => assert!(
                got.as_deref().is_some_and(|g| !g.is_empty()),
                "{what}: no {key} in {:?}",
                r.span.attributes
            ),
        }
    }
}

/// Every string a span carries that could leak data: attribute values, event names and event attributes.
fn span_texts(r: &Received) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let name = &r.span.name;
    for a in &r.span.attributes {
        out.push((
            format!("{}:{name} attribute {}", r.service, a.key),
            text(a.value.as_ref()),
        ));
    }
    for e in &r.span.events {
        out.push((format!("{}:{name} event", r.service), e.name.clone()));
        for a in &e.attributes {
            out.push((
                format!(
                    "{}:{name} event {:?} attribute {}",
                    r.service, e.name, a.key
                ),
                text(a.value.as_ref()),
            ));
        }
    }
    for l in &r.span.links {
        for a in &l.attributes {
            out.push((
                format!("{}:{name} link attribute {}", r.service, a.key),
                text(a.value.as_ref()),
            ));
        }
    }
    out
}

/// `helm template` of the chart with default values and with each `ci/*-values.yaml` (alerts, HPAs and KEDA
/// objects on), into `dir`; returns the files.
fn render_chart(dir: &Path) -> Vec<PathBuf> {
    let root = repo_root();
    // helm comes from the project's tool installer (instant once cached in .cache/tools).
    let helm = support::tool("helm");
    let chart = root.join("helm/hl7-gateway");
    let mut values: Vec<Option<PathBuf>> = vec![None];
    let mut ci: Vec<_> = std::fs::read_dir(chart.join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    ci.sort();
    values.extend(ci.into_iter().map(Some));
    let mut files = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let mut cmd = Command::new(&helm);
        cmd.args(["template", "hl7gw"])
            .arg(&chart)
            .args(["--namespace", "hl7gw"]);
        if let Some(v) = v {
            cmd.arg("-f").arg(v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "helm template {v:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f = dir.join(format!("rendered-{i}.yaml"));
        std::fs::write(&f, out.stdout).unwrap();
        files.push(f);
    }
    files
}

/// The three scrapes, written to `dir`.
fn scrape(p: &Pipeline, dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for part in p.parts() {
        let name = part.name;
        let (status, body) = http_get(part.admin.unwrap(), "/metrics");
        assert_eq!(status, 200, "{name} /metrics");
        assert!(
            body.contains(&format!("hl7gw_{name}_")),
            "{name} /metrics: {body}"
        );
        let f = dir.join(format!("{name}.prom"));
        std::fs::write(&f, &body).unwrap();
        files.push(f);
    }
    files
}

/// `scripts/chart/check-metrics.py` on the renders, the dashboard and the scrapes: Ok(its summary) or Err(its
/// complaint).
fn check_metrics(rendered: &[PathBuf], scrapes: &[PathBuf]) -> Result<String, String> {
    let root = repo_root();
    let mut cmd = Command::new("python3");
    cmd.arg(root.join("scripts/chart/check-metrics.py"));
    for r in rendered {
        cmd.arg("--rendered").arg(r);
    }
    cmd.arg("--dashboard")
        .arg(root.join("helm/hl7-gateway/files/dashboards/hl7gw.json"))
        .arg("--scrape")
        .args(scrapes);
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text.trim().to_owned())
    } else {
        Err(text)
    }
}

#[test]
fn one_trace_across_the_services_and_dashboard_metrics_in_a_real_scrape() {
    let started = Instant::now();
    let rt = support::runtime();
    let pki = support::pki();
    let (collector, otlp) = start_collector(&rt, &pki);

    let mut p = Pipeline::new();
    p.service_env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("https://{otlp}")),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.file("ca.pem")),
        // Export every 200 ms instead of every 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "200".into()),
        // Every log line of our crates, debug included, is searched for patient data below.
        (
            "RUST_LOG",
            "info,hl7gw_ingress=debug,hl7gw_transformer=debug,hl7gw_egress=debug,hl7gw_runtime=debug".into(),
        ),
    ];
    let dir = p.dir.path().to_owned();
    p.log_dir = Some(dir.clone());
    // A named sender (the test messages' MSH-3), so that the per-sender families the dashboard and
    // HL7GWSenderSilent query are in the ingress's scrape.
    p.ingress.env.push((
        "HL7GW_SENDERS",
        "[{name=testapp,sending_application=TESTAPP}]".into(),
    ));
    // JSON log lines for the egress: those inside a span carry its trace id and span id.
    p.egress
        .env
        .push(("HL7GW_SERVICE__LOG_JSON", "true".into()));
    std::fs::write(dir.join("routes.yaml"), routes(free_port())).unwrap();
    std::fs::write(
        dir.join("egress.yaml"),
        format!(
            "destinations:
  lab:
    address: 127.0.0.1:{}
    response_timeout: 5s
    retry: {{initial_backoff: 100ms, max_backoff: 1s}}
  flaky:
    address: 127.0.0.1:{}
    tls: {{ca: {}, cert: {}, key: {}}}
    connect_timeout: 1s
    response_timeout: 1s
    retry: {{max_attempts: 2, initial_backoff: 50ms, max_backoff: 100ms}}
",
            p.receiver_port,
            free_port(),
            // A client certificate (nothing listens there, so it is never shown): its notAfter is in the
            // egress's scrape (hl7gw_tls_certificate_not_after_timestamp_seconds, HL7GWCertificateExpiry).
            pki.file("ca.pem"),
            pki.file("client.pem"),
            pki.file("client.key"),
        ),
    )
    .unwrap();
    p.start_all(None);
    // Send once every service is ready (Kafka answers, routes loaded).
    assert!(p.parts().iter().all(|part| part.admin.is_some()));
    p.wait_ready(Duration::from_secs(60));

    // The traced message: ACKed, then delivered.
    let id = uuid::Uuid::now_v7().simple().to_string();
    let control_id = format!("OBS-{}", &id[id.len() - 12..]);
    let patient = format!("P{}", &id[id.len() - 9..]);
    let mllp: SocketAddr = format!("127.0.0.1:{}", p.mllp).parse().unwrap();
    let ack = rt.block_on(async {
        let mut c = Mllp::connect(mllp).await;
        c.call(&hl7("ADT^A01^ADT_A01", &control_id, "2.5.1", &patient))
            .await
    });
    let ack = ack.expect("an ACK");
    assert_eq!(ack_code(&ack), "AA", "{:?}", String::from_utf8_lossy(&ack));
    wait_delivered(
        &p.received_dir(),
        std::slice::from_ref(&control_id),
        Duration::from_secs(120),
    );
    let delivered = started.elapsed();

    // The rest of the traffic, so that every family the dashboard and the alerts query has a sample (a
    // labelled family without one is not in a scrape): an ORU the egress cannot deliver (retries, DLQ
    // `gave_up`), an SIU whose plugin does not answer (transformer DLQ), an unsupported version (ingress
    // reject and DLQ), and a frame cut off by the sender closing (framing error `truncated`).
    rt.block_on(async {
        let mut c = Mllp::connect(mllp).await;
        for (t, cid, version, code) in [
            ("ORU^R01^ORU_R01", "OBS-ORU", "2.5.1", "AA"),
            ("SIU^S12^SIU_S12", "OBS-SIU", "2.5.1", "AA"),
            ("ADT^A01^ADT_A01", "OBS-BADVERSION", "9.9", "AR"),
        ] {
            let cid = format!("{cid}-{}", &id[id.len() - 6..]);
            let ack = c
                .call(&hl7(t, &cid, version, &patient))
                .await
                .expect("an ACK");
            assert_eq!(ack_code(&ack), code, "{t} {version}");
        }
        let mut s = tokio::net::TcpStream::connect(mllp).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut s, b"\x0bMSH|^~\\&|TESTAPP|TESTFAC")
            .await
            .unwrap();
    });

    // The trace: spans are exported every 200 ms while running; SIGTERM would flush whatever is left.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut chain = find_chain(&collector.spans(), &control_id);
    while chain.is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        chain = find_chain(&collector.spans(), &control_id);
    }
    let trace_found = started.elapsed();

    // Metrics: scrapes of the three services until every queried name is in them (the DLQ writes follow the
    // retries and the plugin timeout).
    let rendered = render_chart(&dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    let summary = loop {
        let scrapes = scrape(&p, &dir);
        match check_metrics(&rendered, &scrapes) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => {
                panic!("check-metrics.py against the scrapes of the running services:\n{e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    };

    if chain.is_err() {
        for part in p.parts_mut() {
            let child = &mut part.process.as_mut().unwrap().0;
            support::sigterm_and_wait(child, part.name, Duration::from_secs(25));
        }
        std::thread::sleep(Duration::from_secs(2));
        chain = find_chain(&collector.spans(), &control_id);
    }
    let spans = collector.spans();
    let (trace_id, ingress_span) = chain.unwrap_or_else(|e| {
        let listing: Vec<String> = spans
            .iter()
            .map(|r| {
                format!(
                    "{} {} trace={} id={} parent={}",
                    r.service,
                    r.span.name,
                    hex(&r.span.trace_id),
                    hex(&r.span.span_id),
                    hex(&r.span.parent_span_id)
                )
            })
            .collect();
        panic!("no ingress → transform → deliver trace: {e}\nspans:\n{listing:#?}")
    });
    for service in ["hl7gw-ingress", "hl7gw-transformer", "hl7gw-egress"] {
        assert!(
            spans
                .iter()
                .any(|r| r.service == service && hex(&r.span.trace_id) == trace_id),
            "trace {trace_id} has a span of {service}"
        );
    }

    // No patient data in any span of any service (all four messages carry the same PID).
    let patient_data = [
        patient.as_str(),
        "ZYXWOBBLE",
        "QUENTINA",
        "19431207",
        "Quarry",
        "Springfield",
        "99123",
        "555-0142",
    ];
    let mut leaks = Vec::new();
    for r in &spans {
        for (where_, value) in span_texts(r) {
            let upper = value.to_uppercase();
            for d in patient_data {
                if upper.contains(&d.to_uppercase()) {
                    leaks.push(format!("{where_} = {value:?} holds {d:?}"));
                }
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "patient data in spans:\n{}",
        leaks.join("\n")
    );
    // Nor in any log line of any service (issue 11: PHI surfaces). The scan does see what the logs carry: the
    // control ids of the rejected message and of the undeliverable ORU are logged.
    let mut logs = String::new();
    for name in ["hl7gw-ingress", "hl7gw-transformer", "hl7gw-egress"] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        let upper = text.to_uppercase();
        for d in patient_data {
            if let Some(at) = upper.find(&d.to_uppercase()) {
                let line = text[..at].rsplit('\n').next().unwrap_or_default();
                leaks.push(format!("{name} log holds {d:?}: {line}..."));
            }
        }
        logs.push_str(&text);
    }
    assert!(
        leaks.is_empty(),
        "patient data in logs:\n{}",
        leaks.join("\n")
    );
    assert!(
        logs.contains("OBS-BADVERSION"),
        "the logs were not captured:\n{logs}"
    );
    // Nor in the delivery ledger (hl7.events): ids, types, times and codes only.
    let events = hl7gw_testkit::pipeline::read_events(&p.topic("events"), Duration::from_secs(30));
    let ledger = format!("{events:?}");
    for d in patient_data {
        assert!(
            !ledger.to_uppercase().contains(&d.to_uppercase()),
            "patient data {d:?} in the ledger: {ledger}"
        );
    }
    assert!(
        ledger.contains(&control_id),
        "the ledger scan saw no event of {control_id}: {ledger}"
    );
    // The scan does see what spans carry: the control id (allowed) is in the attributes.
    assert!(
        spans
            .iter()
            .flat_map(span_texts)
            .any(|(_, v)| v == control_id),
        "no span attribute holds the control id {control_id}"
    );
    // Span kinds and the messaging conventions, on the traced message's producer and consumer spans.
    let (inbound, lab) = (p.topic("inbound"), p.topic("out.lab"));
    let (transformer_group, egress_group) = (p.topic("transformer"), p.topic("egress.lab"));
    let cid = Some(control_id.as_str());
    let ingest = span_named(&spans, &trace_id, "hl7gw-ingress", "hl7.ingest");
    assert_messaging(
        ingest,
        SpanKind::Producer,
        &common::ingest_span_attributes(&inbound, &control_id),
    );
    let transform = span_named(&spans, &trace_id, "hl7gw-transformer", "transform");
    assert_messaging(
        transform,
        SpanKind::Consumer,
        &[
            ("messaging.operation.type", Some("process")),
            ("messaging.destination.name", Some(&inbound)),
            (
                "messaging.destination.partition.id",
                attr(
                    &ingest.span.attributes,
                    "messaging.destination.partition.id",
                )
                .as_deref(),
            ),
            (
                "messaging.kafka.offset",
                attr(&ingest.span.attributes, "messaging.kafka.offset").as_deref(),
            ),
            ("messaging.consumer.group.name", Some(&transformer_group)),
            ("hl7.control_id", cid),
            ("hl7.message_type", Some("ADT")),
            ("hl7.trigger_event", Some("A01")),
            ("hl7.routes", None),
        ],
    );
    let publish = span_named(&spans, &trace_id, "hl7gw-transformer", "publish");
    assert_messaging(
        publish,
        SpanKind::Producer,
        &[
            ("messaging.operation.type", Some("send")),
            ("messaging.destination.name", Some(&lab)),
            ("hl7.control_id", cid),
            ("hl7.destination", Some("lab")),
            ("hl7.route", None),
        ],
    );
    let deliver = span_named(&spans, &trace_id, "hl7gw-egress", "deliver");
    let route = attr(&publish.span.attributes, "hl7.route");
    assert_messaging(
        deliver,
        SpanKind::Consumer,
        &common::deliver_span_attributes(&lab, &egress_group, &control_id, "lab", route.as_deref()),
    );
    // Never the Kafka key (sending facility + patient id by default); every span's resource has the version.
    for r in &spans {
        assert!(
            attr(&r.span.attributes, "messaging.kafka.message.key").is_none(),
            "{} `{}` carries the Kafka key",
            r.service,
            r.span.name
        );
        assert_eq!(
            r.version,
            env!("CARGO_PKG_VERSION"),
            "{} service.version",
            r.service
        );
    }
    // The undeliverable ORU: its dead letter is a producer span below its `deliver`, and the egress's JSON log
    // line "giving up" carries that `deliver` span's trace id and span id.
    let oru = format!("OBS-ORU-{}", &id[id.len() - 6..]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (oru_deliver, dead_letter) = loop {
        let spans = collector.spans();
        let of = |name: &str| {
            spans.iter().find(|r| {
                r.service == "hl7gw-egress"
                    && r.span.name == name
                    && attr(&r.span.attributes, "hl7.control_id").as_deref() == Some(oru.as_str())
            })
        };
        if let (Some(d), Some(l)) = (of("deliver"), of("dead_letter")) {
            break (d.clone(), l.clone());
        }
        assert!(
            Instant::now() < deadline,
            "no egress `deliver` and `dead_letter` spans for {oru}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(dead_letter.span.parent_span_id, oru_deliver.span.span_id);
    assert_messaging(
        &dead_letter,
        SpanKind::Producer,
        &[
            ("messaging.operation.type", Some("send")),
            ("messaging.destination.name", Some(&p.topic("dlq"))),
            ("messaging.destination.partition.id", None),
            ("messaging.kafka.offset", None),
            ("hl7.destination", Some("flaky")),
            ("hl7.reason", Some("gave_up")),
        ],
    );
    let egress_log = std::fs::read_to_string(dir.join("hl7gw-egress.log")).unwrap();
    let gave_up: Vec<serde_json::Value> = egress_log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"] == "giving up: DLQ"
                && v["span"]["hl7.control_id"] == oru.as_str()
        })
        .collect();
    let [line] = &gave_up[..] else {
        panic!("one JSON \"giving up\" line for {oru} in the egress log:\n{egress_log}")
    };
    assert_eq!(line["trace_id"], hex(&oru_deliver.span.trace_id), "{line}");
    assert_eq!(line["span_id"], hex(&oru_deliver.span.span_id), "{line}");

    eprintln!(
        "observability: delivered after {:.1} s, trace complete after {:.1} s: {trace_id}: ingress {ingress_span:?} → \
         transform → publish → deliver; {} spans received, none with patient data; {summary} (after {:.1} s)",
        delivered.as_secs_f64(),
        trace_found.as_secs_f64(),
        spans.len(),
        started.elapsed().as_secs_f64()
    );
}
