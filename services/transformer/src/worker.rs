//! Consume, transform, produce — in Kafka transactions. A batch of inbound records becomes the output (and DLQ)
//! records plus the consumer offsets, committed together: after a crash either all of a batch's effects are
//! visible to read_committed consumers or none are, and the batch is consumed again.

use crate::config::{Config, Unmatched};
use crate::engine::{PluginCaller, Routes};
use crate::metrics::{TransformerMetrics, outcome};
use crate::source::LiveRoutes;
use hl7gw_runtime::envelope;
use hl7gw_runtime::kafka::TransactionalProducer as FutureProducer;
use hl7gw_runtime::ledger;
use hl7gw_runtime::metrics::MsgType;
use hl7gw_runtime::proto::v1::{Envelope, Rejection};
use hl7v2::{Charset, Message as Hl7Message};
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The consumer type the transformer uses.
/// (A batch gathered across a rebalance is dropped: its partitions restart from the committed offsets.)
pub type Consumer_ = StreamConsumer<hl7gw_runtime::kafka::Assignment>;

/// One record to produce inside the transaction.
#[derive(Debug)]
pub struct OutRecord {
    pub topic: String,
    pub key: String,
    pub envelope: Envelope,
    pub traceparent: String,
    /// The `transform` span the record comes from: its `publish` span, made when the record is produced, is
    /// that span's child (none for a record made of something that is not an envelope).
    pub parent: tracing::Span,
}

/// Where an inbound record was read: the consumer span's `messaging.*` attributes.
#[derive(Debug, Clone, Copy)]
pub struct Consumed<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub group: &'a str,
}

/// The result of routing one inbound record.
#[derive(Debug, Default)]
pub struct Routed {
    pub records: Vec<OutRecord>,
    pub outcome: &'static str,
    /// The ledger's `dropped` events: one per route whose `toFhir` skipped the message (`fhir_unsupported`), and
    /// one when nothing was made of the message (no route took it, nothing asked).
    pub dropped: Vec<hl7gw_runtime::proto::v1::Event>,
}

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
    let span = tracing::info_span!(
        "transform",
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.destination.name = tracing::field::Empty,
        messaging.destination.partition.id = tracing::field::Empty,
        messaging.kafka.offset = tracing::field::Empty,
        messaging.consumer.group.name = tracing::field::Empty,
        hl7.message_type = %h.message_type,
        hl7.trigger_event = %h.trigger_event,
        hl7.control_id = %h.control_id,
        hl7.routes = tracing::field::Empty,
        hl7.fhir.unmapped = tracing::field::Empty,
    );
    if let Some(c) = consumed {
        span.record("messaging.destination.name", c.topic);
        span.record(
            "messaging.destination.partition.id",
            c.partition.to_string(),
        );
        span.record("messaging.kafka.offset", c.offset);
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

/// The stage name the transformer writes in envelopes, dead letters and events.
const STAGE: &str = "transformer";

/// The ledger's event for a record the transaction writes: `dead_lettered` for a DLQ record (with its
/// reason), else `routed` (its route, destination and topic).
fn ledger_event(cfg: &Config, r: &OutRecord) -> hl7gw_runtime::proto::v1::Event {
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
fn send_event(
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

/// An output larger than Kafka takes (`kafka.max_message_bytes`, e.g. the JSON of a message near the limit)
/// would fail its transaction on every retry and stop the pod: it goes to the DLQ instead, reason
/// `too_large`. The whole record counts (see [`record_size`]), not the envelope alone: librdkafka refuses a
/// record whose envelope fits but whose key, headers and overhead do not. The dead letter names the input it
/// was made from (`consumed`), so that a replay re-reads it from the inbound topic: the output is not kept.
fn too_large_to_dlq(
    cfg: &Config,
    r: &mut OutRecord,
    consumed: Option<Consumed<'_>>,
    metrics: &TransformerMetrics,
) {
    let max = cfg.kafka.max_message_bytes;
    let size = record_size(&r.envelope, &r.key, &r.traceparent);
    if size <= max {
        return;
    }
    metrics.output_too_large(&r.envelope.route, size, max);
    let detail = format!(
        "output for {} of {size} bytes (record), over the {max}-byte record limit",
        r.topic
    );
    *r = refused_to_dlq(cfg, r, "too_large", detail, false, metrics);
    note_origin(&mut r.envelope, consumed);
}

/// Where `m` was read, for a dead letter's origin.
fn consumed_at<'a>(m: &'a OwnedMessage, cfg: &'a Config) -> Consumed<'a> {
    Consumed {
        topic: m.topic(),
        partition: m.partition(),
        offset: m.offset(),
        group: &cfg.group_id,
    }
}

/// Records in a dead letter where its input was read (unless it names an origin already).
fn note_origin(env: &mut Envelope, consumed: Option<Consumed<'_>>) {
    if let (Some(c), Some(rej)) = (consumed, env.rejection.as_mut())
        && rej.origin_topic.is_empty()
    {
        rej.origin_topic = c.topic.to_owned();
        rej.origin_partition = c.partition;
        rej.origin_offset = c.offset;
    }
}

/// A dead letter, for `reason`, in place of the output `r` Kafka does not take (a dead letter already keeps its
/// own reason): without the message itself when `strip` or when the dead letter would not fit the record limit
/// either (the input stays in the inbound topic).
fn refused_to_dlq(
    cfg: &Config,
    r: &mut OutRecord,
    reason: &'static str,
    detail: String,
    strip: bool,
    metrics: &TransformerMetrics,
) -> OutRecord {
    let mut env = std::mem::take(&mut r.envelope);
    let mut dead = match env.rejection.as_mut() {
        // A dead letter already (e.g. `parse`): it keeps its reason, and goes without the message.
        Some(rej) if r.topic == cfg.dlq_topic => {
            rej.detail = format!("{}; {detail}", rej.detail);
            OutRecord {
                topic: r.topic.clone(),
                key: std::mem::take(&mut r.key),
                envelope: env,
                traceparent: std::mem::take(&mut r.traceparent),
                parent: r.parent.clone(),
            }
        }
        _ => {
            env.rejection = Some(Rejection {
                stage: "transformer".into(),
                reason: reason.into(),
                detail,
                ..Rejection::default()
            });
            dlq(cfg, env, reason, metrics, &r.parent)
        }
    };
    if strip
        || record_size(&dead.envelope, &dead.key, &dead.traceparent) > cfg.kafka.max_message_bytes
    {
        strip_message(&mut dead.envelope);
    }
    dead
}

/// Drops the message from a dead letter, keeping its ids, header and reason, and adds the message's size and
/// SHA-256 to the rejection's detail (to find the input again).
fn strip_message(env: &mut Envelope) {
    let raw = std::mem::take(&mut env.raw);
    if let Some(rej) = env.rejection.as_mut() {
        rej.message_dropped = true;
        rej.detail = format!(
            "{}; the message itself ({} bytes, sha256 {}) is not stored",
            rej.detail,
            raw.len(),
            String::from_utf8_lossy(&envelope::salted_key(b"", &raw)),
        );
    }
}

/// The size Kafka counts for the record of `env` keyed by `key` ([`envelope::record_size`]).
fn record_size(env: &Envelope, key: &str, traceparent: &str) -> usize {
    use prost::Message as _;
    envelope::record_size(env, env.encoded_len(), key.len(), traceparent)
}

/// The dead-letter reason of an error that refuses one record for good (sending it again cannot help): a record
/// over librdkafka's or the topic's size limit, or one the broker finds invalid. `None` for every other error.
fn refused_for_good(e: &KafkaError) -> Option<&'static str> {
    match e.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::MessageBatchTooLarge,
        ) => Some("too_large"),
        Some(RDKafkaErrorCode::InvalidRecord) => Some("invalid_record"),
        _ => None,
    }
}

/// One output of a batch: the input's topic, partition and offset, the output's place among that input's
/// outputs, and its topic. Outputs Kafka refused for good are remembered by it until their input commits.
type OutputId = (String, i32, i64, usize, String);

/// Outputs Kafka refused for good in an earlier attempt at the batch, with the dead-letter reason.
type Refused = std::collections::HashMap<OutputId, &'static str>;

/// Encodes `r` into `buf` and hands it to the producer, inside its `publish` span (a producer span, child of
/// the record's `transform` span) whose trace context the record carries (envelope and headers), so that the
/// egress's `deliver` span is that span's child. The same length as the `transform` span's context the record
/// was sized with.
///
/// Inside the `transform` span too: tracing-opentelemetry ends a span at its last exit, so without entering it
/// here `transform` ended when its routes had run and each `publish` began after its parent's end, which Jaeger
/// flags on the `publish` ("clock skew adjustment ... calculated delta"; issue 37, tests/jaeger.rs of the egress).
/// Now the consumer span lasts until its outputs are handed to the producer.
fn send(
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
    envelope::encode_into(&r.envelope, buf);
    let rec = envelope::record(&r.topic, &r.key, buf, &r.envelope, &r.traceparent);
    let _in = span.enter();
    producer.send_result(rec).map_err(|(e, _)| e)
}

/// The producer span of one output or dead letter (none when the record has no `transform` span). Partition
/// and offset are not on it: the transaction's records are confirmed at its commit, after the span.
fn publish_span(r: &OutRecord) -> tracing::Span {
    if r.parent.is_none() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        parent: &r.parent,
        "publish",
        otel.kind = "producer",
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.destination.name = %r.topic,
        hl7.control_id = r.envelope.header.as_ref().map_or("", |h| h.control_id.as_str()),
        hl7.route = %r.envelope.route,
        hl7.destination = %r.envelope.destination,
    )
}

/// The record of one output for destination `dest`: the transformer's stage and trace context, the
/// destination's topic, keyed by the envelope's key (routed or inbound).
fn output_record(
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

/// When a batch whose first record came at `now` stops gathering: after `linger`, and not before `interval`
/// from the previous batch's start (so transactions start at most 1/interval a second under a steady feed,
/// while a message after a quiet spell waits only `linger`).
fn batch_deadline(
    now: tokio::time::Instant,
    previous: Option<tokio::time::Instant>,
    linger: Duration,
    interval: Duration,
) -> tokio::time::Instant {
    let lingered = now + linger;
    match previous {
        Some(p) if p + interval > lingered => p + interval,
        _ => lingered,
    }
}

/// Payload bytes of the records gathered so far.
fn batch_bytes(batch: &[OwnedMessage]) -> usize {
    batch
        .iter()
        .map(|m| m.payload().map_or(0, <[u8]>::len))
        .sum()
}

fn h_of(env: &Envelope) -> hl7gw_runtime::proto::v1::Header {
    env.header.clone().unwrap_or_default()
}

fn dlq(
    cfg: &Config,
    mut env: Envelope,
    reason: &'static str,
    metrics: &TransformerMetrics,
    parent: &tracing::Span,
) -> OutRecord {
    envelope::push_stage(&mut env, "transformer");
    metrics.dead_lettered(reason);
    let traceparent = envelope::traceparent(&env);
    OutRecord {
        topic: cfg.dlq_topic.clone(),
        key: env.key.clone(),
        envelope: env,
        traceparent,
        parent: parent.clone(),
    }
}

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Creates a transactional producer (always with the same `transactional.id`), for the start and for every
/// recovery from a fatal producer error.
pub type ProducerFactory = Arc<dyn Fn() -> Result<FutureProducer, KafkaError> + Send + Sync>;

/// The worker's part of readiness: down while it cannot commit (retrying a commit, recreating the producer),
/// and while the consumer cannot read the inbound topic (not authorised, missing), each with the reason.
#[derive(Debug)]
pub struct WorkerHealth {
    ok: AtomicBool,
    /// The last error while recovering.
    why: Mutex<String>,
    /// A consumer error that stops all reading, and the rebalance generation it came in: it holds until a
    /// record is read or the assignment changes (librdkafka may report it once only).
    unreadable: Mutex<Option<(u64, String)>>,
}

impl Default for WorkerHealth {
    fn default() -> Self {
        Self {
            ok: AtomicBool::new(true),
            why: Mutex::new(String::new()),
            unreadable: Mutex::new(None),
        }
    }
}

impl WorkerHealth {
    /// True unless the worker is recovering.
    pub fn is_ok(&self) -> bool {
        self.ok.load(Ordering::Acquire)
    }

    /// Why the worker makes the transformer unready, if it does; `generation` is the consumer's now.
    pub fn failure(&self, generation: u64) -> Option<String> {
        if !self.is_ok() {
            let why = self.why.lock().map(|w| w.clone()).unwrap_or_default();
            return Some(format!("recovering: cannot commit to Kafka yet ({why})"));
        }
        let unreadable = self.unreadable.lock().ok()?;
        match unreadable.as_ref() {
            Some((g, e)) if *g == generation => Some(format!("cannot read the inbound topic: {e}")),
            _ => None,
        }
    }

    fn set_unreadable(&self, v: Option<(u64, String)>) {
        if let Ok(mut u) = self.unreadable.lock() {
            *u = v;
        }
    }
}

/// The consume-transform-produce loop.
pub struct Worker<P> {
    pub cfg: Arc<Config>,
    pub consumer: Arc<Consumer_>,
    pub producer: FutureProducer,
    /// Makes a new producer when the current one failed fatally.
    pub make_producer: ProducerFactory,
    pub live: Arc<LiveRoutes>,
    pub plugins: Arc<P>,
    pub metrics: TransformerMetrics,
    /// Readiness, dropped at once when the worker starts recovering.
    pub readiness: Arc<hl7gw_runtime::admin::Health>,
    pub health: Arc<WorkerHealth>,
}

impl<P> std::fmt::Debug for Worker<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").finish_non_exhaustive()
    }
}

impl<P: PluginCaller + 'static> Worker<P> {
    /// Runs until `stop`; the batch in hand when it fires is finished and committed first.
    ///
    /// Transaction errors follow librdkafka's rules: a retriable error (a commit that timed out while the
    /// coordinator is unreachable) retries the same call; an abortable one aborts and reads the batch again; a
    /// fatal one (fenced, or an abort that cannot finish) closes the producer, makes a new one with the same
    /// `transactional.id` and rewinds the consumer to the committed offsets. The process never exits for them;
    /// readiness is down while it recovers, and the retries back off (200 ms doubling to 10 s).
    pub async fn run(mut self, stop: CancellationToken) -> Result<(), WorkerError> {
        let timeout = self.cfg.transaction_timeout;
        let p = self.producer.clone();
        blocking(move || p.init_transactions(timeout)).await?;
        tracing::info!("transactions initialised");
        // Nothing is consumed before the first complete route list: a message read earlier would be routed
        // by no route at all (while the API server is slow or the routes file is missing).
        if !self.live.is_loaded() {
            tracing::warn!("waiting for the routes before consuming");
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = self.live.wait_loaded() => {}
        }
        crate::ensure_destinations(
            &self.cfg,
            &self.live,
            &mut std::collections::BTreeSet::new(),
        )
        .await;
        self.consumer.subscribe(&[&self.cfg.inbound_topic])?;
        tracing::info!(topic = %self.cfg.inbound_topic, "routes loaded: consuming");
        let mut buf = Vec::new();
        let mut refused = Refused::new();
        let mut backoff = Backoff::default();
        let mut errors = ErrorLog::default();
        let mut last_start: Option<tokio::time::Instant> = None;
        while !stop.is_cancelled() {
            let (batch, generation) = self.gather(&stop, &mut errors, last_start).await?;
            if batch.is_empty() {
                continue;
            }
            last_start = Some(tokio::time::Instant::now());
            if self.consumer.context().generation() != generation {
                // Partitions moved while gathering: read the batch again from its first records (a partition
                // that left this pod is read by its new owner from the committed offset).
                tracing::info!(
                    records = batch.len(),
                    "rebalance during a batch: reading it again"
                );
                self.rewind(&batch).await;
                continue;
            }
            match self.transact(&batch, &mut buf, &mut refused).await {
                Ok(done) => {
                    backoff.reset();
                    self.set_recovering(None);
                    if done < batch.len() {
                        // The batch reached its time budget: what was routed is committed, the rest is read
                        // again.
                        self.metrics.batch_cut(done, batch.len() - done);
                        self.rewind(&batch[done..]).await;
                    }
                }
                Err(e) => {
                    self.metrics.aborted(&e);
                    self.set_recovering(Some(&e));
                    let aborted = if is_fatal(&e) {
                        false
                    } else {
                        match self.abort().await {
                            Ok(()) => true,
                            Err(e2) => {
                                tracing::warn!(error = %e2, "the transaction cannot be aborted");
                                false
                            }
                        }
                    };
                    if aborted {
                        self.rewind(&batch).await;
                    } else {
                        self.recover(&stop).await;
                    }
                    let wait = backoff.next();
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// Readiness down for `error` (at once, not at the next probe), or up again with `None`.
    fn set_recovering(&self, error: Option<&dyn std::fmt::Display>) {
        let Some(e) = error else {
            self.health.ok.store(true, Ordering::Release);
            return;
        };
        if let Ok(mut why) = self.health.why.lock() {
            *why = e.to_string();
        }
        // The flag first: the readiness probe loop reads it before it sets readiness.
        self.health.ok.store(false, Ordering::Release);
        if let Some(reason) = self.health.failure(0) {
            self.readiness.set_dependency(Err(reason));
        }
    }

    /// Calls a transactional API again while librdkafka says its error is retriable ("retry call to resume":
    /// the coordinator did not answer in time). Other errors are returned.
    async fn retrying<F>(&self, what: &'static str, call: F) -> Result<(), KafkaError>
    where
        F: Fn(&FutureProducer, &Consumer_, Duration) -> Result<(), KafkaError>
            + Clone
            + Send
            + 'static,
    {
        let mut backoff = Backoff::default();
        loop {
            let (p, c, f) = (self.producer.clone(), self.consumer.clone(), call.clone());
            let timeout = self.cfg.transaction_timeout;
            // librdkafka can block past its own timeout here (send_offsets_to_transaction while the group
            // coordinator's broker is gone: librdkafka issues #5456, #5511). A call that has not returned well
            // after its timeout is abandoned on its blocking thread and the producer treated as broken: the
            // caller recreates it (fencing the stuck one) instead of waiting forever.
            let limit = timeout * 2 + STUCK_MARGIN;
            let abandoned = &self.metrics.abandoned_calls;
            let Some(result) = blocking_within(limit, abandoned, move || f(&p, &c, timeout)).await
            else {
                self.metrics.stuck_calls.inc();
                tracing::warn!(
                    call = what,
                    timeout = ?timeout,
                    "librdkafka did not return from a transactional call: recreating the producer"
                );
                return Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fatal));
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) if is_retriable(&e) => {
                    self.set_recovering(Some(&e));
                    tracing::warn!(call = what, error = %e, "retriable transaction error: calling again");
                    tokio::time::sleep(backoff.next()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Aborts the open transaction (retrying while retriable).
    async fn abort(&self) -> Result<(), KafkaError> {
        self.retrying("abort_transaction", |p, _, t| p.abort_transaction(t))
            .await
    }

    /// Replaces a producer that failed fatally (or whose transaction cannot be finished) by a new one with the
    /// same `transactional.id` (its `init_transactions` fences the old one and settles its open transaction),
    /// then seeks the consumer to the committed offsets, so the records of an unfinished transaction are read
    /// again and those of a committed one are not. Retries until it worked or `stop`.
    async fn recover(&mut self, stop: &CancellationToken) {
        self.set_recovering(Some(&"recreating the transactional producer"));
        self.metrics.producer_recoveries.inc();
        tracing::warn!("recreating the transactional producer");
        let mut backoff = Backoff::default();
        loop {
            if stop.is_cancelled() {
                return;
            }
            match (self.make_producer)() {
                Ok(fresh) => {
                    let old = std::mem::replace(&mut self.producer, fresh);
                    // Closing a producer may block (it purges its queues): off the async workers.
                    tokio::task::spawn_blocking(move || drop(old));
                    let p = self.producer.clone();
                    let timeout = self.cfg.transaction_timeout;
                    let limit = timeout * 2 + STUCK_MARGIN;
                    let abandoned = &self.metrics.abandoned_calls;
                    match blocking_within(limit, abandoned, move || p.init_transactions(timeout))
                        .await
                    {
                        Some(Ok(())) => break,
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "the new producer cannot initialise transactions yet");
                            self.set_recovering(Some(&format_args!(
                                "recreating the transactional producer: {e}"
                            )));
                        }
                        None => {
                            self.metrics.stuck_calls.inc();
                            tracing::warn!(
                                "init_transactions did not return: trying a new producer"
                            );
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot create a producer"),
            }
            tokio::time::sleep(backoff.next()).await;
        }
        loop {
            if stop.is_cancelled() {
                return;
            }
            let c = self.consumer.clone();
            match blocking(move || rewind_to_committed(&c)).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot rewind to the committed offsets yet");
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        }
        tracing::info!("transactional producer recreated; reading from the committed offsets");
    }

    /// Waits for one record, then takes what else arrives within `batch_linger` (and until `batch_interval`
    /// after the previous batch's start, `previous`), up to `batch_max` records and `batch_max_bytes` of
    /// payload. Returns the batch and the rebalance generation its first record was read in.
    async fn gather(
        &self,
        stop: &CancellationToken,
        errors: &mut ErrorLog,
        previous: Option<tokio::time::Instant>,
    ) -> Result<(Vec<OwnedMessage>, u64), WorkerError> {
        let mut batch = Vec::new();
        let first = tokio::select! {
            _ = stop.cancelled() => return Ok((batch, 0)),
            m = self.consumer.recv() => m,
        };
        // A rebalance runs inside `recv`, before it returns a record of the new assignment.
        let generation = self.consumer.context().generation();
        match first {
            Ok(m) => {
                batch.push(m.detach());
                self.health.set_unreadable(None);
            }
            Err(e) => {
                errors.log(&e);
                if hl7gw_runtime::kafka::stops_reading(&e) {
                    self.health
                        .set_unreadable(Some((generation, e.to_string())));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Ok((batch, generation));
            }
        }
        let deadline = batch_deadline(
            tokio::time::Instant::now(),
            previous,
            self.cfg.batch_linger,
            self.cfg.batch_interval,
        );
        let mut bytes = batch_bytes(&batch);
        while batch.len() < self.cfg.batch_max && bytes < self.cfg.batch_max_bytes {
            match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                Err(_) => break,
                Ok(Ok(m)) => {
                    bytes += m.payload_len();
                    batch.push(m.detach());
                }
                Ok(Err(e)) => {
                    errors.log(&e);
                    break;
                }
            }
        }
        Ok((batch, generation))
    }

    /// Routes the batch, then produces its records and offsets in one transaction. Routing (plugin calls
    /// included) happens before the transaction starts, so it does not count against the broker's
    /// `transaction.timeout.ms`; and it is bounded by [`Config::batch_time_budget`]: past the budget the
    /// records routed so far are committed and the count of them is returned (the caller reads the rest again).
    /// The first record is always routed whole (each plugin call bounded by its own timeout), so a batch
    /// always makes progress.
    async fn transact(
        &self,
        batch: &[OwnedMessage],
        buf: &mut Vec<u8>,
        refused: &mut Refused,
    ) -> Result<usize, KafkaError> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.cfg.batch_time_budget();
        let routes = self.live.get();
        let mut routed: Vec<Routed> = Vec::with_capacity(batch.len());
        for m in batch {
            let consumed = Consumed {
                topic: m.topic(),
                partition: m.partition(),
                offset: m.offset(),
                group: &self.cfg.group_id,
            };
            let one = route_consumed(
                &self.cfg,
                &routes,
                m.payload().unwrap_or_default(),
                Some(consumed),
                self.plugins.as_ref(),
                &self.metrics,
            );
            let r = if routed.is_empty() {
                one.await
            } else {
                match tokio::time::timeout_at(deadline, one).await {
                    Ok(r) => r,
                    Err(_) => break,
                }
            };
            routed.push(r);
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        let done = routed.len();
        let routed_at = started.elapsed();
        let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for m in &batch[..done] {
            next.insert((m.topic().to_owned(), m.partition()), m.offset() + 1);
        }
        self.producer.begin_transaction()?;
        let outputs = routed.iter().map(|r| r.records.len()).sum();
        let mut deliveries = Vec::with_capacity(outputs);
        let mut ids: Vec<OutputId> = Vec::with_capacity(outputs);
        // The ledger's events go in the same transaction as what they describe: committed with it or not at all.
        let events_topic = self
            .cfg
            .ledger
            .enabled()
            .then_some(self.cfg.ledger.topic.as_str());
        let mut events = Vec::new();
        let mut ebuf = Vec::new();
        for (m, one) in batch.iter().zip(routed) {
            if let Some(topic) = events_topic {
                for e in &one.dropped {
                    events.push(send_event(&self.producer, topic, e, &mut ebuf)?);
                }
            }
            for (j, mut r) in one.records.into_iter().enumerate() {
                let id: OutputId = (
                    m.topic().to_owned(),
                    m.partition(),
                    m.offset(),
                    j,
                    r.topic.clone(),
                );
                if let Some(&reason) = refused.get(&id) {
                    // The broker refused it in an earlier attempt: a dead letter, without the message (the
                    // DLQ topic may be as small).
                    let detail = format!("Kafka refused the output for {} ({reason})", r.topic);
                    r = refused_to_dlq(&self.cfg, &mut r, reason, detail, true, &self.metrics);
                    note_origin(&mut r.envelope, Some(consumed_at(m, &self.cfg)));
                }
                let delivery = match send(&self.producer, &mut r, buf) {
                    Ok(d) => {
                        if let Some(topic) = events_topic {
                            let e = ledger_event(&self.cfg, &r);
                            events.push(send_event(&self.producer, topic, &e, &mut ebuf)?);
                        }
                        d
                    }
                    Err(e) => match refused_for_good(&e) {
                        // librdkafka refused it at once (its own size check): the dead letter goes in its place.
                        Some(reason) => {
                            let size = record_size(&r.envelope, &r.key, &r.traceparent);
                            self.metrics.output_refused(&r.envelope.route, size, &e);
                            let detail = format!("Kafka refused the output for {}: {e}", r.topic);
                            let mut dead = refused_to_dlq(
                                &self.cfg,
                                &mut r,
                                reason,
                                detail,
                                true,
                                &self.metrics,
                            );
                            note_origin(&mut dead.envelope, Some(consumed_at(m, &self.cfg)));
                            let d = send(&self.producer, &mut dead, buf)?;
                            if let Some(topic) = events_topic {
                                let e = ledger_event(&self.cfg, &dead);
                                events.push(send_event(&self.producer, topic, &e, &mut ebuf)?);
                            }
                            d
                        }
                        None => return Err(e),
                    },
                };
                deliveries.push(delivery);
                ids.push(id);
            }
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), offset) in next {
            offsets.add_partition_offset(&topic, partition, Offset::Offset(offset))?;
        }
        let offsets_sent = self
            .retrying("send_offsets_to_transaction", move |p, c, t| {
                let meta = c.group_metadata().ok_or(KafkaError::ConsumerCommit(
                    rdkafka::types::RDKafkaErrorCode::State,
                ))?;
                p.send_offsets_to_transaction(&offsets, &meta, t)
            })
            .await;
        if let Err(e) = offsets_sent {
            // A record the broker refused fails the transaction; its report is in (or about to be): note it
            // so the next attempt dead-letters it.
            if let Ok(reports) = tokio::time::timeout(
                Duration::from_secs(1),
                futures_util::future::join_all(deliveries),
            )
            .await
            {
                self.note_refused(&reports, ids, refused);
            }
            return Err(e);
        }
        // The deliveries are awaited here, not inside the commit: rdkafka's flush, which the commit starts with,
        // polls in steps of 100 ms while another thread serves the delivery reports, so each commit that still had
        // records in flight took 100 ms more (measured: 100-110 ms per transaction, docs/BENCHMARKS.md). A failed
        // delivery fails the commit, which aborts as before; librdkafka's own timeout bounds the wait.
        // An output reported delivered without an offset was only inferred to be written (librdkafka's implicit
        // ack; runtime delivery.rs, `confirmed`): abort rather than commit the inputs without it.
        let reports = futures_util::future::join_all(deliveries).await;
        // An output the broker refused for good (larger than the topic takes, an invalid record) would fail
        // every attempt at the batch: the next attempt dead-letters it instead.
        if self.note_refused(&reports, ids, refused) {
            return Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge,
            ));
        }
        if reports
            .iter()
            .any(|r| matches!(r, Ok(Ok(d)) if d.offset < 0))
        {
            return Err(KafkaError::MessageProduction(
                rdkafka::types::RDKafkaErrorCode::Inconsistent,
            ));
        }
        // An event not written fails the batch like an output: the ledger must miss nothing that commits.
        for r in futures_util::future::join_all(events).await {
            match r {
                Ok(Ok(d)) if d.offset >= 0 => {}
                Ok(Ok(_)) => {
                    return Err(KafkaError::MessageProduction(
                        RDKafkaErrorCode::Inconsistent,
                    ));
                }
                Ok(Err((e, _))) => return Err(e),
                Err(_) => return Err(KafkaError::Canceled),
            }
        }
        // A record is released just after its delivery callback ran: until then the flush still counts it.
        let settled = tokio::time::Instant::now() + Duration::from_millis(20);
        while self.producer.in_flight_count() > 0 && tokio::time::Instant::now() < settled {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let offsets_at = started.elapsed();
        self.retrying("commit_transaction", |p, _, t| p.commit_transaction(t))
            .await?;
        self.metrics
            .committed(done, started.elapsed(), routed_at, offsets_at);
        // What was refused of the committed inputs is done with.
        refused.retain(|(topic, partition, offset, ..), _| {
            batch[done..]
                .iter()
                .any(|m| m.partition() == *partition && m.offset() == *offset && m.topic() == topic)
        });
        Ok(done)
    }

    /// Remembers the outputs whose delivery `reports` (in the order of `ids`) say Kafka refused them for good;
    /// true when there was one. The broker refuses a whole produce batch at once, so of the outputs of one topic
    /// refused together only the largest is taken for the culprit: the others are sent again (and, should they
    /// be refused again, the largest of those is next).
    fn note_refused<C>(
        &self,
        reports: &[Result<rdkafka::producer::future_producer::OwnedDeliveryResult, C>],
        ids: Vec<OutputId>,
        refused: &mut Refused,
    ) -> bool {
        let mut culprits: BTreeMap<String, (usize, OutputId, &'static str)> = BTreeMap::new();
        for (report, id) in reports.iter().zip(ids) {
            if let Ok(Err((e, m))) = report
                && let Some(reason) = refused_for_good(e)
            {
                tracing::warn!(topic = %id.4, error = %e, "Kafka refused an output for good");
                let size = m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len);
                match culprits.get(&id.4) {
                    Some((largest, ..)) if *largest >= size => {}
                    _ => {
                        culprits.insert(id.4.clone(), (size, id, reason));
                    }
                }
            }
        }
        let any = !culprits.is_empty();
        for (_, (_, id, reason)) in culprits {
            refused.insert(id, reason);
        }
        any
    }

    /// Seeks each partition of an aborted batch back to its first record.
    async fn rewind(&self, batch: &[OwnedMessage]) {
        let mut first: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for m in batch {
            first
                .entry((m.topic().to_owned(), m.partition()))
                .or_insert(m.offset());
        }
        // `seek` blocks (up to its timeout): off the async workers.
        let consumer = self.consumer.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for ((topic, partition), offset) in first {
                if let Err(e) = consumer.seek(
                    &topic,
                    partition,
                    Offset::Offset(offset),
                    Duration::from_secs(5),
                ) {
                    tracing::warn!(error = %e, partition, "seek back failed");
                }
            }
        })
        .await;
    }
}

/// How much longer than twice `transaction_timeout` a transactional call may block before it counts as stuck.
const STUCK_MARGIN: Duration = Duration::from_secs(5);

/// A fatal producer error: the producer cannot be used again (fenced, or an unrecoverable idempotence error).
fn is_fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => t.is_fatal(),
        _ => e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal),
    }
}

/// An error after which librdkafka says the same transactional call may be made again.
fn is_retriable(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => t.is_retriable() && !t.is_fatal() && !t.txn_requires_abort(),
        _ => false,
    }
}

/// Seeks every assigned partition to the group's committed offset (the beginning where none is committed,
/// as `auto.offset.reset: earliest`). Blocking.
fn rewind_to_committed(c: &Consumer_) -> Result<(), KafkaError> {
    let assignment = c.assignment()?;
    if assignment.count() == 0 {
        return Ok(());
    }
    let committed = c.committed_offsets(assignment, Duration::from_secs(10))?;
    for e in committed.elements() {
        let offset = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        c.seek(e.topic(), e.partition(), offset, Duration::from_secs(5))?;
    }
    Ok(())
}

/// Consumer errors (the broker is away: librdkafka reconnects by itself) logged once per 10 s with the count
/// since the last line, not every 100 ms.
#[derive(Debug, Default)]
struct ErrorLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl ErrorLog {
    fn log(&mut self, e: &KafkaError) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(error = %e, suppressed = self.suppressed, "consumer error");
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }
}

/// Waits between retries: 200 ms doubling to 10 s, with up to a quarter added at random so pods that failed
/// together do not retry together.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(10);

    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(Self::MAX);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.subsec_nanos())
            .unwrap_or(0);
        d + d / 4 * (nanos % 1000) / 1000
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// [`blocking`], given up after `limit`: `None` when the call has not returned by then (it keeps its blocking
/// thread, and what it captured, until it does). `abandoned` counts the calls given up on that have not
/// returned yet.
async fn blocking_within<T: Send + 'static>(
    limit: Duration,
    abandoned: &Gauge,
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Option<Result<T, KafkaError>> {
    // Set by whichever of the two ends first: the call returning, or the wait for it being given up.
    let ended = Arc::new(AtomicBool::new(false));
    let (ended_in_call, gauge) = (ended.clone(), abandoned.clone());
    let call = blocking(move || {
        let r = f();
        if ended_in_call.swap(true, Ordering::AcqRel) {
            // Given up on earlier: it has returned now.
            gauge.dec();
        }
        r
    });
    match tokio::time::timeout(limit, call).await {
        Ok(r) => Some(r),
        Err(_) => {
            if !ended.swap(true, Ordering::AcqRel) {
                abandoned.inc();
            }
            None
        }
    }
}

/// Most transactional calls given up on and still not returned before the transformer reports unready: each
/// holds a blocking thread and a whole producer, so past a few of them a restart is the way out.
pub const MAX_ABANDONED_CALLS: i64 = 4;

/// The readiness failure for `abandoned` outstanding abandoned calls, if it is over [`MAX_ABANDONED_CALLS`].
pub fn abandoned_reason(abandoned: i64) -> Option<String> {
    (abandoned > MAX_ABANDONED_CALLS).then(|| {
        format!(
            "{abandoned} librdkafka calls given up on have not returned (bound {MAX_ABANDONED_CALLS}); each holds \
             a thread and a producer: restart the pod"
        )
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}

/// Most unmapped ids a span attribute lists: a message of a thousand Z-segments must not make a span of
/// kilobytes (the metric counts them all).
const MAX_UNMAPPED_IN_SPAN: usize = 32;

/// `hl7.fhir.unmapped`: the first [`MAX_UNMAPPED_IN_SPAN`] ids, comma-separated, and how many more.
fn unmapped_attribute(ids: &[String]) -> String {
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
    use super::*;
    use crate::engine::{Plugin, Route};
    use crate::route::HL7RouteSpec;
    use hl7gw_runtime::proto::v1::TransformRequest;

    #[test]
    fn the_unmapped_span_attribute_is_bounded() {
        let ids: Vec<String> = (0..1000).map(|i| format!("Z{i:02}")).collect();
        let a = unmapped_attribute(&ids);
        assert!(a.len() < 400, "{} bytes", a.len());
        assert!(a.ends_with(",... (968 more)"), "{a}");
        assert_eq!(unmapped_attribute(&ids[..2]), "Z00,Z01");
    }

    #[test]
    fn a_batch_gathers_until_the_interval_since_the_previous_start() {
        let t = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        // A steady feed: the previous batch started 2 ms ago, so this one gathers until 20 ms after it.
        assert_eq!(
            batch_deadline(t, Some(t - ms(2)), ms(5), ms(20)),
            t + ms(18)
        );
        // After a quiet spell (or with the interval off) only the linger counts.
        assert_eq!(
            batch_deadline(t, Some(t - ms(500)), ms(5), ms(20)),
            t + ms(5)
        );
        assert_eq!(batch_deadline(t, None, ms(5), ms(20)), t + ms(5));
        assert_eq!(batch_deadline(t, Some(t), ms(5), ms(0)), t + ms(5));
    }

    /// A librdkafka call stuck past its own timeout (librdkafka#5456) is given up on, not waited for forever;
    /// issue 24, item 16: it is counted as abandoned until it returns.
    #[tokio::test]
    async fn a_stuck_blocking_call_is_given_up_on() {
        let abandoned = Gauge::default();
        let started = Instant::now();
        let r = blocking_within(Duration::from_millis(100), &abandoned, || {
            std::thread::sleep(Duration::from_millis(1500));
            Ok(())
        })
        .await;
        assert!(r.is_none());
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(abandoned.get(), 1, "outstanding while it has not returned");
        let r = blocking_within(Duration::from_secs(5), &abandoned, || Ok(7)).await;
        assert!(matches!(r, Some(Ok(7))));
        assert_eq!(
            abandoned.get(),
            1,
            "a call that returned in time is not counted"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while abandoned.get() != 0 {
            assert!(Instant::now() < deadline, "still counted after it returned");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Issue 24, item 7: readiness names why the worker cannot go on: the error it is recovering from, or a
    /// consumer error that stops all reading, until the assignment changes or a record is read.
    #[test]
    fn worker_health_names_the_error() {
        let h = WorkerHealth::default();
        assert_eq!(h.failure(1), None);
        h.set_unreadable(Some((1, "Broker: Topic authorization failed".into())));
        let why = h.failure(1).expect("unready");
        assert!(why.contains("Topic authorization failed"), "{why}");
        assert_eq!(h.failure(2), None, "the assignment changed since");
        h.set_unreadable(None);
        *h.why.lock().unwrap() = "Broker: Transactional Id authorization failed".into();
        h.ok.store(false, Ordering::Release);
        let why = h.failure(1).expect("unready");
        assert!(
            why.contains("recovering") && why.contains("Transactional Id"),
            "{why}"
        );
    }

    /// Issue 24, item 16: more abandoned calls than the bound make the transformer unready, with the reason.
    #[test]
    fn abandoned_calls_past_the_bound_make_the_transformer_unready() {
        assert_eq!(abandoned_reason(0), None);
        assert_eq!(abandoned_reason(MAX_ABANDONED_CALLS), None);
        let why = abandoned_reason(MAX_ABANDONED_CALLS + 1).expect("unready");
        assert!(why.contains("5 librdkafka calls"), "{why}");
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
        assert_eq!(refused_for_good(&e), Some("too_large"));
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
