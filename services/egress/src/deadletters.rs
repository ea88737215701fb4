//! Dead letters: read back from the DLQ topic (the egress keeps no state of its own), listed, and replayed:
//! the egress's to their destination topic so the egress delivers them again, the transformer's to the
//! inbound topic so the transformer routes them again.

use crate::config::Config;
use hl7gw_runtime::envelope;
use hl7gw_runtime::kafka::{KafkaContext, TransactionalProducer};
use hl7gw_runtime::ledger;
use hl7gw_runtime::proto::v1::{DeadLetter, Envelope};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, Timestamp};
use rdkafka::producer::Producer as _;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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

/// A page of dead letters, whether more matched, and where the next page starts.
#[derive(Debug, Default)]
pub struct Page {
    pub letters: Vec<(DeadLetter, Envelope)>,
    pub truncated: bool,
    pub next_cursor: String,
}

/// Where a listing goes on: per DLQ partition, the next offset to read.
pub type Cursor = BTreeMap<i32, i64>;

/// A cursor as callers carry it: `partition:offset` pairs, comma-separated.
pub fn format_cursor(c: &Cursor) -> String {
    c.iter()
        .map(|(p, o)| format!("{p}:{o}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads a cursor [`format_cursor`] made.
pub fn parse_cursor(s: &str) -> Result<Cursor, String> {
    let mut c = Cursor::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let parsed = part
            .split_once(':')
            .and_then(|(p, o)| Some((p.parse::<i32>().ok()?, o.parse::<i64>().ok()?)));
        match parsed {
            Some((p, o)) if p >= 0 && o >= 0 && c.len() < 10_000 => {
                c.insert(p, o);
            }
            _ => return Err("the cursor is not one a listing returned".to_owned()),
        }
    }
    Ok(c)
}

/// The Kafka header of a replay marker: the DLQ partition and offset (`<partition>/<offset>`) of the dead
/// letter it says was replayed. A marker is a DLQ record (an envelope with rejection stage `replay`) written in
/// the same transaction as the replay, to the dead letter's partition: every later listing finds it after the
/// letter and reports the letter replayed.
pub const REPLAY_OF_HEADER: &str = "hl7gw.replay-of";
/// The stage of replay markers in the DLQ.
pub const STAGE_REPLAY: &str = "replay";

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
    /// Only dead letters of this reason (empty: any).
    pub reason: String,
    /// Go on from a previous page (then `since_ms` is not used).
    pub cursor: Option<Cursor>,
}

/// Why dead letters could not be read or replayed.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("the DLQ could not be read to its end within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Cursor(String),
    /// The caller went away: the listing stopped reading.
    #[error("cancelled: the caller went away")]
    Cancelled,
}

/// How long `list` waits before asking again while the DLQ's partitions have no leader (a new topic, a failover).
const LEADERSHIP_RETRY: Duration = Duration::from_millis(250);

/// Where a listing's reading starts (non-empty partitions), where each ends, and every partition's first offset.
type Extent = (TopicPartitionList, Vec<(i32, i64)>, Cursor);

/// The DLQ's non-empty partitions: where each starts (to assign) and where it ends now.
fn extent(
    consumer: &BaseConsumer<hl7gw_runtime::kafka::KafkaContext>,
    topic: &str,
) -> Result<Extent, rdkafka::error::KafkaError> {
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5))?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    let mut lows = Cursor::new();
    for t in md.topics() {
        match t.error().map(rdkafka::types::RDKafkaErrorCode::from) {
            // No DLQ yet (a cluster that does not create topics on demand): nothing dead-lettered.
            Some(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition) => continue,
            Some(code) => return Err(rdkafka::error::KafkaError::MetadataFetch(code)),
            None => {}
        }
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(5))?;
            lows.insert(p.id(), low);
            if high > low {
                tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
                ends.push((p.id(), high));
            }
        }
    }
    Ok((tpl, ends, lows))
}

/// Reads the DLQ from the start (or from `since`) to its current end and returns the egress's dead letters
/// that pass `filter`, oldest first, with their envelopes. Blocking: run it on a blocking thread. Stops with
/// [`DeadLetterError::Cancelled`] soon after `cancel` is (between two Kafka requests, each at most 5 s).
pub fn list(
    cfg: &Config,
    filter: &Filter,
    cancel: &CancellationToken,
) -> Result<Page, DeadLetterError> {
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
    let (mut tpl, mut ends, lows) = loop {
        if cancel.is_cancelled() {
            return Err(DeadLetterError::Cancelled);
        }
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
    // Where each partition's reading starts: the cursor's offset, `since`'s, or the first record.
    let mut next: Cursor = lows.clone();
    if let Some(cursor) = &filter.cursor {
        for (p, high) in &ends {
            let low = lows.get(p).copied().unwrap_or(0);
            let from = cursor.get(p).copied().unwrap_or(low).clamp(low, *high);
            next.insert(*p, from);
            tpl.set_partition_offset(&cfg.dlq_topic, *p, Offset::Offset(from))?;
        }
        for (p, o) in cursor {
            next.entry(*p).and_modify(|n| *n = (*n).max(*o));
        }
        ends.retain(|(p, high)| next.get(p).is_some_and(|from| from < high));
    } else if let Some(since) = filter.since_ms
        && !ends.is_empty()
    {
        // (An empty list would make librdkafka answer InvalidArgument: an empty DLQ has nothing to look up.)
        let mut times = TopicPartitionList::new();
        for (p, _) in &ends {
            times.add_partition_offset(&cfg.dlq_topic, *p, Offset::Offset(since))?;
        }
        let found = consumer.offsets_for_times(times, Duration::from_secs(5))?;
        for e in found.elements() {
            if let Offset::Offset(o) = e.offset() {
                tpl.set_partition_offset(&cfg.dlq_topic, e.partition(), Offset::Offset(o))?;
                next.insert(e.partition(), o);
            } else if matches!(e.offset(), Offset::End) {
                ends.retain(|(p, _)| *p != e.partition());
            }
        }
    }
    for (p, high) in &ends {
        // A partition with nothing to read starts (and stays) at its end.
        next.entry(*p).or_insert(*high);
    }
    let ended: Vec<i32> = next
        .keys()
        .filter(|p| !ends.iter().any(|(e, _)| e == *p))
        .copied()
        .collect();
    for p in ended {
        if let Ok((_, high)) = consumer.fetch_watermarks(&cfg.dlq_topic, p, Duration::from_secs(5))
        {
            next.insert(p, high.max(next.get(&p).copied().unwrap_or(0)));
        }
    }
    if ends.is_empty() {
        return Ok(Page {
            letters: Vec::new(),
            truncated: false,
            next_cursor: format_cursor(&next),
        });
    }
    consumer.assign(&tpl)?;
    let limit = page_limit(filter.limit);
    let mut bytes = 0usize;
    let mut out: Vec<(DeadLetter, Envelope)> = Vec::new();
    // The letters on the page by (partition, offset), for the replay markers read after them: a marker names an
    // earlier offset of its partition, so nothing is kept for letters off the page (bounded by the page's limit,
    // however many markers the DLQ holds).
    let mut on_page: HashMap<(i32, i64), usize> = HashMap::new();
    let mut full = false;
    let mut done: Vec<(i32, i64)> = Vec::new();
    while done.len() < ends.len() {
        if cancel.is_cancelled() {
            return Err(DeadLetterError::Cancelled);
        }
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
                    if !full {
                        // Read to its end (a transaction's commit marker may be its last offset).
                        next.insert(*p, *high);
                    }
                }
            }
            continue;
        };
        let m = r?;
        let Some(&(_, high)) = ends.iter().find(|(p, _)| *p == m.partition()) else {
            continue;
        };
        if m.offset() >= high {
            // Written after the listing started: the next page's.
            if !done.iter().any(|(d, _)| *d == m.partition()) {
                done.push((m.partition(), high));
            }
            continue;
        }
        if m.offset() + 1 >= high && !done.iter().any(|(d, _)| *d == m.partition()) {
            done.push((m.partition(), high));
        }
        let at = match m.timestamp() {
            Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => t,
            Timestamp::NotAvailable => 0,
        };
        if let Some(of) = replay_of(&m) {
            if let Some(&i) = on_page.get(&(m.partition(), of)) {
                let dl = &mut out[i].0;
                dl.replayed_by = header(&m, REPLAYED_BY_HEADER).unwrap_or_default();
                dl.replayed_at = Some(millis_timestamp(at));
            }
            if !full {
                next.insert(m.partition(), m.offset() + 1);
            }
            continue;
        }
        if full {
            // The page is full: the rest is read only for the markers of the letters on it.
            continue;
        }
        next.insert(m.partition(), m.offset() + 1);
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
            // Listed, never replayed: the sender was NAKed and resends once its message is fixed.
            STAGE_INGRESS => !filter.replay_only,
            _ => false,
        };
        if !known
            || (!filter.stage.is_empty() && rej.stage != filter.stage)
            || (!filter.reason.is_empty() && rej.reason != filter.reason)
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
            at: Some(millis_timestamp(at)),
            reason: rej.reason.clone(),
            ack_code,
            attempts: env.attempts,
            message_type: h.message_type.clone(),
            control_id: h.control_id.clone(),
            partition: m.partition(),
            offset: m.offset(),
            envelope: None,
            stage: rej.stage.clone(),
            replayed_by: String::new(),
            replayed_at: None,
            http_status: rej.http_status,
        };
        bytes += env.raw.len();
        on_page.insert((dl.partition, dl.offset), out.len());
        out.push((dl, env));
        if out.len() >= limit || bytes >= MAX_PAGE_BYTES {
            full = true;
        }
    }
    // More may match when a partition was not read to its end for letters.
    let truncated = ends
        .iter()
        .any(|(p, high)| next.get(p).is_some_and(|n| n < high));
    Ok(Page {
        letters: out,
        truncated,
        next_cursor: format_cursor(&next),
    })
}

/// The Kafka header naming who replayed a letter, on its replay marker.
pub const REPLAYED_BY_HEADER: &str = "hl7gw.replayed-by";

fn header(m: &rdkafka::message::BorrowedMessage<'_>, name: &str) -> Option<String> {
    use rdkafka::message::Headers;
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The DLQ offset of the letter a replay marker names, when `m` is one.
fn replay_of(m: &rdkafka::message::BorrowedMessage<'_>) -> Option<i64> {
    let v = header(m, REPLAY_OF_HEADER)?;
    let (p, o) = v.split_once('/')?;
    (p.parse::<i32>().ok()? == m.partition())
        .then(|| o.parse().ok())
        .flatten()
}

fn millis_timestamp(at: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: at.div_euclid(1000),
        nanos: (at.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// Whether a transformer dead letter can go back to the inbound topic: `unmatched` ones, whose envelope is the
/// inbound one that no route took (the route was missing), and `too_large` ones that name their input (the
/// output over the record limit is not in the letter: the input is re-read from the inbound topic and routed
/// again, once the limit is raised). The others are not: `bad_envelope` and `parse` would fail the same way
/// again, and a failed route's letter would be routed through every route again (duplicates for the routes
/// that succeeded).
pub fn replayable(rej: &hl7gw_runtime::proto::v1::Rejection) -> bool {
    rej.stage == STAGE_TRANSFORMER
        && (rej.reason == "unmatched"
            || (rej.reason == "too_large" && !rej.origin_topic.is_empty()))
}

/// A dead letter `replay` does not send, and why: never sent without its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub id: String,
    pub control_id: String,
    pub why: String,
    /// Where its original was read: `<topic>/<partition>/<offset>` (empty: not known).
    pub origin: String,
}

/// Where a dead letter's original was read, `<topic>/<partition>/<offset>` (empty: not known).
pub fn origin(rej: &hl7gw_runtime::proto::v1::Rejection) -> String {
    if rej.origin_topic.is_empty() {
        return String::new();
    }
    format!(
        "{}/{}/{}",
        rej.origin_topic, rej.origin_partition, rej.origin_offset
    )
}

/// What a replay of `env` must re-read from the letter's origin, if anything: the output an egress letter
/// dropped to fit the record limit, or the input of a transformer `too_large` letter (its output is not
/// kept). `Err`: the letter cannot be replayed whole from where the origin says (not known, or a topic other
/// than the one its stage reads: a DLQ record cannot aim a replay at any topic).
fn needs_origin(cfg: &Config, env: &Envelope) -> Result<Option<(String, i32, i64)>, String> {
    let Some(rej) = env.rejection.as_ref() else {
        return Ok(None);
    };
    let transformer_output = rej.stage == STAGE_TRANSFORMER && rej.reason == "too_large";
    if !env.raw.is_empty() && !rej.message_dropped && !transformer_output {
        return Ok(None);
    }
    if rej.origin_topic.is_empty() {
        return Err(
            "the message was dropped from the dead letter and its origin is not recorded".into(),
        );
    }
    let expected = if rej.stage == STAGE_TRANSFORMER {
        cfg.inbound_topic.clone()
    } else {
        cfg.topic(&env.destination)
    };
    if rej.origin_topic != expected {
        return Err(format!(
            "the dead letter names {} as its origin, not {expected}",
            rej.origin_topic
        ));
    }
    Ok(Some((
        rej.origin_topic.clone(),
        rej.origin_partition,
        rej.origin_offset,
    )))
}

/// Makes each letter whole for its replay: a letter without its message gets it from its origin record while
/// the topic still holds it (checked to be the same envelope id); the others are refused, with why and where
/// the original was read. Reads Kafka on one blocking thread with one consumer, whatever the number of letters.
/// `Err`: the reader's thread failed (nothing is replayed then, and the caller is told).
pub async fn whole(
    cfg: &Config,
    letters: Vec<(DeadLetter, Envelope)>,
) -> Result<(Vec<(DeadLetter, Envelope)>, Vec<Refusal>), String> {
    let cfg = cfg.clone();
    tokio::task::spawn_blocking(move || whole_blocking(&cfg, letters))
        .await
        .map_err(|e| format!("the replay's origin reader failed: {e}"))
}

/// [`whole`] on the blocking thread: the consumer is made once, for the first letter that needs it.
fn whole_blocking(
    cfg: &Config,
    letters: Vec<(DeadLetter, Envelope)>,
) -> (Vec<(DeadLetter, Envelope)>, Vec<Refusal>) {
    let mut out = Vec::with_capacity(letters.len());
    let mut refused = Vec::new();
    let mut reader: Option<Result<BaseConsumer<hl7gw_runtime::kafka::KafkaContext>, String>> = None;
    for (dl, env) in letters {
        let at = env.rejection.as_ref().map(origin).unwrap_or_default();
        let refuse = |why: String| Refusal {
            id: dl.id.clone(),
            control_id: dl.control_id.clone(),
            why,
            origin: at.clone(),
        };
        let (topic, partition, offset) = match needs_origin(cfg, &env) {
            Ok(None) => {
                out.push((dl, env));
                continue;
            }
            Ok(Some(o)) => o,
            Err(why) => {
                refused.push(refuse(why));
                continue;
            }
        };
        let read = match reader.get_or_insert_with(|| origin_reader(cfg)) {
            Ok(consumer) => read_origin(consumer, &topic, partition, offset),
            Err(e) => Err(e.clone()),
        };
        match read {
            Ok(original) if original.id == env.id => {
                let from_transformer = env
                    .rejection
                    .as_ref()
                    .is_some_and(|r| r.stage == STAGE_TRANSFORMER);
                let mut replayed = if from_transformer {
                    // The input itself, routed again (the letter held an output of it).
                    let mut e = original;
                    e.rejection = env.rejection.clone();
                    e
                } else {
                    let mut e = env;
                    e.raw = original.raw;
                    e.content_type = original.content_type;
                    e
                };
                if let Some(r) = replayed.rejection.as_mut() {
                    r.message_dropped = false;
                }
                out.push((dl, replayed));
            }
            Ok(_) => refused.push(refuse(
                "the record at the dead letter's origin is another message".into(),
            )),
            Err(why) => refused.push(refuse(format!(
                "the message was dropped from the dead letter and {why}"
            ))),
        }
    }
    (out, refused)
}

/// The consumer [`read_origin`] reads with (no group offsets: it is assigned each record it reads).
fn origin_reader(cfg: &Config) -> Result<BaseConsumer<hl7gw_runtime::kafka::KafkaContext>, String> {
    hl7gw_runtime::kafka::reader_config(
        &format!("{}.replay-reader", cfg.group_prefix),
        "hl7gw-egress-replay-reader",
        &cfg.kafka,
    )
    .map_err(|e| format!("cannot read it: {e}"))?
    .create_with_context(hl7gw_runtime::kafka::KafkaContext)
    .map_err(|e| format!("cannot read it: {e}"))
}

/// Reads the envelope at `topic`/`partition`/`offset` with `consumer`; `Err` says why it is not there. Blocking.
fn read_origin(
    consumer: &BaseConsumer<hl7gw_runtime::kafka::KafkaContext>,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<Envelope, String> {
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(5))
        .map_err(|e| format!("cannot read {topic}: {e}"))?;
    if offset < low {
        return Err(format!(
            "{topic} no longer holds it (its first offset in partition {partition} is {low}: retention)"
        ));
    }
    if offset >= high {
        return Err(format!("{topic} does not hold it"));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .and_then(|()| consumer.assign(&tpl))
        .map_err(|e| format!("cannot read {topic}: {e}"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m))
                if m.topic() == topic && m.partition() == partition && m.offset() == offset =>
            {
                return envelope::decode(m.payload().unwrap_or_default())
                    .map_err(|e| format!("the record there is not an envelope: {e}"));
            }
            // Past it: deleted (compaction) or never committed.
            Some(Ok(m))
                if m.topic() == topic && m.partition() == partition && m.offset() > offset =>
            {
                return Err(format!("{topic} does not hold it"));
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("cannot read {topic}: {e}")),
            None => {}
        }
    }
    Err(format!("{topic} did not give it within 10 s"))
}

/// The stage of the egress's own dead letters.
pub const STAGE_EGRESS: &str = "egress";
/// The stage of the ingress's dead letters (input it refused with a NAK): listed, not replayed.
pub const STAGE_INGRESS: &str = "ingress";
/// The stage of the transformer's dead letters.
pub const STAGE_TRANSFORMER: &str = "transformer";

/// Sends dead letters back (rejection cleared, a `replay` stage added), in one Kafka transaction with, for each,
/// a replay marker after it in the DLQ and a `replayed` event in the ledger: all of them are written or none
/// is, so a replay cut short and run again neither loses nor repeats a letter. The egress's letters go to their
/// destination topic, the transformer's to the inbound topic (destination cleared, so the routes decide
/// again). `by` is the caller as audited. Returns the replayed (id, destination) pairs; the destination of a
/// transformer dead letter is reported as `transformer`.
pub async fn replay(
    cfg: &Config,
    by: &str,
    letters: Vec<(DeadLetter, Envelope)>,
) -> Result<Vec<(String, String)>, DeadLetterError> {
    if letters.is_empty() {
        return Ok(Vec::new());
    }
    let timeout = Duration::from_secs(30);
    let pc = hl7gw_runtime::kafka::transactional_producer_config(
        "hl7gw-egress-replay",
        &cfg.kafka,
        &format!("{}.replay", cfg.group_prefix),
        timeout,
    )
    .map_err(rdkafka::error::KafkaError::from)?;
    let producer: TransactionalProducer = pc.create_with_context(KafkaContext)?;
    let producer = std::sync::Arc::new(producer);
    // One transactional id for every egress pod: two replays at once fence each other rather than both
    // replaying the same letters.
    blocking(&producer, move |p| p.init_transactions(timeout)).await?;
    let sent = replay_in_transaction(cfg, by, &producer, letters).await;
    let result = match sent {
        Ok(ids) => blocking(&producer, move |p| p.commit_transaction(timeout))
            .await
            .map(|()| ids),
        Err(e) => {
            let _ = blocking(&producer, move |p| p.abort_transaction(timeout)).await;
            Err(e)
        }
    };
    // The last handle's drop flushes: not on a tokio worker.
    let _ = tokio::task::spawn_blocking(move || drop(producer)).await;
    result
}

/// Runs a blocking producer call on a blocking thread.
async fn blocking<F>(
    producer: &std::sync::Arc<TransactionalProducer>,
    call: F,
) -> Result<(), DeadLetterError>
where
    F: FnOnce(&TransactionalProducer) -> Result<(), rdkafka::error::KafkaError> + Send + 'static,
{
    let p = producer.clone();
    hl7gw_runtime::kafka::errors::blocking(move || call(&p))
        .await
        .map_err(DeadLetterError::Kafka)
}

async fn replay_in_transaction(
    cfg: &Config,
    by: &str,
    producer: &TransactionalProducer,
    letters: Vec<(DeadLetter, Envelope)>,
) -> Result<Vec<(String, String)>, DeadLetterError> {
    use rdkafka::message::Header;
    producer.begin_transaction()?;
    let mut ids = Vec::new();
    let mut deliveries = Vec::new();
    let mut buf = Vec::new();
    let replay_of = |dl: &DeadLetter| format!("{}/{}", dl.partition, dl.offset);
    for (dl, mut env) in letters {
        let letter = env.clone();
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
        let traceparent = envelope::traceparent(&env);
        let rec = envelope::encode_record(&topic, &env.key, &env, &traceparent, &mut buf);
        deliveries.push(producer.send_result(rec).map_err(|(e, _)| e)?);
        // The marker: the letter's envelope without its message, rejection stage `replay`, in its partition.
        let mut marker = letter;
        marker.raw = bytes::Bytes::new();
        marker.rejection = Some(hl7gw_runtime::proto::v1::Rejection {
            stage: STAGE_REPLAY.into(),
            reason: "replayed".into(),
            detail: format!("dead letter {} replayed to {topic}", replay_of(&dl)),
            ..Default::default()
        });
        envelope::encode_into(&marker, &mut buf);
        let of = replay_of(&dl);
        let headers = envelope::record_headers(&marker, "")
            .insert(Header {
                key: REPLAY_OF_HEADER,
                value: Some(of.as_str()),
            })
            .insert(Header {
                key: REPLAYED_BY_HEADER,
                value: Some(by),
            });
        let mut rec = rdkafka::producer::FutureRecord::to(&cfg.dlq_topic)
            .partition(dl.partition)
            .payload(buf.as_slice())
            .headers(headers);
        if !marker.key.is_empty() {
            rec = rec.key(marker.key.as_str());
        }
        deliveries.push(producer.send_result(rec).map_err(|(e, _)| e)?);
        if cfg.ledger.enabled() {
            let mut e = ledger::event(ledger::kind::REPLAYED, STAGE_EGRESS, &env);
            e.destination.clone_from(&label);
            e.replayed_by = by.to_owned();
            e.replayed_from = format!("{}/{}", cfg.dlq_topic, of);
            e.topic.clone_from(&topic);
            e.reason.clone_from(&dl.reason);
            ledger::encode_into(&e, &mut buf);
            let rec = ledger::record(&cfg.ledger.topic, &e, &buf);
            deliveries.push(producer.send_result(rec).map_err(|(e, _)| e)?);
        }
        ids.push((env.id.clone(), label));
    }
    for d in futures_util::future::join_all(deliveries).await {
        match d {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(e.into()),
            Err(_) => return Err(rdkafka::error::KafkaError::Canceled.into()),
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36, item 5: a letter without its message is replayed only from its own stage's topic, never
    /// sent empty; a transformer `too_large` letter is replayable when it names its input.
    #[test]
    fn a_letter_without_its_message_is_replayed_from_its_origin_or_refused() {
        use hl7gw_runtime::proto::v1::Rejection;
        let mut cfg = Config::default();
        cfg.destinations.insert(
            "fhir".into(),
            serde_json::from_str(r#"{"url": "http://127.0.0.1:1/fhir"}"#).unwrap(),
        );
        let letter = |stage: &str, reason: &str, raw: &[u8], origin: &str| Envelope {
            id: "e1".into(),
            destination: "fhir".into(),
            raw: raw.to_vec().into(),
            rejection: Some(Rejection {
                stage: stage.into(),
                reason: reason.into(),
                origin_topic: origin.into(),
                origin_partition: 2,
                origin_offset: 7,
                message_dropped: raw.is_empty(),
                ..Rejection::default()
            }),
            ..Envelope::default()
        };
        let whole = letter("egress", "rejected", b"MSH|", "hl7.out.fhir");
        assert_eq!(needs_origin(&cfg, &whole), Ok(None));
        let dropped = letter("egress", "rejected", b"", "hl7.out.fhir");
        assert_eq!(
            needs_origin(&cfg, &dropped),
            Ok(Some(("hl7.out.fhir".into(), 2, 7)))
        );
        assert!(needs_origin(&cfg, &letter("egress", "rejected", b"", "")).is_err());
        assert!(needs_origin(&cfg, &letter("egress", "rejected", b"", "hl7.events")).is_err());
        let too_large = letter("transformer", "too_large", b"", "hl7.inbound");
        assert!(replayable(too_large.rejection.as_ref().unwrap()));
        assert_eq!(
            needs_origin(&cfg, &too_large),
            Ok(Some(("hl7.inbound".into(), 2, 7)))
        );
        assert!(!replayable(
            letter("transformer", "too_large", b"", "")
                .rejection
                .as_ref()
                .unwrap()
        ));
        assert_eq!(
            origin(dropped.rejection.as_ref().unwrap()),
            "hl7.out.fhir/2/7"
        );
    }

    /// Issue 9, item 14: a caller cannot ask the server for an unbounded page.
    #[test]
    fn pages_are_bounded_by_the_server() {
        assert_eq!(page_limit(0), MAX_PAGE);
        assert_eq!(page_limit(10), 10);
        assert_eq!(page_limit(u32::MAX as usize), MAX_PAGE);
    }
}
