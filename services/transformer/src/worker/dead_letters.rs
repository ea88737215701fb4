//! The transformer's dead letters: a message no route takes or a route fails on, an output Kafka does not
//! take (too large, refused for good), each with its reason and where its input was read.

use super::records::Consumed;
use super::records::OutRecord;
use crate::config::Config;
use crate::metrics::TransformerMetrics;
use hl7gw_runtime::envelope;
use hl7gw_runtime::proto::v1::{Envelope, Rejection};

/// The stage name the transformer writes in envelopes, dead letters and events.
pub(super) const STAGE: &str = "transformer";

pub(super) fn dlq(
    cfg: &Config,
    mut env: Envelope,
    reason: &'static str,
    metrics: &TransformerMetrics,
    parent: &tracing::Span,
) -> OutRecord {
    envelope::push_stage(&mut env, "transformer");
    metrics.dead_lettered(reason);
    let traceparent = envelope::traceparent(&env);
    OutRecord {
        topic: cfg.dlq_topic.clone(),
        key: env.key.clone(),
        envelope: env,
        traceparent,
        parent: parent.clone(),
    }
}

/// An output larger than Kafka takes (`kafka.max_message_bytes`, e.g. the JSON of a message near the limit)
/// would fail its transaction on every retry and stop the pod: it goes to the DLQ instead, reason
/// `too_large`. The whole record counts (see [`record_size`]), not the envelope alone: librdkafka refuses a
/// record whose envelope fits but whose key, headers and overhead do not. The dead letter names the input it
/// was made from (`consumed`), so that a replay re-reads it from the inbound topic: the output is not kept.
pub(super) fn too_large_to_dlq(
    cfg: &Config,
    r: &mut OutRecord,
    consumed: Option<Consumed<'_>>,
    metrics: &TransformerMetrics,
) {
    let max = cfg.kafka.max_message_bytes;
    let size = record_size(&r.envelope, &r.key, &r.traceparent);
    if size <= max {
        return;
    }
    metrics.output_too_large(&r.envelope.route, size, max);
    let detail = format!(
        "output for {} of {size} bytes (record), over the {max}-byte record limit",
        r.topic
    );
    *r = refused_to_dlq(cfg, r, "too_large", detail, false, metrics);
    note_origin(&mut r.envelope, consumed);
}

/// Records in a dead letter where its input was read (unless it names an origin already).
pub(super) fn note_origin(env: &mut Envelope, consumed: Option<Consumed<'_>>) {
    if let (Some(c), Some(rej)) = (consumed, env.rejection.as_mut())
        && rej.origin_topic.is_empty()
    {
        rej.origin_topic = c.topic.to_owned();
        rej.origin_partition = c.partition;
        rej.origin_offset = c.offset;
    }
}

/// A dead letter, for `reason`, in place of the output `r` Kafka does not take (a dead letter already keeps its
/// own reason): without the message itself when `strip` or when the dead letter would not fit the record limit
/// either (the input stays in the inbound topic).
pub(super) fn refused_to_dlq(
    cfg: &Config,
    r: &mut OutRecord,
    reason: &'static str,
    detail: String,
    strip: bool,
    metrics: &TransformerMetrics,
) -> OutRecord {
    let mut env = std::mem::take(&mut r.envelope);
    let mut dead = match env.rejection.as_mut() {
        // A dead letter already (e.g. `parse`): it keeps its reason, and goes without the message.
        Some(rej) if r.topic == cfg.dlq_topic => {
            rej.detail = format!("{}; {detail}", rej.detail);
            OutRecord {
                topic: r.topic.clone(),
                key: std::mem::take(&mut r.key),
                envelope: env,
                traceparent: std::mem::take(&mut r.traceparent),
                parent: r.parent.clone(),
            }
        }
        _ => {
            env.rejection = Some(Rejection {
                stage: "transformer".into(),
                reason: reason.into(),
                detail,
                ..Rejection::default()
            });
            dlq(cfg, env, reason, metrics, &r.parent)
        }
    };
    if strip
        || record_size(&dead.envelope, &dead.key, &dead.traceparent) > cfg.kafka.max_message_bytes
    {
        envelope::drop_message(&mut dead.envelope);
    }
    dead
}

/// The size Kafka counts for the record of `env` keyed by `key` ([`envelope::record_size`]).
pub(super) fn record_size(env: &Envelope, key: &str, traceparent: &str) -> usize {
    use prost::Message as _;
    envelope::record_size(env, env.encoded_len(), key.len(), traceparent)
}
