//! The egress's metrics. Labels are bounded: destination names (from configuration), ACK codes, reason kinds.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

hl7gw_runtime::label_sets! {
    pub struct DestLabels { pub destination: String }
    pub struct AckLabels { pub destination: String, pub code: &'static str }
    pub struct ReasonLabels { pub destination: String, pub reason: &'static str }
    pub struct StatusLabels { pub destination: String, pub class: &'static str }
    pub struct ScanLabels { pub method: &'static str, pub limit: &'static str }
}

hl7gw_runtime::metric_set! {
    /// Every egress metric.
    pub struct EgressMetrics under "egress" {
        pub delivered: Family<DestLabels, Counter> = "Messages the receiver accepted (AA/CA)";
        pub acks: Family<AckLabels, Counter> = "Receivers' answers by MSA-1 code";
        pub http_responses: Family<StatusLabels, Counter> =
            "HTTP(S) destinations' answers by status class (1xx..5xx)";
        pub retries: Family<ReasonLabels, Counter> = "Delivery attempts that will be retried, by reason";
        pub dlq_writes: Family<ReasonLabels, Counter> =
            "Messages sent to the DLQ (rejected by the receiver or given up), by reason";
        pub duplicates_suppressed: Family<DestLabels, Counter> =
            "Messages not sent again because they were delivered within the duplicate window, or (after a crash or \
             a rebalance) the ledger has their delivery";
        pub unmatched_acks: Family<DestLabels, Counter> =
            "Receivers' answers whose MSA-2 named another message than the one sent: discarded";
        pub replayed: Family<DestLabels, Counter> = "Dead letters sent back to their destination topic";
        pub partition_pauses: Family<DestLabels, Counter> =
            "Partitions paused because more than queue_bytes_per_partition waited for a slow receiver";
        pub connections_active: Family<DestLabels, Gauge> = "Open connections to receivers";
        pub in_flight: Family<DestLabels, Gauge> =
            "Deliveries in the air (sent or being retried), at most the destination's max_in_flight";
        pub in_flight_bytes as "in_flight": Family<DestLabels, Gauge> =
            "Payload bytes of the deliveries in the air (counted with the records read ahead against the \
             destination's queue_bytes_per_partition)", unit Bytes;
        pub waiting_for_key: Family<DestLabels, Gauge> =
            "Messages read and waiting behind an earlier message of their key (patient) that is still being delivered";
        pub consumer_lag: Family<DestLabels, Gauge> =
            "Destination messages not yet delivered by this consumer (sum over its partitions)";
        pub delivery_duration: Family<DestLabels, Histogram> =
            "Time from sending a message to the receiver's ACK (last attempt)",
            unit Seconds, new Family::new_with_constructor(hl7gw_runtime::metrics::latency_histogram);
        pub end_to_end: Family<DestLabels, Histogram> =
            "Time from the ingress receiving a message to the receiver's ACK",
            unit Seconds, new Family::new_with_constructor(hl7gw_runtime::metrics::end_to_end_histogram);
        pub oldest_undelivered_age: Family<DestLabels, Gauge<f64, std::sync::atomic::AtomicU64>> =
            "How long the oldest message this pod has read but not yet delivered or dead-lettered has waited since \
             the ingress read it (0: none waiting); compare with the destination topic's retention",
            unit Seconds;
        pub ledger_write_retries: Family<DestLabels, Counter> =
            "Ledger events (hl7.events) Kafka did not take at once, written again before the offset is stored";
        pub producer_recoveries: Counter =
            "Kafka producers (DLQ writes, replays) recreated in-process after a fatal error";
        pub admin_scans_in_flight: Gauge =
            "Dead-letter listings (ListDeadLetters) and traces (Trace) reading Kafka now";
        pub admin_scans_refused: Family<ScanLabels, Counter> =
            "ListDeadLetters and Trace calls refused with RESOURCE_EXHAUSTED, by the limit reached (process, caller)";
    }
}

/// The `class` label values of `http_responses`.
pub const HTTP_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// One destination's metric handles, resolved once so a delivery allocates no labels; its events (what each
/// logs and counts) are in [`crate::events`].
#[derive(Debug, Clone)]
pub struct DestMetrics {
    pub(crate) name: String,
    pub(crate) delivered: Counter,
    pub(crate) duplicates_suppressed: Counter,
    pub unmatched_acks: Counter,
    pub connections_active: Gauge,
    pub(crate) in_flight: Gauge,
    pub(crate) in_flight_bytes: Gauge,
    pub(crate) waiting_for_key: Gauge,
    pub(crate) partition_pauses: Counter,
    pub(crate) delivery_duration: Histogram,
    pub(crate) end_to_end: Histogram,
    /// By MSA-1, in the order of `AckCode::ALL`.
    pub(crate) acks: [Counter; 6],
    /// HTTP answers by status class, 1xx to 5xx.
    pub(crate) http_responses: [Counter; 5],
    pub(crate) retries: Family<ReasonLabels, Counter>,
    pub(crate) dlq_writes: Family<ReasonLabels, Counter>,
    pub(crate) oldest_undelivered_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(crate) ledger_write_retries: Counter,
}

impl EgressMetrics {
    /// The handles of destination `name`.
    pub fn destination(&self, name: &str) -> DestMetrics {
        let d = DestLabels {
            destination: name.to_owned(),
        };
        let ack = |code: hl7v2::AckCode| {
            self.acks
                .get_or_create(&AckLabels {
                    destination: name.to_owned(),
                    code: code.as_str(),
                })
                .clone()
        };
        DestMetrics {
            name: name.to_owned(),
            delivered: self.delivered.get_or_create(&d).clone(),
            duplicates_suppressed: self.duplicates_suppressed.get_or_create(&d).clone(),
            unmatched_acks: self.unmatched_acks.get_or_create(&d).clone(),
            connections_active: self.connections_active.get_or_create(&d).clone(),
            in_flight: self.in_flight.get_or_create(&d).clone(),
            in_flight_bytes: self.in_flight_bytes.get_or_create(&d).clone(),
            waiting_for_key: self.waiting_for_key.get_or_create(&d).clone(),
            partition_pauses: self.partition_pauses.get_or_create(&d).clone(),
            delivery_duration: self.delivery_duration.get_or_create(&d).clone(),
            end_to_end: self.end_to_end.get_or_create(&d).clone(),
            acks: hl7v2::AckCode::ALL.map(ack),
            http_responses: HTTP_CLASSES.map(|class| {
                self.http_responses
                    .get_or_create(&StatusLabels {
                        destination: name.to_owned(),
                        class,
                    })
                    .clone()
            }),
            retries: self.retries.clone(),
            dlq_writes: self.dlq_writes.clone(),
            oldest_undelivered_age: self.oldest_undelivered_age.get_or_create(&d).clone(),
            ledger_write_retries: self.ledger_write_retries.get_or_create(&d).clone(),
        }
    }
}
