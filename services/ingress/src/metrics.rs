//! The ingress's metrics and the events that move them. Every label value is bounded (message type codes,
//! outcomes, ACK codes, reason kinds): no label can carry patient data or explode in cardinality.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

pub use hl7gw_runtime::metrics::{MessageLabels, MsgType, ReasonLabels};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: &'static str,
}

/// Message outcomes (the `outcome` label).
pub mod outcome {
    pub const ACCEPTED: &str = "accepted";
    pub const REJECTED: &str = "rejected";
    pub const DUPLICATE: &str = "duplicate";
    pub const UNAVAILABLE: &str = "unavailable";
}

/// Every ingress metric.
#[derive(Debug, Clone)]
pub struct IngressMetrics {
    pub connections_active: Gauge,
    pub connections: Family<ProtocolLabels, Counter>,
    pub connections_refused: Family<ReasonLabels, Counter>,
    pub frames: Counter,
    pub bytes_received: Counter,
    pub bytes_skipped: Counter,
    pub messages: Family<MessageLabels, Counter>,
    pub acks: Family<CodeLabels, Counter>,
    pub rejects: Family<ReasonLabels, Counter>,
    pub framing_errors: Family<ReasonLabels, Counter>,
    pub dlq_writes: Family<ReasonLabels, Counter>,
    pub dlq_failures: Counter,
    pub publish_failures: Family<ReasonLabels, Counter>,
    pub publish_duration: Histogram,
    pub in_flight: Gauge,
    pub control_id_reused: Counter,
    pub write_timeouts: Counter,
    pub batches: Counter,
    pub idle_closes: Counter,
    pub producer_recoveries: Counter,
}

impl IngressMetrics {
    /// Creates the metrics and registers them (names get the registry's `hl7gw_` prefix).
    pub fn register(r: &mut Registry) -> Self {
        let m = Self {
            connections_active: Gauge::default(),
            connections: Family::default(),
            connections_refused: Family::default(),
            frames: Counter::default(),
            bytes_received: Counter::default(),
            bytes_skipped: Counter::default(),
            messages: Family::default(),
            acks: Family::default(),
            rejects: Family::default(),
            framing_errors: Family::default(),
            dlq_writes: Family::default(),
            dlq_failures: Counter::default(),
            publish_failures: Family::default(),
            publish_duration: Histogram::new(hl7gw_runtime::metrics::latency_buckets()),
            in_flight: Gauge::default(),
            control_id_reused: Counter::default(),
            write_timeouts: Counter::default(),
            batches: Counter::default(),
            idle_closes: Counter::default(),
            producer_recoveries: Counter::default(),
        };
        let r = r.sub_registry_with_prefix("ingress");
        r.register(
            "connections_active",
            "Open MLLP connections and gRPC streams",
            m.connections_active.clone(),
        );
        r.register(
            "connections",
            "MLLP connections and gRPC SendStream streams accepted",
            m.connections.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed before any frame (TLS handshake, PROXY header)",
            m.connections_refused.clone(),
        );
        r.register("frames", "Complete MLLP frames read", m.frames.clone());
        r.register_with_unit(
            "received",
            "Bytes read from senders",
            Unit::Bytes,
            m.bytes_received.clone(),
        );
        r.register_with_unit(
            "skipped",
            "Bytes outside MLLP frames, skipped",
            Unit::Bytes,
            m.bytes_skipped.clone(),
        );
        r.register(
            "messages",
            "Messages by type and outcome",
            m.messages.clone(),
        );
        r.register("acks", "ACKs sent by MSA-1 code", m.acks.clone());
        r.register("rejects", "Messages rejected, by reason", m.rejects.clone());
        r.register(
            "framing_errors",
            "MLLP framing violations, by kind",
            m.framing_errors.clone(),
        );
        r.register(
            "dlq_writes",
            "Rejected messages written to the DLQ topic, by reason",
            m.dlq_writes.clone(),
        );
        r.register(
            "dlq_failures",
            "DLQ writes Kafka did not confirm",
            m.dlq_failures.clone(),
        );
        r.register(
            "publish_failures",
            "Publishes to the inbound topic that failed, by reason",
            m.publish_failures.clone(),
        );
        r.register_with_unit(
            "publish_duration",
            "Time from publish to Kafka's confirmation",
            Unit::Seconds,
            m.publish_duration.clone(),
        );
        r.register(
            "in_flight",
            "Messages waiting for Kafka's confirmation",
            m.in_flight.clone(),
        );
        r.register(
            "control_id_reused",
            "Messages whose (MSH-3, MSH-4, MSH-10) was seen within the duplicate window with other content: \
             published as new messages",
            m.control_id_reused.clone(),
        );
        r.register(
            "write_timeouts",
            "Connections closed because the sender did not read its ACKs within write_timeout",
            m.write_timeouts.clone(),
        );
        r.register(
            "batches",
            "FHS/BHS batches received (each message in them is counted in messages_total)",
            m.batches.clone(),
        );
        r.register(
            "idle_closes",
            "MLLP connections closed after idle_timeout without a frame",
            m.idle_closes.clone(),
        );
        r.register(
            "producer_recoveries",
            "Kafka producers recreated in-process after a fatal error (messages in flight got AR/CR 207)",
            m.producer_recoveries.clone(),
        );
        m
    }

    /// Counts a message's outcome.
    pub fn message(&self, t: MsgType, outcome: &'static str) {
        hl7gw_runtime::metrics::count_message(&self.messages, t, outcome);
    }

    /// Counts an ACK sent.
    pub fn ack(&self, code: &'static str) {
        self.acks.get_or_create(&CodeLabels { code }).inc();
    }

    /// A message rejected for `reason`: counter and one log line (control id and code only).
    pub fn rejected(&self, t: MsgType, reason: &'static str, hl7_code: u16, control_id: &[u8]) {
        self.rejects.get_or_create(&ReasonLabels { reason }).inc();
        self.message(t, outcome::REJECTED);
        tracing::info!(
            reason,
            hl7_error = hl7_code,
            control_id = %String::from_utf8_lossy(&control_id[..control_id.len().min(64)]),
            "message rejected"
        );
    }

    /// A publish to the inbound topic that failed, by bounded reason.
    pub fn publish_failed(&self, reason: &'static str) {
        self.publish_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A framing violation on a connection.
    pub fn framing_error(&self, kind: &'static str, peer: &str) {
        self.framing_errors
            .get_or_create(&ReasonLabels { reason: kind })
            .inc();
        tracing::info!(kind, peer, "MLLP framing error");
    }
}
