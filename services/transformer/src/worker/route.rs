//! Routing one inbound record: decoded, its `transform` span, every matching route's steps, the outputs and
//! dead letters it makes. No Kafka here: unit-tested on envelopes.

use super::dead_letters::STAGE;
use super::dead_letters::dlq;
use super::dead_letters::too_large_to_dlq;
use super::records::Consumed;
use super::records::OutRecord;
use super::records::Routed;
use super::records::h_of;
use crate::config::{Config, Unmatched};
use crate::engine::{PluginCaller, Routes};
use crate::metrics::{TransformerMetrics, outcome};
use hl7gw_runtime::envelope;
use hl7gw_runtime::ledger;
use hl7gw_runtime::metrics::MsgType;
use hl7gw_runtime::proto::v1::{Envelope, Rejection};
use hl7v2::{Charset, Message as Hl7Message};
use std::time::Instant;
use tracing::Instrument;

/// Routes and transforms one inbound envelope into output and DLQ records (nothing is produced here).
pub async fn route_one<P: PluginCaller>(
    cfg: &Config,
    routes: &Routes,
    payload: &[u8],
    plugins: &P,
    metrics: &TransformerMetrics,
) -> Routed {
    route_consumed(cfg, routes, payload, None, plugins, metrics).await
}

/// [`route_one`] for a record read from Kafka at `consumed`, which the `transform` span (a consumer span)
/// names.
pub async fn route_consumed<P: PluginCaller>(
    cfg: &Config,
    routes: &Routes,
    payload: &[u8],
    consumed: Option<Consumed<'_>>,
    plugins: &P,
    metrics: &TransformerMetrics,
) -> Routed {
    let env = match envelope::decode(payload) {
        Ok(e) => e,
        Err(e) => {
            metrics.not_an_envelope(&e);
            let env = Envelope {
                id: envelope::new_id(),
                received_at: Some(envelope::timestamp(std::time::SystemTime::now())),
                raw: payload.to_vec().into(),
                rejection: Some(Rejection {
                    stage: "transformer".into(),
                    reason: "bad_envelope".into(),
                    detail: e.to_string(),
                    ..Rejection::default()
                }),
                ..Envelope::default()
            };
            return Routed {
                records: vec![dlq(
                    cfg,
                    env,
                    "bad_envelope",
                    metrics,
                    &tracing::Span::none(),
                )],
                outcome: outcome::FAILED,
                dropped: Vec::new(),
            };
        }
    };
    let h = env.header.clone().unwrap_or_default();
    let t = MsgType::new(h.message_type.as_bytes());
    // A consumer span (OpenTelemetry messaging conventions), one per inbound record; no
    // `messaging.kafka.message.key`: the key is made of the patient id by default.
    let span = hl7gw_runtime::kafka_span!(
        consumer,
        "transform",
        messaging.consumer.group.name = tracing::field::Empty,
        hl7.message_type = %h.message_type,
        hl7.trigger_event = %h.trigger_event,
        hl7.control_id = %h.control_id,
        hl7.routes = tracing::field::Empty,
        hl7.fhir.unmapped = tracing::field::Empty,
    );
    if let Some(c) = consumed {
        hl7gw_runtime::telemetry::record_placement(
            &span,
            Some(c.topic),
            Some((c.partition, c.offset)),
        );
        span.record("messaging.consumer.group.name", c.group);
    }
    if let Some(tc) = &env.trace {
        hl7gw_runtime::telemetry::set_parent(&span, &tc.traceparent, &tc.tracestate);
    }
    // Every output continues the trace from this span (the egress's `deliver` becomes its child).
    let (traceparent, tracestate) = hl7gw_runtime::telemetry::trace_context(&span);
    let trace = hl7gw_runtime::proto::v1::TraceContext {
        traceparent,
        tracestate,
    };
    let started = Instant::now();
    let charset = Charset::from_msh18(env.charset.as_bytes()).unwrap_or(Charset::Utf8);
    let raw = env.raw.clone();
    let msg = match Hl7Message::parse(&raw) {
        Ok(m) => m,
        Err(e) => {
            metrics.unparsable(&span, t, &e);
            let mut bad = env.clone();
            bad.rejection = Some(Rejection {
                stage: "transformer".into(),
                reason: "parse".into(),
                detail: e.to_string(),
                ..Rejection::default()
            });
            return Routed {
                records: vec![dlq(cfg, bad, "parse", metrics, &span)],
                outcome: outcome::FAILED,
                dropped: Vec::new(),
            };
        }
    };
    let mut records = Vec::new();
    let mut dropped = Vec::new();
    let mut failed = false;
    let mut matched = 0usize;
    for route in routes.candidates(&h.message_type, &h.trigger_event) {
        if route.matches(&env, &msg, charset).is_err() {
            continue;
        }
        matched += 1;
        match route
            .run(&env, &raw, charset, plugins)
            .instrument(span.clone())
            .await
        {
            Ok(applied) if applied.skipped_unsupported => {
                // `toFhir` with `onUnsupported: skip` on a type it does not map: no output, counted and on the
                // ledger.
                metrics
                    .fhir_skipped
                    .get_or_create(&crate::metrics::RouteLabels {
                        route: route.name.clone(),
                    })
                    .inc();
                if cfg.ledger.enabled() {
                    let mut e = ledger::event(ledger::kind::DROPPED, STAGE, &env);
                    e.route = route.name.clone();
                    e.reason = "fhir_unsupported".into();
                    dropped.push(e);
                }
            }
            Ok(applied) => {
                metrics.plugins_skipped(&route.name, applied.plugins_skipped);
                if !applied.fhir_unmapped.is_empty() {
                    metrics
                        .fhir_unmapped
                        .get_or_create(&crate::metrics::RouteLabels {
                            route: route.name.clone(),
                        })
                        .inc_by(applied.fhir_unmapped.len() as u64);
                    span.record(
                        "hl7.fhir.unmapped",
                        unmapped_attribute(&applied.fhir_unmapped).as_str(),
                    );
                }
                // The route's own key (e.g. from a hashed id) or the inbound key.
                let key = applied.key.unwrap_or_else(|| env.key.clone());
                for dest in &route.destinations {
                    let mut o = env.clone();
                    o.raw = applied.message.clone().into();
                    o.content_type = applied.content_type.to_owned();
                    o.key = key.clone();
                    o.route = route.name.clone();
                    metrics.output(&route.name, dest);
                    records.push(output_record(cfg, o, dest, &trace, &span));
                }
            }
            Err(e) => {
                metrics.transform_failed(&span, &route.name, e.step, e.kind);
                failed = true;
                let mut bad = env.clone();
                bad.route = route.name.clone();
                bad.rejection = Some(Rejection {
                    stage: "transformer".into(),
                    reason: e.kind.into(),
                    detail: format!("route {} step {}: {}", e.route, e.step, e.detail),
                    ..Rejection::default()
                });
                records.push(dlq(cfg, bad, e.kind, metrics, &span));
            }
        }
    }
    span.record("hl7.routes", matched);
    let outcome = if matched == 0 && hl7gw_runtime::envelope::is_test_traffic(&h_of(&env)) {
        // Test traffic no route asked for: counted, neither delivered by default nor a dead letter.
        outcome::UNMATCHED
    } else if matched == 0 {
        match &cfg.default_destination {
            Some(dest) => {
                records.push(output_record(cfg, env.clone(), dest, &trace, &span));
                outcome::DEFAULT
            }
            None => {
                if cfg.unmatched == Unmatched::DeadLetter {
                    let mut bad = env.clone();
                    bad.rejection = Some(Rejection {
                        stage: "transformer".into(),
                        reason: "unmatched".into(),
                        detail: "no route matched the message".into(),
                        ..Rejection::default()
                    });
                    records.push(dlq(cfg, bad, "unmatched", metrics, &span));
                }
                outcome::UNMATCHED
            }
        }
    } else if failed {
        outcome::FAILED
    } else {
        outcome::ROUTED
    };
    metrics.message(t, outcome);
    metrics
        .transform_duration
        .observe(started.elapsed().as_secs_f64());
    for r in &mut records {
        too_large_to_dlq(cfg, r, consumed, metrics);
    }
    if records.is_empty() && dropped.is_empty() && cfg.ledger.enabled() {
        let mut e = ledger::event(ledger::kind::DROPPED, STAGE, &env);
        e.reason = if hl7gw_runtime::envelope::is_test_traffic(&h_of(&env)) {
            "test_traffic".into()
        } else {
            "unmatched".into()
        };
        dropped.push(e);
    }
    Routed {
        records,
        outcome,
        dropped,
    }
}

/// The record of one output for destination `dest`: the transformer's stage and trace context, the
/// destination's topic, keyed by the envelope's key (routed or inbound).
pub(super) fn output_record(
    cfg: &Config,
    mut o: Envelope,
    dest: &str,
    trace: &hl7gw_runtime::proto::v1::TraceContext,
    parent: &tracing::Span,
) -> OutRecord {
    o.destination = dest.to_owned();
    o.trace = Some(trace.clone());
    envelope::push_stage(&mut o, "transformer");
    OutRecord {
        topic: cfg.out_topic(dest),
        key: o.key.clone(),
        traceparent: trace.traceparent.clone(),
        envelope: o,
        parent: parent.clone(),
    }
}

/// Most unmapped ids a span attribute lists: a message of a thousand Z-segments must not make a span of
/// kilobytes (the metric counts them all).
pub(super) const MAX_UNMAPPED_IN_SPAN: usize = 32;

/// `hl7.fhir.unmapped`: the first [`MAX_UNMAPPED_IN_SPAN`] ids, comma-separated, and how many more.
pub(super) fn unmapped_attribute(ids: &[String]) -> String {
    let mut s = ids
        .iter()
        .take(MAX_UNMAPPED_IN_SPAN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",");
    if ids.len() > MAX_UNMAPPED_IN_SPAN {
        s.push_str(&format!(",... ({} more)", ids.len() - MAX_UNMAPPED_IN_SPAN));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::dead_letters::{record_size, refused_to_dlq};
    use super::super::produce::{ledger_event, send};
    use super::*;
    use crate::engine::{Plugin, Route};
    use crate::route::HL7RouteSpec;
    use hl7gw_runtime::kafka::TransactionalProducer as FutureProducer;
    use hl7gw_runtime::proto::v1::TransformRequest;
    use std::sync::Arc;

    #[test]
    fn the_unmapped_span_attribute_is_bounded() {
        let ids: Vec<String> = (0..1000).map(|i| format!("Z{i:02}")).collect();
        let a = unmapped_attribute(&ids);
        assert!(a.len() < 400, "{} bytes", a.len());
        assert!(a.ends_with(",... (968 more)"), "{a}");
        assert_eq!(unmapped_attribute(&ids[..2]), "Z00,Z01");
    }

    struct NoPlugins;

    impl PluginCaller for NoPlugins {
        async fn call(&self, _: &Plugin, _: TransformRequest) -> Result<(Vec<u8>, String), String> {
            Err("no plugins here".into())
        }
    }

    fn route(name: &str, yaml: &str) -> Arc<Route> {
        let spec: HL7RouteSpec = serde_saphyr::from_str(yaml).unwrap();
        Arc::new(Route::compile(name, &spec).unwrap())
    }

    fn inbound(raw: &[u8]) -> Vec<u8> {
        let m = Hl7Message::parse(raw).unwrap();
        let env = Envelope {
            id: "e1".into(),
            raw: raw.to_vec().into(),
            header: Some(envelope::header(m.header(), Charset::Utf8)),
            key: "F|P1".into(),
            ..Envelope::default()
        };
        let mut buf = Vec::new();
        envelope::encode_into(&env, &mut buf);
        buf
    }

    const ADT: &[u8] = b"MSH|^~\\&|A|F|B|G|20260101||ADT^A01|C1|P|2.5\rPID|1||P1\r";

    const ORU: &[u8] = b"MSH|^~\\&|A|F|B|G|20260101||ORU^R01|C2|P|2.5\rPID|1||P1\r";

    async fn run(
        cfg: &Config,
        routes: &[Arc<Route>],
        payload: &[u8],
    ) -> (Routed, TransformerMetrics) {
        let (_reg, m) = TransformerMetrics::registered();
        let routes = Routes::new(routes.to_vec());
        (route_one(cfg, &routes, payload, &NoPlugins, &m).await, m)
    }

    #[tokio::test]
    async fn every_matching_route_fans_out_with_the_same_key() {
        let routes = [
            route(
                "a",
                "{match: {messageTypes: [ADT]}, destinations: [lab, archive]}",
            ),
            route("b", "{transforms: [{toJson: {}}], destinations: [json]}"),
        ];
        let (r, _) = run(&Config::default(), &routes, &inbound(ADT)).await;
        assert_eq!(r.outcome, outcome::ROUTED);
        let topics: Vec<&str> = r.records.iter().map(|o| o.topic.as_str()).collect();
        assert_eq!(topics, ["hl7.out.lab", "hl7.out.archive", "hl7.out.json"]);
        assert!(
            r.records
                .iter()
                .all(|o| o.key == "F|P1" && o.envelope.id == "e1")
        );
        assert_eq!(
            r.records[2].envelope.content_type,
            crate::engine::JSON_CONTENT_TYPE
        );
        assert_eq!(r.records[0].envelope.route, "a");
        assert_eq!(
            r.records[0].envelope.stages.last().unwrap().name,
            "transformer"
        );
    }

    /// Routed outputs and default-destination copies continue the trace alike: the envelope carries the same
    /// context as the record's `traceparent` header (the transform span's), not the ingress's.
    #[tokio::test]
    async fn every_output_carries_the_transform_spans_trace_context() {
        let ingress_tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut env = envelope::decode(&inbound(ADT)).unwrap();
        env.trace = Some(hl7gw_runtime::proto::v1::TraceContext {
            traceparent: ingress_tp.into(),
            tracestate: String::new(),
        });
        let mut payload = Vec::new();
        envelope::encode_into(&env, &mut payload);
        let routed = [route(
            "a",
            "{match: {messageTypes: [ADT]}, destinations: [lab]}",
        )];
        let with_default = Config {
            default_destination: Some("catchall".into()),
            ..Config::default()
        };
        for (cfg, routes, topic) in [
            (Config::default(), &routed[..], "hl7.out.lab"),
            (with_default, &[][..], "hl7.out.catchall"),
        ] {
            let (r, _) = run(&cfg, routes, &payload).await;
            let [o] = &r.records[..] else {
                panic!("one output: {:?}", r.records)
            };
            assert_eq!(o.topic, topic);
            let trace = o.envelope.trace.as_ref().expect("a trace context");
            assert_eq!(trace.traceparent, o.traceparent, "{topic}");
            assert_ne!(trace.traceparent, ingress_tp, "{topic}");
        }
    }

    /// Issue 9, item 9: an output over the record limit is a dead letter, not a transaction that fails forever.
    #[tokio::test]
    async fn an_output_larger_than_the_record_limit_goes_to_the_dlq() {
        let routes = [route(
            "big",
            "{transforms: [{toJson: {}}], destinations: [json]}",
        )];
        let mut cfg = Config::default();
        cfg.kafka.max_message_bytes = 400;
        let (r, _) = run(&cfg, &routes, &inbound(ADT)).await;
        assert_eq!(r.records.len(), 1);
        assert_eq!(r.records[0].topic, "hl7.dlq");
        let rej = r.records[0].envelope.rejection.as_ref().unwrap();
        assert_eq!(rej.reason, "too_large");
        // Within the limit, the same route delivers.
        let (r, _) = run(&Config::default(), &routes, &inbound(ADT)).await;
        assert_eq!(r.records[0].topic, "hl7.out.json");
    }

    /// Issue 24, item 5: an output whose envelope fits the limit by a few bytes does not fit as a record (key,
    /// headers, overhead): a dead letter that fits, without the message, naming its size and digest.
    #[test]
    fn an_output_a_few_bytes_under_the_limit_counts_as_a_record() {
        use prost::Message as _;
        let (_reg, m) = TransformerMetrics::registered();
        let cfg = Config::default();
        let max = cfg.kafka.max_message_bytes;
        let env = envelope::decode(&inbound(ADT)).unwrap();
        let trace = hl7gw_runtime::proto::v1::TraceContext {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: String::new(),
        };
        let mut r = output_record(&cfg, env, "lab", &trace, &tracing::Span::none());
        // The envelope 10 bytes under the limit.
        r.envelope.raw = Default::default();
        let mut len = max - 10 - r.envelope.encoded_len();
        loop {
            r.envelope.raw = vec![b'X'; len].into();
            match r.envelope.encoded_len().cmp(&(max - 10)) {
                std::cmp::Ordering::Greater => len -= 1,
                std::cmp::Ordering::Less => len += 1,
                std::cmp::Ordering::Equal => break,
            }
        }
        let consumed = Consumed {
            topic: "hl7.inbound",
            partition: 3,
            offset: 42,
            group: "g",
        };
        too_large_to_dlq(&cfg, &mut r, Some(consumed), &m);
        assert_eq!(r.topic, "hl7.dlq");
        let rej = r.envelope.rejection.clone().unwrap();
        assert_eq!(rej.reason, "too_large");
        assert!(r.envelope.raw.is_empty());
        assert!(rej.detail.contains("sha256 "), "{}", rej.detail);
        assert!(record_size(&r.envelope, &r.key, &r.traceparent) <= max);
        // Issue 36, item 5: it names its input, so that a replay re-reads it.
        assert!(rej.message_dropped);
        assert_eq!(
            (
                rej.origin_topic.as_str(),
                rej.origin_partition,
                rej.origin_offset
            ),
            ("hl7.inbound", 3, 42)
        );
    }

    /// librdkafka's own size check (`message.max.bytes`) counts key, headers and overhead: it never refuses a
    /// record [`record_size`] says fits, and its refusal is a `too_large` dead letter, not a retry.
    #[test]
    fn librdkafka_takes_every_record_record_size_says_fits() {
        let max = 1000;
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.max.bytes", max.to_string())
            .create_with_context(hl7gw_runtime::kafka::KafkaContext)
            .unwrap();
        let trace = hl7gw_runtime::proto::v1::TraceContext {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: String::new(),
        };
        let env = envelope::decode(&inbound(ADT)).unwrap();
        let mut r = output_record(
            &Config::default(),
            env,
            "lab",
            &trace,
            &tracing::Span::none(),
        );
        let mut buf = Vec::new();
        let mut fitting = 0;
        let refused = (0..max).find_map(|n| {
            r.envelope.raw = vec![b'X'; n].into();
            let fits = record_size(&r.envelope, &r.key, &r.traceparent) <= max;
            match send(&producer, &mut r, &mut buf) {
                Ok(_) => {
                    fitting += usize::from(fits);
                    None
                }
                Err(e) => {
                    assert!(!fits, "refused at {n} bytes of message though it fits: {e}");
                    Some(e)
                }
            }
        });
        let e = refused.expect("librdkafka refused a record over its limit");
        assert_eq!(
            hl7gw_runtime::kafka::errors::refused_for_good(&e),
            Some("too_large")
        );
        assert!(fitting > 0);
    }

    /// A dead letter Kafka refuses (a message near the limit, plus its rejection) keeps its own reason and
    /// loses the message, not its ids.
    #[tokio::test]
    async fn a_refused_dead_letter_keeps_its_reason() {
        let (_reg, m) = TransformerMetrics::registered();
        let cfg = Config::default();
        let (mut r, _) = run(&cfg, &[], &inbound(ORU)).await;
        let mut r = r.records.remove(0);
        assert_eq!(r.topic, "hl7.dlq");
        let dead = refused_to_dlq(&cfg, &mut r, "too_large", "refused".into(), true, &m);
        let rej = dead.envelope.rejection.clone().unwrap();
        assert_eq!(
            (dead.topic.as_str(), rej.reason.as_str()),
            ("hl7.dlq", "unmatched")
        );
        assert!(
            rej.detail.contains("refused") && rej.detail.contains("sha256"),
            "{}",
            rej.detail
        );
        assert!(dead.envelope.raw.is_empty());
        assert_eq!(
            (dead.envelope.id.as_str(), dead.key.as_str()),
            ("e1", "F|P1")
        );
    }

    /// `helm test` traffic that no route names is counted, never delivered by default nor dead-lettered.
    #[tokio::test]
    async fn unmatched_test_traffic_is_dropped_even_with_a_default_destination() {
        let routes = [route(
            "a",
            "{match: {messageTypes: [ADT]}, destinations: [lab]}",
        )];
        let cfg = Config {
            default_destination: Some("archive".into()),
            ..Config::default()
        };
        let test = b"MSH|^~\\&|HL7GW-TEST|F|B|G|20260101||ADT^A01|T1|T|2.5\rPID|1||P1\r";
        let (r, _) = run(&cfg, &routes, &inbound(test)).await;
        assert_eq!((r.outcome, r.records.len()), (outcome::UNMATCHED, 0));
        // The ledger says what became of it: dropped, as test traffic.
        let dropped = r.dropped.first().expect("a dropped event");
        assert_eq!(
            (
                dropped.kind.as_str(),
                dropped.reason.as_str(),
                dropped.control_id.as_str()
            ),
            (ledger::kind::DROPPED, "test_traffic", "T1")
        );
        let (r, _) = run(&cfg, &routes, &inbound(ADT)).await;
        assert_eq!(r.records[0].topic, "hl7.out.lab");
        assert!(r.dropped.is_empty());
        let e = ledger_event(&cfg, &r.records[0]);
        assert_eq!(
            (e.kind.as_str(), e.route.as_str(), e.destination.as_str()),
            (ledger::kind::ROUTED, "a", "lab")
        );
    }

    /// An `ADT^*` route to FHIR with `onUnsupported: skip`: a merge it maps goes out, an event it does not map
    /// (A47) makes no output and no dead letter, but a `dropped` event naming the route, and a count.
    #[tokio::test]
    async fn to_fhir_skips_types_it_does_not_map_when_the_route_says_so() {
        let routes = [route(
            "fhir",
            "{match: {messageTypes: ['ADT^*']}, transforms: [{toFhir: {onUnsupported: skip}}], destinations: [fhir]}",
        )];
        let cfg = Config::default();
        let a47 =
            b"MSH|^~\\&|A|F|B|G|20260101||ADT^A47|S1|P|2.5\rPID|1||P1^^^F^MR\rMRG|P0^^^F^MR\r";
        let (r, _) = run(&cfg, &routes, &inbound(a47)).await;
        assert!(r.records.is_empty(), "{:?}", r.records.len());
        let e = r.dropped.first().expect("a dropped event");
        assert_eq!(
            (e.reason.as_str(), e.route.as_str(), e.control_id.as_str()),
            ("fhir_unsupported", "fhir", "S1")
        );
        assert_eq!(r.dropped.len(), 1);
        let (r, _) = run(&cfg, &routes, &inbound(ADT)).await;
        assert_eq!(r.records[0].topic, "hl7.out.fhir");
        assert!(r.dropped.is_empty());
        // Without the option the same message is a dead letter.
        let strict = [route(
            "fhir",
            "{match: {messageTypes: ['ADT^*']}, transforms: [{toFhir: {}}], destinations: [fhir]}",
        )];
        let (r, _) = run(&cfg, &strict, &inbound(a47)).await;
        assert_eq!(r.records[0].topic, "hl7.dlq");
    }

    #[tokio::test]
    async fn unmatched_is_counted_or_goes_to_the_default_destination() {
        let routes = [route(
            "a",
            "{match: {messageTypes: [ADT]}, destinations: [lab]}",
        )];
        // The default: to the DLQ with reason `unmatched`.
        let (r, m) = run(&Config::default(), &routes, &inbound(ORU)).await;
        assert_eq!((r.outcome, r.records.len()), (outcome::UNMATCHED, 1));
        assert_eq!(r.records[0].topic, "hl7.dlq");
        let rej = r.records[0].envelope.rejection.as_ref().unwrap();
        assert_eq!(
            (rej.stage.as_str(), rej.reason.as_str()),
            ("transformer", "unmatched")
        );
        assert_eq!(r.records[0].key, "F|P1");
        let dropping = Config {
            unmatched: Unmatched::Drop,
            ..Config::default()
        };
        let (r, _) = run(&dropping, &routes, &inbound(ORU)).await;
        assert_eq!((r.outcome, r.records.len()), (outcome::UNMATCHED, 0));
        let unmatched = m
            .messages
            .get_or_create(&crate::metrics::MessageLabels {
                message_type: MsgType::new(b"ORU"),
                outcome: outcome::UNMATCHED,
            })
            .get();
        assert_eq!(unmatched, 1);

        let cfg = Config {
            default_destination: Some("catch-all".into()),
            ..Config::default()
        };
        let (r, _) = run(&cfg, &routes, &inbound(ORU)).await;
        assert_eq!(r.outcome, outcome::DEFAULT);
        assert_eq!(r.records[0].topic, "hl7.out.catch-all");
    }

    #[tokio::test]
    async fn failures_go_to_the_dlq_with_stage_and_reason() {
        let routes = [
            route(
                "bad",
                "{transforms: [{plugin: {endpoint: 'http://x:1'}}], destinations: [lab]}",
            ),
            route("good", "destinations: [archive]"),
        ];
        let (r, _) = run(&Config::default(), &routes, &inbound(ADT)).await;
        assert_eq!(r.outcome, outcome::FAILED);
        let dlq: Vec<&OutRecord> = r.records.iter().filter(|o| o.topic == "hl7.dlq").collect();
        assert_eq!(dlq.len(), 1);
        let rej = dlq[0].envelope.rejection.as_ref().unwrap();
        assert_eq!(
            (rej.stage.as_str(), rej.reason.as_str()),
            ("transformer", "plugin_failed")
        );
        assert_eq!(dlq[0].envelope.route, "bad");
        assert!(
            r.records.iter().any(|o| o.topic == "hl7.out.archive"),
            "the other route still delivers"
        );

        let (r, _) = run(&Config::default(), &routes, b"not an envelope \xff\xff").await;
        assert_eq!(r.records.len(), 1);
        assert_eq!(
            r.records[0].envelope.rejection.as_ref().unwrap().reason,
            "bad_envelope"
        );
    }
}
