//! Handing the transaction's records to the producer: each output in its `publish` span, the ledger's events,
//! and what Kafka refused for good in an earlier attempt at the batch.

use super::dead_letters::STAGE;
use super::records::OutRecord;
use crate::config::Config;
use hl7gw_runtime::envelope;
use hl7gw_runtime::kafka::TransactionalProducer as FutureProducer;
use hl7gw_runtime::ledger;
use rdkafka::error::KafkaError;

/// The ledger's event for a record the transaction writes: `dead_lettered` for a DLQ record (with its
/// reason), else `routed` (its route, destination and topic).
pub(super) fn ledger_event(cfg: &Config, r: &OutRecord) -> hl7gw_runtime::proto::v1::Event {
    if r.topic == cfg.dlq_topic {
        let mut e = ledger::event(ledger::kind::DEAD_LETTERED, STAGE, &r.envelope);
        e.reason = r
            .envelope
            .rejection
            .as_ref()
            .map(|j| j.reason.clone())
            .unwrap_or_default();
        e.topic.clone_from(&r.topic);
        e
    } else {
        let mut e = ledger::event(ledger::kind::ROUTED, STAGE, &r.envelope);
        e.topic.clone_from(&r.topic);
        e
    }
}

/// Encodes `event` into `buf` and hands it to the producer, for the ledger's topic.
pub(super) fn send_event(
    producer: &FutureProducer,
    topic: &str,
    event: &hl7gw_runtime::proto::v1::Event,
    buf: &mut Vec<u8>,
) -> Result<rdkafka::producer::DeliveryFuture, KafkaError> {
    ledger::encode_into(event, buf);
    producer
        .send_result(ledger::record(topic, event, buf))
        .map_err(|(e, _)| e)
}

/// Encodes `r` into `buf` and hands it to the producer, inside its `publish` span (a producer span, child of
/// the record's `transform` span) whose trace context the record carries (envelope and headers), so that the
/// egress's `deliver` span is that span's child. The same length as the `transform` span's context the record
/// was sized with.
///
/// Inside the `transform` span too: tracing-opentelemetry ends a span at its last exit, so without entering it
/// here `transform` ended when its routes had run and each `publish` began after its parent's end, which Jaeger
/// flags on the `publish` ("clock skew adjustment ... calculated delta"; issue 37, tests/jaeger.rs of the egress).
/// Now the consumer span lasts until its outputs are handed to the producer.
pub(super) fn send(
    producer: &FutureProducer,
    r: &mut OutRecord,
    buf: &mut Vec<u8>,
) -> Result<rdkafka::producer::DeliveryFuture, KafkaError> {
    let transform = r.parent.clone();
    let _in_transform = transform.enter();
    let span = publish_span(r);
    let (traceparent, tracestate) = hl7gw_runtime::telemetry::trace_context(&span);
    if !traceparent.is_empty() {
        r.envelope.trace = Some(hl7gw_runtime::proto::v1::TraceContext {
            traceparent: traceparent.clone(),
            tracestate,
        });
        r.traceparent = traceparent;
    }
    let rec = envelope::encode_record(&r.topic, &r.key, &r.envelope, &r.traceparent, buf);
    let _in = span.enter();
    producer.send_result(rec).map_err(|(e, _)| e)
}

/// The producer span of one output or dead letter (none when the record has no `transform` span). Partition
/// and offset are not on it: the transaction's records are confirmed at its commit, after the span.
pub(super) fn publish_span(r: &OutRecord) -> tracing::Span {
    if r.parent.is_none() {
        return tracing::Span::none();
    }
    let span = hl7gw_runtime::kafka_span!(
        producer,
        parent: &r.parent,
        topic: r.topic,
        "publish",
        hl7.control_id = r.envelope.header.as_ref().map_or("", |h| h.control_id.as_str()),
        hl7.route = %r.envelope.route,
        hl7.destination = %r.envelope.destination,
    );
    span
}

/// One output of a batch: the input's topic, partition and offset, the output's place among that input's
/// outputs, and its topic. Outputs Kafka refused for good are remembered by it until their input commits.
pub(super) type OutputId = (String, i32, i64, usize, String);

/// Outputs Kafka refused for good in an earlier attempt at the batch, with the dead-letter reason.
pub(super) type Refused = std::collections::HashMap<OutputId, &'static str>;
