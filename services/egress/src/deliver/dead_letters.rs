//! A record the destination will not take goes to the DLQ, shrunk to fit the record limit (answer first, then
//! the message), with its ledger event.

use super::ctx::DestCtx;
use super::ctx::Done;
use super::ctx::STAGE;
use super::record::Ending;
use hl7gw_runtime::envelope;
use hl7gw_runtime::ledger;
use hl7gw_runtime::proto::v1::{Envelope, Rejection};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::Producer as _;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

impl DestCtx {
    /// Writes the message to the DLQ, retrying until Kafka confirms, or shutdown. A dead letter larger than the
    /// record limit (the receiver's answer can be 1 MiB) is shrunk until it fits, as is one Kafka refuses for
    /// its size: never retried as it is. While dead letters cannot be written, readiness says why.
    ///
    /// The write is a producer span, `dead_letter`, child of the message's `deliver` span (`parent`; none for
    /// a record that is not an envelope): the dead letter carries its trace context, so that a replay of it
    /// continues the trace from there.
    pub(super) async fn dead_letter(
        &self,
        mut env: Envelope,
        m: &OwnedMessage,
        end: Ending,
        parent: &tracing::Span,
        stop: &CancellationToken,
    ) -> Done {
        let Ending {
            reason,
            detail,
            answer,
            ..
        } = end;
        let span = if parent.is_none() {
            tracing::Span::none()
        } else {
            hl7gw_runtime::kafka_span!(
                producer,
                parent: parent,
                topic: self.cfg.dlq_topic,
                "dead_letter",
                hl7.destination = %self.name,
                hl7.control_id = env.header.as_ref().map_or("", |h| h.control_id.as_str()),
                hl7.reason = reason,
            )
        };
        let (traceparent, tracestate) = hl7gw_runtime::telemetry::trace_context(&span);
        if !traceparent.is_empty() {
            env.trace = Some(hl7gw_runtime::proto::v1::TraceContext {
                traceparent,
                tracestate,
            });
        }
        env.destination = self.name.clone();
        env.rejection = Some(Rejection {
            stage: "egress".into(),
            reason: reason.into(),
            detail,
            ack: answer.body,
            hl7_error_code: 0,
            http_status: answer.http_status,
            // The record it is about: where a replay finds the message when it is dropped from the letter.
            origin_topic: self.topic.clone(),
            origin_partition: m.partition(),
            origin_offset: m.offset(),
            message_dropped: false,
        });
        envelope::push_stage(&mut env, "egress");
        let traceparent = envelope::traceparent(&env);
        let mut buf = Vec::new();
        shrink_to_fit(
            &mut env,
            &traceparent,
            self.cfg.kafka.max_message_bytes,
            &mut buf,
        );
        let mut wait = Duration::from_millis(200);
        let written = loop {
            let rec = envelope::encode_record(
                &self.cfg.dlq_topic,
                &env.key,
                &env,
                &traceparent,
                &mut buf,
            );
            let producer = self.producer.get();
            match producer.send(rec, Duration::from_secs(5)).await {
                Ok(d) => {
                    hl7gw_runtime::failpoint::after_send(producer.client());
                    break d;
                }
                Err(e) => {
                    if hl7gw_runtime::kafka::errors::is_fatal(&e) {
                        self.producer.recover_if_fatal();
                    }
                    self.m.dlq_write_failed(&e);
                    // Refused for its size: smaller at once. Sent again as it was, it would be refused forever.
                    if hl7gw_runtime::kafka::errors::is_too_large(&e) && shrink_one(&mut env) {
                        continue;
                    }
                    self.state.dlq_failing(Some(&e.to_string()));
                    tokio::select! {
                        _ = stop.cancelled() => return Done::Abandoned,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        };
        self.state.dlq_failing(None);
        hl7gw_runtime::telemetry::record_placement(&span, None, Some(written));
        self.m.dead_lettered(reason);
        self.state.dead_lettered.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut by) = self.state.dead_lettered_by_reason.lock() {
            *by.entry(reason).or_default() += 1;
        }
        let event = self.cfg.ledger.enabled().then(|| {
            let mut e = Box::new(ledger::event(ledger::kind::DEAD_LETTERED, STAGE, &env));
            e.reason = reason.to_owned();
            e.attempts = env.attempts;
            e.http_status = env.rejection.as_ref().map_or(0, |r| r.http_status);
            e.ack_code = env
                .rejection
                .as_ref()
                .and_then(|r| hl7v2::read_ack(&r.ack))
                .map(|(c, _)| c.as_str().to_owned())
                .unwrap_or_default();
            e.topic.clone_from(&self.cfg.dlq_topic);
            (e.partition, e.offset) = written;
            e
        });
        Done::Settled(event)
    }

    /// The attempts at a record end in a dead letter (`end` says why); the record no longer counts as retrying.
    /// The `deliver` span (`span`) gets `hl7.attempts` here too: a receiver that never answered (connection
    /// refused, timeouts) left it without one (issue 37, tests/jaeger.rs).
    pub(super) async fn last_attempt(
        &self,
        mut env: Envelope,
        m: &OwnedMessage,
        end: Ending,
        span: &tracing::Span,
        stop: &CancellationToken,
    ) -> Done {
        if end.tries > 1 {
            self.state.retrying.fetch_sub(1, Ordering::Relaxed);
        }
        span.record("hl7.attempts", end.attempt);
        env.attempts = end.attempt;
        self.dead_letter(env, m, end, span, stop).await
    }
}

/// Encodes `env` into `buf` and returns the size Kafka counts for its record ([`envelope::record_size`]).
pub(super) fn encoded_size(env: &Envelope, traceparent: &str, buf: &mut Vec<u8>) -> usize {
    envelope::encode_into(env, buf);
    envelope::record_size(env, buf.len(), env.key.len(), traceparent)
}

/// Shrinks a dead letter until its record fits `max` bytes (see [`shrink_one`]); `buf` is scratch space.
pub(super) fn shrink_to_fit(env: &mut Envelope, traceparent: &str, max: usize, buf: &mut Vec<u8>) {
    while encoded_size(env, traceparent, buf) > max && shrink_one(env) {}
}

/// Drops the next part of a dead letter that may be dropped: the receiver's answer, then the message itself,
/// each noted in the rejection's detail (the message with its size and SHA-256; the ids, header and reason
/// stay). False when nothing is left to drop.
pub(super) fn shrink_one(env: &mut Envelope) -> bool {
    let Some(rej) = env.rejection.as_mut() else {
        return false;
    };
    if !rej.ack.is_empty() {
        let n = std::mem::take(&mut rej.ack).len();
        rej.detail = format!(
            "{}; the receiver's answer ({n} bytes) is not stored",
            rej.detail
        );
        return true;
    }
    if env.raw.is_empty() {
        return false;
    }
    envelope::drop_message(env);
    true
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A dead letter with a message of `raw` bytes and an answer of `ack` bytes.
    pub(in crate::deliver) fn dead_letter(raw: usize, ack: usize) -> Envelope {
        Envelope {
            id: "e1".into(),
            key: "FAC|P1".into(),
            raw: vec![b'M'; raw].into(),
            rejection: Some(Rejection {
                stage: "egress".into(),
                reason: "rejected".into(),
                detail: "receiver answered AE".into(),
                ack: vec![b'A'; ack].into(),
                hl7_error_code: 0,
                http_status: 0,
                ..Rejection::default()
            }),
            ..Envelope::default()
        }
    }

    /// Issue 24, item 6: a dead letter over the record limit loses the receiver's answer first, then the
    /// message (its size and SHA-256 noted), never its ids or reason; one that fits is left alone.
    #[test]
    fn a_dead_letter_is_shrunk_answer_first_until_it_fits() {
        let mut buf = Vec::new();
        let mut env = dead_letter(10_000, 5_000);
        shrink_to_fit(&mut env, "", 20_000, &mut buf);
        assert_eq!(
            (env.raw.len(), env.rejection.as_ref().unwrap().ack.len()),
            (10_000, 5_000)
        );

        shrink_to_fit(&mut env, "", 12_000, &mut buf);
        let rej = env.rejection.clone().unwrap();
        assert_eq!((env.raw.len(), rej.ack.len()), (10_000, 0));
        assert!(
            rej.detail.contains("answer (5000 bytes) is not stored"),
            "{}",
            rej.detail
        );
        assert!(encoded_size(&env, "", &mut buf) <= 12_000);

        assert!(!env.rejection.as_ref().unwrap().message_dropped);
        shrink_to_fit(&mut env, "", 2_000, &mut buf);
        let rej = env.rejection.clone().unwrap();
        assert!(env.raw.is_empty());
        assert!(
            rej.message_dropped,
            "a replay must know the message is not here"
        );
        assert!(
            rej.detail.contains("(10000 bytes, sha256 "),
            "{}",
            rej.detail
        );
        assert_eq!((env.id.as_str(), rej.reason.as_str()), ("e1", "rejected"));
        assert!(encoded_size(&env, "", &mut buf) <= 2_000);
        // Nothing left to drop: Kafka refusing it now is not a size it can fix.
        assert!(!shrink_one(&mut env));
    }
}
