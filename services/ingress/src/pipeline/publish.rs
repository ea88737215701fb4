//! Waiting for Kafka: the delivery report (bounded by `ack_timeout`), a resend's first copy, and what
//! goes to the dead-letter topic instead (rejects, records too large).

use super::*;

impl Pipeline {
    /// Waits for Kafka's answer, bounded by `ack_timeout` from the publish.
    pub async fn resolve(&self, p: Pending) -> Reply {
        let p = match p {
            Pending::Ready(r) => return r,
            Pending::Batch {
                frame,
                parts,
                header,
            } => {
                let mut acks = Vec::with_capacity(parts.len());
                let mut answered = Vec::with_capacity(parts.len());
                let mut all_accepted = true;
                for p in parts {
                    let r = Box::pin(self.resolve(p)).await;
                    if matches!(r.action, Action::Close) {
                        // Unanswered as a whole: the sender resends the batch; what was stored is a resend then.
                        return r;
                    }
                    all_accepted &= matches!(r.action, Action::Accept | Action::Replay(_));
                    answered.push((r.frame.clone(), self.answer_code(&r)));
                    let mut one = Vec::with_capacity(256);
                    if let Some(code) = self.render(&r, &mut one) {
                        acks.push((one, code));
                    }
                }
                return Reply {
                    action: Action::Batch(Box::new(BatchReply {
                        acks,
                        answered,
                        all_accepted,
                        header,
                    })),
                    frame,
                    envelope_id: String::new(),
                    ticket: None,
                };
            }
            Pending::Waiting {
                frame,
                first,
                started,
                msg_type,
            } => return self.await_first_copy(frame, first, started, msg_type).await,
            Pending::Publishing(p) => p,
        };
        let (frame, started, msg_type, span) = (p.frame, p.started, p.msg_type, p.span);
        // A record Kafka refused is dead-lettered with what is known of its source (not its connection id).
        let origin = Origin {
            listener: p.listener,
            protocol: p.protocol,
            peer: p.peer,
            connection_id: String::new(),
            tls_client: String::new(),
        };
        let deadline = tokio::time::Instant::from_std(started + self.cfg.ack_timeout);
        let res = tokio::time::timeout_at(deadline, p.delivery).await;
        drop(p.in_flight);
        match res {
            Ok(Ok(Ok((partition, offset)))) => {
                // A success report may come without an offset (runtime kafka/delivery.rs, `confirmed`).
                hl7gw_runtime::telemetry::record_placement(&span, None, Some((partition, offset)));
                self.metrics
                    .publish_duration
                    .observe(started.elapsed().as_secs_f64());
                self.metrics.message(msg_type, outcome::ACCEPTED);
                Reply {
                    action: Action::Accept,
                    frame,
                    envelope_id: p.envelope_id,
                    ticket: p.ticket,
                }
            }
            // The topic's own limit is below the record: no resend can succeed.
            Ok(Ok(Err((e, size)))) if is_too_large(&e) => {
                self.metrics.publish_failed(kafka_reason(&e));
                tracing::warn!(parent: &span, size, "the topic refused the record as too large");
                let r = self.too_large(size);
                self.reject(frame, r, Some(&origin), 0, SystemTime::now())
            }
            Ok(Ok(Err((e, _))))
                if e.rdkafka_error_code()
                    != Some(rdkafka::types::RDKafkaErrorCode::MessageTimedOut) =>
            {
                let h = Header::salvage(&frame);
                let who = Who::new(&h, &origin.peer, &origin.listener);
                self.kafka_refused(
                    &e,
                    &who,
                    &span,
                    msg_type,
                    "Kafka did not store the message: AR/CR 207",
                );
                self.unavailable(frame, "kafka_unavailable")
            }
            Ok(Err(_)) => {
                self.metrics.message(msg_type, outcome::UNAVAILABLE);
                self.unavailable(frame, "kafka_unavailable")
            }
            // Our timer or librdkafka's own delivery timeout (set to the same bound): `on_timeout` decides.
            Ok(Ok(Err(_))) | Err(_) => {
                self.metrics.publish_failed("timeout");
                let h = Header::salvage(&frame);
                let who = Who::new(&h, &origin.peer, &origin.listener);
                tracing::warn!(
                    parent: &span,
                    sending_application = %who.app(),
                    sending_facility = %who.fac(),
                    peer = %who.peer,
                    listener = %who.listener,
                    on_timeout = ?self.cfg.on_timeout,
                    "Kafka did not confirm within ack_timeout"
                );
                self.metrics.message(msg_type, outcome::UNAVAILABLE);
                match self.cfg.on_timeout {
                    OnTimeout::Nak => self.unavailable(frame, "kafka_timeout"),
                    OnTimeout::Close => Reply {
                        action: Action::Close,
                        frame,
                        envelope_id: String::new(),
                        ticket: None,
                    },
                }
            }
        }
    }

    /// A resend that arrived while its first copy was in flight: the first copy's ACK once it was accepted,
    /// AR/CR 207 when it was not (or not within `ack_timeout`), so the sender resends.
    async fn await_first_copy(
        &self,
        frame: Bytes,
        mut first: tokio::sync::watch::Receiver<FirstCopy>,
        started: Instant,
        msg_type: MsgType,
    ) -> Reply {
        let deadline = tokio::time::Instant::from_std(started + self.cfg.ack_timeout);
        let first_ack = tokio::time::timeout_at(deadline, async {
            first
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|v| v.clone())
                .flatten()
        })
        .await;
        if let Ok(Some(ack)) = first_ack {
            self.metrics.message(msg_type, outcome::DUPLICATE);
            return Reply {
                action: Action::Replay(ack),
                frame,
                envelope_id: String::new(),
                ticket: None,
            };
        }
        self.metrics.message(msg_type, outcome::UNAVAILABLE);
        self.unavailable(frame, "kafka_unavailable")
    }

    /// Kafka refused or lost a message and a resend may get through: the producer recreated if it broke for good,
    /// the failure counted, one line saying `what` with who sent it (never the patient), the message counted
    /// unavailable. The caller answers AR/CR 207 ([`Self::unavailable`]).
    pub(super) fn kafka_refused(
        &self,
        e: &rdkafka::error::KafkaError,
        who: &Who<'_>,
        span: &tracing::Span,
        t: MsgType,
        what: &'static str,
    ) {
        if is_fatal(e) {
            self.producer.recover_if_fatal();
        }
        self.metrics.publish_failed(kafka_reason(e));
        tracing::warn!(
            parent: span,
            error = %e,
            sending_application = %who.app(),
            sending_facility = %who.fac(),
            peer = %who.peer,
            listener = %who.listener,
            "{what}"
        );
        self.metrics.message(t, outcome::UNAVAILABLE);
    }

    /// AR/CR 207: the sender may resend.
    pub(super) fn unavailable(&self, frame: Bytes, reason: &'static str) -> Reply {
        Reply {
            action: Action::Reject(Rejected::reject(
                ErrorCode::ApplicationInternalError,
                reason,
                "system unavailable, resend later",
            )),
            frame,
            envelope_id: String::new(),
            ticket: None,
        }
    }

    /// AE for a message whose record is larger than Kafka takes: permanent, the sender must not resend it.
    pub(super) fn too_large(&self, size: usize) -> Rejected {
        Rejected::error(
            ErrorCode::ApplicationInternalError,
            "too_large",
            format!(
                "message too large for Kafka: a {size}-byte record, the limit is {} bytes",
                self.cfg.kafka.max_message_bytes
            ),
        )
    }

    /// Counts a rejection, sends the input to the DLQ (without waiting), and returns the NAK reply. `origin`
    /// is unknown for a record Kafka refused after the publish. A DLQ record that would exceed the record
    /// limit keeps the metadata and the reason but not the message itself.
    pub(super) fn reject(
        &self,
        frame: Bytes,
        r: Rejected,
        origin: Option<&Origin>,
        sequence: u64,
        received: SystemTime,
    ) -> Reply {
        let h = Header::salvage(&frame);
        let who = origin.map_or(Who::new(&h, "", ""), |o| Who::new(&h, &o.peer, &o.listener));
        self.metrics.rejected(
            MsgType::new(h.message_type),
            r.reason,
            r.code.code(),
            h.control_id,
            &who,
        );
        let id = envelope::new_id();
        let mut env = self.envelope(&id, received, origin, &frame, &h, self.fallback, sequence);
        env.rejection = Some(Rejection {
            stage: "ingress".into(),
            reason: r.reason.into(),
            hl7_error_code: u32::from(r.code.code()),
            detail: r.text.clone(),
            ack: Bytes::new(),
            http_status: 0,
            ..Default::default()
        });
        let mut payload = Vec::new();
        envelope::encode_into(&env, &mut payload);
        if payload.len() > self.cfg.kafka.max_message_bytes {
            envelope::drop_message(&mut env);
            envelope::encode_into(&env, &mut payload);
        }
        let hdrs = kafka_headers(&h, None);
        let record = FutureRecord::<(), _>::to(&self.cfg.dlq_topic)
            .payload(&payload)
            .headers(hdrs);
        let reason = r.reason;
        match self.producer.get().send_result(record) {
            Ok(delivery) => {
                let metrics = self.metrics.clone();
                tokio::spawn(async move {
                    match delivery.await {
                        Ok(Ok(_)) => metrics
                            .dlq_writes
                            .get_or_create(&ReasonLabels { reason })
                            .inc(),
                        _ => metrics.dlq_failures.inc(),
                    }
                });
            }
            Err(_) => {
                self.metrics.dlq_failures.inc();
            }
        }
        Reply {
            action: Action::Reject(r),
            frame,
            envelope_id: id,
            ticket: None,
        }
    }
}
