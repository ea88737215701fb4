//! One message's way through the ingress, shared by MLLP and gRPC: parse and validate the header, answer
//! duplicates from memory, wrap the frame in an `Envelope`, publish it keyed by patient, and decide the ACK.
//!
//! `submit` does everything that needs no waiting and returns a [`Pending`]; `resolve` waits for Kafka's
//! delivery report (durable mode) so a connection can keep several messages in flight and still answer them
//! in order. The ACK bytes are written by `render` into the caller's reused buffer.

use crate::config::{AckMode, Config, OnTimeout};
use crate::metrics::{IngressMetrics, MsgType, ReasonLabels, outcome};
use bytes::Bytes;
use hl7gw_runtime::dedup::{Claim, Claimed, Dedup, FirstCopy, Key};
use hl7gw_runtime::envelope::{self, headers};
use hl7gw_runtime::producer::{ProducerSlot, is_fatal};
use hl7gw_runtime::proto::v1::{Envelope, Rejection, Source, Stage, TraceContext};
use hl7v2::ack::{
    AckCode, AckError, AckIds, ErrorLocation, Outcome, Severity, accept_ack_wanted, ack_code,
    hl7_timestamp, write_ack,
};
use hl7v2::{Charset, ErrorCode, Header, Message};
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};
use tracing::Span;

/// Longest MSH-10 accepted (HL7 2.7, ST).
const MAX_CONTROL_ID: usize = 199;
/// Longest MSH-3 and MSH-4 accepted (HL7 2.7, HD).
const MAX_HD: usize = 227;

/// Where messages come from: one per connection or gRPC stream.
#[derive(Debug, Clone)]
pub struct Origin {
    pub listener: Arc<str>,
    pub protocol: &'static str,
    pub peer: String,
    pub connection_id: String,
    pub tls_client: String,
}

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
    Publishing {
        frame: Bytes,
        delivery: DeliveryFuture,
        started: Instant,
        envelope_id: String,
        ticket: Option<Ticket>,
        msg_type: MsgType,
        span: Span,
        in_flight: InFlight,
    },
}

/// The shared per-process message pipeline.
pub struct Pipeline {
    cfg: Arc<Config>,
    producer: Arc<ProducerSlot>,
    dedup: Arc<Dedup>,
    pub metrics: IngressMetrics,
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
        Self {
            dedup: Arc::new(Dedup::new(
                cfg.duplicate_window,
                cfg.duplicate_capacity,
                cfg.duplicate_max_bytes,
            )),
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

    /// The producer slot (flushed on shutdown, probed for readiness).
    pub fn producer(&self) -> &Arc<ProducerSlot> {
        &self.producer
    }

    /// Everything up to the publish: returns the answer, or the delivery to wait for. An FHS/BHS batch is cut
    /// into its messages, each submitted (and accepted or rejected) on its own.
    pub fn submit(&self, frame: Bytes, origin: &Origin, sequence: u64) -> Pending {
        if hl7v2::is_batch(&frame)
            && let Ok(split) = hl7v2::batch::split(&frame)
            && !split.messages.is_empty()
        {
            self.metrics.batches.inc();
            let header = BatchHeader::read(&split);
            let parts = split
                .messages
                .iter()
                .map(|m| self.submit_one(frame.slice_ref(m), origin, sequence))
                .collect();
            return Pending::Batch {
                frame,
                parts,
                header,
            };
        }
        self.submit_one(frame, origin, sequence)
    }

    /// [`Pipeline::submit`] for one message.
    fn submit_one(&self, frame: Bytes, origin: &Origin, sequence: u64) -> Pending {
        let received = SystemTime::now();
        let span = tracing::info_span!(
            "hl7.ingest",
            hl7.type = tracing::field::Empty,
            hl7.control_id = tracing::field::Empty,
            hl7.size = frame.len(),
        );
        let msg = match Message::parse(&frame) {
            Ok(m) => m,
            Err(e) => {
                let r = Rejected {
                    outcome: Outcome::Error,
                    code: e.code(),
                    reason: e.kind(),
                    text: e.to_string(),
                    location: None,
                };
                return Pending::Ready(self.reject(frame, r, Some(origin), sequence, received));
            }
        };
        let h = *msg.header();
        let t = MsgType::new(h.message_type);
        span.record("hl7.type", tracing::field::display(MsgTypeText(&h)));
        span.record(
            "hl7.control_id",
            String::from_utf8_lossy(&h.control_id[..h.control_id.len().min(64)]).as_ref(),
        );
        let charset = match self.validate(&h, &frame) {
            Ok(c) => c,
            Err(r) => {
                return Pending::Ready(self.reject(frame, r, Some(origin), sequence, received));
            }
        };
        let mut ticket = self.dedup.enabled().then(|| Ticket {
            key: self
                .dedup
                .key(&[h.sending_application, h.sending_facility, h.control_id]),
            digest: self.dedup.digest(&frame),
            fast: None,
            claim: None,
        });
        if let Some(tk) = &mut ticket {
            match self.dedup.claim(tk.key, tk.digest, Instant::now()) {
                Claimed::New(c) => tk.claim = Some(c),
                Claimed::Reused(c) => {
                    tk.claim = Some(c);
                    self.metrics.control_id_reused.inc();
                    tracing::info!(parent: &span, "control id reused with other content: a new message");
                }
                Claimed::Resend(ack) => {
                    self.metrics.message(t, outcome::DUPLICATE);
                    tracing::debug!(parent: &span, "duplicate: replaying the first ACK");
                    return Pending::Ready(Reply {
                        action: Action::Replay(ack),
                        frame,
                        envelope_id: String::new(),
                        ticket: None,
                    });
                }
                // Fast mode answered the first copy before Kafka did: a resend is the sender's second
                // chance if that copy is lost, so it is published again (at least once) instead of waiting.
                Claimed::InFlight(_) if self.cfg.ack_mode == AckMode::Fast => {}
                Claimed::InFlight(first) => {
                    tracing::debug!(parent: &span, "duplicate of a message in flight: waiting for its ACK");
                    return Pending::Waiting {
                        frame,
                        first,
                        started: Instant::now(),
                        msg_type: t,
                    };
                }
            }
        }
        let key = self.kafka_key(&msg);
        let (traceparent, tracestate) = hl7gw_runtime::telemetry::trace_context(&span);
        let id = envelope::new_id();
        let env = self
            .envelope(&id, received, Some(origin), &frame, &h, charset, sequence)
            .with_trace(traceparent.clone(), tracestate)
            .with_key(String::from_utf8_lossy(&key).into_owned());
        let mut payload = Vec::new();
        envelope::encode_into(&env, &mut payload);
        if payload.len() > self.cfg.kafka.max_message_bytes {
            let r = self.too_large(payload.len());
            return Pending::Ready(self.reject(frame, r, Some(origin), sequence, received));
        }
        let hdrs = kafka_headers(&h, Some(&traceparent));
        let mut record = FutureRecord::to(&self.cfg.inbound_topic)
            .payload(&payload)
            .headers(hdrs);
        if !key.is_empty() {
            record = record.key(&key);
        }
        let started = Instant::now();
        let producer = self.producer.get();
        let delivery = match producer.send_result(record) {
            Ok(d) => {
                hl7gw_runtime::failpoint::after_send(producer.client());
                d
            }
            Err((e, _)) => {
                if is_fatal(&e) {
                    self.producer.recover_if_fatal();
                }
                self.metrics.publish_failed(kafka_reason(&e));
                if is_too_large(&e) {
                    let r = self.too_large(payload.len());
                    return Pending::Ready(self.reject(frame, r, Some(origin), sequence, received));
                }
                tracing::warn!(parent: &span, error = %e, "publish refused by the producer");
                self.metrics.message(t, outcome::UNAVAILABLE);
                return Pending::Ready(self.unavailable(frame, "kafka_unavailable"));
            }
        };
        match self.cfg.ack_mode {
            AckMode::Durable => Pending::Publishing {
                frame,
                delivery,
                started,
                envelope_id: id,
                ticket,
                msg_type: t,
                span,
                in_flight: InFlight::new(&self.metrics.in_flight),
            },
            AckMode::Fast => {
                self.metrics.message(t, outcome::ACCEPTED);
                let metrics = self.metrics.clone();
                let fast = ticket.as_mut().map(|tk| {
                    let f = Arc::new(FastStore {
                        state: Mutex::default(),
                        claim: Mutex::new(tk.claim.take()),
                    });
                    tk.fast = Some(f.clone());
                    (self.dedup.clone(), tk.key, tk.digest, f)
                });
                tokio::spawn(async move {
                    let stored = match delivery.await {
                        Ok(Ok(_)) => {
                            metrics
                                .publish_duration
                                .observe(started.elapsed().as_secs_f64());
                            true
                        }
                        Ok(Err((e, _))) => {
                            metrics.publish_failed(kafka_reason(&e));
                            tracing::error!(parent: &span, error = %e, "fast mode: an ACKed message was not stored");
                            false
                        }
                        Err(_) => {
                            metrics.publish_failed("canceled");
                            false
                        }
                    };
                    if let Some((dedup, key, digest, f)) = fast {
                        if !stored {
                            f.failed();
                        } else if let Some(ack) = f.stored() {
                            dedup.remember(key, digest, ack.clone(), Instant::now());
                            if let Some(c) = f.take_claim() {
                                c.accepted(ack);
                            }
                        }
                    }
                });
                Pending::Ready(Reply {
                    action: Action::Accept,
                    frame,
                    envelope_id: id,
                    ticket,
                })
            }
        }
    }

    /// Waits for Kafka's answer, bounded by `ack_timeout` from the publish.
    pub async fn resolve(&self, p: Pending) -> Reply {
        let (frame, delivery, started, envelope_id, ticket, msg_type, span, in_flight) = match p {
            Pending::Ready(r) => return r,
            Pending::Batch {
                frame,
                parts,
                header,
            } => {
                let mut acks = Vec::with_capacity(parts.len());
                let mut all_accepted = true;
                for p in parts {
                    let r = Box::pin(self.resolve(p)).await;
                    if matches!(r.action, Action::Close) {
                        // Unanswered as a whole: the sender resends the batch; what was stored is a resend then.
                        return r;
                    }
                    all_accepted &= matches!(r.action, Action::Accept | Action::Replay(_));
                    let mut one = Vec::with_capacity(256);
                    if let Some(code) = self.render(&r, &mut one) {
                        acks.push((one, code));
                    }
                }
                return Reply {
                    action: Action::Batch(Box::new(BatchReply {
                        acks,
                        all_accepted,
                        header,
                    })),
                    frame,
                    envelope_id: String::new(),
                    ticket: None,
                };
            }
            Pending::Waiting {
                frame,
                first,
                started,
                msg_type,
            } => return self.await_first_copy(frame, first, started, msg_type).await,
            Pending::Publishing {
                frame,
                delivery,
                started,
                envelope_id,
                ticket,
                msg_type,
                span,
                in_flight,
            } => (
                frame,
                delivery,
                started,
                envelope_id,
                ticket,
                msg_type,
                span,
                in_flight,
            ),
        };
        let deadline = tokio::time::Instant::from_std(started + self.cfg.ack_timeout);
        let res = tokio::time::timeout_at(deadline, delivery).await;
        drop(in_flight);
        match res {
            Ok(Ok(Ok(_))) => {
                self.metrics
                    .publish_duration
                    .observe(started.elapsed().as_secs_f64());
                self.metrics.message(msg_type, outcome::ACCEPTED);
                Reply {
                    action: Action::Accept,
                    frame,
                    envelope_id,
                    ticket,
                }
            }
            // The topic's own limit is below the record: no resend can succeed.
            Ok(Ok(Err((e, m)))) if is_too_large(&e) => {
                self.metrics.publish_failed(kafka_reason(&e));
                let size = {
                    use rdkafka::message::Message as _;
                    m.payload().map_or(0, <[u8]>::len)
                };
                tracing::warn!(parent: &span, size, "the topic refused the record as too large");
                let r = self.too_large(size);
                self.reject(frame, r, None, 0, SystemTime::now())
            }
            Ok(Ok(Err((e, _))))
                if e.rdkafka_error_code()
                    != Some(rdkafka::types::RDKafkaErrorCode::MessageTimedOut) =>
            {
                self.metrics.publish_failed(kafka_reason(&e));
                if is_fatal(&e) {
                    self.producer.recover_if_fatal();
                }
                tracing::warn!(parent: &span, error = %e, "Kafka did not store the message");
                self.metrics.message(msg_type, outcome::UNAVAILABLE);
                self.unavailable(frame, "kafka_unavailable")
            }
            Ok(Err(_)) => {
                self.metrics.message(msg_type, outcome::UNAVAILABLE);
                self.unavailable(frame, "kafka_unavailable")
            }
            // Our timer or librdkafka's own delivery timeout (set to the same bound): `on_timeout` decides.
            Ok(Ok(Err(_))) | Err(_) => {
                self.metrics.publish_failed("timeout");
                tracing::warn!(parent: &span, "Kafka did not confirm within ack_timeout");
                self.metrics.message(msg_type, outcome::UNAVAILABLE);
                match self.cfg.on_timeout {
                    OnTimeout::Nak => self.unavailable(frame, "kafka_timeout"),
                    OnTimeout::Close => Reply {
                        action: Action::Close,
                        frame,
                        envelope_id: String::new(),
                        ticket: None,
                    },
                }
            }
        }
    }

    /// A resend that arrived while its first copy was in flight: the first copy's ACK once it was accepted,
    /// AR/CR 207 when it was not (or not within `ack_timeout`), so the sender resends.
    async fn await_first_copy(
        &self,
        frame: Bytes,
        mut first: tokio::sync::watch::Receiver<FirstCopy>,
        started: Instant,
        msg_type: MsgType,
    ) -> Reply {
        let deadline = tokio::time::Instant::from_std(started + self.cfg.ack_timeout);
        let first_ack = tokio::time::timeout_at(deadline, async {
            first
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|v| v.clone())
                .flatten()
        })
        .await;
        if let Ok(Some(ack)) = first_ack {
            self.metrics.message(msg_type, outcome::DUPLICATE);
            return Reply {
                action: Action::Replay(ack),
                frame,
                envelope_id: String::new(),
                ticket: None,
            };
        }
        self.metrics.message(msg_type, outcome::UNAVAILABLE);
        self.unavailable(frame, "kafka_unavailable")
    }

    /// Writes the ACK for `r` into `buf` (cleared first) and returns its code, or `None` when nothing is to be
    /// sent (enhanced mode whose MSH-15 asks for no such ACK, or a close).
    pub fn render(&self, r: &Reply, buf: &mut Vec<u8>) -> Option<AckCode> {
        buf.clear();
        let h = Header::salvage(&r.frame);
        let (outcome, err) = match &r.action {
            Action::Close => return None,
            Action::Batch(b) => return Some(self.render_batch(b, buf)),
            Action::Replay(ack) => {
                // The resend asks for an accept ACK the same way the first message did (MSH-15).
                if !accept_ack_wanted(&h, Outcome::Accept) {
                    return None;
                }
                buf.extend_from_slice(ack);
                let code = hl7v2::read_ack(ack).map(|(c, _)| c);
                self.metrics.ack(code.map_or("unknown", AckCode::as_str));
                return code;
            }
            Action::Accept => (Outcome::Accept, None),
            Action::Reject(rej) => (
                rej.outcome,
                Some(AckError {
                    code: rej.code,
                    severity: Severity::Error,
                    text: &rej.text,
                    location: rej.location.map(|(segment, field)| ErrorLocation {
                        segment,
                        sequence: 1,
                        field,
                    }),
                }),
            ),
        };
        let wanted = accept_ack_wanted(&h, outcome);
        let remember = outcome == Outcome::Accept && r.ticket.is_some();
        if !wanted && !remember {
            return None;
        }
        let code = ack_code(&h, outcome);
        let mut id = [0u8; 28];
        let n = self.next_ack_id(&mut id);
        let ts = hl7_timestamp(SystemTime::now());
        write_ack(
            buf,
            &h,
            code,
            err.as_ref(),
            &AckIds {
                control_id: &id[..n],
                timestamp: &ts,
            },
        );
        // Remember accepted messages even when MSH-15 asked for no ACK, so a resend is not published twice.
        if let (true, Some(tk)) = (remember, &r.ticket) {
            let ack = Bytes::copy_from_slice(buf);
            let now_safe = match &tk.fast {
                None => Some(ack),
                Some(f) => f.acked(ack),
            };
            if let Some(ack) = now_safe {
                self.dedup
                    .remember(tk.key, tk.digest, ack.clone(), Instant::now());
                let claim = match &tk.fast {
                    None => tk.claim.as_ref(),
                    Some(_) => None,
                };
                if let Some(c) = claim {
                    c.accepted(ack);
                } else if let Some(c) = tk.fast.as_ref().and_then(|f| f.take_claim()) {
                    c.accepted(ack);
                }
            }
        }
        if !wanted {
            buf.clear();
            return None;
        }
        self.metrics.ack(code.as_str());
        Some(code)
    }

    /// The acknowledgment batch (HL7 v2 batch protocol): FHS (when the batch had one) and BHS with sender and
    /// receiver swapped and the original control ids in FHS-12/BHS-12, the ACK of each message that asks for
    /// one, BTS with their count, FTS. Returns the first code that is not AA/CA (else the accept code).
    fn render_batch(&self, b: &BatchReply, buf: &mut Vec<u8>) -> AckCode {
        let mut code = None;
        for (_, c) in &b.acks {
            let accept = |k: AckCode| matches!(k, AckCode::AA | AckCode::CA);
            if code.is_none_or(|k| accept(k) && !accept(*c)) {
                code = Some(*c);
            }
        }
        let count = b.acks.len();
        let d = b.header.delims;
        let ts = hl7_timestamp(SystemTime::now());
        let mut id = [0u8; 28];
        let n = self.next_ack_id(&mut id);
        let empty: [Vec<u8>; 5] = Default::default();
        let mut segment = |name: &[u8], ids: &[Vec<u8>; 5]| {
            buf.extend_from_slice(name);
            d.write_msh12(buf);
            for v in [&ids[2], &ids[3], &ids[0], &ids[1]] {
                buf.push(d.field);
                buf.extend_from_slice(v);
            }
            buf.push(d.field);
            buf.extend_from_slice(&ts);
            buf.extend_from_slice(&[d.field; 4]);
            buf.extend_from_slice(&id[..n]);
            buf.push(d.field);
            buf.extend_from_slice(&ids[4]);
            buf.push(b'\r');
        };
        if let Some(f) = &b.header.file {
            segment(b"FHS", f);
        }
        segment(b"BHS", b.header.batch.as_ref().unwrap_or(&empty));
        for (ack, _) in &b.acks {
            buf.extend_from_slice(ack);
        }
        buf.extend_from_slice(b"BTS");
        buf.push(d.field);
        buf.extend_from_slice(count.to_string().as_bytes());
        buf.push(b'\r');
        if b.header.file.is_some() {
            buf.extend_from_slice(b"FTS");
            buf.push(d.field);
            buf.extend_from_slice(b"1\r");
        }
        code.unwrap_or(AckCode::AA)
    }

    /// A whole payload whose MLLP framing was broken (end block not followed by CR): AE with ERR 207, and the
    /// payload in the DLQ (reason `missing_cr`) like any other reject.
    pub fn framing_reject(
        &self,
        frame: Bytes,
        text: String,
        origin: &Origin,
        sequence: u64,
    ) -> Pending {
        let r = Rejected {
            outcome: Outcome::Error,
            code: ErrorCode::ApplicationInternalError,
            reason: "missing_cr",
            text,
            location: None,
        };
        Pending::Ready(self.reject(frame, r, Some(origin), sequence, SystemTime::now()))
    }

    /// A NAK for a frame that never reached the parser (oversize, framing): AE with ERR 207 and the text.
    pub fn framing_reply(&self, text: String) -> Reply {
        Reply {
            action: Action::Reject(Rejected {
                outcome: Outcome::Error,
                code: ErrorCode::ApplicationInternalError,
                reason: "framing",
                text,
                location: None,
            }),
            frame: Bytes::new(),
            envelope_id: String::new(),
            ticket: None,
        }
    }

    fn next_ack_id(&self, out: &mut [u8; 28]) -> usize {
        out[..8].copy_from_slice(&self.ack_prefix);
        let mut n = self.ack_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let len = digits.len() - i;
        out[8..8 + len].copy_from_slice(&digits[i..]);
        8 + len
    }

    fn validate(&self, h: &Header<'_>, frame: &[u8]) -> Result<Charset, Rejected> {
        if h.control_id.is_empty() {
            return Err(Rejected {
                outcome: Outcome::Error,
                code: ErrorCode::RequiredFieldMissing,
                reason: "missing_control_id",
                text: "MSH-10 (message control id) is empty".into(),
                location: Some((b"MSH", 10)),
            });
        }
        // The standard's lengths (HL7 2.7: MSH-10 ST 199, MSH-3/4 HD 227); longer values would let crafted
        // messages make every key, ACK and log line large.
        for (field, value, max) in [
            (10, h.control_id, MAX_CONTROL_ID),
            (3, h.sending_application, MAX_HD),
            (4, h.sending_facility, MAX_HD),
        ] {
            if value.len() > max {
                return Err(Rejected {
                    outcome: Outcome::Error,
                    code: ErrorCode::ValueTooLong,
                    reason: "value_too_long",
                    text: format!("MSH-{field} is longer than {max} characters"),
                    location: Some((b"MSH", field)),
                });
            }
        }
        if h.version.is_empty()
            || !self
                .cfg
                .versions
                .iter()
                .any(|v| h.version.starts_with(v.as_bytes()))
        {
            return Err(Rejected {
                outcome: Outcome::Reject,
                code: ErrorCode::UnsupportedVersionId,
                reason: "unsupported_version",
                text: format!(
                    "MSH-12 version {:?} is not accepted",
                    String::from_utf8_lossy(&h.version[..h.version.len().min(16)])
                ),
                location: Some((b"MSH", 12)),
            });
        }
        if !self.cfg.processing_ids.is_empty()
            && !self
                .cfg
                .processing_ids
                .iter()
                .any(|p| p.as_bytes() == h.processing_id)
        {
            return Err(Rejected {
                outcome: Outcome::Reject,
                code: ErrorCode::UnsupportedProcessingId,
                reason: "unsupported_processing_id",
                text: "MSH-11 processing id is not accepted".into(),
                location: Some((b"MSH", 11)),
            });
        }
        if h.charset.is_empty() {
            return Ok(self.fallback);
        }
        let cs = Charset::from_msh18(h.charset).map_err(|_| Rejected {
            outcome: Outcome::Reject,
            code: ErrorCode::TableValueNotFound,
            reason: "unsupported_charset",
            text: "MSH-18 character set is not supported".into(),
            location: Some((b"MSH", 18)),
        })?;
        cs.decode(frame).map_err(|_| Rejected {
            outcome: Outcome::Error,
            code: ErrorCode::DataType,
            reason: "charset_mismatch",
            text: format!("message bytes are not valid {}", cs.name()),
            location: Some((b"MSH", 18)),
        })?;
        Ok(cs)
    }

    fn kafka_key(&self, msg: &Message<'_>) -> Vec<u8> {
        let key = envelope::kafka_key(msg, &self.key_paths);
        match &self.key_salt {
            Some(salt) if !key.is_empty() => envelope::salted_key(salt, &key),
            _ => key,
        }
    }

    /// The envelope every record of this ingress starts from.
    #[allow(clippy::too_many_arguments)]
    fn envelope(
        &self,
        id: &str,
        received: SystemTime,
        origin: Option<&Origin>,
        frame: &Bytes,
        h: &Header<'_>,
        charset: Charset,
        sequence: u64,
    ) -> Envelope {
        Envelope {
            id: id.to_owned(),
            received_at: Some(envelope::timestamp(received)),
            source: origin.map(|o| self.source(o)),
            raw: frame.clone(),
            charset: charset_label(h, &self.cfg.charset_fallback),
            header: Some(envelope::header(h, charset)),
            trace: None,
            sequence,
            attempts: 0,
            stages: vec![Stage {
                name: "ingress".into(),
                at: Some(envelope::timestamp(received)),
                pod: self.pod.clone(),
            }],
            rejection: None,
            destination: String::new(),
            key: String::new(),
            route: String::new(),
            content_type: String::new(),
        }
    }

    fn source(&self, o: &Origin) -> Source {
        Source {
            listener: o.listener.to_string(),
            peer: o.peer.clone(),
            pod: self.pod.clone(),
            protocol: o.protocol.into(),
            connection_id: o.connection_id.clone(),
            tls_client: o.tls_client.clone(),
        }
    }

    /// AR/CR 207: the sender may resend.
    fn unavailable(&self, frame: Bytes, reason: &'static str) -> Reply {
        Reply {
            action: Action::Reject(Rejected {
                outcome: Outcome::Reject,
                code: ErrorCode::ApplicationInternalError,
                reason,
                text: "system unavailable, resend later".into(),
                location: None,
            }),
            frame,
            envelope_id: String::new(),
            ticket: None,
        }
    }

    /// AE for a message whose record is larger than Kafka takes: permanent, the sender must not resend it.
    fn too_large(&self, size: usize) -> Rejected {
        Rejected {
            outcome: Outcome::Error,
            code: ErrorCode::ApplicationInternalError,
            reason: "too_large",
            text: format!(
                "message too large for Kafka: a {size}-byte record, the limit is {} bytes",
                self.cfg.kafka.max_message_bytes
            ),
            location: None,
        }
    }

    /// Counts a rejection, sends the input to the DLQ (without waiting), and returns the NAK reply. `origin`
    /// is unknown for a record Kafka refused after the publish. A DLQ record that would exceed the record
    /// limit keeps the metadata and the reason but not the message itself.
    fn reject(
        &self,
        frame: Bytes,
        r: Rejected,
        origin: Option<&Origin>,
        sequence: u64,
        received: SystemTime,
    ) -> Reply {
        let h = Header::salvage(&frame);
        self.metrics.rejected(
            MsgType::new(h.message_type),
            r.reason,
            r.code.code(),
            h.control_id,
        );
        let id = envelope::new_id();
        let mut env = self.envelope(&id, received, origin, &frame, &h, self.fallback, sequence);
        env.rejection = Some(Rejection {
            stage: "ingress".into(),
            reason: r.reason.into(),
            hl7_error_code: u32::from(r.code.code()),
            detail: r.text.clone(),
            ack: Bytes::new(),
        });
        let mut payload = Vec::new();
        envelope::encode_into(&env, &mut payload);
        if payload.len() > self.cfg.kafka.max_message_bytes
            && let Some(rej) = env.rejection.as_mut()
        {
            rej.detail = format!(
                "{}; the message itself ({} bytes) is not stored",
                rej.detail,
                env.raw.len()
            );
            env.raw = Bytes::new();
            payload.clear();
            envelope::encode_into(&env, &mut payload);
        }
        let hdrs = kafka_headers(&h, None);
        let record = FutureRecord::<(), _>::to(&self.cfg.dlq_topic)
            .payload(&payload)
            .headers(hdrs);
        let reason = r.reason;
        match self.producer.get().send_result(record) {
            Ok(delivery) => {
                let metrics = self.metrics.clone();
                tokio::spawn(async move {
                    match delivery.await {
                        Ok(Ok(_)) => metrics
                            .dlq_writes
                            .get_or_create(&ReasonLabels { reason })
                            .inc(),
                        _ => metrics.dlq_failures.inc(),
                    }
                });
            }
            Err(_) => {
                self.metrics.dlq_failures.inc();
            }
        }
        Reply {
            action: Action::Reject(r),
            frame,
            envelope_id: id,
            ticket: None,
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

/// The Kafka headers consumers filter on: `hl7.type`, `hl7.control_id`, `traceparent` (when traced),
/// `content-type`.
fn kafka_headers(h: &Header<'_>, traceparent: Option<&str>) -> OwnedHeaders {
    let type_header = type_header(h);
    let mut hdrs = OwnedHeaders::new_with_capacity(4)
        .insert(KafkaHeader {
            key: headers::TYPE,
            value: Some(&type_header),
        })
        .insert(KafkaHeader {
            key: headers::CONTROL_ID,
            value: Some(h.control_id),
        });
    if let Some(tp) = traceparent {
        hdrs = hdrs.insert(KafkaHeader {
            key: headers::TRACEPARENT,
            value: Some(tp),
        });
    }
    hdrs.insert(KafkaHeader {
        key: headers::CONTENT_TYPE,
        value: Some(headers::ENVELOPE_CONTENT_TYPE),
    })
}

/// `ADT^A01` for the `hl7.type` header.
fn type_header(h: &Header<'_>) -> Vec<u8> {
    let mut v = Vec::with_capacity(h.message_type.len() + h.trigger_event.len() + 1);
    v.extend_from_slice(h.message_type);
    if !h.trigger_event.is_empty() {
        v.push(b'^');
        v.extend_from_slice(h.trigger_event);
    }
    v
}

struct MsgTypeText<'h, 'a>(&'h Header<'a>);

impl std::fmt::Display for MsgTypeText<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(&type_header(self.0)))
    }
}

fn charset_label(h: &Header<'_>, fallback: &str) -> String {
    if h.charset.is_empty() {
        fallback.to_owned()
    } else {
        String::from_utf8_lossy(h.charset).into_owned()
    }
}

/// A record over librdkafka's or the topic's size limit.
fn is_too_large(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge)
    )
}

fn kafka_reason(e: &rdkafka::error::KafkaError) -> &'static str {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};
    match e.rdkafka_error_code() {
        Some(C::QueueFull) => "queue_full",
        Some(C::MessageTimedOut) => "timed_out",
        Some(C::MessageSizeTooLarge) => "too_large",
        Some(C::UnknownTopicOrPartition) | Some(C::UnknownTopic) => "unknown_topic",
        Some(C::AllBrokersDown) => "brokers_down",
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
            Self::Publishing { envelope_id, .. } => f
                .debug_struct("Publishing")
                .field("envelope_id", envelope_id)
                .finish_non_exhaustive(),
        }
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
