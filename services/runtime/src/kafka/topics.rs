//! Topics: created when missing, and a consumer's lag on the ones it reads.

use super::clients::ClientConfigError;
use super::clients::admin_config;
use super::context::KafkaContext;
use super::settings::KafkaSettings;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::topic_partition_list::Offset;
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;

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
