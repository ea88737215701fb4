//! The answer: the ACK (or batch ACK) written into the connection's reused buffer, with a control id
//! unique per process, and the NAKs for frames that never reached the parser.

use super::*;

impl Pipeline {
    /// The code `r` answers with, whether or not the sender asked for that ACK (MSH-15); None for a close,
    /// and for a batch (each of its messages has its own).
    pub fn answer_code(&self, r: &Reply) -> Option<AckCode> {
        Self::code_of(r, &Header::salvage(&r.frame))
    }

    /// [`Pipeline::answer_code`] with `r.frame`'s header already read.
    fn code_of(r: &Reply, h: &Header<'_>) -> Option<AckCode> {
        let outcome = match &r.action {
            Action::Accept | Action::Replay(_) => Outcome::Accept,
            Action::Reject(rej) => rej.outcome,
            Action::Close | Action::Batch(_) => return None,
        };
        Some(ack_code(h, outcome))
    }

    /// Counts an answered message (each message of a batch) in the sender view, for `conn`.
    pub fn answered(&self, conn: &crate::senders::SenderConn, r: &Reply) {
        let now = SystemTime::now();
        match &r.action {
            Action::Batch(b) => {
                for (frame, code) in &b.answered {
                    self.senders
                        .record(conn, &Header::salvage(frame), *code, now);
                }
            }
            _ => {
                let h = Header::salvage(&r.frame);
                self.senders.record(conn, &h, Self::code_of(r, &h), now);
            }
        }
    }

    /// Writes the ACK for `r` into `buf` (cleared first) and returns its code, or `None` when nothing is to be
    /// sent (enhanced mode whose MSH-15 asks for no such ACK, or a close).
    pub fn render(&self, r: &Reply, buf: &mut Vec<u8>) -> Option<AckCode> {
        self.render_accept(r, buf, AcceptAck::Msh15)
    }

    /// [`Pipeline::render`] with the MLLP listener's `accept_ack`: `always` sends the accept ACK of an
    /// enhanced-mode message whatever its MSH-15 says (a batch's messages keep MSH-15's rule).
    pub fn render_accept(
        &self,
        r: &Reply,
        buf: &mut Vec<u8>,
        accept: AcceptAck,
    ) -> Option<AckCode> {
        buf.clear();
        let always = accept == AcceptAck::Always;
        let h = Header::salvage(&r.frame);
        let (outcome, err) = match &r.action {
            Action::Close => return None,
            Action::Batch(b) => return Some(self.render_batch(b, buf)),
            Action::Replay(ack) => {
                // The resend asks for an accept ACK the same way the first message did (MSH-15).
                if !always && !accept_ack_wanted(&h, Outcome::Accept) {
                    return None;
                }
                buf.extend_from_slice(ack);
                let code = hl7v2::read_ack(ack).map(|(c, _)| c);
                self.metrics.ack(code.map_or("unknown", AckCode::as_str));
                return code;
            }
            Action::Accept => (Outcome::Accept, None),
            Action::Reject(rej) => (rej.outcome, Some(rej.ack_error())),
        };
        let wanted = always || accept_ack_wanted(&h, outcome);
        let remember = outcome == Outcome::Accept && r.ticket.is_some();
        if !wanted && !remember {
            return None;
        }
        let code = ack_code(&h, outcome);
        self.write_ack_now(buf, &h, code, err.as_ref());
        // Remember accepted messages even when MSH-15 asked for no ACK, so a resend is not published twice.
        if let (true, Some(tk)) = (remember, &r.ticket) {
            let ack = Bytes::copy_from_slice(buf);
            let now_safe = match &tk.fast {
                None => Some(ack),
                Some(f) => f.acked(ack),
            };
            if let Some(ack) = now_safe {
                self.dedup
                    .remember(tk.key, tk.digest, ack.clone(), Instant::now());
                let claim = match &tk.fast {
                    None => tk.claim.as_ref(),
                    Some(_) => None,
                };
                if let Some(c) = claim {
                    c.accepted(ack);
                } else if let Some(c) = tk.fast.as_ref().and_then(|f| f.take_claim()) {
                    c.accepted(ack);
                }
            }
        }
        if !wanted {
            buf.clear();
            return None;
        }
        self.metrics.ack(code.as_str());
        Some(code)
    }

    /// The application ACK for `r` (`application_ack: on_store`), written into `buf` (cleared first): the
    /// gateway answers as the application once Kafka confirmed the write (AA) or the message was refused (AE/AR
    /// with the same ERR as the accept ACK), when the message is in enhanced mode and its MSH-16 asks for that
    /// outcome. Its own MSH-10, MSA-2 the message's MSH-10, MSH-15/16 empty (it asks for no acknowledgment).
    /// A resend from the duplicate window gets it again (a new MSH-10, the same code). `None` for original
    /// mode, a batch, a close, or when MSH-16 asks for none.
    pub fn render_application(&self, r: &Reply, buf: &mut Vec<u8>) -> Option<AckCode> {
        buf.clear();
        let (outcome, rej) = match &r.action {
            Action::Accept => (Outcome::Accept, None),
            Action::Replay(ack) => (
                hl7v2::read_ack(ack).map_or(Outcome::Accept, |(c, _)| c.outcome()),
                None,
            ),
            Action::Reject(rej) => (rej.outcome, Some(rej)),
            Action::Close | Action::Batch(_) => return None,
        };
        let h = Header::salvage(&r.frame);
        if !application_ack_wanted(&h, outcome) {
            return None;
        }
        let err = rej.map(Rejected::ack_error);
        let code = application_ack_code(outcome);
        self.write_ack_now(buf, &h, code, err.as_ref());
        self.metrics.application_ack(code.as_str());
        Some(code)
    }

    /// The acknowledgment batch (HL7 v2 batch protocol): FHS (when the batch had one) and BHS with sender and
    /// receiver swapped and the original control ids in FHS-12/BHS-12, the ACK of each message that asks for
    /// one, BTS with their count, FTS. Returns the first code that is not AA/CA (else the accept code).
    fn render_batch(&self, b: &BatchReply, buf: &mut Vec<u8>) -> AckCode {
        let mut code = None;
        for (_, c) in &b.acks {
            let accept = |k: AckCode| matches!(k, AckCode::AA | AckCode::CA);
            if code.is_none_or(|k| accept(k) && !accept(*c)) {
                code = Some(*c);
            }
        }
        let count = b.acks.len();
        let d = b.header.delims;
        let ts = hl7_timestamp(SystemTime::now());
        let mut id = [0u8; 28];
        let n = self.next_ack_id(&mut id);
        let empty: [Vec<u8>; 5] = Default::default();
        let mut segment = |name: &[u8], ids: &[Vec<u8>; 5]| {
            buf.extend_from_slice(name);
            d.write_msh12(buf);
            for v in [&ids[2], &ids[3], &ids[0], &ids[1]] {
                buf.push(d.field);
                buf.extend_from_slice(v);
            }
            buf.push(d.field);
            buf.extend_from_slice(&ts);
            buf.extend_from_slice(&[d.field; 4]);
            buf.extend_from_slice(&id[..n]);
            buf.push(d.field);
            buf.extend_from_slice(&ids[4]);
            buf.push(b'\r');
        };
        if let Some(f) = &b.header.file {
            segment(b"FHS", f);
        }
        segment(b"BHS", b.header.batch.as_ref().unwrap_or(&empty));
        for (ack, _) in &b.acks {
            buf.extend_from_slice(ack);
        }
        buf.extend_from_slice(b"BTS");
        buf.push(d.field);
        buf.extend_from_slice(count.to_string().as_bytes());
        buf.push(b'\r');
        if b.header.file.is_some() {
            buf.extend_from_slice(b"FTS");
            buf.push(d.field);
            buf.extend_from_slice(b"1\r");
        }
        code.unwrap_or(AckCode::AA)
    }

    /// A whole payload whose MLLP framing was broken (end block not followed by CR): AE with ERR 207, and the
    /// payload in the DLQ (reason `missing_cr`) like any other reject.
    pub fn framing_reject(
        &self,
        frame: Bytes,
        text: String,
        origin: &Origin,
        sequence: u64,
    ) -> Pending {
        let r = Rejected::error(ErrorCode::ApplicationInternalError, "missing_cr", text);
        Pending::Ready(self.reject(frame, r, Some(origin), sequence, SystemTime::now()))
    }

    /// A NAK for a frame that never reached the parser (oversize, framing): AE with ERR 207 and the text.
    pub fn framing_reply(&self, text: String) -> Reply {
        Reply {
            action: Action::Reject(Rejected::error(
                ErrorCode::ApplicationInternalError,
                "framing",
                text,
            )),
            frame: Bytes::new(),
            envelope_id: String::new(),
            ticket: None,
        }
    }

    /// Writes the ACK (`code`, `err`) to `h` into `buf`, with the next control id of this process and the time
    /// now.
    fn write_ack_now(
        &self,
        buf: &mut Vec<u8>,
        h: &Header<'_>,
        code: AckCode,
        err: Option<&AckError<'_>>,
    ) {
        let mut id = [0u8; 28];
        let n = self.next_ack_id(&mut id);
        let ts = hl7_timestamp(SystemTime::now());
        write_ack(
            buf,
            h,
            code,
            err,
            &AckIds {
                control_id: &id[..n],
                timestamp: &ts,
            },
        );
    }

    fn next_ack_id(&self, out: &mut [u8; 28]) -> usize {
        out[..8].copy_from_slice(&self.ack_prefix);
        let n = self.ack_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(n).as_bytes();
        out[8..8 + digits.len()].copy_from_slice(digits);
        8 + digits.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ack_control_ids_are_unique_with_the_process_prefix() {
        let pipe = test_pipeline(Config::default());
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let mut id = [0u8; 28];
            let n = pipe.next_ack_id(&mut id);
            assert!(n > 8 && n <= MAX_CONTROL_ID);
            assert_eq!(id[..8], pipe.ack_prefix);
            assert!(
                id[..8]
                    .iter()
                    .all(|b| b.is_ascii_digit() || (b'A'..=b'V').contains(b))
            );
            assert!(seen.insert(id[..n].to_vec()), "repeated ACK id");
        }
    }

    #[tokio::test]
    async fn a_framing_nak_is_ae_with_err_207_and_the_text() {
        let pipe = test_pipeline(Config::default());
        let mut buf = b"left over".to_vec();
        let reply = pipe.framing_reply("message larger than the 10-byte limit".into());
        assert_eq!(reply.reason(), "framing");
        assert_eq!(pipe.render(&reply, &mut buf), Some(AckCode::AE));
        assert_eq!(hl7v2::read_ack(&buf).map(|(c, _)| c), Some(AckCode::AE));
        let text = String::from_utf8_lossy(&buf);
        assert!(text.starts_with("MSH|"), "{text}");
        assert!(text.contains("\rERR|") && text.contains("207"), "{text}");
        assert!(
            text.contains("message larger than the 10-byte limit"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn close_writes_nothing() {
        let pipe = test_pipeline(Config::default());
        let mut buf = b"left over".to_vec();
        let reply = Reply {
            action: Action::Close,
            frame: Bytes::new(),
            envelope_id: String::new(),
            ticket: None,
        };
        assert_eq!(pipe.render(&reply, &mut buf), None);
    }
}
