//! Kafka client setup shared by the services: producer settings that make an ACK a promise, topic creation,
//! and a broker reachability check for readiness.

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Kafka tuning beyond the broker list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// How long the producer waits to batch records (`linger.ms`). 0 (the default) sends at once; librdkafka
    /// still batches what queues up while a request is in flight, so throughput under load holds. 1 ms adds a
    /// millisecond to every sequential sender's round trip (measured: 630 vs. more msg/s, docs/BENCHMARKS.md).
    pub linger_ms: u32,
    /// `compression.type`: none, gzip, snappy, lz4 or zstd.
    pub compression: String,
    /// Partitions for topics the service creates when they are missing (0: do not create topics).
    pub create_topics_partitions: u32,
    /// Extra librdkafka properties (security.protocol, sasl.*, ssl.*, ...), applied last.
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            linger_ms: 0,
            compression: "none".into(),
            create_topics_partitions: 6,
            properties: BTreeMap::new(),
        }
    }
}

/// Producer settings: acks=all and the idempotent producer (no duplicates or reordering from retries), and
/// `delivery_timeout` as librdkafka's own bound on a record's delivery.
pub fn producer_config(
    brokers: &str,
    client_id: &str,
    s: &KafkaSettings,
    delivery_timeout: Duration,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("client.id", client_id)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("max.in.flight.requests.per.connection", "5")
        .set("linger.ms", s.linger_ms.to_string())
        .set("compression.type", &s.compression)
        .set(
            "message.timeout.ms",
            delivery_timeout.as_millis().max(1).to_string(),
        )
        .set("socket.nagle.disable", "true")
        .set("queue.buffering.max.messages", "200000")
        .set("reconnect.backoff.max.ms", "1000");
    for (k, v) in &s.properties {
        c.set(k, v);
    }
    c
}

/// Settings for an admin client or a metadata probe.
pub fn base_config(brokers: &str, s: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    for (k, v) in &s.properties {
        c.set(k, v);
    }
    c
}

/// Why topics could not be created.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("creating topic {topic}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
}

/// Creates the topics that do not exist yet (replication factor: the broker's default).
pub async fn ensure_topics(
    brokers: &str,
    s: &KafkaSettings,
    topics: &[&str],
) -> Result<(), TopicError> {
    if s.create_topics_partitions == 0 || topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = base_config(brokers, s).create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            NewTopic::new(
                t,
                s.create_topics_partitions as i32,
                TopicReplication::Fixed(-1),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for r in admin.create_topics(new.iter(), &opts).await? {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(TopicError::Create { topic, code }),
        }
    }
    Ok(())
}
