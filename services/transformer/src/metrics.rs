//! The transformer's metrics. Labels are bounded: message type codes, outcomes, destination and route names
//! (from configuration), reason kinds. No label carries message content.

pub use hl7gw_runtime::metrics::{MessageLabels, MsgType, ReasonLabels};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutputLabels {
    pub route: String,
    pub destination: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
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

/// Every transformer metric.
#[derive(Debug, Clone)]
pub struct TransformerMetrics {
    pub messages: Family<MessageLabels, Counter>,
    pub outputs: Family<OutputLabels, Counter>,
    pub dlq_writes: Family<ReasonLabels, Counter>,
    pub plugin_skips: Family<RouteLabels, Counter>,
    pub transactions: Family<ResultLabels, Counter>,
    pub batches_cut: Counter,
    pub producer_recoveries: Counter,
    pub stuck_calls: Counter,
    pub route_reloads: Family<ResultLabels, Counter>,
    pub routes_active: Gauge,
    pub routes_refused: Gauge,
    pub consumer_lag: Gauge,
    pub transform_duration: Histogram,
    pub batch_duration: Histogram,
}

impl TransformerMetrics {
    /// Creates the metrics and registers them under `hl7gw_transformer_`.
    pub fn register(r: &mut Registry) -> Self {
        let m = Self {
            messages: Family::default(),
            outputs: Family::default(),
            dlq_writes: Family::default(),
            plugin_skips: Family::default(),
            transactions: Family::default(),
            batches_cut: Counter::default(),
            producer_recoveries: Counter::default(),
            stuck_calls: Counter::default(),
            route_reloads: Family::default(),
            routes_active: Gauge::default(),
            routes_refused: Gauge::default(),
            consumer_lag: Gauge::default(),
            transform_duration: Histogram::new(hl7gw_runtime::metrics::latency_buckets()),
            batch_duration: Histogram::new(hl7gw_runtime::metrics::latency_buckets()),
        };
        let r = r.sub_registry_with_prefix("transformer");
        r.register(
            "messages",
            "Inbound messages by type and outcome",
            m.messages.clone(),
        );
        r.register(
            "outputs",
            "Messages produced to destination topics, by route and destination",
            m.outputs.clone(),
        );
        r.register(
            "dlq_writes",
            "Messages sent to the DLQ, by reason",
            m.dlq_writes.clone(),
        );
        r.register(
            "plugin_skips",
            "Plugin steps that failed and were skipped (onFailure: skip): the message went on without that step",
            m.plugin_skips.clone(),
        );
        r.register(
            "transactions",
            "Kafka transactions by result (committed, aborted)",
            m.transactions.clone(),
        );
        r.register(
            "batches_cut",
            "Batches committed early because routing them (plugin calls included) reached the batch time budget; the rest was read again",
            m.batches_cut.clone(),
        );
        r.register(
            "producer_recoveries",
            "Transactional producers closed and recreated after a fatal error or a transaction that could not be finished",
            m.producer_recoveries.clone(),
        );
        r.register(
            "stuck_calls",
            "Transactional librdkafka calls that did not return within twice transaction_timeout (a known \
             librdkafka hang when a coordinator's broker is gone): the producer was recreated",
            m.stuck_calls.clone(),
        );
        r.register(
            "route_reloads",
            "Route set reloads by result (ok, refused, error)",
            m.route_reloads.clone(),
        );
        r.register(
            "routes_active",
            "Routes routing now",
            m.routes_active.clone(),
        );
        r.register(
            "routes_refused",
            "Route documents refused at the last reload",
            m.routes_refused.clone(),
        );
        r.register(
            "consumer_lag",
            "Inbound messages not yet processed by this consumer (sum over its partitions)",
            m.consumer_lag.clone(),
        );
        r.register_with_unit(
            "transform_duration",
            "Time to route and transform one message",
            Unit::Seconds,
            m.transform_duration.clone(),
        );
        r.register_with_unit(
            "batch_duration",
            "Time from a batch's first message to its committed transaction",
            Unit::Seconds,
            m.batch_duration.clone(),
        );
        m
    }

    /// Counts an inbound message's outcome.
    pub fn message(&self, t: MsgType, outcome: &'static str) {
        hl7gw_runtime::metrics::count_message(&self.messages, t, outcome);
    }
}
