//! Reading what a topic holds: every record with its key, headers and envelope.

#![allow(clippy::unwrap_used)]

use hl7gw_runtime::proto::v1::Envelope;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
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
