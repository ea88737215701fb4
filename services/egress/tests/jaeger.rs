//! Issue 37, item 4: the pipeline's traces as a real Jaeger shows them. A Jaeger v2 started by the project's
//! own `scripts/jaeger.sh up` (on free ports, its own `JAEGER_DIR`) takes the three services' OTLP/gRPC export;
//! messages with recognisable fake patient data go through ingress → transformer → egress; then Jaeger's HTTP
//! query API (`/api/traces?service=…&tags=…`, `/api/traces/{id}`, `/api/operations`) must show, for each message:
//! - one trace, found by its `hl7.control_id` from the ingress and from the egress alike, a different one per
//!   message;
//! - the ingress's `hl7.ingest` (the root), the transformer's `transform` (CHILD_OF `hl7.ingest`) and `publish`
//!   (CHILD_OF `transform`), the egress's `deliver` (CHILD_OF that `publish`): the links across Kafka intact,
//!   every reference to a span of the trace and no span with a Jaeger warning (how Jaeger marks an orphan);
//! - span kinds as docs/observability.md says (Jaeger's `span.kind` tag, and the `spanKind` of each operation in
//!   `/api/operations`), the `messaging.*` and `hl7.*` tags as documented; a message the egress cannot deliver
//!   has its `dead_letter` (producer, CHILD_OF its `deliver`);
//! - no patient data anywhere in Jaeger's answers (tags, logs, process tags, warnings).
//!
//! The Jaeger binary is built from the Go module proxy by `scripts/jaeger.sh build` (8-15 min once, then cached in
//! `.cache/tools/jaeger-*/`); `make test` builds it before `cargo test`. Run alone, this test builds it the first
//! time through `scripts/jaeger.sh up`, as the Kubernetes tests build their control plane through
//! `scripts/cluster.sh up`. It prints the traces as Jaeger showed them (the view docs/observability.md quotes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline as common;

use common::{Pipeline, wait_delivered};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{Mllp, ack_code, free_port, repo_root};

/// A Jaeger started by `scripts/jaeger.sh up` for this test, stopped (`down`) when dropped.
struct Jaeger {
    /// Its `JAEGER_DIR`: config, log, PID file.
    dir: PathBuf,
    env: Vec<(&'static str, String)>,
    otlp_grpc: u16,
    query: u16,
}

impl Jaeger {
    fn up() -> Self {
        // A fixed folder under cargo's target/tmp: a Jaeger left by a killed run is stopped by the next `up`.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("jaeger");
        let (otlp_grpc, otlp_http, query, query_grpc) =
            (free_port(), free_port(), free_port(), free_port());
        let env = vec![
            ("JAEGER_DIR", dir.display().to_string()),
            ("JAEGER_OTLP_GRPC_PORT", otlp_grpc.to_string()),
            ("JAEGER_OTLP_HTTP_PORT", otlp_http.to_string()),
            ("JAEGER_QUERY_PORT", query.to_string()),
            ("JAEGER_QUERY_GRPC_PORT", query_grpc.to_string()),
            ("JAEGER_MAX_TRACES", "10000".into()),
        ];
        let jaeger = Self {
            dir,
            env,
            otlp_grpc,
            query,
        };
        let status = jaeger.script("up");
        assert!(
            status.success(),
            "scripts/jaeger.sh up failed (the binary comes from `scripts/jaeger.sh build`, 8-15 min once; log: {})",
            jaeger.dir.join("jaeger.log").display()
        );
        jaeger
    }

    fn script(&self, command: &str) -> std::process::ExitStatus {
        Command::new("bash")
            .arg(repo_root().join("scripts/jaeger.sh"))
            .arg(command)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .status()
            .unwrap()
    }

    /// GET `path` (with its query) on the query API: the JSON answer. HTTP/1.0, so that Go's server answers
    /// without chunked encoding and closes.
    fn get(&self, path: &str) -> Value {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.query));
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "GET {path}: {head}\n{body}"
        );
        serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// The traces `/api/traces` finds for `service` with the tag `key` = `value` (last hour).
    fn search(&self, service: &str, key: &str, value: &str) -> Vec<Value> {
        let tags = serde_json::json!({ key: value }).to_string();
        let v = self.get(&format!(
            "/api/traces?service={}&tags={}&lookback=1h&limit=100",
            encode(service),
            encode(&tags)
        ));
        v["data"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.script("down");
    }
}

/// Percent-encoding of a query parameter's value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A message whose PID, NK1 and PV1 values appear nowhere else: none of them may show up in Jaeger.
fn hl7(message_type: &str, control_id: &str, patient: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|TESTAPP|TESTFAC|HL7GW|HL7GW|20261122120000||{message_type}|{control_id}|P|2.5.1\r\
         EVN|A01|20261122120000\r\
         PID|1||{patient}^^^TESTFAC^MR||VORTIGAN^PERPETUA^ISOLDE||19380611|F|||8 Heron Wharf^^Gullhaven^^98765||555-0199\r\
         NK1|1|VORTIGAN^BARNABY|SPO\r\
         PV1|1|I|WARD7^BED3\r"
    )
    .into_bytes()
}

/// The fake patient data of [`hl7`] (the patient id is added per run).
const PATIENT_DATA: &[&str] = &[
    "VORTIGAN",
    "PERPETUA",
    "ISOLDE",
    "BARNABY",
    "19380611",
    "Heron Wharf",
    "Gullhaven",
    "98765",
    "555-0199",
];

/// ADT to `lab` (the receiver: the testkit's route), ORU to `flaky` (nothing listens: the egress gives up and
/// dead-letters it).
fn routes() -> String {
    format!("{}---\n{}", common::ROUTES, common::ORU_TO_FLAKY)
}

/// One span of a Jaeger trace, as the checks need it.
#[derive(Clone, Debug)]
struct JSpan {
    service: String,
    name: String,
    id: String,
    trace: String,
    /// (refType, traceID, spanID)
    refs: Vec<(String, String, String)>,
    tags: BTreeMap<String, String>,
    warnings: Vec<String>,
    start: u64,
    duration: u64,
}

/// A tag's value as text (Jaeger's JSON has strings, numbers and booleans).
fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The process (resource) tags of each service in a trace of Jaeger's JSON: `service.version` and `host.name` (by
/// which Jaeger's clock-skew adjuster tells one process's spans from another's: without it, it warned on the
/// transformer's `publish` against its own `transform`).
fn check_processes(trace: &Value) -> Result<(), String> {
    let processes = trace["processes"].as_object().cloned().unwrap_or_default();
    for (id, p) in &processes {
        let tags: BTreeMap<String, String> = p["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| (value_text(&t["key"]), value_text(&t["value"])))
            .collect();
        let service = value_text(&p["serviceName"]);
        if tags.get("service.version").map(String::as_str) != Some(env!("CARGO_PKG_VERSION")) {
            return Err(format!(
                "process {id} ({service}): service.version in {tags:?}"
            ));
        }
        if tags.get("host.name").is_none_or(|h| h.is_empty()) {
            return Err(format!(
                "process {id} ({service}): no host.name in {tags:?}"
            ));
        }
    }
    Ok(())
}

/// The spans of one trace of Jaeger's JSON (`data[i]`), sorted by start time.
fn spans_of(trace: &Value) -> Vec<JSpan> {
    let services: HashMap<&str, &str> = trace["processes"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, p)| (k.as_str(), p["serviceName"].as_str().unwrap_or("?")))
                .collect()
        })
        .unwrap_or_default();
    let mut out: Vec<JSpan> = trace["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| JSpan {
            service: services
                .get(s["processID"].as_str().unwrap_or_default())
                .copied()
                .unwrap_or("?")
                .to_owned(),
            name: s["operationName"].as_str().unwrap_or_default().to_owned(),
            id: s["spanID"].as_str().unwrap_or_default().to_owned(),
            trace: s["traceID"].as_str().unwrap_or_default().to_owned(),
            refs: s["references"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    (
                        value_text(&r["refType"]),
                        value_text(&r["traceID"]),
                        value_text(&r["spanID"]),
                    )
                })
                .collect(),
            tags: s["tags"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| (value_text(&t["key"]), value_text(&t["value"])))
                .collect(),
            warnings: s["warnings"]
                .as_array()
                .into_iter()
                .flatten()
                .map(value_text)
                .collect(),
            start: s["startTime"].as_u64().unwrap_or_default(),
            duration: s["duration"].as_u64().unwrap_or_default(),
        })
        .collect();
    out.sort_by_key(|s| s.start);
    out
}

/// The compact view docs/observability.md quotes: one line per span, with its parent and a few tags.
fn view(trace_id: &str, spans: &[JSpan]) -> String {
    let names: HashMap<&str, String> = spans
        .iter()
        .map(|s| (s.id.as_str(), format!("{}:{}", s.service, s.name)))
        .collect();
    let mut out = format!("trace {trace_id}\n");
    for s in spans {
        let parent = match s.refs.first() {
            None => "root".to_owned(),
            Some((kind, _, id)) => format!(
                "{kind} {}",
                names
                    .get(id.as_str())
                    .cloned()
                    .unwrap_or_else(|| id.clone())
            ),
        };
        let tags: Vec<String> = s
            .tags
            .iter()
            .filter(|(k, _)| {
                k.starts_with("messaging.")
                    || k.starts_with("hl7.")
                    || k.starts_with("span.")
                    || k.starts_with("otel.")
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.push_str(&format!(
            "  {} {} ({} us) <- {parent}: {}{}\n",
            s.service,
            s.name,
            s.duration,
            tags.join(" "),
            if s.warnings.is_empty() {
                String::new()
            } else {
                format!(" WARNINGS {:?}", s.warnings)
            }
        ));
    }
    out
}

/// Jaeger's note on a span whose parent is another host's and which does not fit within it (`max_clock_skew_adjust`
/// is 0, Jaeger's default, so nothing is shifted). Jaeger's v1 query API (what its UI reads) knows a process's
/// host only by an `ip` process tag, which OpenTelemetry resources do not have, so it takes every parent of
/// another service for another host's, and a Kafka consumer span, which starts after its producer span ended,
/// gets the note when it is the shorter of the two (`transform` below `hl7.ingest`, usually).
const SKEW_NOTE: &str = "clock skew adjustment disabled; not applying calculated delta of ";

/// What is wrong with a trace's links as Jaeger shows them: a reference to a span that is not in the trace
/// (an orphan; Jaeger also warns "parent span ID=... is not in the trace"), any other warning (duplicate span
/// ids, ...), or a clock-skew note on a span whose parent is of its own service (a child outside its parent's
/// time in one process). A clock-skew note across services, from producer to consumer, is Jaeger's RPC view of
/// a Kafka hop ([`SKEW_NOTE`]); those are returned in the second list.
fn link_problems(spans: &[JSpan]) -> (Vec<String>, Vec<String>) {
    let by_id: HashMap<&str, &JSpan> = spans.iter().map(|s| (s.id.as_str(), s)).collect();
    let (mut bad, mut notes) = (Vec::new(), Vec::new());
    for s in spans {
        let parent = s.refs.first().and_then(|(_, _, id)| by_id.get(id.as_str()));
        for w in &s.warnings {
            match parent {
                Some(p) if w.starts_with(SKEW_NOTE) && p.service != s.service => {
                    notes.push(format!(
                        "{} `{}` below {} `{}`: {w:?}",
                        s.service, s.name, p.service, p.name
                    ))
                }
                _ => bad.push(format!("{} `{}`: Jaeger warns {w:?}", s.service, s.name)),
            }
        }
        for (kind, trace, id) in &s.refs {
            if trace != &s.trace || !by_id.contains_key(id.as_str()) {
                bad.push(format!(
                    "{} `{}`: {kind} {trace}/{id} is not a span of the trace",
                    s.service, s.name
                ));
            }
        }
    }
    (bad, notes)
}

/// The one span of `service` named `name`.
fn one<'a>(spans: &'a [JSpan], service: &str, name: &str) -> Result<&'a JSpan, String> {
    let found: Vec<&JSpan> = spans
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect();
    match found[..] {
        [s] => Ok(s),
        _ => Err(format!("{} {service} `{name}` spans", found.len())),
    }
}

/// `child`'s only reference is CHILD_OF `parent`.
fn child_of(child: &JSpan, parent: &JSpan) -> Result<(), String> {
    let want = (
        "CHILD_OF".to_owned(),
        parent.trace.clone(),
        parent.id.clone(),
    );
    if child.refs == [want] {
        Ok(())
    } else {
        Err(format!(
            "{} `{}` references {:?}, not CHILD_OF {} `{}` ({})",
            child.service, child.name, child.refs, parent.service, parent.name, parent.id
        ))
    }
}

/// The delivered message's trace, complete: `hl7.ingest` → `transform` → `publish` → `deliver`, nothing else,
/// no orphan. Err says what is missing so far (spans arrive in batches from three processes).
fn delivered_chain(spans: &[JSpan]) -> Result<[JSpan; 4], String> {
    let ingest = one(spans, "hl7gw-ingress", "hl7.ingest")?;
    let transform = one(spans, "hl7gw-transformer", "transform")?;
    let publish = one(spans, "hl7gw-transformer", "publish")?;
    let deliver = one(spans, "hl7gw-egress", "deliver")?;
    if spans.len() != 4 {
        return Err(format!("{} spans, not 4", spans.len()));
    }
    if !ingest.refs.is_empty() {
        return Err(format!("`hl7.ingest` references {:?}", ingest.refs));
    }
    child_of(transform, ingest)?;
    child_of(publish, transform)?;
    child_of(deliver, publish)?;
    let (bad, _) = link_problems(spans);
    if !bad.is_empty() {
        return Err(bad.join("; "));
    }
    Ok([
        ingest.clone(),
        transform.clone(),
        publish.clone(),
        deliver.clone(),
    ])
}

/// The tags of `s` that must be as given (`None`: present and not empty).
fn assert_tags(s: &JSpan, expect: &[(&str, Option<&str>)]) {
    for (key, value) in expect {
        let got = s.tags.get(*key);
        match value {
            Some(v) => assert_eq!(
                got.map(String::as_str),
                Some(*v),
                "{} `{}`: tag {key} (tags {:?})",
                s.service,
                s.name,
                s.tags
            ),
            None => assert!(
                got.is_some_and(|g| !g.is_empty()),
                "{} `{}`: no tag {key} (tags {:?})",
                s.service,
                s.name,
                s.tags
            ),
        }
    }
}

/// Polls `f` every 300 ms until it is Ok or `limit` passed; the last answer.
fn poll<T>(limit: Duration, mut f: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = Instant::now() + limit;
    loop {
        let r = f();
        if r.is_ok() || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn jaeger_shows_one_trace_per_message_across_the_services() {
    let started = Instant::now();
    let jaeger = Jaeger::up();
    let jaeger_up = started.elapsed();
    let rt = support::runtime();

    let mut p = Pipeline::new();
    p.service_env = vec![
        // Plain OTLP/gRPC to Jaeger's receiver, as docs/observability.md tells (http://: no TLS).
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}", jaeger.otlp_grpc),
        ),
        // Export every 200 ms instead of every 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "200".into()),
    ];
    let dir = p.dir.path().to_owned();
    p.log_dir = Some(dir.clone());
    p.set_routes(&routes());
    p.set_destinations(&format!(
        "  lab:\n    address: 127.0.0.1:{}\n    response_timeout: 5s\n    retry: {{initial_backoff: 100ms, max_backoff: 1s}}\n\
         \x20 flaky:\n    address: 127.0.0.1:{}\n    connect_timeout: 1s\n    response_timeout: 1s\n    retry: {{max_attempts: 2, initial_backoff: 50ms, max_backoff: 100ms}}\n",
        p.receiver_port,
        free_port()
    ));
    p.start_all(None);
    p.wait_ready(Duration::from_secs(60));

    // Three ADTs (each its own trace) and an ORU the egress cannot deliver, all of one fake patient.
    let id = uuid::Uuid::now_v7().simple().to_string();
    let tail = &id[id.len() - 10..];
    let patient = format!("Q{}", &id[id.len() - 9..]);
    let adts: Vec<String> = (1..=3).map(|i| format!("JGR-{tail}-{i}")).collect();
    let oru = format!("JGR-{tail}-ORU");
    let mllp: SocketAddr = format!("127.0.0.1:{}", p.mllp).parse().unwrap();
    rt.block_on(async {
        let mut c = Mllp::connect(mllp).await;
        for cid in &adts {
            let ack = c
                .call(&hl7("ADT^A01^ADT_A01", cid, &patient))
                .await
                .expect("an ACK");
            assert_eq!(ack_code(&ack), "AA", "{cid}");
        }
        let ack = c
            .call(&hl7("ORU^R01^ORU_R01", &oru, &patient))
            .await
            .expect("an ACK");
        assert_eq!(ack_code(&ack), "AA", "{oru}");
    });
    wait_delivered(&p.received_dir(), &adts, Duration::from_secs(120));
    let delivered = started.elapsed();

    // Each ADT: one trace, found by its control id from the ingress and from the egress, complete and linked.
    let mut views = Vec::new();
    let mut trace_ids = HashSet::new();
    let mut chains = Vec::new();
    let mut skew_notes = Vec::new();
    for cid in &adts {
        let found = poll(Duration::from_secs(30), || {
            let from_ingress = jaeger.search("hl7gw-ingress", "hl7.control_id", cid);
            let [trace] = &from_ingress[..] else {
                return Err(format!(
                    "{} traces of the ingress with hl7.control_id={cid}",
                    from_ingress.len()
                ));
            };
            let trace_id = value_text(&trace["traceID"]);
            let from_egress = jaeger.search("hl7gw-egress", "hl7.control_id", cid);
            let egress_ids: Vec<String> = from_egress
                .iter()
                .map(|t| value_text(&t["traceID"]))
                .collect();
            if egress_ids != [trace_id.clone()] {
                return Err(format!(
                    "the egress's traces with hl7.control_id={cid} are {egress_ids:?}, the ingress's {trace_id}"
                ));
            }
            // By id, as a user opens it.
            let by_id = jaeger.get(&format!("/api/traces/{trace_id}"));
            let [trace] = by_id["data"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            else {
                return Err(format!("/api/traces/{trace_id}: {by_id}"));
            };
            check_processes(trace)?;
            std::fs::write(
                jaeger.dir.join(format!("trace-{cid}.json")),
                serde_json::to_string_pretty(trace).unwrap(),
            )
            .unwrap();
            let spans = spans_of(trace);
            delivered_chain(&spans)
                .map(|chain| (trace_id.clone(), spans.clone(), chain))
                .map_err(|e| format!("trace {trace_id}: {e}\n{}", view(&trace_id, &spans)))
        });
        let (trace_id, spans, chain) =
            found.unwrap_or_else(|e| panic!("Jaeger's trace of {cid}: {e}"));
        assert!(
            chain.iter().all(|s| s.trace == trace_id),
            "{cid}: spans of other traces: {chain:?}"
        );
        assert!(
            trace_ids.insert(trace_id.clone()),
            "{cid} shares trace {trace_id} with another message"
        );
        skew_notes.extend(link_problems(&spans).1);
        // Jaeger's v3 API (OTLP JSON) tells hosts apart by `host.name` (the services' resources carry it): on one
        // host it has no note at all.
        let v3 = jaeger
            .get(&format!("/api/v3/traces/{trace_id}"))
            .to_string();
        assert!(
            v3.contains("hl7.ingest") && v3.contains("deliver") && v3.contains("\"host.name\""),
            "/api/v3/traces/{trace_id}: {v3}"
        );
        assert!(
            !v3.contains("@jaeger@warnings"),
            "/api/v3/traces/{trace_id} has warnings: {v3}"
        );
        views.push(view(&trace_id, &spans));
        chains.push((cid.clone(), chain));
    }
    let traces_found = started.elapsed();

    // Kinds and tags as docs/observability.md documents them, on each ADT's four spans.
    let (inbound, lab, dlq) = (p.topic("inbound"), p.topic("out.lab"), p.topic("dlq"));
    let (transformer_group, egress_group) = (p.topic("transformer"), p.topic("egress.lab"));
    for (control_id, [ingest, transform, publish, deliver]) in &chains {
        let cid = Some(control_id.as_str());
        let mut ingest_tags = vec![
            ("span.kind", Some("producer")),
            ("messaging.system", Some("kafka")),
        ];
        ingest_tags.extend(common::ingest_span_attributes(&inbound, control_id));
        ingest_tags.push(("hl7.size", None));
        assert_tags(ingest, &ingest_tags);
        assert_tags(
            transform,
            &[
                ("span.kind", Some("consumer")),
                ("messaging.system", Some("kafka")),
                ("messaging.operation.type", Some("process")),
                ("messaging.destination.name", Some(&inbound)),
                (
                    "messaging.destination.partition.id",
                    ingest
                        .tags
                        .get("messaging.destination.partition.id")
                        .map(String::as_str),
                ),
                (
                    "messaging.kafka.offset",
                    ingest
                        .tags
                        .get("messaging.kafka.offset")
                        .map(String::as_str),
                ),
                ("messaging.consumer.group.name", Some(&transformer_group)),
                ("hl7.control_id", cid),
                ("hl7.message_type", Some("ADT")),
                ("hl7.trigger_event", Some("A01")),
                // The number of routes that matched.
                ("hl7.routes", Some("1")),
            ],
        );
        assert_tags(
            publish,
            &[
                ("span.kind", Some("producer")),
                ("messaging.system", Some("kafka")),
                ("messaging.operation.type", Some("send")),
                ("messaging.destination.name", Some(&lab)),
                ("hl7.control_id", cid),
                ("hl7.route", Some("adt-to-lab")),
                ("hl7.destination", Some("lab")),
            ],
        );
        let mut deliver_tags = vec![
            ("span.kind", Some("consumer")),
            ("messaging.system", Some("kafka")),
            ("hl7.message_type", Some("ADT")),
            ("hl7.trigger_event", Some("A01")),
        ];
        deliver_tags.extend(common::deliver_span_attributes(
            &lab,
            &egress_group,
            control_id,
            "lab",
            Some("adt-to-lab"),
        ));
        assert_tags(deliver, &deliver_tags);
        for s in [ingest, transform, publish, deliver] {
            assert!(
                !s.tags.contains_key("messaging.kafka.message.key"),
                "{} `{}` carries the Kafka key",
                s.service,
                s.name
            );
        }
    }

    // The ORU: its `deliver` gives up, and its `dead_letter` (producer, to the DLQ) is CHILD_OF that `deliver`.
    let (oru_trace, oru_spans) = poll(Duration::from_secs(30), || {
        let traces = jaeger.search("hl7gw-egress", "hl7.control_id", &oru);
        let [trace] = &traces[..] else {
            return Err(format!("{} traces of the egress for {oru}", traces.len()));
        };
        let trace_id = value_text(&trace["traceID"]);
        let spans = spans_of(trace);
        let check = || -> Result<(), String> {
            let ingest = one(&spans, "hl7gw-ingress", "hl7.ingest")?;
            let transform = one(&spans, "hl7gw-transformer", "transform")?;
            let publish = one(&spans, "hl7gw-transformer", "publish")?;
            let deliver = one(&spans, "hl7gw-egress", "deliver")?;
            let dead = one(&spans, "hl7gw-egress", "dead_letter")?;
            child_of(transform, ingest)?;
            child_of(publish, transform)?;
            child_of(deliver, publish)?;
            child_of(dead, deliver)?;
            let (bad, _) = link_problems(&spans);
            if bad.is_empty() {
                Ok(())
            } else {
                Err(bad.join("; "))
            }
        };
        check()
            .map(|()| (trace_id.clone(), spans.clone()))
            .map_err(|e| format!("trace {trace_id}: {e}\n{}", view(&trace_id, &spans)))
    })
    .unwrap_or_else(|e| panic!("Jaeger's trace of the undeliverable {oru}: {e}"));
    assert!(!trace_ids.contains(&oru_trace));
    // Its `deliver` says how many attempts it took, though the receiver never answered.
    assert_tags(
        one(&oru_spans, "hl7gw-egress", "deliver").unwrap(),
        &[
            ("span.kind", Some("consumer")),
            ("messaging.destination.name", Some(&p.topic("out.flaky"))),
            (
                "messaging.consumer.group.name",
                Some(&p.topic("egress.flaky")),
            ),
            ("hl7.destination", Some("flaky")),
            ("hl7.route", Some("oru-to-flaky")),
            ("hl7.attempts", Some("2")),
        ],
    );
    let dead = one(&oru_spans, "hl7gw-egress", "dead_letter").unwrap();
    assert_tags(
        dead,
        &[
            ("span.kind", Some("producer")),
            ("messaging.system", Some("kafka")),
            ("messaging.operation.type", Some("send")),
            ("messaging.destination.name", Some(&dlq)),
            ("messaging.destination.partition.id", None),
            ("messaging.kafka.offset", None),
            ("hl7.control_id", Some(&oru)),
            ("hl7.destination", Some("flaky")),
            ("hl7.reason", Some("gave_up")),
        ],
    );
    skew_notes.extend(link_problems(&oru_spans).1);
    views.push(view(&oru_trace, &oru_spans));

    // Jaeger's index of operations: each span name once per service, with the kind Jaeger took from the span.
    let mut operations = Vec::new();
    for (service, expect) in [
        ("hl7gw-ingress", &[("hl7.ingest", "producer")][..]),
        (
            "hl7gw-transformer",
            &[("publish", "producer"), ("transform", "consumer")][..],
        ),
        (
            "hl7gw-egress",
            &[("dead_letter", "producer"), ("deliver", "consumer")][..],
        ),
    ] {
        let ops = jaeger.get(&format!("/api/operations?service={service}"));
        let mut got: Vec<(String, String)> = ops["data"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| (value_text(&o["name"]), value_text(&o["spanKind"])))
            .collect();
        got.sort();
        let want: Vec<(String, String)> = expect
            .iter()
            .map(|(n, k)| ((*n).to_owned(), (*k).to_owned()))
            .collect();
        assert_eq!(got, want, "/api/operations?service={service}: {ops}");
        operations.push(format!(
            "{service}: {}",
            got.iter()
                .map(|(n, k)| format!("{n} ({k})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let services = jaeger.get("/api/services");
    for s in ["hl7gw-ingress", "hl7gw-transformer", "hl7gw-egress"] {
        assert!(
            services["data"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == s)),
            "/api/services: {services}"
        );
    }

    // No patient data anywhere in what Jaeger answers: every trace of every service, whole (span tags, logs,
    // process tags, warnings), as text.
    let mut answers = String::new();
    for s in ["hl7gw-ingress", "hl7gw-transformer", "hl7gw-egress"] {
        answers.push_str(
            &jaeger
                .get(&format!("/api/traces?service={s}&lookback=1h&limit=1000"))
                .to_string(),
        );
    }
    let upper = answers.to_uppercase();
    let mut leaks = Vec::new();
    for d in PATIENT_DATA.iter().copied().chain([patient.as_str()]) {
        if let Some(at) = upper.find(&d.to_uppercase()) {
            let from = at.saturating_sub(200);
            leaks.push(format!(
                "{d:?} in Jaeger's answer: ...{}...",
                &answers[from..(at + 100).min(answers.len())]
            ));
        }
    }
    assert!(
        leaks.is_empty(),
        "patient data in Jaeger:\n{}",
        leaks.join("\n")
    );
    // The scan does see what the traces carry.
    for cid in adts.iter().chain([&oru]) {
        assert!(
            answers.contains(cid.as_str()),
            "{cid} not in Jaeger's answers"
        );
    }

    eprintln!(
        "jaeger: up after {:.1} s, delivered after {:.1} s, traces complete in Jaeger after {:.1} s, checked after \
         {:.1} s\noperations: {}\nclock-skew notes across services (allowed): {skew_notes:#?}\n{}",
        jaeger_up.as_secs_f64(),
        delivered.as_secs_f64(),
        traces_found.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        operations.join("; "),
        views.join("")
    );
}
