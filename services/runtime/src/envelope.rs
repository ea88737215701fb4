//! Helpers around the `Envelope` contract: ids, timestamps, header text, Kafka headers.

use crate::proto::v1::{Envelope, Header};
use hl7v2::Charset;
use std::time::SystemTime;

/// The sending application (MSH-3) of test traffic (`hl7gw-load --test-traffic`, `helm test`): routes take
/// it only when they name it, and it never goes to a default destination.
pub const TEST_SENDING_APPLICATION: &str = "HL7GW-TEST";

/// True for test traffic: MSH-3 (its first component) is [`TEST_SENDING_APPLICATION`].
pub fn is_test_traffic(h: &Header) -> bool {
    h.sending_application.split('^').next() == Some(TEST_SENDING_APPLICATION)
}

/// Drops the message from a dead letter, keeping its ids, header and reason, and adds the message's size and
/// SHA-256 to the rejection's detail (to find the input again). Marked dropped even when the message was empty:
/// a replay must never send an empty body for it.
pub fn drop_message(env: &mut Envelope) {
    let raw = std::mem::take(&mut env.raw);
    if let Some(rej) = env.rejection.as_mut() {
        rej.message_dropped = true;
        rej.detail = format!(
            "{}; the message itself ({} bytes, sha256 {}) is not stored",
            rej.detail,
            raw.len(),
            String::from_utf8_lossy(&salted_key(b"", &raw)),
        );
    }
}

/// A Kafka key that keeps partitioning but hides the identifier: the lowercase hex SHA-256 of `salt` then `key`.
pub fn salted_key(salt: &[u8], key: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(salt);
    h.update(key);
    let digest = h.finalize();
    let mut out = Vec::with_capacity(64);
    for b in digest {
        out.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    out
}

/// The Kafka key of a message: the values at `paths` (as they stand in the message, escapes included), joined
/// by `|`; empty when every value is empty. One rule for the ingress's key and a route's `keyPaths`.
pub fn kafka_key(msg: &hl7v2::Message<'_>, paths: &[hl7v2::Path]) -> Vec<u8> {
    let mut key = Vec::with_capacity(48);
    for (i, p) in paths.iter().enumerate() {
        if i > 0 {
            key.push(b'|');
        }
        if let Some(v) = msg.get_path(p) {
            key.extend_from_slice(v);
        }
    }
    if key.iter().all(|&b| b == b'|') {
        key.clear();
    }
    key
}

/// Kafka header names consumers filter on (the envelope repeats them).
pub mod headers {
    pub const TYPE: &str = "hl7.type";
    pub const CONTROL_ID: &str = "hl7.control_id";
    pub const TRACEPARENT: &str = "traceparent";
    /// W3C `tracestate`, next to `traceparent` when the trace context has one.
    pub const TRACESTATE: &str = "tracestate";
    pub const CONTENT_TYPE: &str = "content-type";
    /// On hl7.out topics and worker DLQ records: the destination name.
    pub const DESTINATION: &str = "hl7gw.destination";
    /// The value of `content-type` on every hl7gw record.
    pub const ENVELOPE_CONTENT_TYPE: &str = "application/x-protobuf; messageType=hl7gw.v1.Envelope";
}

/// A new time-ordered envelope id (UUIDv7).
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A protobuf timestamp for `t`.
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

/// Decodes header bytes as text in `charset`, falling back to one char per byte when they are not valid in it.
pub fn text(bytes: &[u8], charset: Charset) -> String {
    match charset.decode(bytes) {
        Ok(s) => s.into_owned(),
        Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
    }
}

/// The envelope's header from a parsed MSH.
pub fn header(h: &hl7v2::Header<'_>, charset: Charset) -> Header {
    let t = |b: &[u8]| text(b, charset);
    Header {
        message_type: t(h.message_type),
        trigger_event: t(h.trigger_event),
        structure: t(h.structure),
        control_id: t(h.control_id),
        version: t(h.version),
        processing_id: t(h.processing_id),
        sending_application: t(h.sending_application),
        sending_facility: t(h.sending_facility),
        receiving_application: t(h.receiving_application),
        receiving_facility: t(h.receiving_facility),
        accept_ack_type: t(h.accept_ack_type),
        application_ack_type: t(h.application_ack_type),
        timestamp: t(h.timestamp),
    }
}

/// Encodes an envelope into `buf` (cleared first), for a Kafka value.
pub fn encode_into(env: &Envelope, buf: &mut Vec<u8>) {
    use prost::Message;
    buf.clear();
    buf.reserve(env.encoded_len());
    // Encoding into a Vec cannot run out of space.
    let _ = env.encode(buf);
}

/// Bytes a record takes beyond its key, value and headers, as the limits count them: librdkafka's worst case
/// per record (`RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`, 36 bytes) and the record batch header (61 bytes) the broker
/// counts against the topic's `max.message.bytes`, rounded up.
pub const RECORD_OVERHEAD: usize = 128;

/// The size Kafka counts for the record of `env` whose encoding is `encoded_len` bytes, keyed by `key_len`
/// bytes: the value, the key, the headers (each with its two length varints) and [`RECORD_OVERHEAD`].
pub fn record_size(env: &Envelope, encoded_len: usize, key_len: usize, traceparent: &str) -> usize {
    use rdkafka::message::Headers as _;
    let headers: usize = record_headers(env, traceparent)
        .iter()
        .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len) + 10)
        .sum();
    encoded_len + key_len + headers + RECORD_OVERHEAD
}

/// The Kafka headers of a worker's record: those of [`kafka_headers`], with `traceparent` the given one (which
/// continues the message's trace), the envelope's `tracestate` when that `traceparent` is the envelope's own,
/// and `hl7gw.destination` when the envelope names one.
pub fn record_headers(env: &Envelope, traceparent: &str) -> rdkafka::message::OwnedHeaders {
    let tracestate = match &env.trace {
        Some(t) if !traceparent.is_empty() && t.traceparent == traceparent => t.tracestate.as_str(),
        _ => "",
    };
    let (ty, control_id) = match &env.header {
        Some(h) if h.trigger_event.is_empty() => (h.message_type.clone(), h.control_id.as_str()),
        Some(h) => (
            format!("{}^{}", h.message_type, h.trigger_event),
            h.control_id.as_str(),
        ),
        None => (String::new(), ""),
    };
    kafka_headers(
        ty.as_bytes(),
        control_id.as_bytes(),
        traceparent,
        tracestate,
        &env.destination,
    )
}

/// The Kafka headers consumers filter on, on every record the gateway writes: `hl7.type` (`ADT^A01`),
/// `hl7.control_id`, `traceparent` and `tracestate` (each when not empty), `content-type`, and
/// `hl7gw.destination` (when not empty).
pub fn kafka_headers(
    ty: &[u8],
    control_id: &[u8],
    traceparent: &str,
    tracestate: &str,
    destination: &str,
) -> rdkafka::message::OwnedHeaders {
    use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
    let mut out = OwnedHeaders::new_with_capacity(6)
        .insert(KafkaHeader {
            key: headers::TYPE,
            value: Some(ty),
        })
        .insert(KafkaHeader {
            key: headers::CONTROL_ID,
            value: Some(control_id),
        });
    if !traceparent.is_empty() {
        out = out.insert(KafkaHeader {
            key: headers::TRACEPARENT,
            value: Some(traceparent),
        });
        if !tracestate.is_empty() {
            out = out.insert(KafkaHeader {
                key: headers::TRACESTATE,
                value: Some(tracestate),
            });
        }
    }
    out = out.insert(KafkaHeader {
        key: headers::CONTENT_TYPE,
        value: Some(headers::ENVELOPE_CONTENT_TYPE),
    });
    if !destination.is_empty() {
        out = out.insert(KafkaHeader {
            key: headers::DESTINATION,
            value: Some(destination),
        });
    }
    out
}

/// A worker's Kafka record of `env`, encoded in `payload`, for `topic`: keyed by `key` (no key when empty), with
/// the [`record_headers`] that carry `traceparent`.
pub fn record<'a>(
    topic: &'a str,
    key: &'a str,
    payload: &'a [u8],
    env: &Envelope,
    traceparent: &str,
) -> rdkafka::producer::FutureRecord<'a, str, [u8]> {
    let rec = rdkafka::producer::FutureRecord::to(topic)
        .payload(payload)
        .headers(record_headers(env, traceparent));
    if key.is_empty() { rec } else { rec.key(key) }
}

/// [`record`] of `env` encoded into `buf` (cleared first): how every worker writes an envelope to a topic.
pub fn encode_record<'a>(
    topic: &'a str,
    key: &'a str,
    env: &Envelope,
    traceparent: &str,
    buf: &'a mut Vec<u8>,
) -> rdkafka::producer::FutureRecord<'a, str, [u8]> {
    encode_into(env, buf);
    record(topic, key, buf, env, traceparent)
}

/// The W3C `traceparent` the envelope carries, empty when none.
pub fn traceparent(env: &Envelope) -> String {
    env.trace
        .as_ref()
        .map(|t| t.traceparent.clone())
        .unwrap_or_default()
}

/// Appends a stage to the envelope's history.
pub fn push_stage(env: &mut Envelope, name: &str) {
    env.stages.push(crate::proto::v1::Stage {
        name: name.to_owned(),
        at: Some(timestamp(SystemTime::now())),
        pod: crate::pod_name(),
    });
}

/// Decodes an envelope from a Kafka value.
pub fn decode(bytes: &[u8]) -> Result<Envelope, prost::DecodeError> {
    use prost::Message;
    Envelope::decode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dead letter without its message says so (size and SHA-256 in the detail, `message_dropped`), also
    /// when the message was empty: a replay then re-reads the original instead of sending an empty body.
    #[test]
    fn a_dropped_message_is_marked_with_its_size_and_hash() {
        let letter = |raw: &[u8]| Envelope {
            raw: raw.to_vec().into(),
            rejection: Some(crate::proto::v1::Rejection {
                reason: "too_large".into(),
                detail: "over the limit".into(),
                ..Default::default()
            }),
            ..Envelope::default()
        };
        let mut env = letter(b"MSH|^~\\&|");
        drop_message(&mut env);
        let rej = env.rejection.as_ref().expect("rejection");
        assert!(env.raw.is_empty() && rej.message_dropped);
        assert!(
            rej.detail
                .starts_with("over the limit; the message itself (9 bytes, sha256 "),
            "{}",
            rej.detail
        );
        let mut empty = letter(b"");
        drop_message(&mut empty);
        assert!(empty.rejection.expect("rejection").message_dropped);
    }

    #[test]
    fn ids_are_time_ordered_and_round_trip() {
        let a = new_id();
        let b = new_id();
        assert!(a < b, "{a} {b}");
        let env = Envelope {
            id: a.clone(),
            raw: bytes::Bytes::from_static(b"MSH|^~\\&|x"),
            received_at: Some(timestamp(SystemTime::now())),
            ..Envelope::default()
        };
        let mut buf = Vec::new();
        encode_into(&env, &mut buf);
        assert_eq!(decode(&buf).unwrap(), env);
    }

    /// A worker's record carries the envelope's `tracestate` next to its `traceparent`; none when the trace
    /// context has no state, or when the record's `traceparent` is not the envelope's.
    #[test]
    fn records_carry_tracestate_with_traceparent() {
        use rdkafka::message::Headers as _;
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut env = Envelope {
            trace: Some(crate::proto::v1::TraceContext {
                traceparent: tp.into(),
                tracestate: "vendor=abc".into(),
            }),
            ..Envelope::default()
        };
        let find = |h: &rdkafka::message::OwnedHeaders, key: &str| {
            h.iter()
                .find(|x| x.key == key)
                .and_then(|x| x.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let h = record_headers(&env, tp);
        assert_eq!(find(&h, headers::TRACEPARENT).as_deref(), Some(tp));
        assert_eq!(find(&h, headers::TRACESTATE).as_deref(), Some("vendor=abc"));
        let before = record_size(&env, 10, 0, tp);
        assert!(before > record_size(&Envelope::default(), 10, 0, tp));
        let other = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
        assert_eq!(
            find(&record_headers(&env, other), headers::TRACESTATE),
            None
        );
        assert_eq!(find(&record_headers(&env, ""), headers::TRACESTATE), None);
        env.trace.as_mut().unwrap().tracestate.clear();
        assert_eq!(find(&record_headers(&env, tp), headers::TRACESTATE), None);
    }

    #[test]
    fn header_text_falls_back_per_byte() {
        assert_eq!(text(b"H\xf4pital", Charset::Utf8), "H\u{f4}pital");
        assert_eq!(text("Hôpital".as_bytes(), Charset::Utf8), "Hôpital");
    }
}
