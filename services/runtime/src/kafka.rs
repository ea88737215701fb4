//! Kafka client setup shared by the services: one settings builder per client role (producer, transactional
//! producer, consumer, DLQ reader, admin) that applies `kafka.security` and `kafka.properties` the same way for
//! all of them, topic creation, and what a client's errors say for readiness.

pub mod assignment;
pub mod delivery;
pub mod errors;
pub mod offsets;
pub mod producer;
pub mod security;
pub mod stats;
pub mod unreadable;

pub use assignment::Assignment;
pub use security::KafkaSecurity;
pub use unreadable::Unreadable;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::topic_partition_list::Offset;
use rdkafka::types::RDKafkaErrorCode;
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
        if let Some(k) = security::SECURITY_PROPERTIES
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

/// Why a Kafka client's settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    #[error(transparent)]
    Security(#[from] security::SecurityError),
    /// librdkafka refused a setting: a wrong value, or one this build cannot honour. The value is shown only
    /// when it is not a secret.
    #[error("kafka setting {key}{shown}: {reason}")]
    Setting {
        key: String,
        shown: String,
        reason: String,
    },
}

impl From<ClientConfigError> for rdkafka::error::KafkaError {
    fn from(e: ClientConfigError) -> Self {
        rdkafka::error::KafkaError::ClientCreation(e.to_string())
    }
}

/// What every client starts from: the brokers, `kafka.security`, and connection habits.
fn client_base(client_id: &str, s: &KafkaSettings) -> Result<ClientConfig, ClientConfigError> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &s.brokers)
        .set("client.id", client_id)
        .set("socket.nagle.disable", "true")
        .set("reconnect.backoff.max.ms", "1000")
        .set(
            "statistics.interval.ms",
            s.statistics_interval.as_millis().to_string(),
        );
    s.security.apply(&mut c)?;
    Ok(c)
}

/// Applies `kafka.properties` (last, once) and has librdkafka check every setting now, without connecting,
/// so a setting this build cannot honour fails with its name here rather than inside a running service.
fn finish(mut c: ClientConfig, s: &KafkaSettings) -> Result<ClientConfig, ClientConfigError> {
    for (k, v) in &s.properties {
        c.set(k, v);
    }
    match c.create_native_config() {
        Ok(_) => Ok(c),
        Err(rdkafka::error::KafkaError::ClientConfig(_, reason, key, value)) => {
            let shown = if security::is_secret_property(&key) {
                String::new()
            } else {
                format!("={value}")
            };
            Err(ClientConfigError::Setting { key, shown, reason })
        }
        Err(e) => Err(ClientConfigError::Setting {
            key: "(client)".into(),
            shown: String::new(),
            reason: e.to_string(),
        }),
    }
}

/// Producer settings: acks=all and the idempotent producer (no duplicates or reordering from retries), and
/// `delivery_timeout` as librdkafka's own bound on a record's delivery.
pub fn producer_config(
    client_id: &str,
    s: &KafkaSettings,
    delivery_timeout: Duration,
) -> Result<ClientConfig, ClientConfigError> {
    finish(producer_base(client_id, s, delivery_timeout)?, s)
}

/// [`producer_config`] before the user's properties.
fn producer_base(
    client_id: &str,
    s: &KafkaSettings,
    delivery_timeout: Duration,
) -> Result<ClientConfig, ClientConfigError> {
    let mut c = client_base(client_id, s)?;
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        .set(
            "max.in.flight.requests.per.connection",
            s.max_in_flight.to_string(),
        )
        .set("linger.ms", s.linger_ms.to_string())
        .set("compression.type", &s.compression)
        .set("message.max.bytes", s.max_message_bytes.to_string())
        .set(
            "message.timeout.ms",
            delivery_timeout.as_millis().max(1).to_string(),
        )
        .set("queue.buffering.max.messages", "200000")
        // The Java client's partitioner (murmur2 of the key; keyless records at random): a key lands in the
        // partition a Java producer would choose, so mixed producers keep "one key, one partition".
        .set("partitioner", "murmur2_random");
    Ok(c)
}

/// The transformer's producer: [`producer_config`] plus a transactional id; a transaction not committed
/// within `timeout` is aborted by the broker.
pub fn transactional_producer_config(
    client_id: &str,
    s: &KafkaSettings,
    transactional_id: &str,
    timeout: Duration,
) -> Result<ClientConfig, ClientConfigError> {
    let mut c = producer_base(client_id, s, timeout)?;
    c.set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", timeout.as_millis().to_string());
    finish(c, s)
}

/// When a consumer's offsets reach Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Only by the service's own commit calls (the transformer commits inside its transaction).
    Manual,
    /// Offsets the service stored (after its work) are committed in the background this often and on close.
    StoredEvery(Duration),
}

/// Admin client settings (topic creation, metadata probes).
pub fn admin_config(s: &KafkaSettings) -> Result<ClientConfig, ClientConfigError> {
    let c = client_base("hl7gw-admin", s)?;
    finish(c, s)
}

/// A reader of a topic from a given offset to its end (the DLQ listing): its own group, never committing,
/// committed records only.
pub fn reader_config(
    group_id: &str,
    client_id: &str,
    s: &KafkaSettings,
) -> Result<ClientConfig, ClientConfigError> {
    let mut c = client_base(client_id, s)?;
    c.set("group.id", group_id)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed");
    finish(c, s)
}

/// `--check-config`'s Kafka part: every client role's settings built natively (a setting this build cannot
/// honour fails here), the secret files read; returns the warnings to print.
pub fn check_config(s: &KafkaSettings) -> Result<Vec<String>, ClientConfigError> {
    check_clients(s)?;
    Ok(s.warnings())
}

/// Builds every role's settings natively without connecting, and reads the secret files.
pub fn check_clients(s: &KafkaSettings) -> Result<(), ClientConfigError> {
    s.security.check_files()?;
    let t = Duration::from_secs(30);
    producer_config("check", s, t)?;
    transactional_producer_config("check", s, "check", t)?;
    consumer_config("check", "check", s, Commit::Manual)?;
    reader_config("check", "check", s)?;
    admin_config(s)?;
    Ok(())
}

/// Why topics could not be created.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Config(#[from] ClientConfigError),
    #[error("creating topic {topic}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
}

/// Creates the topics that do not exist yet, with the configured replication, `min.insync.replicas` and
/// record size limit.
pub async fn ensure_topics(s: &KafkaSettings, topics: &[&str]) -> Result<(), TopicError> {
    ensure_topics_with(s, topics, &[]).await
}

/// [`ensure_topics`], with topic configs (`retention.ms`...) set on the topics it creates.
pub async fn ensure_topics_with(
    s: &KafkaSettings,
    topics: &[&str],
    configs: &[(&str, &str)],
) -> Result<(), TopicError> {
    if s.create_topics_partitions == 0 || topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<KafkaContext> = admin_config(s)?.create_with_context(KafkaContext)?;
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
            let n = configs.iter().fold(n, |n, (k, v)| n.set(k, v));
            if s.min_insync_replicas > 0 {
                n.set("min.insync.replicas", &min_isr)
            } else {
                n
            }
        })
        .collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(10)));
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

/// Consumer settings for the workers: a group, offsets committed only after the service's work is done
/// (`commit`), read_committed so records of aborted transactions are never seen, and a short session timeout so
/// a killed pod's partitions move on within seconds. A fetch waits at the broker up to 100 ms for data (it
/// returns as soon as a record is there): 10 ms made an idle consumer send each broker 100 empty fetches a
/// second, and the broker's CPU goes per request (docs/BENCHMARKS.md, issue 25).
pub fn consumer_config(
    group_id: &str,
    client_id: &str,
    s: &KafkaSettings,
    commit: Commit,
) -> Result<ClientConfig, ClientConfigError> {
    let mut c = client_base(client_id, s)?;
    c.set("group.id", group_id)
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .set("fetch.wait.max.ms", "100");
    match commit {
        Commit::Manual => c.set("enable.auto.commit", "false"),
        Commit::StoredEvery(every) => c.set("enable.auto.commit", "true").set(
            "auto.commit.interval.ms",
            every.as_millis().max(1).to_string(),
        ),
    };
    // Prefetch bounded in bytes. librdkafka bounds each fetch by this too (fetch.max.bytes left unset is
    // lowered to it); a record larger than a fetch still comes, alone, so large messages never stall.
    let prefetch = s.prefetch_bytes(crate::memory::limit());
    c.set("queued.max.messages.kbytes", (prefetch / 1024).to_string());
    finish(c, s)
}

/// The last errors the Kafka clients of this process reported (librdkafka's error callback), for readiness:
/// the last authentication/TLS failure is kept apart, so the "all brokers down" that follows it does not hide it.
#[derive(Default)]
struct ClientErrors {
    credentials: Option<(std::time::Instant, String)>,
    other: Option<(std::time::Instant, String)>,
    logged_credentials: Option<std::time::Instant>,
    logged_other: Option<std::time::Instant>,
}

static CLIENT_ERRORS: std::sync::Mutex<Option<ClientErrors>> = std::sync::Mutex::new(None);

/// Partition leadership in motion (a topic just created, a broker failing over, a leader election): the same
/// metadata or offsets request succeeds once the cluster has settled, so callers retry it for a while.
pub fn leadership_moving(error: &rdkafka::error::KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownLeaderEpoch
                | RDKafkaErrorCode::FencedLeaderEpoch
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::OperationTimedOut
        )
    )
}

/// One log line per kind of client error per this long (librdkafka reports each failed connection attempt).
const CLIENT_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// Records a client error (called from every client context's `error` callback) and logs it, at most once
/// per 10 s per kind: at ERROR for authentication and TLS failures (a configuration or a Secret to fix), at
/// WARN for broker transport errors, which every failover and rolling restart produces and the services ride
/// out.
pub fn client_error(error: &rdkafka::error::KafkaError, reason: &str) {
    use rdkafka::types::RDKafkaErrorCode as C;
    let credentials = matches!(
        error.rdkafka_error_code(),
        Some(
            C::Authentication
                | C::SaslAuthenticationFailed
                | C::SSL
                | C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::TransactionalIdAuthorizationFailed
        )
    );
    let now = std::time::Instant::now();
    let mut guard = CLIENT_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    let e = guard.get_or_insert_with(ClientErrors::default);
    let logged = if credentials {
        e.credentials = Some((
            now,
            format!("kafka authentication/TLS/authorization failed: {reason}"),
        ));
        &mut e.logged_credentials
    } else {
        e.other = Some((now, format!("kafka: {reason}")));
        &mut e.logged_other
    };
    if logged.is_some_and(|at| now.duration_since(at) < CLIENT_ERROR_LOG_EVERY) {
        return;
    }
    *logged = Some(now);
    drop(guard);
    if credentials {
        tracing::error!(error = %error, reason, "kafka: authentication, TLS or authorization (ACL) failed; check kafka.security and the user's ACLs (repeats are logged every 10 s)");
    } else {
        tracing::warn!(error = %error, reason, "kafka client error (repeats are logged every 10 s)");
    }
}

/// librdkafka's log lines through `tracing`. Connection failures (`FAIL`) go at WARN: the error callback
/// ([`client_error`]) already says, at the right level, what they mean.
pub fn client_log(level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
    use rdkafka::config::RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error if fac != "FAIL" => {
            tracing::error!(target: "librdkafka", "{fac} {message}")
        }
        L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => {
            tracing::warn!(target: "librdkafka", "{fac} {message}")
        }
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "{fac} {message}"),
        L::Debug => tracing::debug!(target: "librdkafka", "{fac} {message}"),
    }
}

/// The last client error reported within `within`, if any: an authentication/TLS failure first.
pub fn recent_client_error(within: Duration) -> Option<String> {
    let guard = CLIENT_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    let e = guard.as_ref()?;
    let recent = |x: &Option<(std::time::Instant, String)>| {
        x.as_ref()
            .filter(|(at, _)| at.elapsed() <= within)
            .map(|(_, what)| what.clone())
    };
    recent(&e.credentials).or_else(|| recent(&e.other))
}

/// Whether Kafka answered a readiness probe's metadata request (`None` if not) and, when it was for a `named` topic, whether that
/// topic has partitions.
pub fn metadata_ok(
    answer: rdkafka::error::KafkaResult<rdkafka::metadata::Metadata>,
    named: Option<&str>,
) -> Option<bool> {
    let m = answer.ok()?;
    Some(named.is_none_or(|name| {
        m.topics()
            .iter()
            .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
    }))
}

/// The readiness failure of a metadata probe (see [`metadata_ok`]) for `named`, if any.
pub fn metadata_failure(ok: Option<bool>, named: Option<&str>) -> Option<String> {
    match ok {
        None => Some(unreachable_reason()),
        Some(false) => Some(format!(
            "topic {} does not exist or has no partitions",
            named.unwrap_or_default()
        )),
        Some(true) => None,
    }
}

/// A consumer error that stops all reading until someone fixes it (authorisation, a missing topic), as
/// opposed to a broker away for a while, which librdkafka recovers from by itself.
pub fn stops_reading(e: &rdkafka::error::KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
        )
    )
}

/// Why Kafka did not answer a readiness probe: the clients' last error when recent (a refused password or
/// certificate says so), else that no broker answered.
pub fn unreachable_reason() -> String {
    recent_client_error(Duration::from_secs(60))
        .unwrap_or_else(|| "kafka: no broker answered the metadata request".to_owned())
}

/// The context of the services' producers and admin clients: errors go to [`client_error`], librdkafka's
/// log lines through `tracing`.
#[derive(Debug, Clone, Copy, Default)]
pub struct KafkaContext;

impl ClientContext for KafkaContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        client_error(&error, reason);
    }
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        client_log(level, fac, message);
    }
    fn stats_raw(&self, statistics: &[u8]) {
        stats::record(statistics);
    }
}

impl rdkafka::consumer::ConsumerContext for KafkaContext {}

/// The services' producer: delivery reports served on tokio.
pub use delivery::Producer;

/// The transformer's transactional producer (rdkafka's polling thread serves its reports; its
/// `commit_transaction` flushes through it).
pub type TransactionalProducer = rdkafka::producer::FutureProducer<KafkaContext>;

/// Messages not yet done on the consumer's assigned partitions: high watermark minus the group's committed
/// offset (minus the position before anything was committed, minus the low watermark before anything was read).
/// Committed, not the position: a service holds what it read until its work is done (the egress up to
/// `queue_bytes_per_partition` per partition while a receiver is down, thousands of messages), and those wait as
/// much as the ones not read yet; the position alone kept a stopped destination's lag near 0 (found by
/// scripts/prom-check.sh: HL7GWEgressConsumerLag never fired with the receiver down). Blocking: call from a
/// blocking task.
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
        let pos = at(&committed)
            .or_else(|| at(&position))
            .unwrap_or(low)
            .max(low);
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
