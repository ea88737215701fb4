//! The egress's events, one per thing that happens to a delivery: its log line and the counters it moves, in
//! one place (as vector's `internal_events`). Fields are bounded (destination names from the config, ACK codes,
//! reason kinds) and never carry message content.

use crate::metrics::{DestMetrics, ReasonLabels};
use std::time::{Instant, SystemTime};
use tracing::Span;

impl DestMetrics {
    /// The receiver answered with `code` (whatever comes next).
    pub fn answered(&self, code: hl7v2::AckCode) {
        self.acks[code.index()].inc();
    }

    /// The receiver accepted a message sent at `started`; `received_at` is when the ingress read it.
    pub fn delivered(&self, started: Instant, received_at: Option<SystemTime>) {
        self.delivered.inc();
        self.delivery_duration
            .observe(started.elapsed().as_secs_f64());
        if let Some(d) = received_at.and_then(|t| SystemTime::now().duration_since(t).ok()) {
            self.end_to_end.observe(d.as_secs_f64());
        }
    }

    /// An output delivered within the duplicate window came again: not sent again.
    pub fn duplicate_suppressed(&self, span: &Span) {
        self.duplicates_suppressed.inc();
        tracing::info!(parent: span, "delivered within the duplicate window: not sent again");
    }

    /// The ledger says the record at `offset` of `partition` was delivered past the last commit (a crash or a
    /// rebalance of its last owner): not sent again.
    pub fn duplicate_known(&self, partition: i32, offset: i64) {
        self.duplicates_suppressed.inc();
        tracing::debug!(
            partition,
            offset,
            "delivered before (the ledger has its event): not sent again"
        );
    }

    /// An attempt failed other than by not connecting (those repeat until the receiver is back).
    pub fn attempt_failed(&self, span: &Span, error: &dyn std::fmt::Display) {
        tracing::info!(parent: span, error = %error, "delivery attempt failed");
    }

    /// An attempt failed for `reason` and another follows after the backoff.
    pub fn retrying(&self, reason: &'static str) {
        self.retries_for(reason).inc();
    }

    /// The receiver refused the message for good (`code`, with its ERR code): it goes to the DLQ.
    pub fn refused(&self, span: &Span, code: &'static str, error: Option<u16>) {
        tracing::warn!(
            parent: span,
            code,
            error,
            "receiver refused the message for good: DLQ"
        );
    }

    /// An HTTP destination answered with `status` (whatever comes next).
    pub fn http_answered(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.http_responses[class].inc();
    }

    /// An HTTP destination refused the message for good (`status`): it goes to the DLQ.
    pub fn http_refused(&self, span: &Span, status: u16) {
        tracing::warn!(
            parent: span,
            status,
            "receiver refused the message for good: DLQ"
        );
    }

    /// The message as sent has no MSH-10, so no answer could ever be matched to it: DLQ, not sent.
    pub fn unanswerable(&self, span: &Span) {
        tracing::warn!(parent: span, "the message has no MSH-10 (control id): DLQ");
    }

    /// The attempts (or negative answers) allowed ran out: the message goes to the DLQ.
    pub fn gave_up(&self, span: &Span, reason: &'static str, attempts: u32) {
        tracing::warn!(parent: span, reason, attempts, "giving up: DLQ");
    }

    /// A DLQ write Kafka did not confirm; it is retried.
    pub fn dlq_write_failed(&self, error: &dyn std::fmt::Display) {
        tracing::warn!(destination = %self.name, error = %error, "DLQ write failed; retrying");
    }

    /// A ledger event was not written (`error`): written again until Kafka takes it, before its offset is stored.
    pub fn event_write_failed(&self, error: &dyn std::fmt::Display) {
        self.ledger_write_retries.inc();
        tracing::warn!(destination = %self.name, error = %error, "ledger event not written; retrying");
    }

    /// A message is in the DLQ for `reason`.
    pub fn dead_lettered(&self, reason: &'static str) {
        self.dlq_writes
            .get_or_create(&ReasonLabels {
                destination: self.name.clone(),
                reason,
            })
            .inc();
    }

    fn retries_for(&self, reason: &'static str) -> prometheus_client::metrics::counter::Counter {
        self.retries
            .get_or_create(&ReasonLabels {
                destination: self.name.clone(),
                reason,
            })
            .clone()
    }
}
