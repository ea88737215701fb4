//! Accepting a message: split batches, parse and validate the header, answer duplicates from memory,
//! build the envelope and hand the record to the producer.

use super::*;

impl Pipeline {
    /// Everything up to the publish: returns the answer, or the delivery to wait for. An FHS/BHS batch is cut
    /// into its messages, each submitted (and accepted or rejected) on its own.
    pub fn submit(&self, frame: Bytes, origin: &Origin, sequence: u64) -> Pending {
        if hl7v2::is_batch(&frame)
            && let Ok(split) = hl7v2::batch::split(&frame)
            && !split.messages.is_empty()
        {
            self.metrics.batches.inc();
            let header = BatchHeader::read(&split);
            if let Some(r) = self.batch_refusal(&split) {
                return self.refuse_batch(frame.clone(), &split, header, r, origin, sequence);
            }
            let parts = split
                .messages
                .iter()
                .map(|m| self.submit_one(frame.slice_ref(m), origin, sequence))
                .collect();
            return Pending::Batch {
                frame,
                parts,
                header,
            };
        }
        self.submit_one(frame, origin, sequence)
    }

    /// Why a batch is refused whole: more messages than `max_batch_messages`, or trailer counts (BTS-1,
    /// FTS-1) that disagree with what it holds (a message lost, or merged into another by a misnamed `msh`).
    fn batch_refusal(&self, split: &hl7v2::Split<'_>) -> Option<Rejected> {
        let (n, max) = (split.messages.len(), self.cfg.max_batch_messages);
        if n > max {
            return Some(Rejected::error(
                ErrorCode::ApplicationInternalError,
                "batch_too_large",
                format!(
                    "the batch holds {n} messages, more than the {max} accepted in one batch: none was \
                     stored; send them in smaller batches"
                ),
            ));
        }
        let m = split.mismatches.first()?;
        let (what, count) = match m.trailer {
            "BTS" => ("messages", "BTS-1"),
            _ => ("batches", "FTS-1"),
        };
        Some(Rejected::error(
            ErrorCode::SegmentSequence,
            "batch_count_mismatch",
            format!(
                "{count} says {} {what}, the file holds {}: none was stored (a message may be missing or \
                 merged into the one before it)",
                m.declared, m.actual
            ),
        ))
    }

    /// A batch refused whole: dead-lettered once as received, and answered with an acknowledgment batch
    /// holding one negative ACK (addressed from its first message) that says why.
    fn refuse_batch(
        &self,
        frame: Bytes,
        split: &hl7v2::Split<'_>,
        header: BatchHeader,
        r: Rejected,
        origin: &Origin,
        sequence: u64,
    ) -> Pending {
        let first = split
            .messages
            .first()
            .map_or_else(Bytes::new, |m| frame.slice_ref(m));
        let mut answer = self.reject(frame.clone(), r, Some(origin), sequence, SystemTime::now());
        answer.frame = first;
        Pending::Batch {
            frame,
            parts: vec![Pending::Ready(answer)],
            header,
        }
    }

    /// [`Pipeline::submit`] for one message.
    fn submit_one(&self, frame: Bytes, origin: &Origin, sequence: u64) -> Pending {
        let received = SystemTime::now();
        // The message's span is the producer of its `hl7.inbound` record (OpenTelemetry messaging conventions;
        // the topic is recorded when the record is handed to the producer, so a message refused before has
        // none; `messaging.kafka.message.key` is left out: the key is made of the patient id by default).
        let span = hl7gw_runtime::kafka_span!(
            producer,
            "hl7.ingest",
            hl7.message_type = tracing::field::Empty,
            hl7.trigger_event = tracing::field::Empty,
            hl7.control_id = tracing::field::Empty,
            hl7.size = frame.len(),
        );
        let msg = match Message::parse(&frame) {
            Ok(m) => m,
            Err(e) => {
                let r = Rejected::error(e.code(), e.kind(), e.to_string());
                return Pending::Ready(self.reject(frame, r, Some(origin), sequence, received));
            }
        };
        let h = *msg.header();
        let t = MsgType::new(h.message_type);
        // Bounded like the `hl7.type` header: read before the header's lengths are checked.
        let code = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(MAX_CODE)]).into_owned();
        span.record("hl7.message_type", code(h.message_type).as_str());
        span.record("hl7.trigger_event", code(h.trigger_event).as_str());
        span.record(
            "hl7.control_id",
            String::from_utf8_lossy(&h.control_id[..h.control_id.len().min(64)]).as_ref(),
        );
        let charset = match self.validate(&h, &frame) {
            Ok(c) => c,
            Err(r) => {
                return Pending::Ready(self.reject(frame, r, Some(origin), sequence, received));
            }
        };
        let mut ticket = self.dedup.enabled().then(|| Ticket {
            key: self
                .dedup
                .key(&[h.sending_application, h.sending_facility, h.control_id]),
            digest: self.dedup.digest(&frame),
            fast: None,
            claim: None,
        });
        if let Some(tk) = &mut ticket {
            match self.dedup.claim(tk.key, tk.digest, Instant::now()) {
                Claimed::New(c) => tk.claim = Some(c),
                Claimed::Reused(c) => {
                    tk.claim = Some(c);
                    self.metrics.control_id_reused.inc();
                    tracing::info!(parent: &span, "control id reused with other content: a new message");
                }
                Claimed::Resend(ack) => {
                    self.metrics.message(t, outcome::DUPLICATE);
                    tracing::debug!(parent: &span, "duplicate: replaying the first ACK");
                    return Pending::Ready(Reply {
                        action: Action::Replay(ack),
                        frame,
                        envelope_id: String::new(),
                        ticket: None,
                    });
                }
                // Fast mode answered the first copy before Kafka did: a resend is the sender's second
                // chance if that copy is lost, so it is published again (at least once) instead of waiting.
                Claimed::InFlight(_) if self.cfg.ack_mode == AckMode::Fast => {}
                Claimed::InFlight(first) => {
                    tracing::debug!(parent: &span, "duplicate of a message in flight: waiting for its ACK");
                    return Pending::Waiting {
                        frame,
                        first,
                        started: Instant::now(),
                        msg_type: t,
                    };
                }
            }
        }
        let key = self.kafka_key(&msg);
        let (traceparent, tracestate) = hl7gw_runtime::telemetry::trace_context(&span);
        let id = envelope::new_id();
        let env = self
            .envelope(&id, received, Some(origin), &frame, &h, charset, sequence)
            .with_trace(traceparent.clone(), tracestate.clone())
            .with_key(String::from_utf8_lossy(&key).into_owned());
        let mut payload = Vec::new();
        envelope::encode_into(&env, &mut payload);
        if payload.len() > self.cfg.kafka.max_message_bytes {
            let r = self.too_large(payload.len());
            return Pending::Ready(self.reject(frame, r, Some(origin), sequence, received));
        }
        let hdrs = kafka_headers(&h, Some((&traceparent, &tracestate)));
        let mut record = FutureRecord::to(&self.cfg.inbound_topic)
            .payload(&payload)
            .headers(hdrs);
        if !key.is_empty() {
            record = record.key(&key);
        }
        hl7gw_runtime::telemetry::record_placement(&span, Some(&self.cfg.inbound_topic), None);
        let started = Instant::now();
        let producer = self.producer.get();
        let delivery = match producer.send_result(record) {
            Ok(d) => {
                hl7gw_runtime::failpoint::after_send(producer.client());
                d
            }
            Err(e) => {
                if is_too_large(&e) {
                    if is_fatal(&e) {
                        self.producer.recover_if_fatal();
                    }
                    self.metrics.publish_failed(kafka_reason(&e));
                    let r = self.too_large(payload.len());
                    return Pending::Ready(self.reject(frame, r, Some(origin), sequence, received));
                }
                let who = Who::new(&h, &origin.peer, &origin.listener);
                self.kafka_refused(
                    &e,
                    &who,
                    &span,
                    t,
                    "publish refused by the producer: AR/CR 207",
                );
                return Pending::Ready(self.unavailable(frame, "kafka_unavailable"));
            }
        };
        match self.cfg.ack_mode {
            AckMode::Durable => Pending::Publishing(Publish {
                frame,
                delivery,
                started,
                envelope_id: id,
                ticket,
                msg_type: t,
                span,
                in_flight: InFlight::new(&self.metrics.in_flight),
                peer: origin.peer.clone(),
                listener: origin.listener.clone(),
                protocol: origin.protocol,
            }),
            AckMode::Fast => {
                self.metrics.message(t, outcome::ACCEPTED);
                let metrics = self.metrics.clone();
                let fast = ticket.as_mut().map(|tk| {
                    let f = Arc::new(FastStore {
                        state: Mutex::default(),
                        claim: Mutex::new(tk.claim.take()),
                    });
                    tk.fast = Some(f.clone());
                    (self.dedup.clone(), tk.key, tk.digest, f)
                });
                tokio::spawn(async move {
                    let stored = match delivery.await {
                        Ok(Ok(_)) => {
                            metrics
                                .publish_duration
                                .observe(started.elapsed().as_secs_f64());
                            true
                        }
                        Ok(Err((e, _))) => {
                            metrics.publish_failed(kafka_reason(&e));
                            tracing::error!(parent: &span, error = %e, "fast mode: an ACKed message was not stored");
                            false
                        }
                        Err(_) => {
                            metrics.publish_failed("canceled");
                            false
                        }
                    };
                    if let Some((dedup, key, digest, f)) = fast {
                        if !stored {
                            f.failed();
                        } else if let Some(ack) = f.stored() {
                            dedup.remember(key, digest, ack.clone(), Instant::now());
                            if let Some(c) = f.take_claim() {
                                c.accepted(ack);
                            }
                        }
                    }
                });
                Pending::Ready(Reply {
                    action: Action::Accept,
                    frame,
                    envelope_id: id,
                    ticket,
                })
            }
        }
    }

    fn validate(&self, h: &Header<'_>, frame: &[u8]) -> Result<Charset, Rejected> {
        if h.control_id.is_empty() {
            return Err(Rejected::error(
                ErrorCode::RequiredFieldMissing,
                "missing_control_id",
                "MSH-10 (message control id) is empty",
            )
            .at_msh(10));
        }
        // The standard's lengths (HL7 2.7: MSH-10 ST 199, MSH-3 to MSH-6 HD 227, MSH-9's codes, MSH-11 PT,
        // MSH-12 VID) for every field a key, the ACK or a log line carries; longer values would let crafted
        // messages make each of them large (an ACK echoing 1 MB of MSH-12, remembered in the duplicate window).
        for (field, value, max) in [
            (10, h.control_id, MAX_CONTROL_ID),
            (3, h.sending_application, MAX_HD),
            (4, h.sending_facility, MAX_HD),
            (5, h.receiving_application, MAX_HD),
            (6, h.receiving_facility, MAX_HD),
            (9, h.message_type, MAX_CODE),
            (9, h.trigger_event, MAX_CODE),
            (9, h.structure, MAX_CODE),
            (11, h.processing_field, MAX_PROCESSING_FIELD),
            (12, h.version_field, MAX_VERSION_FIELD),
        ] {
            if value.len() > max {
                return Err(Rejected::error(
                    ErrorCode::ValueTooLong,
                    "value_too_long",
                    format!("MSH-{field} is longer than {max} characters"),
                )
                .at_msh(field));
            }
        }
        if h.version.is_empty()
            || !self
                .cfg
                .versions
                .iter()
                .any(|v| h.version.starts_with(v.as_bytes()))
        {
            return Err(Rejected::reject(
                ErrorCode::UnsupportedVersionId,
                "unsupported_version",
                format!(
                    "MSH-12 version {:?} is not accepted",
                    String::from_utf8_lossy(&h.version[..h.version.len().min(16)])
                ),
            )
            .at_msh(12));
        }
        if !self.cfg.processing_ids.is_empty()
            && !self
                .cfg
                .processing_ids
                .iter()
                .any(|p| p.as_bytes() == h.processing_id)
        {
            return Err(Rejected::reject(
                ErrorCode::UnsupportedProcessingId,
                "unsupported_processing_id",
                "MSH-11 processing id is not accepted",
            )
            .at_msh(11));
        }
        if h.charset.is_empty() {
            return Ok(self.fallback);
        }
        let cs = Charset::from_msh18(h.charset).map_err(|_| {
            Rejected::reject(
                ErrorCode::TableValueNotFound,
                "unsupported_charset",
                "MSH-18 character set is not supported",
            )
            .at_msh(18)
        })?;
        cs.decode(frame).map_err(|_| {
            Rejected::error(
                ErrorCode::DataType,
                "charset_mismatch",
                format!("message bytes are not valid {}", cs.name()),
            )
            .at_msh(18)
        })?;
        Ok(cs)
    }

    fn kafka_key(&self, msg: &Message<'_>) -> Vec<u8> {
        let key = envelope::kafka_key(msg, &self.key_paths);
        match &self.key_salt {
            Some(salt) if !key.is_empty() => envelope::salted_key(salt, &key),
            _ => key,
        }
    }

    /// The envelope every record of this ingress starts from.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn envelope(
        &self,
        id: &str,
        received: SystemTime,
        origin: Option<&Origin>,
        frame: &Bytes,
        h: &Header<'_>,
        charset: Charset,
        sequence: u64,
    ) -> Envelope {
        Envelope {
            id: id.to_owned(),
            received_at: Some(envelope::timestamp(received)),
            source: origin.map(|o| self.source(o)),
            raw: frame.clone(),
            charset: charset_label(h, &self.cfg.charset_fallback),
            header: Some(envelope::header(h, charset)),
            trace: None,
            sequence,
            attempts: 0,
            stages: vec![Stage {
                name: "ingress".into(),
                at: Some(envelope::timestamp(received)),
                pod: self.pod.clone(),
            }],
            rejection: None,
            destination: String::new(),
            key: String::new(),
            route: String::new(),
            content_type: String::new(),
        }
    }

    fn source(&self, o: &Origin) -> Source {
        Source {
            listener: o.listener.to_string(),
            peer: o.peer.to_string(),
            pod: self.pod.clone(),
            protocol: o.protocol.into(),
            connection_id: o.connection_id.clone(),
            tls_client: o.tls_client.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin {
            listener: "mllp".into(),
            protocol: "mllp",
            peer: "127.0.0.1:1".into(),
            connection_id: "c1".into(),
            tls_client: String::new(),
        }
    }

    /// The reason a message is refused before any publish (its DLQ record is only queued here).
    fn refused(cfg: Config, msg: &str) -> &'static str {
        let pipe = test_pipeline(cfg);
        match pipe.submit(Bytes::copy_from_slice(msg.as_bytes()), &origin(), 1) {
            Pending::Ready(Reply {
                action: Action::Reject(r),
                ..
            }) => r.reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    /// A batch of `n` tiny messages whose BTS-1 says `declared`.
    fn batch(n: usize, declared: usize) -> String {
        let mut b = String::from("FHS|^~\\&|APP|FAC\rBHS|^~\\&|APP|FAC\r");
        for i in 0..n {
            b.push_str(&format!(
                "MSH|^~\\&|APP|FAC|GW|HOSP|2026||ADT^A01|B{i}|P|2.5\rPID|1||{i}\r"
            ));
        }
        b.push_str(&format!("BTS|{declared}\rFTS|1\r"));
        b
    }

    /// The reasons of a batch's answers, without waiting for Kafka (refusals are answered at once).
    fn batch_reasons(pipe: &Pipeline, b: String) -> Vec<&'static str> {
        match pipe.submit(Bytes::from(b), &origin(), 1) {
            Pending::Batch { parts, .. } => parts
                .iter()
                .map(|p| match p {
                    Pending::Ready(r) => r.reason(),
                    _ => "publishing",
                })
                .collect(),
            other => panic!("not a batch: {other:?}"),
        }
    }

    /// Issue 24, items 4 and 15: a batch over `max_batch_messages` (here the largest a 1 MiB frame holds),
    /// and one whose BTS-1 disagrees with the messages found (a misnamed `msh` merged two), are refused whole
    /// with one answer, before any record is made; a batch at the limit is taken message by message.
    #[tokio::test]
    async fn oversized_and_miscounted_batches_are_refused_whole() {
        let pipe = test_pipeline(Config::default());
        let mut n = 0;
        while batch(n + 1000, n + 1000).len() < hl7v2::mllp::DEFAULT_MAX_FRAME {
            n += 1000;
        }
        assert!(n > 10_000, "{n} messages");
        assert_eq!(batch_reasons(&pipe, batch(n, n)), ["batch_too_large"]);
        let small = Config {
            max_batch_messages: 3,
            ..Config::default()
        };
        let pipe = test_pipeline(small);
        assert_eq!(batch_reasons(&pipe, batch(4, 4)), ["batch_too_large"]);
        assert_eq!(batch_reasons(&pipe, batch(3, 3)).len(), 3);
        let merged = batch(3, 3).replace(
            "MSH|^~\\&|APP|FAC|GW|HOSP|2026||ADT^A01|B1",
            "msh|^~\\&|APP|FAC|GW|HOSP|2026||ADT^A01|B1",
        );
        assert_eq!(batch_reasons(&pipe, merged), ["batch_count_mismatch"]);
    }

    /// A runtime: a refused message's DLQ record is published from a task.
    #[tokio::test]
    async fn header_rules_refuse_before_the_publish() {
        let msh = |ctrl: &str, version: &str, charset: &str| {
            format!(
                "MSH|^~\\&|APP|FAC|GW|HOSP|20260101120000||ADT^A01|{ctrl}|P|{version}||||||{charset}\rPID|1||123^^^H^MR\r"
            )
        };
        let cfg = Config::default;
        assert_eq!(refused(cfg(), &msh("", "2.5", "")), "missing_control_id");
        assert_eq!(
            refused(cfg(), &msh(&"9".repeat(MAX_CONTROL_ID + 1), "2.5", "")),
            "value_too_long"
        );
        assert_eq!(refused(cfg(), &msh("C1", "", "")), "unsupported_version");
        assert_eq!(
            refused(cfg(), &msh("C1", "2.5", "NOT-A-CHARSET")),
            "unsupported_charset"
        );
        // Issue 24, item 9: the fields the ACK echoes are held to HL7's lengths, and the NAK stays small.
        let long = "9".repeat(1 << 20);
        for msg in [
            msh("C1", &format!("2.5{long}"), ""),
            format!("MSH|^~\\&|APP|FAC|{long}|HOSP|20260101120000||ADT^A01|C1|P|2.5\r"),
            format!("MSH|^~\\&|APP|FAC|GW|{long}|20260101120000||ADT^A01|C1|P|2.5\r"),
            format!("MSH|^~\\&|APP|FAC|GW|HOSP|20260101120000||ADT^A{long}|C1|P|2.5\r"),
            format!("MSH|^~\\&|APP|FAC|GW|HOSP|20260101120000||ADT^A01|C1|P{long}|2.5\r"),
        ] {
            let pipe = test_pipeline(cfg());
            let reply = match pipe.submit(Bytes::from(msg), &origin(), 1) {
                Pending::Ready(r) => r,
                _ => panic!("not refused"),
            };
            assert!(
                matches!(&reply.action, Action::Reject(r) if r.reason == "value_too_long"),
                "not refused as too long"
            );
            let mut nak = Vec::new();
            pipe.render(&reply, &mut nak);
            assert!(nak.len() < 2048, "a NAK of {} bytes", nak.len());
        }
        let only_test = Config {
            processing_ids: vec!["T".into()],
            ..Config::default()
        };
        assert_eq!(
            refused(only_test, &msh("C1", "2.5", "")),
            "unsupported_processing_id"
        );
    }
}
