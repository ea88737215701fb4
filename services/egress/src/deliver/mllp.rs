//! Delivery over MLLP: one message in flight per connection, the answer read by MSA-2, negative ACKs retried as the
//! ACK policy says.

use super::ctx::DestCtx;
use super::ctx::Done;
use super::record::Answer;
use super::record::Delivery;
use super::record::Ending;
use super::state::set;
use crate::mllp_client::{MllpClient, SendError};
use hl7gw_runtime::proto::v1::Envelope;
use hl7v2::AckCode;
use std::time::{Instant, SystemTime};

impl DestCtx {
    /// Sends an output over MLLP until its answer settles it: AA/CA delivered; a negative ACK retried or
    /// dead-lettered as the ACK policy says; no answer retried as `retry` says. On the worker's connection, or a
    /// connection of its own.
    pub(super) async fn deliver_mllp(
        &self,
        client: Option<&mut MllpClient>,
        env: Envelope,
        d: Delivery<'_>,
    ) -> Done {
        let Delivery {
            m,
            key,
            generation,
            head,
            span,
            stop,
        } = d;

        // The worker hands every MLLP delivery one of its connections; a connection of its own otherwise.
        let mut spare;
        let client = match client {
            Some(c) => c,
            None => {
                spare = self.mllp_client();
                &mut spare
            }
        };
        let out = outgoing(&env.raw, &self.dest.ack_policy);
        // The receiver answers the control id it reads in the message sent (a route may have changed it).
        let sent_id = hl7v2::Header::salvage(&out).control_id;
        if sent_id.is_empty() {
            // No answer could name it (a route cleared MSH-10): sent, it would wait for one forever.
            self.m.unanswerable(span);
            let end = Ending {
                tries: 0,
                attempt: env.attempts,
                reason: "no_control_id",
                detail: "the message as sent has no MSH-10: no answer could be matched to it"
                    .into(),
                answer: Answer::default(),
            };
            return self.dead_letter(env, m, end, span, stop).await;
        }
        let retry = &self.dest.retry;
        let policy = &self.dest.ack_policy;
        let mut attempt = env.attempts;
        let mut tries = 0u32;
        let mut negative = 0u32;
        loop {
            attempt += 1;
            tries += 1;
            let started = Instant::now();
            let result = client.send(&out, sent_id).await;
            let reason: &'static str;
            let mut last_ack = None;
            match result {
                Ok(frame) => match hl7v2::read_ack(&frame) {
                    Some((code, _)) => {
                        let code_str = code.as_str();
                        self.m.answered(code);
                        set(&self.state.last_ack_code, code_str);
                        if let Ok(mut t) = self.state.last_ack_at.lock() {
                            *t = Some(SystemTime::now());
                        }
                        span.record("hl7.ack_code", code_str);
                        span.record("hl7.attempts", attempt);
                        match code {
                            AckCode::AA | AckCode::CA => {
                                let answer = (code_str, 0);
                                return self
                                    .delivered(&env, m, started, attempt, tries, key, answer);
                            }
                            negative_code => {
                                let error = err_code(&frame);
                                if !policy.retries(negative_code, error) {
                                    self.m.refused(span, code_str, error);
                                    let detail = match error {
                                        Some(e) => {
                                            format!("receiver answered {code_str} (ERR {e})")
                                        }
                                        None => format!("receiver answered {code_str}"),
                                    };
                                    let end = Ending {
                                        tries,
                                        attempt,
                                        reason: "rejected",
                                        detail,
                                        answer: Answer::ack(frame.freeze()),
                                    };
                                    return self.last_attempt(env, m, end, span, stop).await;
                                }
                                negative += 1;
                                reason = "negative_ack";
                                last_ack = Some(frame.freeze());
                            }
                        }
                    }
                    None => {
                        reason = "unreadable_ack";
                        client.disconnect();
                    }
                },
                Err(e) => {
                    reason = e.kind();
                    if !matches!(e, SendError::Connect(_) | SendError::ConnectTimeout) {
                        self.m.attempt_failed(span, &e);
                    }
                }
            }
            set(&self.state.last_error, reason);
            if (retry.max_attempts > 0 && tries >= retry.max_attempts)
                || (policy.max_retries > 0 && negative > policy.max_retries)
            {
                self.m.gave_up(span, reason, tries);
                let end = Ending {
                    tries,
                    attempt,
                    reason: "gave_up",
                    detail: format!("{tries} attempts, last: {reason}"),
                    answer: last_ack.map(Answer::ack).unwrap_or_default(),
                };
                return self.last_attempt(env, m, end, span, stop).await;
            }
            let wait = retry.backoff(tries, fastrand::f64());
            if !self
                .pause_before_retry(tries, reason, wait, generation, head, stop)
                .await
            {
                return Done::Abandoned;
            }
        }
    }

    /// A connection to the MLLP receiver (connected on its first send).
    pub(super) fn mllp_client(&self) -> MllpClient {
        MllpClient::new(
            self.dest.clone(),
            self.tls.clone(),
            self.m.connections_active.clone(),
            self.m.unmatched_acks.clone(),
        )
    }
}

/// The bytes to send: the message, with MSH-15 set to `AL` when it asks for no accept ACK and the policy says
/// so (a receiver that stays silent could never let the offset be committed).
pub(super) fn outgoing(raw: &bytes::Bytes, policy: &crate::config::AckPolicy) -> bytes::Bytes {
    // The header alone decides (no full parse for the common case: MSH-15 empty or AL).
    let msh15 = hl7v2::Header::salvage(raw).accept_ack_type;
    if !policy.rewrite_msh15 || msh15.is_empty() || msh15 == b"AL" {
        return raw.clone();
    }
    let Ok(m) = hl7v2::Message::parse(raw) else {
        return raw.clone();
    };
    let mut e = m.edit();
    match e.set("MSH-15", b"AL") {
        Ok(()) => e.encode().into(),
        Err(_) => raw.clone(),
    }
}

/// The table 0357 code of a negative answer: ERR-3 (v2.5+) or ERR-1's fourth component (v2.3/2.4).
pub(super) fn err_code(ack: &[u8]) -> Option<u16> {
    let m = hl7v2::Message::parse(ack).ok()?;
    ["ERR-3-1", "ERR-1-4-1"]
        .iter()
        .find_map(|p| m.get(p).filter(|v| !v.is_empty()))
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
}
