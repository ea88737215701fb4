//! The transformer's events, one per thing that happens to a message or a batch: its log line and the
//! counters it moves, in one place (as vector's `internal_events`). Fields are bounded (message type codes,
//! route and destination names from configuration, reason kinds) and never carry message content.

use crate::metrics::{
    MsgType, OutputLabels, ReasonLabels, ResultLabels, RouteLabels, TransformerMetrics, outcome,
};
use std::time::Duration;
use tracing::Span;

impl TransformerMetrics {
    /// An inbound record that is not an `Envelope`: it goes to the DLQ.
    pub fn not_an_envelope(&self, error: &dyn std::fmt::Display) {
        tracing::warn!(error = %error, "inbound record is not an Envelope: DLQ");
        self.message(MsgType::OTHER, outcome::FAILED);
    }

    /// An inbound message of type `t` that does not parse: it goes to the DLQ.
    pub fn unparsable(&self, span: &Span, t: MsgType, error: &dyn std::fmt::Display) {
        tracing::warn!(parent: span, error = %error, "inbound message does not parse: DLQ");
        self.message(t, outcome::FAILED);
    }

    /// Route `route` failed at `step` (`kind`): the message goes to the DLQ for it.
    pub fn transform_failed(&self, span: &Span, route: &str, step: usize, kind: &'static str) {
        tracing::warn!(parent: span, route, step, kind, "transform failed: DLQ");
    }

    /// Route `route` skipped `n` plugin steps (their failure policy says skip).
    pub fn plugins_skipped(&self, route: &str, n: usize) {
        if n > 0 {
            self.plugin_skips
                .get_or_create(&RouteLabels {
                    route: route.to_owned(),
                })
                .inc_by(n as u64);
        }
    }

    /// Route `route` produced an output for `destination`.
    pub fn output(&self, route: &str, destination: &str) {
        self.outputs
            .get_or_create(&OutputLabels {
                route: route.to_owned(),
                destination: destination.to_owned(),
            })
            .inc();
    }

    /// An output of `size` bytes over the `max`-byte record limit: the DLQ gets it instead.
    pub fn output_too_large(&self, route: &str, size: usize, max: usize) {
        tracing::warn!(
            size,
            max,
            route,
            "an output is larger than kafka.max_message_bytes: DLQ"
        );
    }

    /// Kafka refused an output of `size` bytes (its record) for good (`error`): the DLQ gets it instead.
    pub fn output_refused(&self, route: &str, size: usize, error: &dyn std::fmt::Display) {
        tracing::warn!(size, route, error = %error, "Kafka refused an output for good: DLQ");
    }

    /// A record for the DLQ, for `reason`, is part of the batch's transaction.
    pub fn dead_lettered(&self, reason: &'static str) {
        self.dlq_writes
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A transaction of `messages` committed after `took`.
    pub fn committed(&self, messages: usize, took: Duration, routed: Duration, offsets: Duration) {
        tracing::debug!(
            messages,
            routed_ms = routed.as_secs_f64() * 1e3,
            offsets_ms = offsets.as_secs_f64() * 1e3,
            committed_ms = took.as_secs_f64() * 1e3,
            "transaction committed"
        );
        self.transactions
            .get_or_create(&ResultLabels {
                result: "committed",
            })
            .inc();
        self.batch_duration.observe(took.as_secs_f64());
    }

    /// A transaction failed: it is aborted and its batch read again.
    pub fn aborted(&self, error: &dyn std::fmt::Display) {
        self.transactions
            .get_or_create(&ResultLabels { result: "aborted" })
            .inc();
        tracing::warn!(error = %error, "transaction failed: aborting and reading the batch again");
    }

    /// A batch reached its time budget: `committed` messages were, `again` are read again.
    pub fn batch_cut(&self, committed: usize, again: usize) {
        self.batches_cut.inc();
        tracing::info!(
            committed,
            again,
            "batch time budget reached: committed what was done"
        );
    }
}
