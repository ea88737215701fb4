//! One message's way through the ingress, shared by MLLP and gRPC: parse and validate the header, answer
//! duplicates from memory, wrap the frame in an `Envelope`, publish it keyed by patient, and decide the ACK.
//!
//! `submit` does everything that needs no waiting and returns a [`Pending`]; `resolve` waits for Kafka's
//! delivery report (durable mode) so a connection can keep several messages in flight and still answer them
//! in order. The ACK bytes are written by `render` into the caller's reused buffer.
//!
//! This module holds the types and the helpers the three steps share; `accept` (submit), `publish` (resolve,
//! the dead-letter path) and `ack` (render) are the steps.

mod accept;
mod ack;
mod publish;

use crate::budget::Budget;
use crate::config::{AcceptAck, AckMode, Config, OnTimeout};
use crate::metrics::{IngressMetrics, MsgType, ReasonLabels, outcome};
pub use crate::origin::Origin;
pub(crate) use crate::origin::Who;
use bytes::Bytes;
use hl7gw_runtime::dedup::{Claim, Claimed, Dedup, FirstCopy, Key};
use hl7gw_runtime::envelope;
use hl7gw_runtime::kafka::delivery::DeliveryFuture;
use hl7gw_runtime::kafka::errors::{is_fatal, is_too_large};
use hl7gw_runtime::kafka::producer::ProducerSlot;
use hl7gw_runtime::proto::v1::{Envelope, Rejection, Source, Stage, TraceContext};
use hl7v2::ack::{
    AckCode, AckError, AckIds, ErrorLocation, MAX_CODE, MAX_CONTROL_ID, MAX_HD,
    MAX_PROCESSING_FIELD, MAX_VERSION_FIELD, Outcome, Severity, accept_ack_wanted, ack_code,
    application_ack_code, application_ack_wanted, hl7_timestamp, write_ack,
};
use hl7v2::{Charset, ErrorCode, Header, Message};
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureRecord, Producer as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};
use tracing::Span;

/// Why a message gets a negative answer, as the ERR segment and the DLQ record say it.
#[derive(Debug, Clone)]
pub struct Rejected {
    pub outcome: Outcome,
    pub code: ErrorCode,
    /// Bounded label: metrics, logs, DLQ record.
    pub reason: &'static str,
    /// Text for the sender (no message content).
    pub text: String,
    pub location: Option<(&'static [u8], usize)>,
}

impl Rejected {
    /// AE/CE: the message is wrong; the sender must fix it, not resend it.
    pub fn error(code: ErrorCode, reason: &'static str, text: impl Into<String>) -> Self {
        Self::new(Outcome::Error, code, reason, text.into())
    }

    /// AR/CR: refused as it stands (a version, processing id or character set not taken, or resend later).
    pub fn reject(code: ErrorCode, reason: &'static str, text: impl Into<String>) -> Self {
        Self::new(Outcome::Reject, code, reason, text.into())
    }

    /// The ERR segment of the answer: this rejection's code, text and location (the first repetition).
    pub(crate) fn ack_error(&self) -> AckError<'_> {
        AckError {
            code: self.code,
            severity: Severity::Error,
            text: &self.text,
            location: self.location.map(|(segment, field)| ErrorLocation {
                segment,
                sequence: 1,
                field,
            }),
        }
    }

    fn new(outcome: Outcome, code: ErrorCode, reason: &'static str, text: String) -> Self {
        Self {
            outcome,
            code,
            reason,
            text,
            location: None,
        }
    }

    /// The ERR segment points at MSH-`field`.
    pub fn at_msh(self, field: usize) -> Self {
        Self {
            location: Some((b"MSH", field)),
            ..self
        }
    }
}

/// What to answer.
#[derive(Debug)]
pub enum Action {
    /// Accepted (stored, or parsed in fast mode).
    Accept,
    /// Refused with a reason.
    Reject(Rejected),
    /// An FHS/BHS batch: each message answered on its own, the answers sent as one acknowledgment batch.
    Batch(Box<BatchReply>),
    /// The first ACK of a duplicate, sent again.
    Replay(Bytes),
    /// Kafka did not confirm in time and the config says close: no answer, close the connection.
    Close,
}

/// The answer to one message, before its bytes are written.
#[derive(Debug)]
pub struct Reply {
    pub action: Action,
    /// The payload as received (its MSH is read again to address the ACK).
    pub frame: Bytes,
    /// The envelope published, if any.
    pub envelope_id: String,
    ticket: Option<Ticket>,
}

/// What the duplicate window needs to remember an accepted message once that is safe: its key, the digest
/// of its bytes, and in fast mode the meeting point of the ACK and Kafka's confirmation.
#[derive(Debug)]
pub struct Ticket {
    key: Key,
    digest: u64,
    fast: Option<Arc<FastStore>>,
    /// Held while the message is in flight (durable mode; fast mode keeps it in its [`FastStore`]), so a resend
    /// waits for this copy instead of publishing again.
    claim: Option<Claim>,
}

/// Fast mode answers before Kafka confirms, so a message is remembered only once both its ACK was written
/// and Kafka stored it: a resend of a message Kafka never took is published again, not answered from memory.
#[derive(Debug, Default)]
struct FastStore {
    state: Mutex<FastState>,
    claim: Mutex<Option<Claim>>,
}

#[derive(Debug, Default)]
enum FastState {
    #[default]
    Waiting,
    Acked(Bytes),
    Stored,
    Failed,
}

impl FastStore {
    /// The ACK was written; returns it when Kafka already confirmed (remember it now).
    fn acked(&self, ack: Bytes) -> Option<Bytes> {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match *g {
            FastState::Stored => Some(ack),
            FastState::Waiting => {
                *g = FastState::Acked(ack);
                None
            }
            FastState::Acked(_) | FastState::Failed => None,
        }
    }

    /// Kafka confirmed; returns the ACK when it was already written (remember it now).
    fn stored(&self) -> Option<Bytes> {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *g, FastState::Stored) {
            FastState::Acked(ack) => Some(ack),
            _ => None,
        }
    }

    fn failed(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = FastState::Failed;
        drop(self.take_claim());
    }

    /// The claim, to release once the message is remembered (or failed).
    fn take_claim(&self) -> Option<Claim> {
        self.claim.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// One message waiting for Kafka in the `in_flight` gauge, for as long as it is held: a message dropped
/// unanswered (peer gone, gRPC call cancelled) leaves the gauge with it.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl InFlight {
    fn new(g: &Gauge) -> Self {
        g.inc();
        Self(g.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Reply {
    /// The reason label for a negative answer ("" when accepted).
    pub fn reason(&self) -> &'static str {
        match &self.action {
            Action::Reject(r) => r.reason,
            Action::Close => "kafka_timeout",
            _ => "",
        }
    }
}

/// The answers to a batch's messages, each rendered as soon as it was known (so its duplicate-window claim
/// is released then, not when the whole batch is), and what the acknowledgment batch's header echoes.
#[derive(Debug)]
pub struct BatchReply {
    /// Each message's ACK (when it asks for one) and code.
    acks: Vec<(Vec<u8>, AckCode)>,
    /// Each message and its answer's code, asked for or not (the sender view counts them).
    answered: Vec<(Bytes, Option<AckCode>)>,
    all_accepted: bool,
    header: BatchHeader,
}

impl BatchReply {
    /// True when every message of the batch was accepted (or was a resend of an accepted one).
    pub fn all_accepted(&self) -> bool {
        self.all_accepted
    }
}

/// FHS/BHS fields the acknowledgment batch answers with: sender and receiver swapped, and the original
/// control ids as reference (FHS-12, BHS-12).
#[derive(Debug, Clone, Default)]
pub struct BatchHeader {
    delims: hl7v2::Delimiters,
    file: Option<[Vec<u8>; 5]>,
    batch: Option<[Vec<u8>; 5]>,
}

impl BatchHeader {
    fn read(split: &hl7v2::Split<'_>) -> Self {
        // Fields 3-6 (sending/receiving application/facility) and 11 (control id).
        let ids = |s: &hl7v2::Segment<'_>| {
            [3, 4, 5, 6, 11].map(|n| s.field(n).map(|v| v.raw().to_vec()).unwrap_or_default())
        };
        Self {
            delims: split.delims,
            file: split.file_header.as_ref().map(ids),
            batch: split.batch_header.as_ref().map(ids),
        }
    }
}

/// A message whose answer may still depend on Kafka.
pub enum Pending {
    /// A batch's messages, each submitted on its own.
    Batch {
        frame: Bytes,
        parts: Vec<Pending>,
        header: BatchHeader,
    },
    Ready(Reply),
    /// A resend of a message still in flight: answered with the first copy's ACK once it has one.
    Waiting {
        frame: Bytes,
        first: tokio::sync::watch::Receiver<FirstCopy>,
        started: Instant,
        msg_type: MsgType,
    },
    Publishing(Publish),
}

/// A record handed to the producer (durable mode): its delivery report decides the answer.
pub struct Publish {
    frame: Bytes,
    delivery: DeliveryFuture,
    started: Instant,
    envelope_id: String,
    ticket: Option<Ticket>,
    msg_type: MsgType,
    span: Span,
    in_flight: InFlight,
    /// Peer, listener and protocol, for the log lines (and a dead letter's source) of a NAK decided by
    /// Kafka's answer.
    peer: Arc<str>,
    listener: Arc<str>,
    protocol: &'static str,
}

/// The shared per-process message pipeline.
pub struct Pipeline {
    cfg: Arc<Config>,
    producer: Arc<ProducerSlot>,
    dedup: Arc<Dedup>,
    /// The bytes all connections and streams together may hold.
    pub budget: Arc<Budget>,
    pub metrics: IngressMetrics,
    /// The live view of senders and connections (`Ingest/Senders`).
    pub senders: Arc<crate::senders::Senders>,
    key_paths: Vec<hl7v2::Path>,
    /// `key_salt_file`'s content: keys are salted hashes.
    key_salt: Option<Vec<u8>>,
    fallback: Charset,
    pod: String,
    ack_prefix: [u8; 8],
    ack_seq: AtomicU64,
}

impl Pipeline {
    /// Builds the pipeline (the config was validated; `key_salt` is `key_salt_file`'s content).
    pub fn new(
        cfg: Arc<Config>,
        producer: Arc<ProducerSlot>,
        metrics: IngressMetrics,
        key_salt: Option<Vec<u8>>,
    ) -> Self {
        let key_paths = cfg
            .key_paths
            .iter()
            .filter_map(|p| hl7v2::Path::parse(p).ok())
            .collect();
        let fallback =
            Charset::from_msh18(cfg.charset_fallback.as_bytes()).unwrap_or(Charset::Utf8);
        let start = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut ack_prefix = [0u8; 8];
        let digits = b"0123456789ABCDEFGHIJKLMNOPQRSTUV";
        let mut v = start ^ u64::from(std::process::id()).rotate_left(40);
        for b in ack_prefix.iter_mut() {
            *b = digits[(v & 31) as usize];
            v >>= 5;
        }
        let total = cfg.in_flight_budget(hl7gw_runtime::memory::limit());
        metrics.in_flight_budget_bytes.set(total as i64);
        let budget = Arc::new(Budget::new(
            total,
            cfg.max_connections
                .saturating_mul(crate::budget::FLOOR_MESSAGE_BYTES),
            metrics.in_flight_bytes.clone(),
            metrics.budget_waits.clone(),
        ));
        Self {
            senders: Arc::new(crate::senders::Senders::new(&cfg, metrics.clone())),
            dedup: Arc::new(Dedup::new(
                cfg.duplicate_window,
                cfg.duplicate_capacity,
                cfg.duplicate_max_bytes,
            )),
            budget,
            cfg,
            producer,
            metrics,
            key_paths,
            key_salt,
            fallback,
            pod: hl7gw_runtime::pod_name(),
            ack_prefix,
            ack_seq: AtomicU64::new(0),
        }
    }
}

/// Small setters for the envelope fields only accepted messages carry.
trait EnvelopeExt {
    fn with_trace(self, traceparent: String, tracestate: String) -> Self;
    fn with_key(self, key: String) -> Self;
}

impl EnvelopeExt for Envelope {
    fn with_trace(mut self, traceparent: String, tracestate: String) -> Self {
        self.trace = Some(TraceContext {
            traceparent,
            tracestate,
        });
        self
    }

    fn with_key(mut self, key: String) -> Self {
        self.key = key;
        self
    }
}

/// The Kafka headers consumers filter on: `hl7.type`, `hl7.control_id`, `traceparent` and `tracestate` (when
/// traced), `content-type`.
fn kafka_headers(h: &Header<'_>, trace: Option<(&str, &str)>) -> OwnedHeaders {
    let (traceparent, tracestate) = trace.unwrap_or_default();
    envelope::kafka_headers(&type_header(h), h.control_id, traceparent, tracestate, "")
}

/// `ADT^A01` for the `hl7.type` header.
fn type_header(h: &Header<'_>) -> Vec<u8> {
    // Bounded: it is a Kafka header and a span attribute, read before the header's lengths are checked.
    let (code, trigger) = (
        &h.message_type[..h.message_type.len().min(MAX_CODE)],
        &h.trigger_event[..h.trigger_event.len().min(MAX_CODE)],
    );
    let mut v = Vec::with_capacity(code.len() + trigger.len() + 1);
    v.extend_from_slice(code);
    if !trigger.is_empty() {
        v.push(b'^');
        v.extend_from_slice(trigger);
    }
    v
}

fn charset_label(h: &Header<'_>, fallback: &str) -> String {
    if h.charset.is_empty() {
        fallback.to_owned()
    } else {
        String::from_utf8_lossy(h.charset).into_owned()
    }
}

fn kafka_reason(e: &rdkafka::error::KafkaError) -> &'static str {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};
    match e.rdkafka_error_code() {
        Some(C::QueueFull) => "queue_full",
        Some(C::MessageTimedOut) => "timed_out",
        Some(C::MessageSizeTooLarge) => "too_large",
        Some(C::UnknownTopicOrPartition) | Some(C::UnknownTopic) => "unknown_topic",
        Some(C::AllBrokersDown) => "brokers_down",
        // A success report without an offset (runtime kafka/delivery.rs, `confirmed`).
        Some(C::Inconsistent) => "unconfirmed",
        _ => match e {
            KafkaError::Canceled => "canceled",
            _ => "kafka_error",
        },
    }
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ready(r) => f.debug_tuple("Ready").field(r).finish(),
            Self::Batch { parts, .. } => f.debug_struct("Batch").field("parts", parts).finish(),
            Self::Waiting { .. } => f.debug_struct("Waiting").finish_non_exhaustive(),
            Self::Publishing(p) => f.debug_tuple("Publishing").field(p).finish(),
        }
    }
}

impl std::fmt::Debug for Publish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publish")
            .field("envelope_id", &self.envelope_id)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("inbound_topic", &self.cfg.inbound_topic)
            .field("ack_mode", &self.cfg.ack_mode)
            .finish_non_exhaustive()
    }
}

/// A pipeline for unit tests (in a tokio runtime, which the producer needs): its producer points at a closed port, so nothing here may wait for Kafka
/// (records handed to it stay queued until the pipeline is dropped).
#[cfg(test)]
pub(crate) fn test_pipeline(cfg: Config) -> Pipeline {
    let mut registry = prometheus_client::registry::Registry::default();
    let producer = ProducerSlot::from_config(
        "hl7gw-ingress-test",
        hl7gw_runtime::kafka::KafkaSettings {
            brokers: "127.0.0.1:1".into(),
            ..Default::default()
        },
        std::time::Duration::from_secs(1),
        Default::default(),
    )
    .expect("a producer needs no broker to be created");
    Pipeline::new(
        Arc::new(cfg),
        Arc::new(producer),
        IngressMetrics::register(&mut registry),
        None,
    )
}
