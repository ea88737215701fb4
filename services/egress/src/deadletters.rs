//! Dead letters: read back from the DLQ topic (the egress keeps no state of its own), listed, and replayed:
//! the egress's to their destination topic so the egress delivers them again, the transformer's to the
//! inbound topic so the transformer routes them again.

use crate::config::Config;
use hl7gw_runtime::envelope;
use hl7gw_runtime::kafka::Producer;
use hl7gw_runtime::proto::v1::{DeadLetter, Envelope};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, Timestamp};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::time::Duration;

/// Most dead letters one call lists or replays (the server's page), whatever the caller asks.
pub const MAX_PAGE: usize = 1000;
/// Most bytes of messages one page holds in memory.
pub const MAX_PAGE_BYTES: usize = 32 * 1024 * 1024;

/// The page size for a caller's `limit` (0: the whole page).
pub fn page_limit(requested: usize) -> usize {
    if requested == 0 {
        MAX_PAGE
    } else {
        requested.min(MAX_PAGE)
    }
}

/// A page of dead letters, and whether more matched.
#[derive(Debug, Default)]
pub struct Page {
    pub letters: Vec<(DeadLetter, Envelope)>,
    pub truncated: bool,
}

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub destination: String,
    /// `egress`, `transformer`, or empty for both.
    pub stage: String,
    /// Only dead letters `Replay` can send back (see [`replayable`]).
    pub replay_only: bool,
    pub ids: Vec<String>,
    /// Milliseconds since the epoch (DLQ record timestamps), inclusive / exclusive.
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub limit: usize,
}

/// Why dead letters could not be read or replayed.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("the DLQ could not be read to its end within {0:?}")]
    Timeout(Duration),
}

/// How long `list` waits before asking again while the DLQ's partitions have no leader (a new topic, a failover).
const LEADERSHIP_RETRY: Duration = Duration::from_millis(250);

/// The DLQ's non-empty partitions: where each starts (to assign) and where it ends now.
fn extent(
    consumer: &BaseConsumer<hl7gw_runtime::kafka::KafkaContext>,
    topic: &str,
) -> Result<(TopicPartitionList, Vec<(i32, i64)>), rdkafka::error::KafkaError> {
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5))?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for t in md.topics() {
        match t.error().map(rdkafka::types::RDKafkaErrorCode::from) {
            // No DLQ yet (a cluster that does not create topics on demand): nothing dead-lettered.
            Some(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition) => continue,
            Some(code) => return Err(rdkafka::error::KafkaError::MetadataFetch(code)),
            None => {}
        }
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(5))?;
            if high > low {
                tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
                ends.push((p.id(), high));
            }
        }
    }
    Ok((tpl, ends))
}

/// Reads the DLQ from the start (or from `since`) to its current end and returns the egress's dead letters
/// that pass `filter`, oldest first, with their envelopes. Blocking: run it on a blocking thread.
pub fn list(cfg: &Config, filter: &Filter) -> Result<Page, DeadLetterError> {
    let budget = Duration::from_secs(30);
    let consumer: BaseConsumer<hl7gw_runtime::kafka::KafkaContext> =
        hl7gw_runtime::kafka::reader_config(
            &format!("{}.dlq-reader", cfg.group_prefix),
            "hl7gw-egress-dlq-reader",
            &cfg.kafka,
        )
        .map_err(rdkafka::error::KafkaError::from)?
        .create_with_context(hl7gw_runtime::kafka::KafkaContext)?;
    let deadline = std::time::Instant::now() + budget;
    let (mut tpl, mut ends) = loop {
        match extent(&consumer, &cfg.dlq_topic) {
            Err(e)
                if hl7gw_runtime::kafka::leadership_moving(&e)
                    && std::time::Instant::now() + LEADERSHIP_RETRY < deadline =>
            {
                std::thread::sleep(LEADERSHIP_RETRY);
            }
            found => break found?,
        }
    };
    if let Some(since) = filter.since_ms {
        let mut times = TopicPartitionList::new();
        for (p, _) in &ends {
            times.add_partition_offset(&cfg.dlq_topic, *p, Offset::Offset(since))?;
        }
        let found = consumer.offsets_for_times(times, Duration::from_secs(5))?;
        for e in found.elements() {
            if let Offset::Offset(o) = e.offset() {
                tpl.set_partition_offset(&cfg.dlq_topic, e.partition(), Offset::Offset(o))?;
            } else if matches!(e.offset(), Offset::End) {
                ends.retain(|(p, _)| *p != e.partition());
            }
        }
    }
    consumer.assign(&tpl)?;
    let limit = page_limit(filter.limit);
    let mut bytes = 0usize;
    let mut out = Vec::new();
    let mut done: Vec<(i32, i64)> = Vec::new();
    while done.len() < ends.len() {
        if std::time::Instant::now() > deadline {
            return Err(DeadLetterError::Timeout(budget));
        }
        let Some(r) = consumer.poll(Duration::from_millis(200)) else {
            // Past the last record of every partition already seen (aborted/control records at the end).
            let pos = consumer.position()?;
            for (p, high) in &ends {
                if let Some(e) = pos.find_partition(&cfg.dlq_topic, *p)
                    && matches!(e.offset(), Offset::Offset(o) if o >= *high)
                    && !done.iter().any(|(d, _)| d == p)
                {
                    done.push((*p, *high));
                }
            }
            continue;
        };
        let m = r?;
        if let Some((_, high)) = ends.iter().find(|(p, _)| *p == m.partition())
            && m.offset() + 1 >= *high
            && !done.iter().any(|(d, _)| *d == m.partition())
        {
            done.push((m.partition(), *high));
        }
        let at = match m.timestamp() {
            Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => t,
            Timestamp::NotAvailable => 0,
        };
        if filter.until_ms.is_some_and(|u| at >= u) || filter.since_ms.is_some_and(|s| at < s) {
            continue;
        }
        let Ok(env) = envelope::decode(m.payload().unwrap_or_default()) else {
            continue;
        };
        let Some(rej) = env.rejection.as_ref() else {
            continue;
        };
        let known = match rej.stage.as_str() {
            // Replayable only to a destination this egress delivers to.
            STAGE_EGRESS => cfg.destinations.contains_key(&env.destination),
            // Listed whatever the reason; replayed only when `replayable` (see [`replayable`]).
            STAGE_TRANSFORMER => !filter.replay_only || replayable(rej),
            _ => false,
        };
        if !known
            || (!filter.stage.is_empty() && rej.stage != filter.stage)
            || (!filter.destination.is_empty() && env.destination != filter.destination)
            || (!filter.ids.is_empty() && !filter.ids.contains(&env.id))
        {
            continue;
        }
        let h = env.header.clone().unwrap_or_default();
        let ack_code = hl7v2::read_ack(&rej.ack)
            .map(|(c, _)| c.as_str().to_owned())
            .unwrap_or_default();
        let dl = DeadLetter {
            id: env.id.clone(),
            destination: env.destination.clone(),
            at: Some(prost_types::Timestamp {
                seconds: at.div_euclid(1000),
                nanos: (at.rem_euclid(1000) * 1_000_000) as i32,
            }),
            reason: rej.reason.clone(),
            ack_code,
            attempts: env.attempts,
            message_type: h.message_type.clone(),
            control_id: h.control_id.clone(),
            partition: m.partition(),
            offset: m.offset(),
            envelope: None,
            stage: rej.stage.clone(),
        };
        bytes += env.raw.len();
        out.push((dl, env));
        if out.len() >= limit || bytes >= MAX_PAGE_BYTES {
            // Stopped before the end of the DLQ: more may match.
            return Ok(Page {
                letters: out,
                truncated: done.len() < ends.len(),
            });
        }
    }
    Ok(Page {
        letters: out,
        truncated: false,
    })
}

/// Whether a transformer dead letter can go back to the inbound topic: only `unmatched` ones, whose envelope is
/// the inbound one that no route took (the route was missing). The others are not: `too_large` holds an output
/// without its message, `bad_envelope` and `parse` would fail the same way again, and a failed route's letter
/// would be routed through every route again (duplicates for the routes that succeeded).
pub fn replayable(rej: &hl7gw_runtime::proto::v1::Rejection) -> bool {
    rej.stage == STAGE_TRANSFORMER && rej.reason == "unmatched"
}

/// The stage of the egress's own dead letters.
pub const STAGE_EGRESS: &str = "egress";
/// The stage of the transformer's dead letters.
pub const STAGE_TRANSFORMER: &str = "transformer";

/// Sends dead letters back (rejection cleared, a `replay` stage added) and waits for Kafka to confirm each:
/// the egress's to their destination topic, the transformer's to the inbound topic (destination cleared, so
/// the routes decide again). Returns the replayed (id, destination) pairs; the destination of a transformer
/// dead letter is reported as `transformer`.
pub async fn replay(
    cfg: &Config,
    producer: &Producer,
    letters: Vec<Envelope>,
) -> Result<Vec<(String, String)>, DeadLetterError> {
    let mut ids = Vec::new();
    let mut buf = Vec::new();
    for mut env in letters {
        let from_transformer = env
            .rejection
            .take()
            .is_some_and(|r| r.stage == STAGE_TRANSFORMER);
        let (topic, label) = if from_transformer {
            env.destination.clear();
            (cfg.inbound_topic.clone(), STAGE_TRANSFORMER.to_owned())
        } else {
            (cfg.topic(&env.destination), env.destination.clone())
        };
        envelope::push_stage(&mut env, "replay");
        envelope::encode_into(&env, &mut buf);
        let rec = envelope::record(&topic, &env.key, &buf, &env, &envelope::traceparent(&env));
        producer.send(rec, Duration::from_secs(10)).await?;
        ids.push((env.id.clone(), label));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 9, item 14: a caller cannot ask the server for an unbounded page.
    #[test]
    fn pages_are_bounded_by_the_server() {
        assert_eq!(page_limit(0), MAX_PAGE);
        assert_eq!(page_limit(10), 10);
        assert_eq!(page_limit(u32::MAX as usize), MAX_PAGE);
    }
}
