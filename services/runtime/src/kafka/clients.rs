//! One settings builder per client role (producer, transactional producer, consumer, DLQ reader, admin), each
//! applying `kafka.security` and `kafka.properties` the same way.

use super::context::KafkaContext;
use super::settings::KafkaSettings;
use rdkafka::ClientConfig;
use std::time::Duration;

/// Why a Kafka client's settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    #[error(transparent)]
    Security(#[from] super::security::SecurityError),
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
            let shown = if super::security::is_secret_property(&key) {
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

/// The transformer's transactional producer (rdkafka's polling thread serves its reports; its
/// `commit_transaction` flushes through it).
pub type TransactionalProducer = rdkafka::producer::FutureProducer<KafkaContext>;
