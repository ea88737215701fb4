//! The transformer's metrics. Labels are bounded: message type codes, outcomes, destination and route names
//! (from configuration), reason kinds. No label carries message content.

pub use hl7gw_runtime::metrics::{MessageLabels, MsgType, ReasonLabels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

hl7gw_runtime::label_sets! {
    pub struct OutputLabels { pub route: String, pub destination: String }
    pub struct RouteLabels { pub route: String }
    pub struct ResultLabels { pub result: &'static str }
}

/// Message outcomes (the `outcome` label).
pub mod outcome {
    /// At least one route matched and every output was produced.
    pub const ROUTED: &str = "routed";
    /// No route matched and no default destination is set.
    pub const UNMATCHED: &str = "unmatched";
    /// No route matched; sent to the default destination.
    pub const DEFAULT: &str = "default";
    /// A transform failed or the envelope was unreadable: DLQ.
    pub const FAILED: &str = "failed";
}

hl7gw_runtime::metric_set! {
    /// Every transformer metric.
    pub struct TransformerMetrics under "transformer" {
        pub messages: Family<MessageLabels, Counter> = "Inbound messages by type and outcome";
        pub outputs: Family<OutputLabels, Counter> =
            "Messages produced to destination topics, by route and destination";
        pub dlq_writes: Family<ReasonLabels, Counter> = "Messages sent to the DLQ, by reason";
        pub plugin_skips: Family<RouteLabels, Counter> =
            "Plugin steps that failed and were skipped (onFailure: skip): the message went on without that step";
        pub fhir_unmapped: Family<RouteLabels, Counter> =
            "Segments and fields with a value that a route's toFhir step did not map (listed by id in the message's span)";
        pub fhir_skipped: Family<RouteLabels, Counter> =
            "Messages of a type a route's toFhir step does not map, skipped (onUnsupported: skip): the route made no output";
        pub transactions: Family<ResultLabels, Counter> = "Kafka transactions by result (committed, aborted)";
        pub batches_cut: Counter =
            "Batches committed early because routing them (plugin calls included) reached the batch time budget; the rest was read again";
        pub producer_recoveries: Counter =
            "Transactional producers closed and recreated after a fatal error or a transaction that could not be finished";
        pub stuck_calls: Counter = "Transactional librdkafka calls that did not return within twice transaction_timeout (a known \
            librdkafka hang when a coordinator's broker is gone): the producer was recreated";
        pub abandoned_calls: Gauge = "Transactional librdkafka calls given up on (stuck past twice transaction_timeout) that have \
            not returned yet, each holding a blocking thread and a producer; over 4, the transformer is unready";
        pub route_reloads: Family<ResultLabels, Counter> = "Route set reloads by result (ok, refused, error)";
        pub routes_active: Gauge = "Routes routing now";
        pub routes_refused: Gauge = "Route documents refused at the last reload";
        pub consumer_lag: Gauge =
            "Inbound messages not yet processed by this consumer (sum over its partitions)";
        pub transform_duration: Histogram =
            "Time to route and transform one message",
            unit Seconds, new hl7gw_runtime::metrics::latency_histogram();
        pub batch_duration: Histogram =
            "Time from a batch's first message to its committed transaction",
            unit Seconds, new hl7gw_runtime::metrics::latency_histogram();
    }
}

impl TransformerMetrics {
    /// Counts an inbound message's outcome.
    pub fn message(&self, t: MsgType, outcome: &'static str) {
        hl7gw_runtime::metrics::count_message(&self.messages, t, outcome);
    }
}
