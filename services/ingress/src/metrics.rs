//! The ingress's metrics and the events that move them. Every label value is bounded (message type codes,
//! outcomes, ACK codes, reason kinds): no label can carry patient data or explode in cardinality.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

pub use hl7gw_runtime::metrics::{MessageLabels, MsgType, ReasonLabels};

/// Message outcomes (the `outcome` label).
pub mod outcome {
    pub const ACCEPTED: &str = "accepted";
    pub const REJECTED: &str = "rejected";
    pub const DUPLICATE: &str = "duplicate";
    pub const UNAVAILABLE: &str = "unavailable";
}

hl7gw_runtime::label_sets! {
    pub struct CodeLabels { pub code: &'static str }
    pub struct ProtocolLabels { pub protocol: &'static str }
    /// `sender`: a name from the config's `senders:` (bounded by the config, never from input).
    pub struct SenderLabels { pub sender: String }
    pub struct SenderCodeLabels { pub sender: String, pub code: &'static str }
}

/// A gauge holding unix seconds.
pub type TimestampGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

hl7gw_runtime::metric_set! {
    /// Every ingress metric.
    pub struct IngressMetrics under "ingress" {
        pub connections_active: Gauge = "Open MLLP connections and gRPC streams";
        pub connections: Family<ProtocolLabels, Counter> =
            "MLLP connections and gRPC SendStream streams accepted";
        pub connections_refused: Family<ReasonLabels, Counter> =
            "Connections closed before any frame, by reason: tls_handshake, proxy_header, max_connections, \
             max_connections_per_address";
        pub frames: Counter = "Complete MLLP frames read";
        pub bytes_received as "received": Counter = "Bytes read from senders", unit Bytes;
        pub bytes_skipped as "skipped": Counter = "Bytes outside MLLP frames, skipped", unit Bytes;
        pub messages: Family<MessageLabels, Counter> = "Messages by type and outcome";
        pub acks: Family<CodeLabels, Counter> = "ACKs sent by MSA-1 code";
        pub application_acks: Family<CodeLabels, Counter> =
            "Application ACKs sent as the application (application_ack: on_store), by MSA-1 code";
        pub rejects: Family<ReasonLabels, Counter> = "Messages rejected, by reason";
        pub framing_errors: Family<ReasonLabels, Counter> = "MLLP framing violations, by kind";
        pub dlq_writes: Family<ReasonLabels, Counter> =
            "Rejected messages written to the DLQ topic, by reason";
        pub dlq_failures: Counter = "DLQ writes Kafka did not confirm";
        pub publish_failures: Family<ReasonLabels, Counter> =
            "Publishes to the inbound topic that failed, by reason";
        pub publish_duration: Histogram =
            "Time from publish to Kafka's confirmation",
            unit Seconds, new hl7gw_runtime::metrics::latency_histogram();
        pub in_flight: Gauge = "Messages waiting for Kafka's confirmation";
        pub in_flight_bytes as "in_flight": Gauge = "Bytes of messages held by all connections and streams until their answers are written \
            (each message charged its bytes plus a fixed overhead)", unit Bytes;
        pub in_flight_budget_bytes as "in_flight_budget": Gauge = "The most in_flight_bytes may reach (max_in_flight_bytes, or sized from the memory limit)",
            unit Bytes;
        pub budget_waits: Counter =
            "Times a connection or stream waited for the process's in-flight byte budget before reading on";
        pub control_id_reused: Counter = "Messages whose (MSH-3, MSH-4, MSH-10) was seen within the duplicate window with other content: \
            published as new messages";
        pub write_timeouts: Counter =
            "Connections closed because the sender did not read its ACKs within write_timeout";
        pub batches: Counter = "FHS/BHS batches received (each message in them is counted in messages_total)";
        pub idle_closes: Counter = "MLLP connections closed after idle_timeout without a complete frame";
        pub connections_evicted: Counter = "MLLP connections closed to make room for a new one at max_connections: \
            the one with no complete frame for longest (idle or trickling), nothing waiting for its answer";
        pub producer_recoveries: Counter =
            "Kafka producers recreated in-process after a fatal error (messages in flight got AR/CR 207)";
        pub sender_messages: Family<SenderLabels, Counter> =
            "Messages answered, for each sender named in the config (senders:)";
        pub sender_naks: Family<SenderCodeLabels, Counter> =
            "Negative answers (AE, AR, CE, CR) for each sender named in the config, whether or not MSH-15 asked for them";
        pub sender_last_message_timestamp: Family<SenderLabels, TimestampGauge> =
            "When each sender named in the config last had a message answered (unix time; the process start \
            until its first message)", unit Seconds;
        pub senders_tracked: Gauge = "Distinct (MSH-3, MSH-4) pairs in the sender view (at most max_senders)";
        pub senders_evicted: Counter =
            "Sender view entries removed to make room for a new (MSH-3, MSH-4) pair at max_senders (the least recent \
            unnamed one; its counts move to `other`)";
        pub senders_untracked_messages: Counter =
            "Messages of senders beyond max_senders, counted in the sender view's other entry";
    }
}

impl IngressMetrics {
    /// Counts a message's outcome.
    pub fn message(&self, t: MsgType, outcome: &'static str) {
        hl7gw_runtime::metrics::count_message(&self.messages, t, outcome);
    }

    /// Counts an ACK sent.
    pub fn ack(&self, code: &'static str) {
        self.acks.get_or_create(&CodeLabels { code }).inc();
    }

    /// Counts an application ACK sent (`application_ack: on_store`).
    pub fn application_ack(&self, code: &'static str) {
        self.application_acks
            .get_or_create(&CodeLabels { code })
            .inc();
    }

    /// A message rejected for `reason`: counter and one log line (control id, code and who sent it: MSH-3,
    /// MSH-4, peer, listener; no patient data).
    pub(crate) fn rejected(
        &self,
        t: MsgType,
        reason: &'static str,
        hl7_code: u16,
        control_id: &[u8],
        who: &crate::origin::Who<'_>,
    ) {
        self.rejects.get_or_create(&ReasonLabels { reason }).inc();
        self.message(t, outcome::REJECTED);
        hl7gw_runtime::limited_info!(
            reason,
            reason,
            hl7_error = hl7_code,
            control_id = %String::from_utf8_lossy(&control_id[..control_id.len().min(64)]),
            sending_application = %who.app(),
            sending_facility = %who.fac(),
            peer = %who.peer,
            listener = %who.listener,
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
        hl7gw_runtime::limited_info!(kind, kind, peer, "MLLP framing error");
    }
}
