//! The `kafka:` section every service has: brokers, security, the properties a user may add (and those the
//! section owns), durability, batching and prefetch.

use super::security::KafkaSecurity;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The `kafka:` section every service shares: where the brokers are, how to reach them, and the tuning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// How long the producer waits to batch records (`linger.ms`). 0 (the default) sends at once; librdkafka
    /// still batches what queues up while a request is in flight, so throughput under load holds. 1 ms adds a
    /// millisecond to every sequential sender's round trip (measured: 630 vs. more msg/s, docs/BENCHMARKS.md).
    pub linger_ms: u32,
    /// Produce requests in flight per broker connection (`max.in.flight.requests.per.connection`, 1 to 5; the
    /// idempotent producer keeps order at any of them). Fewer in flight means what arrives meanwhile waits and
    /// goes out in one request: fewer, fuller requests for the broker, at no cost to a sequential sender.
    pub max_in_flight: u32,
    /// `compression.type`: none, gzip, snappy, lz4 or zstd.
    pub compression: String,
    /// Partitions for topics the service creates when they are missing (0: do not create topics). 3: few
    /// partitions per broker make fuller produce requests (the broker's CPU goes per request; docs/BENCHMARKS.md).
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
    /// How often every client reports librdkafka's statistics (`hl7gw_kafka_requests_total`,
    /// `hl7gw_kafka_produce_batch_messages`); 0s: never.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub statistics_interval: Duration,
    /// TLS and SASL for every client.
    pub security: KafkaSecurity,
    /// Extra librdkafka properties, applied last. The properties the services' promises rest on
    /// ([`PROTECTED_PROPERTIES`]) and those `security` sets ([`security::SECURITY_PROPERTIES`]) are refused
    /// when the config is read.
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
        "set kafka.max_in_flight (1-5) instead",
    ),
    ("max.in.flight", "set kafka.max_in_flight (1-5) instead"),
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
        "partitioner",
        "murmur2_random (the Java client's): one key, one partition, whoever produces",
    ),
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
    ("bootstrap.servers", "set from kafka.brokers"),
    ("metadata.broker.list", "set from kafka.brokers"),
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
    (
        "statistics.interval.ms",
        "set kafka.statistics_interval instead",
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
        if let Some(k) = super::security::SECURITY_PROPERTIES
            .iter()
            .find(|k| k.eq_ignore_ascii_case(key.trim()))
        {
            return Err(serde::de::Error::custom(format!(
                "kafka.properties.{k} cannot be set: use kafka.security (secrets from files, not the config)"
            )));
        }
    }
    Ok(props)
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            linger_ms: 0,
            max_in_flight: 5,
            compression: "none".into(),
            create_topics_partitions: 3,
            replication_factor: -1,
            min_insync_replicas: 0,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            consumer_prefetch_bytes: 0,
            statistics_interval: Duration::from_secs(15),
            security: KafkaSecurity::default(),
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
        if self.brokers.trim().is_empty() {
            return rule("kafka.brokers is empty".into());
        }
        if !(1..=5).contains(&self.max_in_flight) {
            return rule(format!(
                "kafka.max_in_flight must be between 1 and 5 (the idempotent producer's limit), not {}",
                self.max_in_flight
            ));
        }
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
        self.security
            .validate()
            .map_err(|e| crate::config::ConfigError::Rule(e.to_string()))
    }

    /// What `--check-config` warns about: durability of created topics, an unencrypted connection.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = self.durability_warnings();
        w.extend(self.security.warnings());
        w
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
        figment::Figment::from(serde_saphyr::figment::Yaml::string(yaml))
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
        for key in ["security.protocol", "sasl.password", "SSL.KEY.PASSWORD"] {
            let e = settings(&format!("properties: {{{key}: x}}")).unwrap_err();
            assert!(e.contains("use kafka.security"), "{key}: {e}");
        }
        let s = settings("properties: {ssl.cipher.suites: x, socket.keepalive.enable: 'true'}")
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
                max_in_flight: 0,
                ..KafkaSettings::default()
            },
            KafkaSettings {
                max_in_flight: 6,
                ..KafkaSettings::default()
            },
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
