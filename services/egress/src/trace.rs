//! `Trace`: where a message went. The ingress's record in the inbound topic (found by envelope id or control
//! id within a time window, the window turned into offsets with Kafka's offsets-for-times) and the ledger's
//! events for it (one partition of the events topic, the one its envelope id is keyed to, read from the
//! message's time). Bounded: at most [`MAX_RECORDS`] records read and [`BUDGET`] spent per call; past either
//! the answer says it is incomplete. A call whose caller went away stops reading (a cancellation token).

use crate::config::Config;
use hl7gw_runtime::envelope;
use hl7gw_runtime::kafka::KafkaContext;
use hl7gw_runtime::ledger;
use hl7gw_runtime::proto::v1::{TraceRequest, TraceResponse, TracedMessage};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

/// Most records one call reads (inbound and events together).
pub const MAX_RECORDS: u64 = 2_000_000;
/// Most time one call spends reading.
pub const BUDGET: Duration = Duration::from_secs(20);
/// Most events one message's answer holds (the rest are left out and the answer says it is truncated).
pub const MAX_EVENTS_PER_MESSAGE: usize = 1000;
/// Most messages one answer holds.
pub const MAX_MESSAGES: usize = 100;
/// The window searched when none is given: an hour.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);
/// With an envelope id, how far around its time the inbound record is looked for (its Kafka timestamp is when
/// the ingress produced it: milliseconds after the id was made, minutes when Kafka was away).
const ID_BEFORE: Duration = Duration::from_secs(10);
const ID_AFTER: Duration = Duration::from_secs(600);

/// A trace query, checked.
#[derive(Debug, Clone)]
pub struct Query {
    pub envelope_id: String,
    pub control_id: String,
    pub sending_application: String,
    pub sending_facility: String,
    /// The window, in milliseconds since the epoch (record timestamps).
    pub since_ms: i64,
    pub until_ms: i64,
    pub limit: usize,
}

fn ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn ts_ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000)
}

impl Query {
    /// The query a request asks for: an envelope id or a control id, and a window (defaults in the proto).
    pub fn from_request(r: &TraceRequest) -> Result<Self, String> {
        let limit = match r.limit as usize {
            0 => 20,
            n => n.min(MAX_MESSAGES),
        };
        let now = ms(SystemTime::now());
        let (since_ms, until_ms) = if !r.envelope_id.is_empty() {
            let at = ledger::id_time(&r.envelope_id).map(ms);
            let since = r
                .since
                .as_ref()
                .map(ts_ms)
                .or(at.map(|t| t - ID_BEFORE.as_millis() as i64));
            let until = r
                .until
                .as_ref()
                .map(ts_ms)
                .or(at.map(|t| t + ID_AFTER.as_millis() as i64));
            match (since, until) {
                (Some(s), Some(u)) => (s, u.min(now)),
                _ => {
                    return Err(
                        "the envelope id is not a UUIDv7 (which holds its time): give since and until"
                            .into(),
                    );
                }
            }
        } else if !r.control_id.is_empty() {
            let until = r.until.as_ref().map_or(now, ts_ms).min(now);
            let since = r
                .since
                .as_ref()
                .map_or(until - DEFAULT_WINDOW.as_millis() as i64, ts_ms);
            (since, until)
        } else {
            return Err("give an envelope id or a control id".into());
        };
        if since_ms > until_ms {
            return Err("since is after until".into());
        }
        Ok(Self {
            envelope_id: r.envelope_id.clone(),
            control_id: r.control_id.clone(),
            sending_application: r.sending_application.clone(),
            sending_facility: r.sending_facility.clone(),
            since_ms,
            until_ms,
            limit,
        })
    }
}

/// Why a trace could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The caller went away: the trace stopped reading.
    #[error("cancelled: the caller went away")]
    Cancelled,
}

/// What is left of a call's bounds, and whether its caller is still there.
struct Budget<'a> {
    deadline: Instant,
    records: u64,
    exhausted: bool,
    cancel: &'a CancellationToken,
}

impl Budget<'_> {
    /// Whether reading must stop: the records or the time are spent (the answer is then truncated), or the
    /// caller went away.
    fn spent(&mut self) -> bool {
        if self.records >= MAX_RECORDS || Instant::now() > self.deadline {
            self.exhausted = true;
        }
        self.exhausted || self.cancel.is_cancelled()
    }

    /// [`TraceError::Cancelled`] once the caller went away.
    fn check(&self) -> Result<(), TraceError> {
        if self.cancel.is_cancelled() {
            Err(TraceError::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// Finds the messages the query names and the ledger's events for each. Blocking: run it on a blocking thread.
/// Stops with [`TraceError::Cancelled`] soon after `cancel` is (between two Kafka requests, each at most 5 s).
pub fn find(
    cfg: &Config,
    q: &Query,
    cancel: &CancellationToken,
) -> Result<TraceResponse, TraceError> {
    let consumer: BaseConsumer<KafkaContext> = hl7gw_runtime::kafka::reader_config(
        &format!("{}.trace-reader", cfg.group_prefix),
        "hl7gw-egress-trace",
        &cfg.kafka,
    )
    .map_err(rdkafka::error::KafkaError::from)?
    .create_with_context(KafkaContext)?;
    let mut budget = Budget {
        deadline: Instant::now() + BUDGET,
        records: 0,
        exhausted: false,
        cancel,
    };
    let mut found: Vec<TracedMessage> = Vec::new();
    // The inbound records in the window: those whose envelope (or control id and sender) match.
    let ranges = window(&consumer, &cfg.inbound_topic, None, q.since_ms, q.until_ms)?;
    budget.check()?;
    scan(&consumer, &cfg.inbound_topic, &ranges, &mut budget, |m| {
        if !q.envelope_id.is_empty() {
            // The id is not in a header: every envelope of the window is decoded (ids only, then dropped).
        } else if header(m, envelope::headers::CONTROL_ID) != Some(q.control_id.as_bytes()) {
            return true;
        }
        let Ok(env) = envelope::decode(m.payload().unwrap_or_default()) else {
            return true;
        };
        let h = env.header.clone().unwrap_or_default();
        let matches = if q.envelope_id.is_empty() {
            h.control_id == q.control_id
                && (q.sending_application.is_empty()
                    || h.sending_application == q.sending_application)
                && (q.sending_facility.is_empty() || h.sending_facility == q.sending_facility)
        } else {
            env.id == q.envelope_id
        };
        if matches {
            found.push(TracedMessage {
                envelope_id: env.id,
                received_at: env.received_at,
                source: env.source,
                header: env.header,
                topic: m.topic().to_owned(),
                partition: m.partition(),
                offset: m.offset(),
                events: Vec::new(),
            });
        }
        // An envelope id is unique: stop at it.
        (q.envelope_id.is_empty() || !matches) && found.len() < q.limit
    })?;
    if found.is_empty() && !q.envelope_id.is_empty() {
        // Not in the inbound topic (retention, or another inbound topic): the ledger may still know it.
        found.push(TracedMessage {
            envelope_id: q.envelope_id.clone(),
            ..TracedMessage::default()
        });
    }
    budget.check()?;
    if cfg.ledger.enabled() && !found.is_empty() && !budget.spent() {
        events(&consumer, cfg, q, &mut found, &mut budget)?;
    }
    budget.check()?;
    if !q.envelope_id.is_empty() {
        found.retain(|m| m.received_at.is_some() || !m.events.is_empty());
    }
    Ok(TraceResponse {
        messages: found,
        truncated: budget.exhausted,
        records_scanned: budget.records,
    })
}

/// Offsets of a destination topic's partition that the ledger says were delivered, with the envelope id and
/// route each `delivered` event names.
pub type Delivered = HashMap<i64, (String, String)>;

/// Most time a partition's ledger look-up (see [`delivered_offsets`]) may take before the partition's
/// deliveries go on without it.
pub const LEDGER_LOOKUP_BUDGET: Duration = Duration::from_secs(10);

/// What the ledger says this consumer group (`group`) already delivered of one partition of a destination topic:
/// the offsets from `from` on named by its `delivered` events of `topic`/`partition`, with the envelope id and
/// route the event
/// names (a topic made again under the same name reuses offsets), read from `since_ms` (event timestamps) to
/// the events topic's end now, within [`LEDGER_LOOKUP_BUDGET`]; and whether the read was complete. Issue 38:
/// the egress asks this when it is given a partition, so that what a crashed owner delivered after its last
/// commit is not sent again. Blocking: run it on a blocking thread.
pub fn delivered_offsets(
    cfg: &Config,
    group: &str,
    topic: &str,
    partition: i32,
    from: i64,
    since_ms: i64,
    cancel: &CancellationToken,
) -> Result<(Delivered, u64, bool), TraceError> {
    let consumer: BaseConsumer<KafkaContext> = hl7gw_runtime::kafka::reader_config(
        &format!("{}.ledger-reader", cfg.group_prefix),
        "hl7gw-egress-ledger",
        &cfg.kafka,
    )
    .map_err(rdkafka::error::KafkaError::from)?
    .create_with_context(KafkaContext)?;
    let mut budget = Budget {
        deadline: Instant::now() + LEDGER_LOOKUP_BUDGET,
        records: 0,
        exhausted: false,
        cancel,
    };
    let ranges = window(&consumer, &cfg.ledger.topic, None, since_ms, i64::MAX)?;
    let mut found = HashMap::new();
    scan(&consumer, &cfg.ledger.topic, &ranges, &mut budget, |m| {
        if header(m, ledger::KIND_HEADER) == Some(ledger::kind::DELIVERED.as_bytes())
            && let Ok(e) = ledger::decode(m.payload().unwrap_or_default())
            && e.consumer_group == group
            && e.topic == topic
            && e.partition == partition
            && e.offset >= from
        {
            found.insert(e.offset, (e.envelope_id, e.route));
        }
        true
    })?;
    budget.check()?;
    Ok((found, budget.records, !budget.exhausted))
}

/// Reads the ledger's events of the messages found: per events partition (the one each id is keyed to), from
/// the earliest of their times to the partition's end now.
fn events(
    consumer: &BaseConsumer<KafkaContext>,
    cfg: &Config,
    q: &Query,
    found: &mut [TracedMessage],
    budget: &mut Budget<'_>,
) -> Result<(), TraceError> {
    let topic = &cfg.ledger.topic;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5))?;
    let partitions = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len() as i32);
    if partitions == 0 {
        return Ok(());
    }
    let mut by_id: HashMap<String, usize> = HashMap::new();
    let mut from: BTreeMap<i32, i64> = BTreeMap::new();
    for (i, m) in found.iter().enumerate() {
        by_id.insert(m.envelope_id.clone(), i);
        let p = ledger::partition_for(m.envelope_id.as_bytes(), partitions);
        let at = m
            .received_at
            .as_ref()
            .map(ts_ms)
            .or_else(|| ledger::id_time(&m.envelope_id).map(ms))
            .unwrap_or(q.since_ms)
            - ID_BEFORE.as_millis() as i64;
        let e = from.entry(p).or_insert(at);
        *e = (*e).min(at);
    }
    let mut ranges = Vec::new();
    for (p, since) in from {
        budget.check()?;
        ranges.extend(window(consumer, topic, Some(p), since, i64::MAX)?);
    }
    let mut capped = false;
    scan(consumer, topic, &ranges, budget, |m| {
        let Some(key) = m.key() else { return true };
        let Some(&i) = std::str::from_utf8(key).ok().and_then(|k| by_id.get(k)) else {
            return true;
        };
        if found[i].events.len() >= MAX_EVENTS_PER_MESSAGE {
            // A message replayed over and over (`--force`): the answer keeps the first ones and says it is cut.
            capped = true;
        } else if let Ok(e) = ledger::decode(m.payload().unwrap_or_default()) {
            found[i].events.push(e);
        }
        true
    })?;
    if capped {
        budget.exhausted = true;
    }
    Ok(())
}

/// The offsets of `topic` (all its partitions, or `only`) whose records are timestamped in [since, until):
/// (partition, first offset, end offset), empty ranges left out.
fn window(
    consumer: &BaseConsumer<KafkaContext>,
    topic: &str,
    only: Option<i32>,
    since: i64,
    until: i64,
) -> Result<Vec<(i32, i64, i64)>, TraceError> {
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(Vec::new());
    };
    if t.error().is_some() {
        // No such topic (yet): nothing to read.
        return Ok(Vec::new());
    }
    let parts: Vec<i32> = t
        .partitions()
        .iter()
        .map(|p| p.id())
        .filter(|p| only.is_none_or(|o| o == *p))
        .collect();
    let offsets_at = |at: i64| -> Result<HashMap<i32, Option<i64>>, TraceError> {
        Ok(hl7gw_runtime::kafka::offsets::offsets_at_time(
            consumer,
            topic,
            &parts,
            at,
            Duration::from_secs(5),
        )?)
    };
    let starts = offsets_at(since)?;
    let ends = if until == i64::MAX {
        HashMap::new()
    } else {
        offsets_at(until)?
    };
    let mut out = Vec::new();
    for p in parts {
        let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(5))?;
        let Some(Some(start)) = starts.get(&p).copied() else {
            // Nothing at or after `since`.
            continue;
        };
        let end = ends.get(&p).copied().flatten().unwrap_or(high).min(high);
        if start < end {
            out.push((p, start, end));
        }
    }
    Ok(out)
}

/// Reads each (partition, start, end) range of `topic`, handing every record to `each` until it says stop
/// (false) or the budget runs out.
fn scan<F>(
    consumer: &BaseConsumer<KafkaContext>,
    topic: &str,
    ranges: &[(i32, i64, i64)],
    budget: &mut Budget<'_>,
    mut each: F,
) -> Result<(), TraceError>
where
    F: FnMut(&rdkafka::message::BorrowedMessage<'_>) -> bool,
{
    if ranges.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for (p, start, _) in ranges {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*start))?;
    }
    consumer.assign(&tpl)?;
    let mut open: HashMap<i32, i64> = ranges.iter().map(|(p, _, end)| (*p, *end)).collect();
    while !open.is_empty() {
        if budget.spent() {
            break;
        }
        let Some(r) = consumer.poll(Duration::from_millis(200)) else {
            // Past the last record (transaction markers at the end of a range are not delivered).
            let pos = consumer.position()?;
            open.retain(|p, end| {
                !matches!(
                    pos.find_partition(topic, *p).map(|e| e.offset()),
                    Some(Offset::Offset(o)) if o >= *end
                )
            });
            continue;
        };
        let m = r?;
        let Some(&end) = open.get(&m.partition()) else {
            continue;
        };
        if m.offset() >= end {
            open.remove(&m.partition());
            continue;
        }
        budget.records += 1;
        if m.offset() + 1 >= end {
            open.remove(&m.partition());
        }
        if !each(&m) {
            break;
        }
    }
    consumer.unassign()?;
    Ok(())
}

/// A Kafka header's value.
fn header<'a>(m: &'a rdkafka::message::BorrowedMessage<'_>, name: &str) -> Option<&'a [u8]> {
    m.headers()?.iter().find(|h| h.key == name)?.value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_needs_an_id_and_gets_a_bounded_window() {
        let none = TraceRequest::default();
        assert!(Query::from_request(&none).is_err());
        let by_control = Query::from_request(&TraceRequest {
            control_id: "MSG1".into(),
            limit: 1000,
            ..TraceRequest::default()
        })
        .unwrap();
        assert_eq!(by_control.until_ms - by_control.since_ms, 3_600_000);
        assert_eq!(by_control.limit, MAX_MESSAGES);
        let id = envelope::new_id();
        let by_id = Query::from_request(&TraceRequest {
            envelope_id: id,
            ..TraceRequest::default()
        })
        .unwrap();
        assert!(by_id.until_ms - by_id.since_ms <= (ID_BEFORE + ID_AFTER).as_millis() as i64);
        assert!(
            Query::from_request(&TraceRequest {
                envelope_id: "not-a-uuid".into(),
                ..TraceRequest::default()
            })
            .is_err()
        );
    }
}
