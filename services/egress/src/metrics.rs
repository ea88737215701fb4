//! The egress's metrics. Labels are bounded: destination names (from configuration), ACK codes, reason kinds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DestLabels {
    pub destination: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AckLabels {
    pub destination: String,
    pub code: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    pub destination: String,
    pub reason: &'static str,
}

/// Every egress metric.
#[derive(Debug, Clone)]
pub struct EgressMetrics {
    pub delivered: Family<DestLabels, Counter>,
    pub acks: Family<AckLabels, Counter>,
    pub retries: Family<ReasonLabels, Counter>,
    pub dlq_writes: Family<ReasonLabels, Counter>,
    pub duplicates_suppressed: Family<DestLabels, Counter>,
    pub unmatched_acks: Family<DestLabels, Counter>,
    pub replayed: Family<DestLabels, Counter>,
    pub connections_active: Family<DestLabels, Gauge>,
    pub consumer_lag: Family<DestLabels, Gauge>,
    pub delivery_duration: Family<DestLabels, Histogram>,
    pub end_to_end: Family<DestLabels, Histogram>,
    pub producer_recoveries: Counter,
}

fn histogram() -> Histogram {
    Histogram::new(hl7gw_runtime::metrics::latency_buckets())
}

impl EgressMetrics {
    /// Creates the metrics and registers them under `hl7gw_egress_`.
    pub fn register(r: &mut Registry) -> Self {
        let m = Self {
            delivered: Family::default(),
            acks: Family::default(),
            retries: Family::default(),
            dlq_writes: Family::default(),
            duplicates_suppressed: Family::default(),
            unmatched_acks: Family::default(),
            replayed: Family::default(),
            connections_active: Family::default(),
            consumer_lag: Family::default(),
            delivery_duration: Family::new_with_constructor(histogram),
            end_to_end: Family::new_with_constructor(histogram),
            producer_recoveries: Counter::default(),
        };
        let r = r.sub_registry_with_prefix("egress");
        r.register(
            "delivered",
            "Messages the receiver accepted (AA/CA)",
            m.delivered.clone(),
        );
        r.register("acks", "Receivers' answers by MSA-1 code", m.acks.clone());
        r.register(
            "retries",
            "Delivery attempts that will be retried, by reason",
            m.retries.clone(),
        );
        r.register(
            "dlq_writes",
            "Messages sent to the DLQ (rejected by the receiver or given up), by reason",
            m.dlq_writes.clone(),
        );
        r.register(
            "duplicates_suppressed",
            "Messages not sent again because they were delivered within the duplicate window",
            m.duplicates_suppressed.clone(),
        );
        r.register(
            "unmatched_acks",
            "Receivers' answers whose MSA-2 named another message than the one sent: discarded",
            m.unmatched_acks.clone(),
        );
        r.register(
            "replayed",
            "Dead letters sent back to their destination topic",
            m.replayed.clone(),
        );
        r.register(
            "connections_active",
            "Open connections to receivers",
            m.connections_active.clone(),
        );
        r.register(
            "consumer_lag",
            "Destination messages not yet delivered by this consumer (sum over its partitions)",
            m.consumer_lag.clone(),
        );
        r.register_with_unit(
            "delivery_duration",
            "Time from sending a message to the receiver's ACK (last attempt)",
            Unit::Seconds,
            m.delivery_duration.clone(),
        );
        r.register_with_unit(
            "end_to_end",
            "Time from the ingress receiving a message to the receiver's ACK",
            Unit::Seconds,
            m.end_to_end.clone(),
        );
        r.register(
            "producer_recoveries",
            "Kafka producers (DLQ writes, replays) recreated in-process after a fatal error",
            m.producer_recoveries.clone(),
        );
        m
    }
}

/// One destination's metric handles, resolved once so a delivery allocates no labels; its events (what each
/// logs and counts) are in [`crate::events`].
#[derive(Debug, Clone)]
pub struct DestMetrics {
    pub(crate) name: String,
    pub(crate) delivered: Counter,
    pub(crate) duplicates_suppressed: Counter,
    pub unmatched_acks: Counter,
    pub connections_active: Gauge,
    pub(crate) delivery_duration: Histogram,
    pub(crate) end_to_end: Histogram,
    /// By MSA-1, in the order of `AckCode::ALL`.
    pub(crate) acks: [Counter; 6],
    pub(crate) retries: Family<ReasonLabels, Counter>,
    pub(crate) dlq_writes: Family<ReasonLabels, Counter>,
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
            delivery_duration: self.delivery_duration.get_or_create(&d).clone(),
            end_to_end: self.end_to_end.get_or_create(&d).clone(),
            acks: hl7v2::AckCode::ALL.map(ack),
            retries: self.retries.clone(),
            dlq_writes: self.dlq_writes.clone(),
        }
    }
}
