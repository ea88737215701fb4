//! One record's delivery, whatever the protocol: decoded, its `deliver` span, the duplicate checks, then MLLP or
//! HTTP; what both protocols share: the wait before a retry, a delivery's ledger event.

use super::ctx::DestCtx;
use super::ctx::Done;
use super::ctx::STAGE;
use super::state::Head;
use super::state::epoch_ms;
use crate::mllp_client::MllpClient;
use hl7gw_runtime::dedup::Seen;
use hl7gw_runtime::envelope;
use hl7gw_runtime::ledger;
use hl7gw_runtime::proto::v1::Envelope;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Message, OwnedMessage};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

impl DestCtx {
    pub(super) async fn deliver(
        &self,
        client: Option<&mut MllpClient>,
        m: &OwnedMessage,
        generation: u64,
        known: Option<(String, String)>,
        head: &Head,
        stop: &CancellationToken,
    ) -> Done {
        let payload = m.payload().unwrap_or_default();
        let env = match envelope::decode(payload) {
            Ok(e) => e,
            Err(e) => {
                let env = Envelope {
                    id: envelope::new_id(),
                    raw: payload.to_vec().into(),
                    destination: self.name.clone(),
                    ..Envelope::default()
                };
                let end = Ending {
                    tries: 0,
                    attempt: 0,
                    reason: "bad_envelope",
                    detail: e.to_string(),
                    answer: Answer::default(),
                };
                return self
                    .dead_letter(env, m, end, &tracing::Span::none(), stop)
                    .await;
            }
        };
        let received = env
            .received_at
            .and_then(|t| SystemTime::try_from(t).ok())
            .map_or(1, epoch_ms);
        head.received_ms.store(received.max(1), Ordering::Relaxed);
        let h = env.header.clone().unwrap_or_default();
        // A consumer span (OpenTelemetry messaging conventions) for the record of `hl7.out.<destination>`; no
        // `messaging.kafka.message.key`: the key is made of the patient id by default.
        let span = hl7gw_runtime::kafka_span!(
            consumer,
            record: (self.topic, m.partition(), m.offset()),
            "deliver",
            messaging.consumer.group.name = %self.cfg.group(&self.name),
            hl7.destination = %self.name,
            hl7.route = %env.route,
            hl7.message_type = %h.message_type,
            hl7.trigger_event = %h.trigger_event,
            hl7.control_id = %h.control_id,
            hl7.ack_code = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            hl7.attempts = tracing::field::Empty,
        );
        if let Some(tc) = &env.trace {
            hl7gw_runtime::telemetry::set_parent(&span, &tc.traceparent, &tc.tracestate);
        }
        // One output is one envelope (its id, given at the ingress) through one route: two senders that share a
        // control id, or two routes to this destination, are different outputs.
        let key = (!env.id.is_empty() && self.dedup.enabled()).then(|| {
            let replay = replay_mark(&env);
            self.dedup
                .key(&[env.id.as_bytes(), env.route.as_bytes(), replay.as_bytes()])
        });
        if let Some(key) = key
            && self.dedup.lookup(key, 0, Instant::now()) != Seen::New
        {
            self.m.duplicate_suppressed(&span);
            return Done::Settled(None);
        }
        if known.is_some_and(|(id, route)| id == env.id && route == env.route) {
            // Delivered by this partition's last owner after its last commit (the ledger has the event).
            self.m.duplicate_known(m.partition(), m.offset());
            return Done::Settled(None);
        }
        let delivery = Delivery {
            m,
            key,
            generation,
            head,
            span: &span,
            stop,
        };
        match &self.http {
            Some(http) => self.deliver_http(http, env, delivery).await,
            None => self.deliver_mllp(client, env, delivery).await,
        }
    }

    /// Counts a retry for `reason` and waits `wait` before attempt `tries + 1`. False when the partition moved
    /// or shutdown came meanwhile (the record is abandoned: read again by its next owner).
    pub(super) async fn pause_before_retry(
        &self,
        tries: u32,
        reason: &'static str,
        wait: Duration,
        generation: u64,
        head: &Head,
        stop: &CancellationToken,
    ) -> bool {
        if tries == 1 {
            self.state.retrying.fetch_add(1, Ordering::Relaxed);
            head.retrying_ms
                .store(epoch_ms(SystemTime::now()), Ordering::Relaxed);
        }
        self.m.retrying(reason);
        let moved = self.consumer.context().changed();
        if generation != self.consumer.context().generation() {
            self.state.retrying.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        tokio::select! {
            _ = moved => {}
            _ = stop.cancelled() => {
                self.state.retrying.fetch_sub(1, Ordering::Relaxed);
                return false;
            }
            _ = tokio::time::sleep(wait) => {}
        }
        if generation != self.consumer.context().generation() {
            self.state.retrying.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The receiver took the output (`answer`: the MSA-1 code, or an HTTP status): counted, remembered for
    /// the duplicate window, and its ledger event made.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn delivered(
        &self,
        env: &Envelope,
        m: &OwnedMessage,
        started: Instant,
        attempt: u32,
        tries: u32,
        key: Option<hl7gw_runtime::dedup::Key>,
        answer: (&str, u32),
    ) -> Done {
        self.accepted(env, started);
        let event = self.cfg.ledger.enabled().then(|| {
            let mut e = Box::new(ledger::event(ledger::kind::DELIVERED, STAGE, env));
            answer.0.clone_into(&mut e.ack_code);
            e.http_status = answer.1;
            e.attempts = attempt;
            e.latency_ms = ledger::latency_ms(env);
            e.topic.clone_from(&self.topic);
            e.offset = m.offset();
            e.consumer_group = self.cfg.group(&self.name);
            e
        });
        if let Some(key) = key {
            self.dedup
                .remember(key, 0, bytes::Bytes::new(), Instant::now());
        }
        if tries > 1 {
            self.state.retrying.fetch_sub(1, Ordering::Relaxed);
        }
        Done::Settled(event)
    }

    pub(super) fn accepted(&self, env: &Envelope, started: Instant) {
        self.state.delivered.fetch_add(1, Ordering::Relaxed);
        let received_at = env
            .received_at
            .as_ref()
            .and_then(|t| SystemTime::try_from(*t).ok());
        self.m.delivered(started, received_at);
    }
}

/// How a record's attempts ended in a dead letter.
pub(super) struct Ending {
    /// Tries in this delivery (more than one: it was counted as retrying).
    pub(super) tries: u32,
    /// The attempt count the envelope records.
    pub(super) attempt: u32,
    /// `rejected`, `gave_up`, `unauthorized`, ...
    pub(super) reason: &'static str,
    pub(super) detail: String,
    /// The receiver's last answer.
    pub(super) answer: Answer,
}

/// The receiver's last answer kept in a dead letter: its bytes (an ACK, or an HTTP response body) and, for
/// HTTP, the status.
#[derive(Debug, Default)]
pub(super) struct Answer {
    pub(super) body: bytes::Bytes,
    pub(super) http_status: u32,
}

impl Answer {
    pub(super) fn ack(frame: bytes::Bytes) -> Self {
        Self {
            body: frame,
            http_status: 0,
        }
    }

    pub(super) fn http(body: bytes::Bytes, status: u16) -> Self {
        Self {
            body,
            http_status: u32::from(status),
        }
    }
}

/// What a delivery carries into its destination's send loop besides the envelope.
pub(super) struct Delivery<'a> {
    pub(super) m: &'a OwnedMessage,
    pub(super) key: Option<hl7gw_runtime::dedup::Key>,
    pub(super) generation: u64,
    pub(super) head: &'a Head,
    pub(super) span: &'a tracing::Span,
    pub(super) stop: &'a CancellationToken,
}

/// What tells one replay of an output from another: the time of its last `replay` stage (empty for an output
/// never replayed). Part of the duplicate window's key, so a replay (forced ones too) is a delivery of its own,
/// while Kafka's redeliveries of that same replay record are still suppressed.
pub(super) fn replay_mark(env: &Envelope) -> String {
    env.stages
        .iter()
        .rev()
        .find(|s| s.name == "replay")
        .map(|s| {
            let at = s.at.unwrap_or_default();
            format!("replay@{}.{:09}", at.seconds, at.nanos)
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::deliver::dead_letters::tests::dead_letter;

    /// Issue 36, item 5: two replays of one output are two deliveries for the duplicate window; a record read
    /// twice is one; an output never replayed keeps the key it had.
    #[test]
    fn each_replay_is_its_own_delivery_for_the_duplicate_window() {
        let mut env = dead_letter(10, 0);
        assert_eq!(replay_mark(&env), "");
        envelope::push_stage(&mut env, "egress");
        assert_eq!(replay_mark(&env), "");
        let mut first = env.clone();
        envelope::push_stage(&mut first, "replay");
        std::thread::sleep(Duration::from_millis(2));
        let mut forced = env.clone();
        envelope::push_stage(&mut forced, "replay");
        assert_ne!(replay_mark(&first), "");
        assert_ne!(replay_mark(&first), replay_mark(&forced));
        // Routed again after its replay (a transformer letter): still that replay's.
        let mut routed = first.clone();
        envelope::push_stage(&mut routed, "transformer");
        assert_eq!(replay_mark(&routed), replay_mark(&first));
    }
}
