//! A time window turned into offsets: where each partition's first record at or after a time is.

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::Duration;

/// The offset in each of `parts` of `topic` of the first record at or after `at_ms` (ms since the epoch, as
/// Kafka's record timestamps); `None` for a partition with none (Kafka's `offsets_for_times`).
pub fn offsets_at_time<X: ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    topic: &str,
    parts: &[i32],
    at_ms: i64,
    timeout: Duration,
) -> KafkaResult<HashMap<i32, Option<i64>>> {
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        tpl.add_partition_offset(topic, *p, Offset::Offset(at_ms.max(0)))?;
    }
    let found = consumer.offsets_for_times(tpl, timeout)?;
    Ok(found
        .elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            (e.partition(), o)
        })
        .collect())
}
