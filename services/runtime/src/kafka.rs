//! Kafka client setup shared by the services: producer settings that make an ACK a promise, topic creation,
//! and a broker reachability check for readiness.

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::topic_partition_list::Offset;
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
    /// Replication factor of topics the service creates (-1: the broker's default). Production: 3.
    pub replication_factor: i32,
    /// `min.insync.replicas` of topics the service creates (0: the broker's default). Production: 2, so an
    /// AA (acks=all) never rests on one disk.
    pub min_insync_replicas: u32,
    /// Largest record the service produces, and the `max.message.bytes` of topics it creates: one limit for
    /// librdkafka (`message.max.bytes`) and the topics. A message whose record would be larger is refused
    /// for good (AE and DLQ), not retried. The default (2 MiB) matches k8s/kafka/topics.yaml.
    pub max_message_bytes: usize,
    /// Bytes a consumer fetches ahead of its work (librdkafka's `queued.max.messages.kbytes`, which also
    /// bounds each fetch request). 0 (the default): 1/16 of the memory limit (the pod's), between 4 and 64 MiB, or
    /// 32 MiB when there is no limit. librdkafka's own default (64 MiB queued plus 50 MiB fetches) is
    /// most of a 512 MiB pod once messages are large.
    pub consumer_prefetch_bytes: usize,
    /// Extra librdkafka properties (security.protocol, sasl.*, ssl.*, ...), applied last. The properties
    /// the services' promises rest on ([`PROTECTED_PROPERTIES`]) are refused when the config is read.
    #[serde(deserialize_with = "deserialize_properties")]
    pub properties: BTreeMap<String, String>,
}

/// librdkafka properties set by the code and not overridable through `kafka.properties`, each with what
/// depends on it. A value here could turn a durable ACK into a promise Kafka never made (`acks`,
/// idempotence), let a consumer see aborted transactions, commit offsets before the work is done, or lose the
/// egress's queued records on a cooperative rebalance.
pub const PROTECTED_PROPERTIES: &[(&str, &str)] = &[
    ("acks", "an AA is sent only after acks=all"),
    ("request.required.acks", "an AA is sent only after acks=all"),
    (
        "enable.idempotence",
        "the idempotent producer keeps retries from duplicating or reordering",
    ),
    (
        "max.in.flight.requests.per.connection",
        "ordering with the idempotent producer",
    ),
    ("max.in.flight", "ordering with the idempotent producer"),
    (
        "message.timeout.ms",
        "set from ack_timeout / transaction_timeout",
    ),
    (
        "delivery.timeout.ms",
        "set from ack_timeout / transaction_timeout",
    ),
    (
        "transactional.id",
        "set from the transformer's transactional_id",
    ),
    (
        "transaction.timeout.ms",
        "set from the transformer's transaction_timeout",
    ),
    ("isolation.level", "consumers read committed records only"),
    (
        "enable.auto.commit",
        "offsets are committed only after the work is done",
    ),
    (
        "enable.auto.offset.store",
        "offsets are stored only after the work is done",
    ),
    (
        "auto.offset.reset",
        "a new consumer group starts at the earliest record, not after the backlog",
    ),
    (
        "partition.assignment.strategy",
        "the workers rely on eager rebalancing (range/roundrobin)",
    ),
    (
        "group.protocol",
        "the workers rely on the classic group protocol",
    ),
    ("group.id", "set from group_id / group_prefix"),
    ("bootstrap.servers", "set from kafka_brokers"),
    ("metadata.broker.list", "set from kafka_brokers"),
    ("linger.ms", "set kafka.linger_ms instead"),
    ("queue.buffering.max.ms", "set kafka.linger_ms instead"),
    ("compression.type", "set kafka.compression instead"),
    ("compression.codec", "set kafka.compression instead"),
    ("message.max.bytes", "set kafka.max_message_bytes instead"),
    (
        "queued.max.messages.kbytes",
        "set kafka.consumer_prefetch_bytes instead",
    ),
    (
        "fetch.max.bytes",
        "set kafka.consumer_prefetch_bytes instead",
    ),
];

/// Refuses `kafka.properties` entries that collide with [`PROTECTED_PROPERTIES`].
fn deserialize_properties<'de, D>(d: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let props = BTreeMap::<String, String>::deserialize(d)?;
    for key in props.keys() {
        if let Some((k, why)) = PROTECTED_PROPERTIES
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key.trim()))
        {
            return Err(serde::de::Error::custom(format!(
                "kafka.properties.{k} cannot be set: {why}"
            )));
        }
    }
    Ok(props)
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            linger_ms: 0,
            compression: "none".into(),
            create_topics_partitions: 6,
            replication_factor: -1,
            min_insync_replicas: 0,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            consumer_prefetch_bytes: 0,
            properties: BTreeMap::new(),
        }
    }
}

/// The default of [`KafkaSettings::max_message_bytes`]: 2 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

impl KafkaSettings {
    /// The rules serde cannot check.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        let rule = |m: String| Err(crate::config::ConfigError::Rule(m));
        if !(1000..=1_000_000_000).contains(&self.max_message_bytes) {
            return rule(format!(
                "kafka.max_message_bytes must be between 1000 and 1000000000, not {}",
                self.max_message_bytes
            ));
        }
        if self.consumer_prefetch_bytes != 0 && self.consumer_prefetch_bytes < 1 << 20 {
            return rule(format!(
                "kafka.consumer_prefetch_bytes must be 0 (sized from the memory limit) or at least 1048576, not {}",
                self.consumer_prefetch_bytes
            ));
        }
        if self.replication_factor == 0 || self.replication_factor < -1 {
            return rule(
                "kafka.replication_factor must be -1 (broker default) or at least 1".into(),
            );
        }
        if self.replication_factor > 0 && self.min_insync_replicas as i32 > self.replication_factor
        {
            return rule(format!(
                "kafka.min_insync_replicas ({}) above kafka.replication_factor ({}): no write could succeed",
                self.min_insync_replicas, self.replication_factor
            ));
        }
        Ok(())
    }

    /// Warnings for `--check-config`: topics this service would create whose durability does not match
    /// production (an AA resting on a single broker's disk).
    pub fn durability_warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.create_topics_partitions == 0 {
            return w;
        }
        if self.replication_factor < 3 {
            w.push(format!(
                "kafka.replication_factor is {}: topics created by this service may have fewer than 3 \
                 replicas (production: 3, or create the topics yourself and set create_topics_partitions: 0)",
                self.replication_factor
            ));
        }
        if self.min_insync_replicas < 2 {
            w.push(format!(
                "kafka.min_insync_replicas is {}: an acknowledged write may rest on one broker (production: 2)",
                self.min_insync_replicas
            ));
        }
        w
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
        .set("message.max.bytes", s.max_message_bytes.to_string())
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

/// Creates the topics that do not exist yet, with the configured replication, `min.insync.replicas` and
/// record size limit.
pub async fn ensure_topics(
    brokers: &str,
    s: &KafkaSettings,
    topics: &[&str],
) -> Result<(), TopicError> {
    if s.create_topics_partitions == 0 || topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = base_config(brokers, s).create()?;
    let max_bytes = s.max_message_bytes.to_string();
    let min_isr = s.min_insync_replicas.to_string();
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            let n = NewTopic::new(
                t,
                s.create_topics_partitions as i32,
                TopicReplication::Fixed(s.replication_factor),
            )
            .set("max.message.bytes", &max_bytes);
            if s.min_insync_replicas > 0 {
                n.set("min.insync.replicas", &min_isr)
            } else {
                n
            }
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

impl KafkaSettings {
    /// The consumer prefetch in bytes: [`KafkaSettings::consumer_prefetch_bytes`], or sized from `limit`
    /// (the process's memory limit) when that is 0.
    pub fn prefetch_bytes(&self, limit: Option<u64>) -> usize {
        const MIB: u64 = 1 << 20;
        if self.consumer_prefetch_bytes > 0 {
            return self.consumer_prefetch_bytes;
        }
        match limit {
            Some(l) => (l / 16).clamp(4 * MIB, 64 * MIB) as usize,
            None => (32 * MIB) as usize,
        }
    }
}

/// Consumer settings for the workers: a group, offsets committed only by the service (after its work is
/// done), read_committed so records of aborted transactions are never seen, and a short session timeout so a
/// killed pod's partitions move on within seconds.
pub fn consumer_config(
    brokers: &str,
    group_id: &str,
    client_id: &str,
    s: &KafkaSettings,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("group.id", group_id)
        .set("client.id", client_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .set("socket.nagle.disable", "true")
        .set("fetch.wait.max.ms", "10")
        .set("reconnect.backoff.max.ms", "1000");
    // Prefetch bounded in bytes. librdkafka bounds each fetch by this too (fetch.max.bytes left unset is
    // lowered to it); a record larger than a fetch still comes, alone, so large messages never stall.
    let prefetch = s.prefetch_bytes(crate::memory::limit());
    c.set("queued.max.messages.kbytes", (prefetch / 1024).to_string());
    for (k, v) in &s.properties {
        c.set(k, v);
    }
    c
}

/// Messages not yet consumed on the consumer's assigned partitions (high watermark minus position, or minus
/// the committed offset before the first message). Blocking: call from a blocking task.
pub fn consumer_lag<C: ConsumerContext, K: Consumer<C>>(
    consumer: &K,
    timeout: Duration,
) -> Result<i64, rdkafka::error::KafkaError> {
    let assigned = consumer.assignment()?;
    if assigned.count() == 0 {
        return Ok(0);
    }
    let position = consumer.position()?;
    let committed = consumer.committed(timeout)?;
    let mut lag = 0;
    for e in assigned.elements() {
        let (low, high) = consumer.fetch_watermarks(e.topic(), e.partition(), timeout)?;
        let at = |list: &rdkafka::TopicPartitionList| {
            list.find_partition(e.topic(), e.partition())
                .and_then(|p| match p.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
        };
        let pos = at(&position).or_else(|| at(&committed)).unwrap_or(low);
        lag += (high - pos).max(0);
    }
    Ok(lag)
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefetch_follows_the_memory_limit_unless_set() {
        let mut s = super::KafkaSettings::default();
        assert_eq!(s.prefetch_bytes(None), 32 << 20);
        assert_eq!(s.prefetch_bytes(Some(512 << 20)), 32 << 20);
        assert_eq!(s.prefetch_bytes(Some(128 << 20)), 8 << 20);
        assert_eq!(s.prefetch_bytes(Some(16 << 20)), 4 << 20);
        assert_eq!(s.prefetch_bytes(Some(8 << 30)), 64 << 20);
        s.consumer_prefetch_bytes = 2 << 20;
        assert_eq!(s.prefetch_bytes(Some(8 << 30)), 2 << 20);
        s.consumer_prefetch_bytes = 1000;
        assert!(s.validate().is_err());
    }

    use super::*;

    fn settings(yaml: &str) -> Result<KafkaSettings, String> {
        use figment::providers::Format;
        figment::Figment::from(figment::providers::Yaml::string(yaml))
            .extract()
            .map_err(|e| e.to_string())
    }

    /// Issue 9, item 5: what the code relies on cannot be switched off through `kafka.properties`.
    #[test]
    fn protected_properties_are_refused_and_others_pass() {
        for key in [
            "acks",
            "enable.idempotence",
            "ISOLATION.LEVEL",
            "partition.assignment.strategy",
        ] {
            let e = settings(&format!("properties: {{{key}: x}}")).unwrap_err();
            assert!(
                e.to_string().contains(&key.to_ascii_lowercase()),
                "{key}: {e}"
            );
        }
        let s =
            settings("properties: {security.protocol: SASL_SSL, sasl.mechanism: SCRAM-SHA-512}")
                .unwrap();
        assert_eq!(s.properties.len(), 2);
    }

    /// Issue 9, item 6: a service that creates its topics says when they would not survive a broker.
    #[test]
    fn durability_is_checked() {
        let d = KafkaSettings::default();
        d.validate().unwrap();
        assert_eq!(d.durability_warnings().len(), 2, "broker defaults: warn");
        let prod = KafkaSettings {
            replication_factor: 3,
            min_insync_replicas: 2,
            ..KafkaSettings::default()
        };
        prod.validate().unwrap();
        assert!(prod.durability_warnings().is_empty());
        let none = KafkaSettings {
            create_topics_partitions: 0,
            ..KafkaSettings::default()
        };
        assert!(
            none.durability_warnings().is_empty(),
            "topics made elsewhere"
        );
        for bad in [
            KafkaSettings {
                replication_factor: 0,
                ..KafkaSettings::default()
            },
            KafkaSettings {
                replication_factor: 2,
                min_insync_replicas: 3,
                ..KafkaSettings::default()
            },
            KafkaSettings {
                max_message_bytes: 10,
                ..KafkaSettings::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
