//! Reading what a topic holds (every record with its key, headers and envelope), writing envelopes to a topic
//! as the services do, and creating or reconfiguring a topic.

#![allow(clippy::unwrap_used)]

use hl7gw_runtime::proto::v1::{Envelope, Rejection};
use rdkafka::ClientConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::time::{Duration, Instant};

/// A record read back from Kafka.
#[derive(Debug)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub partition: i32,
    pub offset: i64,
    pub headers: Vec<(String, Vec<u8>)>,
    pub envelope: Envelope,
}

impl Record {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// A consumer of `topic` from its beginning, in a group of its own, reading committed records only.
pub fn reader(brokers: &str, topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("test-{}", uuid::Uuid::now_v7().simple()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    consumer
}

/// Reads every record of `topic` from the beginning until `expected` arrived or `limit` passed.
pub fn read_topic(brokers: &str, topic: &str, expected: usize, limit: Duration) -> Vec<Record> {
    let consumer = reader(brokers, topic);
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                quiet_since = Instant::now();
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| (x.key.to_owned(), x.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Record {
                    key: m.key().map(<[u8]>::to_vec),
                    partition: m.partition(),
                    offset: m.offset(),
                    headers,
                    envelope: hl7gw_runtime::envelope::decode(m.payload().unwrap_or_default())
                        .expect("envelope decodes"),
                });
            }
            Some(Err(e)) => eprintln!("consumer: {e}"),
            None => {
                // Once the expected count is reached, wait a little more to see any extra record.
                if out.len() >= expected && quiet_since.elapsed() > Duration::from_secs(2) {
                    break;
                }
            }
        }
    }
    out
}

/// The one record of `records` (the dead letters a test expects one of) with its rejection; panics unless
/// there is exactly one.
pub fn only_dead_letter(records: &[Record]) -> (&Record, Rejection) {
    let [d] = records else {
        panic!("one dead letter: {}", records.len())
    };
    (d, d.envelope.rejection.clone().unwrap_or_default())
}

/// The shared test broker and the topics of one test's ingress ([`Ingress::on_fresh_topics`]).
#[derive(Debug)]
pub struct Topics {
    pub brokers: &'static str,
    pub inbound: String,
    pub dlq: String,
}

impl Topics {
    /// [`read_topic`] of the inbound topic.
    pub fn inbound_records(&self, expected: usize, limit: Duration) -> Vec<Record> {
        read_topic(self.brokers, &self.inbound, expected, limit)
    }

    /// [`read_topic`] of the DLQ topic.
    pub fn dlq_records(&self, expected: usize, limit: Duration) -> Vec<Record> {
        read_topic(self.brokers, &self.dlq, expected, limit)
    }
}

/// Writes envelopes to topics as the services write theirs ([`hl7gw_runtime::envelope::encode_record`]: the key
/// and the standard headers); each send returns once the broker has the record.
pub struct EnvelopeProducer(FutureProducer);

impl EnvelopeProducer {
    /// A producer to `brokers` with librdkafka's defaults (records up to 1 MB).
    pub fn new(brokers: &str) -> Self {
        Self::with_max_bytes(brokers, None)
    }

    /// A producer to `brokers` whose records may be up to `max_bytes` (`message.max.bytes`), librdkafka's
    /// default when `None`.
    pub fn with_max_bytes(brokers: &str, max_bytes: Option<usize>) -> Self {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers);
        if let Some(n) = max_bytes {
            config.set("message.max.bytes", n.to_string());
        }
        Self(config.create().expect("a producer"))
    }

    /// Writes `env` to `topic` keyed by `key` (no key when empty), with the headers the services put on their
    /// records and no `traceparent`.
    pub async fn send(&self, topic: &str, key: &str, env: &Envelope) {
        let mut payload = Vec::new();
        let record = hl7gw_runtime::envelope::encode_record(topic, key, env, "", &mut payload);
        self.deliver(record).await;
    }

    /// Writes a record whose value is `payload` as it is (e.g. one that is not an envelope), without key or
    /// headers.
    pub async fn send_bytes(&self, topic: &str, payload: &[u8]) {
        self.deliver(FutureRecord::<str, [u8]>::to(topic).payload(payload))
            .await;
    }

    async fn deliver(&self, record: FutureRecord<'_, str, [u8]>) {
        let topic = record.topic.to_owned();
        if let Err((e, _)) = self.0.send(record, Duration::from_secs(10)).await {
            panic!("producing to {topic}: {e}");
        }
    }
}

/// [`EnvelopeProducer::send`] on a producer of its own: one envelope to `topic` keyed by `key`.
pub async fn produce_envelope(brokers: &str, topic: &str, key: &str, env: &Envelope) {
    EnvelopeProducer::new(brokers).send(topic, key, env).await;
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", crate::broker())
        .create()
        .expect("an admin client")
}

/// Creates `topic` on the test broker with `partitions` partitions (replication 1) and the topic configs
/// `configs` (e.g. `max.message.bytes`).
pub async fn create_topic(topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    for r in admin()
        .create_topics([&t], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
}

/// Sets the topic config `key` of `topic` on the test broker to `value`.
pub async fn alter_topic(topic: &str, key: &str, value: &str) {
    let change = AlterConfig::new(ResourceSpecifier::Topic(topic)).set(key, value);
    for r in admin()
        .alter_configs([&change], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
}
