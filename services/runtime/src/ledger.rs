//! The delivery ledger: one [`Event`] per outcome of an output (routed, dropped, dead-lettered, delivered,
//! replayed) on the events topic, keyed by envelope id, with ids, types, times and codes only (no content, no
//! patient data). The transformer writes its events in the transaction of the batch they describe; the egress
//! writes each before it stores the offset of the record it describes. `hl7gw trace` reads them back.

use crate::envelope;
use crate::proto::v1::{Envelope, Event};
use std::time::SystemTime;

/// The events topic's default name.
pub const DEFAULT_TOPIC: &str = "hl7.events";

/// What an event says happened.
pub mod kind {
    /// The transformer made an output for a destination.
    pub const ROUTED: &str = "routed";
    /// No route took the message and nothing was asked for it (test traffic, `unmatched: count`).
    pub const DROPPED: &str = "dropped";
    /// A stage wrote the message (or an output) to the DLQ.
    pub const DEAD_LETTERED: &str = "dead_lettered";
    /// The destination's receiver accepted the output.
    pub const DELIVERED: &str = "delivered";
    /// A dead letter was sent back to be routed or delivered again.
    pub const REPLAYED: &str = "replayed";
}

/// Where the ledger goes (the `ledger` section of the transformer's and the egress's configs).
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerSettings {
    /// The events topic; empty turns the ledger off (then `hl7gw trace` shows only where the ingress wrote a
    /// message, and replays cannot be told apart from first deliveries).
    pub topic: String,
    /// `retention.ms` of the events topic when a service creates it (a hospital's accounting of disclosures
    /// may need years: then create the topic yourself, or export it).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub retention: std::time::Duration,
    /// How long the egress's ledger producer gathers events into one request (`linger.ms`; at most 1s). An
    /// event delays only the commit of its offset (every 500 ms anyway), never a delivery, so batching them is
    /// free: at 0 the egress sent about one produce request per two deliveries, each costing the broker as
    /// much as a full one (docs/BENCHMARKS.md, issue 26).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub linger: std::time::Duration,
}

impl Default for LedgerSettings {
    fn default() -> Self {
        Self {
            topic: DEFAULT_TOPIC.to_owned(),
            retention: std::time::Duration::from_secs(30 * 24 * 3600),
            linger: std::time::Duration::from_millis(20),
        }
    }
}

impl LedgerSettings {
    /// Whether events are written.
    pub fn enabled(&self) -> bool {
        !self.topic.is_empty()
    }

    /// Checks the rules serde cannot: `linger` at most 1s.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        if self.linger > std::time::Duration::from_secs(1) {
            return Err(crate::config::ConfigError::Rule(
                "ledger.linger: at most 1s (offsets wait for their events)".into(),
            ));
        }
        Ok(())
    }

    /// The Kafka settings of a producer of events: `kafka`'s, with `linger`.
    pub fn producer_settings(
        &self,
        kafka: &crate::kafka::KafkaSettings,
    ) -> crate::kafka::KafkaSettings {
        let mut k = kafka.clone();
        k.linger_ms = u32::try_from(self.linger.as_millis()).unwrap_or(1000);
        k
    }

    /// Creates the events topic with its retention if it does not exist yet (and topics are created at all).
    pub async fn ensure_topic(
        &self,
        kafka: &crate::kafka::KafkaSettings,
    ) -> Result<(), crate::kafka::TopicError> {
        if !self.enabled() {
            return Ok(());
        }
        let ms = self.retention.as_millis().to_string();
        crate::kafka::ensure_topics_with(kafka, &[&self.topic], &[("retention.ms", &ms)]).await
    }
}

/// The `content-type` header of events records.
pub const CONTENT_TYPE: &str = "application/x-protobuf; messageType=hl7gw.v1.Event";
/// The Kafka header naming the event's kind (consumers can filter without decoding).
pub const KIND_HEADER: &str = "hl7gw.event";

/// An event of `kind` written by `stage` about `env` (its id, MSH essentials, received time, route and
/// destination), at the current time.
pub fn event(kind: &str, stage: &str, env: &Envelope) -> Event {
    let h = env.header.clone().unwrap_or_default();
    Event {
        envelope_id: env.id.clone(),
        kind: kind.to_owned(),
        at: Some(envelope::timestamp(SystemTime::now())),
        stage: stage.to_owned(),
        route: env.route.clone(),
        destination: env.destination.clone(),
        message_type: h.message_type,
        trigger_event: h.trigger_event,
        control_id: h.control_id,
        sending_application: h.sending_application,
        sending_facility: h.sending_facility,
        pod: crate::pod_name(),
        received_at: env.received_at,
        ..Event::default()
    }
}

/// Milliseconds from the ingress reading `env` to now (0 when unknown).
pub fn latency_ms(env: &Envelope) -> i64 {
    env.received_at
        .and_then(|t| SystemTime::try_from(t).ok())
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Encodes `event` into `buf` (cleared first).
pub fn encode_into(event: &Event, buf: &mut Vec<u8>) {
    use prost::Message;
    buf.clear();
    buf.reserve(event.encoded_len());
    // Encoding into a Vec with room for it cannot fail.
    let _ = event.encode(buf);
}

/// Decodes an event from a Kafka value.
pub fn decode(bytes: &[u8]) -> Result<Event, prost::DecodeError> {
    use prost::Message;
    Event::decode(bytes)
}

/// The Kafka record of `event`, encoded in `payload`, for `topic`: keyed by its envelope id, with
/// `content-type` and the event's kind as headers.
pub fn record<'a>(
    topic: &'a str,
    event: &'a Event,
    payload: &'a [u8],
) -> rdkafka::producer::FutureRecord<'a, str, [u8]> {
    use rdkafka::message::{Header, OwnedHeaders};
    let headers = OwnedHeaders::new_with_capacity(2)
        .insert(Header {
            key: envelope::headers::CONTENT_TYPE,
            value: Some(CONTENT_TYPE),
        })
        .insert(Header {
            key: KIND_HEADER,
            value: Some(event.kind.as_str()),
        });
    rdkafka::producer::FutureRecord::to(topic)
        .payload(payload)
        .key(event.envelope_id.as_str())
        .headers(headers)
}

/// The partition a key lands in on a topic of `partitions` partitions with the producers' partitioner
/// (librdkafka's `murmur2_random`, the Java client's default): the events of one envelope id are all there.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    if partitions <= 0 {
        return 0;
    }
    ((murmur2(key) & 0x7fff_ffff) as i32) % partitions
}

/// Kafka's murmur2 (seed 0x9747b28c), as the Java client's `Utils.murmur2`.
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The time a UUIDv7 envelope id was made, if it is one.
pub fn id_time(id: &str) -> Option<SystemTime> {
    let u = uuid::Uuid::parse_str(id).ok()?;
    let (secs, nanos) = u.get_timestamp()?.to_unix();
    Some(SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of the Java client's `Utils.murmur2` for these keys (kafka-clients 4.3.1, run once with the
    /// broker's jars in .cache/kafka-4.3.1/libs), and its partition of a UUID key on 6 partitions.
    #[test]
    fn murmur2_is_the_java_clients() {
        let cases: &[(&[u8], u32)] = &[
            (b"kafka", 0xd067_cf64),
            (b"giberish123456789", 0x8f55_2b0c),
            (b"1234", 0x9fc9_7b14),
            (b"234", 0xe7c0_09ca),
            (b"34", 0x8739_30da),
            (b"4", 0x5a4b_5ca1),
            (b"PreAmbleWillBeRemoved,ThePrePartThatIs", 0x7842_4f1c),
            (b"reamble", 0x40d3_bbba),
            (b"eamble", 0xe0b5_44c2),
            (b"amble", 0x8dc9_726c),
            (b"mble", 0x8a51_4010),
            (b"ble", 0x2c41_ca29),
            (b"le", 0x9ef1_9451),
            (b"e", 0xc655_a13a),
            (b"", 0x106e_08d9),
            // The Java client's UtilsTest.testMurmur2.
            (b"21", -973_932_308_i32 as u32),
            (b"foobar", -790_332_482_i32 as u32),
            (b"a-little-bit-long-string", -985_981_536_i32 as u32),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), *want, "{}", String::from_utf8_lossy(key));
        }
        assert_eq!(partition_for(b"kafka", 6), 4);
        assert_eq!(partition_for(b"0192f5a0-1234-7abc-8def-0123456789ab", 6), 3);
    }

    #[test]
    fn the_ledger_producer_lingers_at_most_a_second() {
        let l = LedgerSettings::default();
        assert!(l.validate().is_ok());
        let k = l.producer_settings(&crate::kafka::KafkaSettings::default());
        assert_eq!(k.linger_ms, 20);
        let long = LedgerSettings {
            linger: std::time::Duration::from_secs(2),
            ..LedgerSettings::default()
        };
        assert!(long.validate().is_err());
    }

    #[test]
    fn events_round_trip_and_an_id_says_when() {
        let env = Envelope {
            id: envelope::new_id(),
            destination: "lab".into(),
            route: "r".into(),
            ..Envelope::default()
        };
        let e = event(kind::DELIVERED, "egress", &env);
        let mut buf = Vec::new();
        encode_into(&e, &mut buf);
        assert_eq!(decode(&buf).unwrap(), e);
        let t = id_time(&env.id).unwrap();
        let d = SystemTime::now().duration_since(t).unwrap();
        assert!(d.as_secs() < 5, "{d:?}");
        assert!(id_time("not-an-id").is_none());
    }
}
