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

/// Declares the metrics every destination has with the label `destination` alone, once: their families (a
/// metric set, `struct Families under "prefix"`) and one destination's handles (`handles Handles`, what
/// `Families::resolve` gives).
macro_rules! per_destination {
    (
        $(#[$meta:meta])*
        pub struct $families:ident under $prefix:literal, handles $handles:ident {
            $(
                $field:ident $(as $metric:literal)? : $ty:ty = $help:literal
                    $(, unit $unit:ident)? $(, new $make:expr)?;
            )*
        }
    ) => {
        hl7gw_runtime::metric_set! {
            $(#[$meta])*
            pub struct $families under $prefix {
                $( pub $field $(as $metric)?: Family<DestLabels, $ty> = $help $(, unit $unit)? $(, new $make)?; )*
            }
        }

        /// One destination's handles of the per-destination metrics.
        #[derive(Debug, Clone)]
        pub struct $handles {
            $( pub $field: $ty, )*
        }

        impl $families {
            /// The handles of the destination `d`.
            pub fn resolve(&self, d: &DestLabels) -> $handles {
                $handles { $( $field: self.$field.get_or_create(d).clone(), )* }
            }
        }
    };
}

per_destination! {
    /// The families of the per-destination metrics (label `destination`).
    pub struct DestFamilies under "egress", handles DestHandles {
        delivered: Counter = "Messages the receiver accepted (AA/CA)";
        duplicates_suppressed: Counter =
            "Messages not sent again because they were delivered within the duplicate window, or (after a crash or \
             a rebalance) the ledger has their delivery";
        unmatched_acks: Counter =
            "Receivers' answers whose MSA-2 named another message than the one sent: discarded";
        partition_pauses: Counter =
            "Partitions paused because more than queue_bytes_per_partition waited for a slow receiver";
        connections_active: Gauge = "Open connections to receivers";
        in_flight: Gauge = "Deliveries in the air (sent or being retried), at most the destination's max_in_flight";
        in_flight_bytes as "in_flight": Gauge =
            "Payload bytes of the deliveries in the air (counted with the records read ahead against the \
             destination's queue_bytes_per_partition)", unit Bytes;
        waiting_for_key: Gauge =
            "Messages read and waiting behind an earlier message of their key (patient) that is still being delivered";
        delivery_duration: Histogram = "Time from sending a message to the receiver's ACK (last attempt)",
            unit Seconds, new Family::new_with_constructor(hl7gw_runtime::metrics::latency_histogram);
        end_to_end: Histogram = "Time from the ingress receiving a message to the receiver's ACK",
            unit Seconds, new Family::new_with_constructor(hl7gw_runtime::metrics::end_to_end_histogram);
        oldest_undelivered_age: Gauge<f64, std::sync::atomic::AtomicU64> =
            "How long the oldest message this pod has read but not yet delivered or dead-lettered has waited since \
             the ingress read it (0: none waiting); compare with the destination topic's retention",
            unit Seconds;
        ledger_write_retries: Counter =
            "Ledger events (hl7.events) Kafka did not take at once, written again before the offset is stored";
    }
}

hl7gw_runtime::metric_set! {
    /// Every egress metric: those with labels besides the destination, the process's, the per-destination ones.
    pub struct EgressMetrics under "egress" {
        pub acks: Family<AckLabels, Counter> = "Receivers' answers by MSA-1 code";
        pub http_responses: Family<StatusLabels, Counter> =
            "HTTP(S) destinations' answers by status class (1xx..5xx)";
        pub retries: Family<ReasonLabels, Counter> = "Delivery attempts that will be retried, by reason";
        pub dlq_writes: Family<ReasonLabels, Counter> =
            "Messages sent to the DLQ (rejected by the receiver or given up), by reason";
        pub replayed: Family<DestLabels, Counter> = "Dead letters sent back to their destination topic";
        pub consumer_lag: Family<DestLabels, Gauge> =
            "Destination messages not yet delivered by this consumer (sum over its partitions)";
        pub producer_recoveries: Counter =
            "Kafka producers (DLQ writes, replays) recreated in-process after a fatal error";
        pub admin_scans_in_flight: Gauge =
            "Dead-letter listings (ListDeadLetters) and traces (Trace) reading Kafka now";
        pub admin_scans_refused: Family<ScanLabels, Counter> =
            "ListDeadLetters and Trace calls refused with RESOURCE_EXHAUSTED, by the limit reached (process, caller)";
    }
    with { pub per_destination: DestFamilies }
}

/// The `class` label values of `http_responses`.
pub const HTTP_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// One destination's metric handles, resolved once so a delivery allocates no labels (it derefs to the
/// per-destination ones); its events (what each logs and counts) are in [`crate::events`].
#[derive(Debug, Clone)]
pub struct DestMetrics {
    pub(crate) name: String,
    handles: DestHandles,
    /// By MSA-1, in the order of `AckCode::ALL`.
    pub(crate) acks: [Counter; 6],
    /// HTTP answers by status class, 1xx to 5xx.
    pub(crate) http_responses: [Counter; 5],
    pub(crate) retries: Family<ReasonLabels, Counter>,
    pub(crate) dlq_writes: Family<ReasonLabels, Counter>,
}

impl std::ops::Deref for DestMetrics {
    type Target = DestHandles;
    fn deref(&self) -> &DestHandles {
        &self.handles
    }
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
            handles: self.per_destination.resolve(&d),
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
        }
    }
}
