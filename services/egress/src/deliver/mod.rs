//! Delivery to one destination: a consumer group on `hl7.out.<destination>`, one worker per partition. A worker
//! delivers records of different keys (patients) at once and the records of one key one at a time in offset
//! order ([`window`]), up to the destination's `max_in_flight` deliveries (their bytes bounded with the rest of
//! the partition's by `queue_bytes_per_partition`); an MLLP destination's worker keeps `connections`
//! connections, one message in flight on each, an HTTP destination's share the pooled client. An offset is stored for commit only once every record up to it
//! was accepted by the receiver or went to the DLQ (and its ledger event was written), so a crash redelivers
//! at most what was in flight or waiting behind it.

pub mod window;

use crate::client::{MllpClient, SendError, Tls};
use crate::config::{Config, Destination};
use crate::metrics::{DestMetrics, EgressMetrics};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use hl7gw_runtime::dedup::{Dedup, Seen};
use hl7gw_runtime::envelope;
use hl7gw_runtime::ledger;
use hl7gw_runtime::proto::v1::{Envelope, Event, Rejection};
use hl7v2::AckCode;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::Producer as _;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use window::Window;

pub type DestConsumer = StreamConsumer<hl7gw_runtime::kafka::Assignment>;

/// What an operator sees of a destination (gRPC `Status`).
#[derive(Debug, Default)]
pub struct DestState {
    pub last_ack_code: Mutex<String>,
    pub last_ack_at: Mutex<Option<SystemTime>>,
    pub last_error: Mutex<String>,
    pub retrying: AtomicU64,
    pub delivered: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// The deliveries in the air, by partition and sequence number: the oldest undelivered message's age and
    /// the retrying-since time come from here.
    pub heads: Mutex<HashMap<(i32, u64), Arc<Head>>>,
    /// Dead letters written since start by reason (the reasons are a fixed set of labels).
    pub dead_lettered_by_reason: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    pub lag: std::sync::atomic::AtomicI64,
    pub ready: AtomicBool,
    /// An HTTP destination's last request got an answer (its pool's connections are not counted).
    pub answered: AtomicBool,
    /// Since when, and why, a dead letter cannot be written (Kafka away, the DLQ topic not authorised, a record
    /// refused even shrunk): readiness goes down once this lasts [`DLQ_FAILING_UNREADY`].
    pub dlq_failing: Mutex<Option<(Instant, String)>>,
    /// The same for the ledger's events: while they cannot be written, offsets are not stored and the
    /// destination's deliveries wait (the ledger must miss nothing).
    pub ledger_failing: Mutex<Option<(Instant, String)>>,
    /// A consumer error that stops all reading of the destination topic (authorisation, a missing topic) and
    /// the rebalance generation it came in: it holds until a record is read or the assignment changes
    /// (librdkafka may report it once only).
    pub unreadable: Mutex<Option<(u64, String)>>,
}

/// The stage name the egress writes in dead letters and events.
const STAGE: &str = "egress";

/// Most records a partition's worker holds from its last stored offset on (in flight, waiting behind their key,
/// or settled with their ledger event still on its way): past it, the worker takes no new record until the
/// oldest is settled.
const MAX_WINDOW: usize = 256;

/// A settled record: its offset is stored once its event (if any) is written.
struct Pending {
    event: Option<Box<Event>>,
    delivery: Option<hl7gw_runtime::delivery::DeliveryFuture>,
}

/// How a record of a partition's window ended: settled, or abandoned (shutdown, the partition moved; its offset
/// and every later one stay unstored).
enum Outcome {
    Settled(Pending),
    Abandoned,
}

/// A record taken into a partition's window and not yet started.
struct Waiting {
    generation: u64,
    m: OwnedMessage,
    queued: QueuedBytes,
    /// The envelope id and route the ledger says were delivered from this offset (by the partition's last
    /// owner, after its last commit).
    known: Option<(String, String)>,
}

/// How far back the ledger is read for a partition's deliveries past its committed offset: from the committed
/// record's time, but not before this long ago (an older committed record means a backlog, and its last owner
/// delivered only just before it went).
const LEDGER_LOOKBACK: Duration = Duration::from_secs(600);

/// Slack for the clocks of the transformer that timestamped a record and of the egress that wrote its event.
const LEDGER_SKEW: Duration = Duration::from_secs(10);

/// A delivery that ended, back in its partition's worker.
struct Finished {
    seq: u64,
    key: u64,
    done: Done,
    client: Option<MllpClient>,
}

/// Takes a delivery's [`Head`] out of the destination's state when the delivery ends.
struct HeadGone<'a>(&'a DestState, (i32, u64));

impl Drop for HeadGone<'_> {
    fn drop(&mut self) {
        if let Ok(mut h) = self.0.heads.lock() {
            h.remove(&self.1);
        }
    }
}

/// How long dead letters may fail to be written before the egress says so in `/readyz`.
pub const DLQ_FAILING_UNREADY: Duration = Duration::from_secs(5);

impl DestState {
    /// Why this destination makes the egress unready, if it does: its dead letters have not been written for
    /// [`DLQ_FAILING_UNREADY`], or its topic cannot be read (`generation`: the consumer's now).
    pub fn unready_reason(&self, generation: u64) -> Option<String> {
        if let Ok(g) = self.dlq_failing.lock()
            && let Some((since, why)) = g.as_ref()
            && since.elapsed() >= DLQ_FAILING_UNREADY
        {
            return Some(format!("dead letters cannot be written to Kafka: {why}"));
        }
        if let Ok(g) = self.ledger_failing.lock()
            && let Some((since, why)) = g.as_ref()
            && since.elapsed() >= DLQ_FAILING_UNREADY
        {
            return Some(format!(
                "ledger events cannot be written to Kafka (deliveries wait): {why}"
            ));
        }
        let u = self.unreadable.lock().ok()?;
        match u.as_ref() {
            Some((g, why)) if *g == generation => Some(format!("cannot read the topic: {why}")),
            _ => None,
        }
    }

    fn set_unreadable(&self, v: Option<(u64, String)>) {
        if let Ok(mut u) = self.unreadable.lock() {
            *u = v;
        }
    }

    fn dlq_failing(&self, why: Option<&str>) {
        failing(&self.dlq_failing, why);
    }

    fn ledger_failing(&self, why: Option<&str>) {
        failing(&self.ledger_failing, why);
    }
}

/// Records since when (and the latest why) writes of one kind fail; `None` clears it.
fn failing(m: &Mutex<Option<(Instant, String)>>, why: Option<&str>) {
    if let Ok(mut g) = m.lock() {
        match (why, g.as_ref()) {
            (None, _) => *g = None,
            (Some(w), Some((since, _))) => *g = Some((*since, w.to_owned())),
            (Some(w), None) => *g = Some((Instant::now(), w.to_owned())),
        }
    }
}

/// The message a partition's worker is delivering: when the ingress read it and since when it is being retried
/// (milliseconds since the epoch; 0: none).
#[derive(Debug, Default)]
pub struct Head {
    received_ms: std::sync::atomic::AtomicI64,
    retrying_ms: std::sync::atomic::AtomicI64,
}

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl DestState {
    /// How long the oldest message a worker holds has waited since the ingress read it (0: none held).
    pub fn oldest_undelivered_age(&self) -> Duration {
        let now = epoch_ms(SystemTime::now());
        let oldest = self
            .heads
            .lock()
            .map(|h| {
                h.values()
                    .map(|x| x.received_ms.load(Ordering::Relaxed))
                    .filter(|&t| t > 0)
                    .min()
            })
            .ok()
            .flatten();
        oldest.map_or(Duration::ZERO, |t| {
            Duration::from_millis(u64::try_from(now - t).unwrap_or(0))
        })
    }

    /// Since when the longest-retried message has been waiting for its next attempt.
    pub fn retrying_since(&self) -> Option<SystemTime> {
        let ms = self
            .heads
            .lock()
            .ok()?
            .values()
            .map(|x| x.retrying_ms.load(Ordering::Relaxed))
            .filter(|&t| t > 0)
            .min()?;
        Some(SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).ok()?))
    }
}

fn set(m: &Mutex<String>, v: &str) {
    if let Ok(mut g) = m.lock() {
        v.clone_into(&mut g);
    }
}

/// Everything a destination's workers share.
pub struct DestCtx {
    pub name: String,
    pub topic: String,
    pub dest: Arc<Destination>,
    pub tls: Option<Tls>,
    /// The pooled HTTP(S) client of a destination with a `url` (shared by its partition workers).
    pub http: Option<Arc<crate::http::HttpClient>>,
    pub cfg: Arc<Config>,
    pub consumer: Arc<DestConsumer>,
    pub producer: Arc<hl7gw_runtime::producer::ProducerSlot>,
    /// The ledger's events' producer (lingering; see `ledger.linger`).
    pub ledger: Arc<hl7gw_runtime::producer::ProducerSlot>,
    pub metrics: EgressMetrics,
    /// This destination's per-message handles.
    pub m: DestMetrics,
    pub dedup: Dedup,
    pub state: DestState,
}

impl std::fmt::Debug for DestCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DestCtx")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A record on its way to a partition worker, with the rebalance generation it was read in.
type Item = (u64, OwnedMessage);

/// The queue to one partition's worker, bounded in records (the channel) and in payload bytes.
struct Lane {
    tx: mpsc::Sender<Item>,
    bytes: Arc<AtomicUsize>,
    max_bytes: usize,
}

impl Lane {
    /// Queues `item` unless the lane is full in records or bytes (an empty lane takes any one record).
    // The same signature as `mpsc::Sender::try_send`: a full lane hands the record back to be held.
    #[allow(clippy::result_large_err)]
    fn try_send(&self, item: Item) -> Result<(), mpsc::error::TrySendError<Item>> {
        let len = payload_len(&item);
        let queued = self.bytes.load(Ordering::Acquire);
        if queued > 0 && queued + len > self.max_bytes {
            return Err(mpsc::error::TrySendError::Full(item));
        }
        // Counted before the worker can take it (and count it off).
        self.bytes.fetch_add(len, Ordering::AcqRel);
        self.tx.try_send(item).inspect_err(|_| {
            self.bytes.fetch_sub(len, Ordering::AcqRel);
        })
    }
}

fn payload_len(item: &Item) -> usize {
    item.1.payload().map_or(0, <[u8]>::len)
}

/// Records of one partition read while its lane was full, in order, waiting for room.
#[derive(Default)]
struct Held {
    q: VecDeque<Item>,
    bytes: usize,
    /// Fetching is paused: more than `queue_bytes_per_partition` is held.
    paused: bool,
}

impl Held {
    fn push(&mut self, item: Item) {
        self.bytes += payload_len(&item);
        self.q.push_back(item);
    }

    fn pop(&mut self) -> Option<Item> {
        let item = self.q.pop_front()?;
        self.bytes -= payload_len(&item);
        Some(item)
    }

    fn unpop(&mut self, item: Item) {
        self.bytes += payload_len(&item);
        self.q.push_front(item);
    }
}

/// Takes a record's bytes off its lane's count when dropped (the record is settled, abandoned or dropped), and
/// tells the reader there is room for a held record.
struct QueuedBytes(Arc<AtomicUsize>, usize, Arc<tokio::sync::Notify>);

impl Drop for QueuedBytes {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
        self.2.notify_one();
    }
}

/// How a delivery ended.
#[derive(Debug, PartialEq)]
enum Done {
    /// Accepted or dead-lettered (with the ledger's event, written before the offset is stored) or
    /// suppressed (no event: the first delivery has one): the offset may be committed.
    Settled(Option<Box<Event>>),
    /// Shutdown or the partition moved: the offset stays, the message will be read again.
    Abandoned,
}

impl DestCtx {
    /// Reads the destination topic and hands each record to its partition's worker until `stop`. A partition
    /// whose worker queue is full has its records held back in order, and its fetching paused once more than
    /// `queue_bytes_per_partition` is held (resumed below half of it), so the other partitions go on and the
    /// consumer keeps polling (a blocked poll would leave the group after `max.poll.interval.ms` while the
    /// stuck worker still held a stale queue). Pausing at a watermark rather than at every full queue matters:
    /// a pause drops what librdkafka fetched ahead, and a resumed partition with nothing else to fetch waits
    /// up to a second for its broker thread to fetch again, which capped a backlog on one partition at about
    /// one queue (64 records) a second. A worker that dies (a panic) cancels `failed`: a new worker would store
    /// offsets past the message the dead one held, so instead the process stops and the partition is read
    /// again from its committed offset.
    pub async fn run(self: Arc<Self>, stop: CancellationToken, failed: CancellationToken) {
        let tracker = TaskTracker::new();
        let mut workers: HashMap<i32, Lane> = HashMap::new();
        let mut held: HashMap<i32, Held> = HashMap::new();
        // A worker is done with a record: there may be room in its lane for a held one.
        let room = Arc::new(tokio::sync::Notify::new());
        loop {
            if !held.is_empty() && !self.hand_over_held(&mut held, &workers) {
                tracing::error!(destination = %self.name, "a partition worker stopped unexpectedly: stopping the egress");
                failed.cancel();
                break;
            }
            let m = tokio::select! {
                _ = stop.cancelled() => break,
                _ = room.notified(), if !held.is_empty() => continue,
                m = self.consumer.recv() => m,
            };
            let m = match m {
                Ok(m) => {
                    self.state.set_unreadable(None);
                    m.detach()
                }
                Err(e) => {
                    tracing::warn!(destination = %self.name, error = %e, "consumer error");
                    if hl7gw_runtime::kafka::stops_reading(&e) {
                        let generation = self.consumer.context().generation();
                        self.state.set_unreadable(Some((generation, e.to_string())));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let generation = self.consumer.context().generation();
            let partition = m.partition();
            let tx = workers.entry(partition).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(self.cfg.queue_per_partition);
                let bytes = Arc::new(AtomicUsize::new(0));
                tracker.spawn(self.clone().partition_worker(
                    partition,
                    rx,
                    bytes.clone(),
                    room.clone(),
                    stop.clone(),
                ));
                Lane {
                    tx,
                    bytes,
                    max_bytes: self.cfg.queue_bytes_per_partition,
                }
            });
            let item = if held.contains_key(&partition) {
                // Behind records already held: keep the partition's order.
                (generation, m)
            } else {
                match tx.try_send((generation, m)) {
                    Ok(()) => continue,
                    Err(mpsc::error::TrySendError::Full(item)) => item,
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        tracing::error!(destination = %self.name, partition, "a partition worker stopped unexpectedly: stopping the egress");
                        failed.cancel();
                        break;
                    }
                }
            };
            let h = held.entry(partition).or_default();
            h.push(item);
            if !h.paused && h.bytes > self.cfg.queue_bytes_per_partition {
                h.paused = true;
                self.m.partition_pauses.inc();
                self.pause(partition, true);
            }
        }
        drop(workers);
        tracker.close();
        tracker.wait().await;
    }

    /// Moves held records to their workers as their queues free up, resuming a paused partition once less
    /// than half of `queue_bytes_per_partition` is held; records read before a rebalance are dropped (the
    /// partition restarts from its committed offset). False when a worker is gone.
    fn hand_over_held(&self, held: &mut HashMap<i32, Held>, workers: &HashMap<i32, Lane>) -> bool {
        let current = self.consumer.context().generation();
        let mut alive = true;
        held.retain(|&partition, h| {
            let Some(tx) = workers.get(&partition) else {
                return false;
            };
            while let Some(item) = h.pop() {
                if item.0 != current {
                    continue;
                }
                match tx.try_send(item) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(item)) => {
                        h.unpop(item);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        alive = false;
                        return false;
                    }
                }
            }
            if h.paused && h.bytes <= self.cfg.queue_bytes_per_partition / 2 {
                h.paused = false;
                self.pause(partition, false);
            }
            !h.q.is_empty()
        });
        alive
    }

    /// Pauses or resumes fetching one partition (a partition that moved meanwhile is no error).
    fn pause(&self, partition: i32, pause: bool) {
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        let r = if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = r {
            tracing::debug!(destination = %self.name, partition, pause, error = %e, "pause/resume");
        }
    }

    /// One partition's deliveries (see the module doc): takes records from its lane into the window while it
    /// has room, starts every record whose key is free up to `max_in_flight` (and, for MLLP, on an idle
    /// connection), and stores the offsets of the settled prefix once their events are written. A record
    /// abandoned (the partition moved) drains the window first: the deliveries in the air end, the prefix they
    /// settled is stored, and the rest is read again from the committed offset, so an offset is never stored
    /// past a record of an earlier generation that did not finish.
    async fn partition_worker(
        self: Arc<Self>,
        partition: i32,
        mut rx: mpsc::Receiver<Item>,
        queued_bytes: Arc<AtomicUsize>,
        room: Arc<tokio::sync::Notify>,
        stop: CancellationToken,
    ) {
        let mut idle: Vec<MllpClient> = if self.http.is_some() {
            Vec::new()
        } else {
            (0..self.dest.connections.max(1))
                .map(|_| self.mllp_client())
                .collect()
        };
        let mut window: Window<Waiting, Outcome> = Window::default();
        let mut running: FuturesUnordered<BoxFuture<'static, Finished>> = FuturesUnordered::new();
        // The deliveries in the air.
        let mut busy = 0usize;
        let mut waiting_shown = 0i64;
        // The rebalance generation the window's records were read in, and the offsets of that generation the
        // ledger says were delivered already.
        let mut window_generation: Option<u64> = None;
        let mut delivered_before = HashMap::new();
        'work: loop {
            // Start every ready record that can start now: up to `max_in_flight`, and for MLLP on an idle
            // connection.
            while busy < self.dest.max_in_flight && window.peek_ready().is_some() {
                if self.http.is_none() && idle.is_empty() {
                    break;
                }
                let Some((seq, key, w)) = window.take_ready() else {
                    break;
                };
                busy += 1;
                let run = self
                    .clone()
                    .start(partition, seq, key, w, idle.pop(), stop.clone());
                running.push(run);
            }
            let waiting = i64::try_from(window.waiting()).unwrap_or(i64::MAX);
            self.m.waiting_for_key.inc_by(waiting - waiting_shown);
            waiting_shown = waiting;
            // The finished prefix whose events need no wait settles now (a suppressed duplicate, an event the
            // producer could not queue: written here, with retries).
            while let Some((_, Outcome::Settled(Pending { delivery: None, .. }))) =
                window.front_mut()
            {
                if !self
                    .settle_front(partition, &mut window, false, &stop)
                    .await
                {
                    break 'work;
                }
            }
            let front_waits = matches!(
                window.front_mut(),
                Some((
                    _,
                    Outcome::Settled(Pending {
                        delivery: Some(_),
                        ..
                    })
                ))
            );
            let can_take = window.len() < MAX_WINDOW;
            let abandoned = tokio::select! {
                biased;
                Some(f) = running.next(), if !running.is_empty() => {
                    busy -= 1;
                    self.finished(partition, f, &mut window, &mut idle)
                }
                r = front_event(&mut window), if front_waits => {
                    if !self.settle_front(partition, &mut window, r, &stop).await {
                        break 'work;
                    }
                    false
                }
                item = rx.recv(), if can_take => {
                    let Some((generation, m)) = item else {
                        break 'work;
                    };
                    let queued = QueuedBytes(queued_bytes.clone(), m.payload().map_or(0, <[u8]>::len), room.clone());
                    if generation != self.consumer.context().generation() {
                        // Read before a rebalance: the partition restarts from its committed offset.
                        continue;
                    }
                    if window_generation != Some(generation) {
                        // The partition was (re)assigned: what the last generation left is settled first, then
                        // the ledger says what was delivered past the committed offset (this record's).
                        if !window.is_empty() || !running.is_empty() {
                            let drained = self.drain(partition, &mut window, &mut running, &mut idle, &stop).await;
                            busy = 0;
                            if !drained {
                                break 'work;
                            }
                        }
                        window_generation = Some(generation);
                        delivered_before = self.ledger_lookup(partition, &m, &stop).await;
                    }
                    let known = delivered_before.remove(&m.offset());
                    window.push(m.offset(), key_hash(&m), Waiting { generation, m, queued, known });
                    false
                }
                _ = stop.cancelled() => break 'work,
            };
            if abandoned {
                if stop.is_cancelled() {
                    break;
                }
                let drained = self
                    .drain(partition, &mut window, &mut running, &mut idle, &stop)
                    .await;
                busy = 0;
                if !drained {
                    break;
                }
            }
        }
        // Shutdown: nothing new starts, the deliveries in the air end (a retry gives up waiting at once), and the
        // offsets of the settled prefix are stored once their events are written (up to 5 s each); from the
        // first that is not, none is (those records are delivered again by the next owner, and their events
        // written then: a second delivery is recorded as one).
        drop(window.drop_unstarted());
        self.m.waiting_for_key.dec_by(waiting_shown);
        while let Some(f) = running.next().await {
            self.finished(partition, f, &mut window, &mut idle);
        }
        while let Some((_, Outcome::Settled(p))) = window.front_mut() {
            let written = match p.delivery.as_mut() {
                Some(d) => matches!(
                    tokio::time::timeout(Duration::from_secs(5), d).await,
                    Ok(Ok(Ok(_)))
                ),
                None => p.event.is_none(),
            };
            if !written || !self.settle_front(partition, &mut window, true, &stop).await {
                return;
            }
        }
    }

    /// The offsets of `partition` from `first` (the first record read after an assignment: the committed
    /// offset) on that the ledger's `delivered` events of this consumer group name: what the partition's last
    /// owner delivered and did not commit (a crash, a rebalance). A new group (or an event written before
    /// issue 38, without its group) suppresses nothing. Empty when the ledger is off, or cannot be read within
    /// [`crate::trace::LEDGER_LOOKUP_BUDGET`] (then those records are delivered again, as before issue 38).
    async fn ledger_lookup(
        self: &Arc<Self>,
        partition: i32,
        first: &OwnedMessage,
        stop: &CancellationToken,
    ) -> crate::trace::Delivered {
        if !self.cfg.ledger.enabled() {
            return HashMap::new();
        }
        let now = epoch_ms(SystemTime::now());
        let at = first.timestamp().to_millis().unwrap_or(now);
        let since =
            at.max(now - LEDGER_LOOKBACK.as_millis() as i64) - LEDGER_SKEW.as_millis() as i64;
        let (this, from, cancel) = (self.clone(), first.offset(), stop.child_token());
        let started = Instant::now();
        let found = tokio::task::spawn_blocking(move || {
            let group = this.cfg.group(&this.name);
            crate::trace::delivered_offsets(
                &this.cfg,
                &group,
                &this.topic,
                partition,
                from,
                since,
                &cancel,
            )
        })
        .await;
        match found {
            Ok(Ok((offsets, scanned, complete))) => {
                tracing::info!(
                    destination = %self.name,
                    partition,
                    from,
                    delivered = offsets.len(),
                    events_read = scanned,
                    complete,
                    ms = started.elapsed().as_millis() as u64,
                    "ledger read for the deliveries past the committed offset"
                );
                offsets
            }
            Ok(Err(e)) => {
                tracing::warn!(destination = %self.name, partition, error = %e, "the ledger could not be read: what the last owner delivered past the committed offset is delivered again");
                HashMap::new()
            }
            Err(e) => {
                tracing::warn!(destination = %self.name, partition, error = %e, "the ledger look-up failed");
                HashMap::new()
            }
        }
    }

    /// A connection to the MLLP receiver (connected on its first send).
    fn mllp_client(&self) -> MllpClient {
        MllpClient::new(
            self.dest.clone(),
            self.tls.clone(),
            self.m.connections_active.clone(),
            self.m.unmatched_acks.clone(),
        )
    }

    /// The delivery of one record, as a future the worker polls beside the others.
    #[allow(clippy::too_many_arguments)]
    fn start(
        self: Arc<Self>,
        partition: i32,
        seq: u64,
        key: u64,
        w: Waiting,
        client: Option<MllpClient>,
        stop: CancellationToken,
    ) -> BoxFuture<'static, Finished> {
        Box::pin(async move {
            let Waiting {
                generation,
                m,
                queued,
                known,
            } = w;
            let mut client = client;
            let _gauges = InFlight::new(&self.m, m.payload().map_or(0, <[u8]>::len));
            let done = if generation == self.consumer.context().generation() {
                let head = Arc::new(Head::default());
                if let Ok(mut h) = self.state.heads.lock() {
                    h.insert((partition, seq), head.clone());
                }
                let _gone = HeadGone(&self.state, (partition, seq));
                self.deliver(client.as_mut(), &m, generation, known, &head, &stop)
                    .await
            } else {
                // Read before a rebalance: abandoned, read again from the committed offset.
                Done::Abandoned
            };
            drop(queued);
            Finished {
                seq,
                key,
                done,
                client,
            }
        })
    }

    /// A delivery ended: its connection back to the idle ones, its ledger event handed to the producer, its
    /// outcome in the window (the next record of its key may start). True when it was abandoned.
    fn finished(
        &self,
        partition: i32,
        f: Finished,
        window: &mut Window<Waiting, Outcome>,
        idle: &mut Vec<MllpClient>,
    ) -> bool {
        if let Some(c) = f.client {
            idle.push(c);
        }
        let outcome = match f.done {
            Done::Settled(event) => {
                let mut p = Pending {
                    event: None,
                    delivery: None,
                };
                if let Some(mut e) = event {
                    if e.topic == self.topic {
                        e.partition = partition;
                    }
                    // Not queued (the producer's queue is full): written in turn, with retries.
                    p.delivery = self.send_event(&e);
                    p.event = Some(e);
                }
                Outcome::Settled(p)
            }
            Done::Abandoned => Outcome::Abandoned,
        };
        let abandoned = matches!(outcome, Outcome::Abandoned);
        window.finish(f.seq, f.key, outcome);
        abandoned
    }

    /// The partition moved (a delivery was abandoned): the records not started are dropped, the deliveries in
    /// the air end (their retries stop at the move), the settled prefix is stored, and the events of records
    /// settled behind an unfinished one are written (their offsets are not stored: they are read again and
    /// suppressed as duplicates, which writes no event). False when shutdown came meanwhile.
    async fn drain(
        &self,
        partition: i32,
        window: &mut Window<Waiting, Outcome>,
        running: &mut FuturesUnordered<BoxFuture<'static, Finished>>,
        idle: &mut Vec<MllpClient>,
        stop: &CancellationToken,
    ) -> bool {
        drop(window.drop_unstarted());
        while let Some(f) = running.next().await {
            self.finished(partition, f, window, idle);
        }
        while matches!(window.front_mut(), Some((_, Outcome::Settled(_)))) {
            let written = front_event(window).await;
            if !self.settle_front(partition, window, written, stop).await {
                return false;
            }
        }
        for o in window.reset() {
            if let Outcome::Settled(Pending {
                event: Some(e),
                delivery,
            }) = o
            {
                let written = match delivery {
                    Some(d) => matches!(d.await, Ok(Ok(_))),
                    None => false,
                };
                if !written && !self.write_event(&e, stop).await {
                    return false;
                }
            }
        }
        true
    }

    /// Hands the ledger's event to the producer (not waiting for Kafka); `None` when it could not be queued.
    fn send_event(&self, e: &Event) -> Option<hl7gw_runtime::delivery::DeliveryFuture> {
        let mut buf = Vec::new();
        ledger::encode_into(e, &mut buf);
        let rec = ledger::record(&self.cfg.ledger.topic, e, &buf);
        self.ledger.get().send_result(rec).ok()
    }

    /// Takes the oldest record (settled) off the window: once its event is written (`written`, or written again
    /// here until Kafka takes it), its offset is stored. False when shutdown came first (the offset stays: the
    /// record is read again, delivered again, and its event written then).
    async fn settle_front(
        &self,
        partition: i32,
        window: &mut Window<Waiting, Outcome>,
        written: bool,
        stop: &CancellationToken,
    ) -> bool {
        let Some((offset, Outcome::Settled(mut p))) = window.pop_front() else {
            return true;
        };
        if let Some(event) = p.event.take()
            && !written
            && !self.write_event(&event, stop).await
        {
            return false;
        }
        if let Err(e) = self.consumer.store_offset(&self.topic, partition, offset) {
            tracing::debug!(destination = %self.name, partition, error = %e, "offset not stored (partition moved)");
        }
        true
    }

    /// Writes one event to the ledger, retrying until Kafka confirms it, or shutdown (false).
    async fn write_event(&self, e: &Event, stop: &CancellationToken) -> bool {
        let mut buf = Vec::new();
        ledger::encode_into(e, &mut buf);
        let mut wait = Duration::from_millis(200);
        loop {
            let producer = self.ledger.get();
            match producer
                .send(
                    ledger::record(&self.cfg.ledger.topic, e, &buf),
                    Duration::from_secs(5),
                )
                .await
            {
                Ok(_) => {
                    self.state.ledger_failing(None);
                    return true;
                }
                Err(err) => {
                    if hl7gw_runtime::producer::is_fatal(&err) {
                        self.ledger.recover_if_fatal();
                    }
                    self.m.event_write_failed(&err);
                    self.state.ledger_failing(Some(&err.to_string()));
                    tokio::select! {
                        _ = stop.cancelled() => return false,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn deliver(
        &self,
        client: Option<&mut MllpClient>,
        m: &OwnedMessage,
        generation: u64,
        known: Option<(String, String)>,
        head: &Head,
        stop: &CancellationToken,
    ) -> Done {
        let payload = m.payload().unwrap_or_default();
        let env = match envelope::decode(payload) {
            Ok(e) => e,
            Err(e) => {
                let env = Envelope {
                    id: envelope::new_id(),
                    raw: payload.to_vec().into(),
                    destination: self.name.clone(),
                    ..Envelope::default()
                };
                let end = Ending {
                    tries: 0,
                    attempt: 0,
                    reason: "bad_envelope",
                    detail: e.to_string(),
                    answer: Answer::default(),
                };
                return self
                    .dead_letter(env, m, end, &tracing::Span::none(), stop)
                    .await;
            }
        };
        let received = env
            .received_at
            .and_then(|t| SystemTime::try_from(t).ok())
            .map_or(1, epoch_ms);
        head.received_ms.store(received.max(1), Ordering::Relaxed);
        let h = env.header.clone().unwrap_or_default();
        // A consumer span (OpenTelemetry messaging conventions) for the record of `hl7.out.<destination>`; no
        // `messaging.kafka.message.key`: the key is made of the patient id by default.
        let span = tracing::info_span!(
            "deliver",
            otel.kind = "consumer",
            messaging.system = "kafka",
            messaging.operation.type = "process",
            messaging.destination.name = %self.topic,
            messaging.destination.partition.id = %m.partition(),
            messaging.kafka.offset = m.offset(),
            messaging.consumer.group.name = %self.cfg.group(&self.name),
            hl7.destination = %self.name,
            hl7.route = %env.route,
            hl7.message_type = %h.message_type,
            hl7.trigger_event = %h.trigger_event,
            hl7.control_id = %h.control_id,
            hl7.ack_code = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            hl7.attempts = tracing::field::Empty,
        );
        if let Some(tc) = &env.trace {
            hl7gw_runtime::telemetry::set_parent(&span, &tc.traceparent, &tc.tracestate);
        }
        // One output is one envelope (its id, given at the ingress) through one route: two senders that share a
        // control id, or two routes to this destination, are different outputs.
        let key = (!env.id.is_empty() && self.dedup.enabled()).then(|| {
            let replay = replay_mark(&env);
            self.dedup
                .key(&[env.id.as_bytes(), env.route.as_bytes(), replay.as_bytes()])
        });
        if let Some(key) = key
            && self.dedup.lookup(key, 0, Instant::now()) != Seen::New
        {
            self.m.duplicate_suppressed(&span);
            return Done::Settled(None);
        }
        if known.is_some_and(|(id, route)| id == env.id && route == env.route) {
            // Delivered by this partition's last owner after its last commit (the ledger has the event).
            self.m.duplicate_known(m.partition(), m.offset());
            return Done::Settled(None);
        }
        if let Some(http) = &self.http {
            let delivery = Delivery {
                m,
                key,
                generation,
                head,
                span: &span,
                stop,
            };
            return self.deliver_http(http, env, delivery).await;
        }
        // The worker hands every MLLP delivery one of its connections; a connection of its own otherwise.
        let mut spare;
        let client = match client {
            Some(c) => c,
            None => {
                spare = self.mllp_client();
                &mut spare
            }
        };
        let out = outgoing(&env.raw, &self.dest.ack_policy);
        // The receiver answers the control id it reads in the message sent (a route may have changed it).
        let sent_id = hl7v2::Header::salvage(&out).control_id;
        if sent_id.is_empty() {
            // No answer could name it (a route cleared MSH-10): sent, it would wait for one forever.
            self.m.unanswerable(&span);
            let end = Ending {
                tries: 0,
                attempt: env.attempts,
                reason: "no_control_id",
                detail: "the message as sent has no MSH-10: no answer could be matched to it"
                    .into(),
                answer: Answer::default(),
            };
            return self.dead_letter(env, m, end, &span, stop).await;
        }
        let retry = &self.dest.retry;
        let policy = &self.dest.ack_policy;
        let mut attempt = env.attempts;
        let mut tries = 0u32;
        let mut negative = 0u32;
        loop {
            attempt += 1;
            tries += 1;
            let started = Instant::now();
            let result = client.send(&out, sent_id).await;
            let reason: &'static str;
            let mut last_ack = None;
            match result {
                Ok(frame) => match hl7v2::read_ack(&frame) {
                    Some((code, _)) => {
                        let code_str = code.as_str();
                        self.m.answered(code);
                        set(&self.state.last_ack_code, code_str);
                        if let Ok(mut t) = self.state.last_ack_at.lock() {
                            *t = Some(SystemTime::now());
                        }
                        span.record("hl7.ack_code", code_str);
                        span.record("hl7.attempts", attempt);
                        match code {
                            AckCode::AA | AckCode::CA => {
                                let answer = (code_str, 0);
                                return self
                                    .delivered(&env, m, started, attempt, tries, key, answer);
                            }
                            negative_code => {
                                let error = err_code(&frame);
                                if !policy.retries(negative_code, error) {
                                    self.m.refused(&span, code_str, error);
                                    let detail = match error {
                                        Some(e) => {
                                            format!("receiver answered {code_str} (ERR {e})")
                                        }
                                        None => format!("receiver answered {code_str}"),
                                    };
                                    let end = Ending {
                                        tries,
                                        attempt,
                                        reason: "rejected",
                                        detail,
                                        answer: Answer::ack(frame.freeze()),
                                    };
                                    return self.last_attempt(env, m, end, &span, stop).await;
                                }
                                negative += 1;
                                reason = "negative_ack";
                                last_ack = Some(frame.freeze());
                            }
                        }
                    }
                    None => {
                        reason = "unreadable_ack";
                        client.disconnect();
                    }
                },
                Err(e) => {
                    reason = e.kind();
                    if !matches!(e, SendError::Connect(_) | SendError::ConnectTimeout) {
                        self.m.attempt_failed(&span, &e);
                    }
                }
            }
            set(&self.state.last_error, reason);
            if (retry.max_attempts > 0 && tries >= retry.max_attempts)
                || (policy.max_retries > 0 && negative > policy.max_retries)
            {
                self.m.gave_up(&span, reason, tries);
                let end = Ending {
                    tries,
                    attempt,
                    reason: "gave_up",
                    detail: format!("{tries} attempts, last: {reason}"),
                    answer: last_ack.map(Answer::ack).unwrap_or_default(),
                };
                return self.last_attempt(env, m, end, &span, stop).await;
            }
            let wait = retry.backoff(tries, fastrand::f64());
            if !self
                .pause_before_retry(tries, reason, wait, generation, head, stop)
                .await
            {
                return Done::Abandoned;
            }
        }
    }

    /// Sends an output to an HTTP(S) destination until its answer settles it: 2xx delivered; 408, 429 and 5xx
    /// retried (waiting at least `Retry-After`, up to `http.max_retry_after`) as `ack_policy.max_retries`
    /// allows, then `gave_up`; refused credentials (401/403, a token endpoint refusing the client) as
    /// `ack_policy.max_auth_retries` allows, then `unauthorized` (replayable once they are fixed); no answer at
    /// all retried as `retry` says (forever by default: the patient's later messages wait behind it); any other
    /// status dead-lettered (`rejected`) with the status and the response body.
    async fn deliver_http(
        &self,
        http: &crate::http::HttpClient,
        env: Envelope,
        d: Delivery<'_>,
    ) -> Done {
        let Delivery {
            m,
            key,
            generation,
            head,
            span,
            stop,
        } = d;
        let content_type = match env.content_type.as_str() {
            "" => "application/hl7-v2",
            c => c,
        }
        .to_owned();
        let traceparent = hl7gw_runtime::telemetry::trace_context(span).0;
        let retry = &self.dest.retry;
        let policy = &self.dest.ack_policy;
        let mut attempt = env.attempts;
        let mut tries = 0u32;
        let mut negative = 0u32;
        // Refused credentials (401/403, a token endpoint's refusal), bounded by `max_auth_retries`.
        let mut refused_auth = 0u32;
        let mut auth_detail = String::new();
        loop {
            attempt += 1;
            tries += 1;
            let started = Instant::now();
            let mut wait = retry.backoff(tries, fastrand::f64());
            let mut last = None;
            let reason: &'static str = match http
                .send(env.raw.clone(), &content_type, &traceparent)
                .await
            {
                Ok(a) => {
                    let status = a.status.as_u16();
                    self.state.answered.store(true, Ordering::Relaxed);
                    self.m.http_answered(status);
                    set(&self.state.last_ack_code, a.status.as_str());
                    if let Ok(mut t) = self.state.last_ack_at.lock() {
                        *t = Some(SystemTime::now());
                    }
                    span.record("http.response.status_code", status);
                    span.record("hl7.attempts", attempt);
                    match http_verdict(status) {
                        HttpVerdict::Delivered => {
                            let answer = ("", u32::from(status));
                            return self.delivered(&env, m, started, attempt, tries, key, answer);
                        }
                        HttpVerdict::Refused => {
                            self.m.http_refused(span, status);
                            let end = Ending {
                                tries,
                                attempt,
                                reason: "rejected",
                                detail: http_detail(status, &a.content_type, &a.body),
                                answer: Answer::http(a.body, status),
                            };
                            return self.last_attempt(env, m, end, span, stop).await;
                        }
                        HttpVerdict::RetryLater(reason) => {
                            negative += 1;
                            if let Some(after) = a.retry_after {
                                wait = wait.max(after.min(self.dest.http.max_retry_after));
                            }
                            last = Some(Answer::http(a.body, status));
                            reason
                        }
                        HttpVerdict::Unauthorized => {
                            refused_auth += 1;
                            auth_detail = http_detail(status, &a.content_type, &a.body);
                            last = Some(Answer::http(a.body, status));
                            "unauthorized"
                        }
                    }
                }
                Err(e) => {
                    self.state.answered.store(false, Ordering::Relaxed);
                    if !matches!(e, crate::http::HttpError::Connect(_)) {
                        self.m.attempt_failed(span, &e);
                    }
                    if let crate::http::HttpError::Refused { status, detail } = &e {
                        refused_auth += 1;
                        auth_detail.clone_from(detail);
                        last = Some(Answer::http(bytes::Bytes::new(), *status));
                    }
                    e.kind()
                }
            };
            set(&self.state.last_error, reason);
            if policy.max_auth_retries > 0 && refused_auth > policy.max_auth_retries {
                self.m.gave_up(span, reason, tries);
                let end = Ending {
                    tries,
                    attempt,
                    reason: "unauthorized",
                    detail: format!(
                        "credentials refused {refused_auth} times in {tries} attempts, last: {auth_detail}"
                    ),
                    answer: last.unwrap_or_default(),
                };
                return self.last_attempt(env, m, end, span, stop).await;
            }
            if (retry.max_attempts > 0 && tries >= retry.max_attempts)
                || (policy.max_retries > 0 && negative > policy.max_retries)
            {
                self.m.gave_up(span, reason, tries);
                let end = Ending {
                    tries,
                    attempt,
                    reason: "gave_up",
                    detail: format!("{tries} attempts, last: {reason}"),
                    answer: last.unwrap_or_default(),
                };
                return self.last_attempt(env, m, end, span, stop).await;
            }
            if !self
                .pause_before_retry(tries, reason, wait, generation, head, stop)
                .await
            {
                return Done::Abandoned;
            }
        }
    }

    /// Counts a retry for `reason` and waits `wait` before attempt `tries + 1`. False when the partition moved
    /// or shutdown came meanwhile (the record is abandoned: read again by its next owner).
    async fn pause_before_retry(
        &self,
        tries: u32,
        reason: &'static str,
        wait: Duration,
        generation: u64,
        head: &Head,
        stop: &CancellationToken,
    ) -> bool {
        if tries == 1 {
            self.state.retrying.fetch_add(1, Ordering::Relaxed);
            head.retrying_ms
                .store(epoch_ms(SystemTime::now()), Ordering::Relaxed);
        }
        self.m.retrying(reason);
        let moved = self.consumer.context().changed();
        if generation != self.consumer.context().generation() {
            self.state.retrying.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        tokio::select! {
            _ = moved => {}
            _ = stop.cancelled() => {
                self.state.retrying.fetch_sub(1, Ordering::Relaxed);
                return false;
            }
            _ = tokio::time::sleep(wait) => {}
        }
        if generation != self.consumer.context().generation() {
            self.state.retrying.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The receiver took the output (`answer`: the MSA-1 code, or an HTTP status): counted, remembered for
    /// the duplicate window, and its ledger event made.
    #[allow(clippy::too_many_arguments)]
    fn delivered(
        &self,
        env: &Envelope,
        m: &OwnedMessage,
        started: Instant,
        attempt: u32,
        tries: u32,
        key: Option<hl7gw_runtime::dedup::Key>,
        answer: (&str, u32),
    ) -> Done {
        self.accepted(env, started);
        let event = self.cfg.ledger.enabled().then(|| {
            let mut e = Box::new(ledger::event(ledger::kind::DELIVERED, STAGE, env));
            answer.0.clone_into(&mut e.ack_code);
            e.http_status = answer.1;
            e.attempts = attempt;
            e.latency_ms = ledger::latency_ms(env);
            e.topic.clone_from(&self.topic);
            e.offset = m.offset();
            e.consumer_group = self.cfg.group(&self.name);
            e
        });
        if let Some(key) = key {
            self.dedup
                .remember(key, 0, bytes::Bytes::new(), Instant::now());
        }
        if tries > 1 {
            self.state.retrying.fetch_sub(1, Ordering::Relaxed);
        }
        Done::Settled(event)
    }

    fn accepted(&self, env: &Envelope, started: Instant) {
        self.state.delivered.fetch_add(1, Ordering::Relaxed);
        let received_at = env
            .received_at
            .as_ref()
            .and_then(|t| SystemTime::try_from(*t).ok());
        self.m.delivered(started, received_at);
    }

    /// Writes the message to the DLQ, retrying until Kafka confirms, or shutdown. A dead letter larger than the
    /// record limit (the receiver's answer can be 1 MiB) is shrunk until it fits, as is one Kafka refuses for
    /// its size: never retried as it is. While dead letters cannot be written, readiness says why.
    ///
    /// The write is a producer span, `dead_letter`, child of the message's `deliver` span (`parent`; none for
    /// a record that is not an envelope): the dead letter carries its trace context, so that a replay of it
    /// continues the trace from there.
    async fn dead_letter(
        &self,
        mut env: Envelope,
        m: &OwnedMessage,
        end: Ending,
        parent: &tracing::Span,
        stop: &CancellationToken,
    ) -> Done {
        let Ending {
            reason,
            detail,
            answer,
            ..
        } = end;
        let span = if parent.is_none() {
            tracing::Span::none()
        } else {
            tracing::info_span!(
                parent: parent,
                "dead_letter",
                otel.kind = "producer",
                messaging.system = "kafka",
                messaging.operation.type = "send",
                messaging.destination.name = %self.cfg.dlq_topic,
                messaging.destination.partition.id = tracing::field::Empty,
                messaging.kafka.offset = tracing::field::Empty,
                hl7.destination = %self.name,
                hl7.control_id = env.header.as_ref().map_or("", |h| h.control_id.as_str()),
                hl7.reason = reason,
            )
        };
        let (traceparent, tracestate) = hl7gw_runtime::telemetry::trace_context(&span);
        if !traceparent.is_empty() {
            env.trace = Some(hl7gw_runtime::proto::v1::TraceContext {
                traceparent,
                tracestate,
            });
        }
        env.destination = self.name.clone();
        env.rejection = Some(Rejection {
            stage: "egress".into(),
            reason: reason.into(),
            detail,
            ack: answer.body,
            hl7_error_code: 0,
            http_status: answer.http_status,
            // The record it is about: where a replay finds the message when it is dropped from the letter.
            origin_topic: self.topic.clone(),
            origin_partition: m.partition(),
            origin_offset: m.offset(),
            message_dropped: false,
        });
        envelope::push_stage(&mut env, "egress");
        let traceparent = envelope::traceparent(&env);
        let mut buf = Vec::new();
        shrink_to_fit(
            &mut env,
            &traceparent,
            self.cfg.kafka.max_message_bytes,
            &mut buf,
        );
        let mut wait = Duration::from_millis(200);
        let written = loop {
            envelope::encode_into(&env, &mut buf);
            let rec = envelope::record(&self.cfg.dlq_topic, &env.key, &buf, &env, &traceparent);
            let producer = self.producer.get();
            match producer.send(rec, Duration::from_secs(5)).await {
                Ok(d) => {
                    hl7gw_runtime::failpoint::after_send(producer.client());
                    break d;
                }
                Err(e) => {
                    if hl7gw_runtime::producer::is_fatal(&e) {
                        self.producer.recover_if_fatal();
                    }
                    self.m.dlq_write_failed(&e);
                    // Refused for its size: smaller at once. Sent again as it was, it would be refused forever.
                    if is_too_large(&e) && shrink_one(&mut env) {
                        continue;
                    }
                    self.state.dlq_failing(Some(&e.to_string()));
                    tokio::select! {
                        _ = stop.cancelled() => return Done::Abandoned,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        };
        self.state.dlq_failing(None);
        if written.1 >= 0 {
            span.record("messaging.destination.partition.id", written.0.to_string());
            span.record("messaging.kafka.offset", written.1);
        }
        self.m.dead_lettered(reason);
        self.state.dead_lettered.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut by) = self.state.dead_lettered_by_reason.lock() {
            *by.entry(reason).or_default() += 1;
        }
        let event = self.cfg.ledger.enabled().then(|| {
            let mut e = Box::new(ledger::event(ledger::kind::DEAD_LETTERED, STAGE, &env));
            e.reason = reason.to_owned();
            e.attempts = env.attempts;
            e.http_status = env.rejection.as_ref().map_or(0, |r| r.http_status);
            e.ack_code = env
                .rejection
                .as_ref()
                .and_then(|r| hl7v2::read_ack(&r.ack))
                .map(|(c, _)| c.as_str().to_owned())
                .unwrap_or_default();
            e.topic.clone_from(&self.cfg.dlq_topic);
            (e.partition, e.offset) = written;
            e
        });
        Done::Settled(event)
    }

    /// The attempts at a record end in a dead letter (`end` says why); the record no longer counts as retrying.
    /// The `deliver` span (`span`) gets `hl7.attempts` here too: a receiver that never answered (connection
    /// refused, timeouts) left it without one (issue 37, tests/jaeger.rs).
    async fn last_attempt(
        &self,
        mut env: Envelope,
        m: &OwnedMessage,
        end: Ending,
        span: &tracing::Span,
        stop: &CancellationToken,
    ) -> Done {
        if end.tries > 1 {
            self.state.retrying.fetch_sub(1, Ordering::Relaxed);
        }
        span.record("hl7.attempts", end.attempt);
        env.attempts = end.attempt;
        self.dead_letter(env, m, end, span, stop).await
    }
}

/// A delivery in the air, counted in the in-flight gauges while it lasts.
struct InFlight {
    bytes: i64,
    in_flight: prometheus_client::metrics::gauge::Gauge,
    in_flight_bytes: prometheus_client::metrics::gauge::Gauge,
}

impl InFlight {
    fn new(m: &DestMetrics, len: usize) -> Self {
        let bytes = i64::try_from(len).unwrap_or(i64::MAX);
        m.in_flight.inc();
        m.in_flight_bytes.inc_by(bytes);
        Self {
            bytes,
            in_flight: m.in_flight.clone(),
            in_flight_bytes: m.in_flight_bytes.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.in_flight.dec();
        self.in_flight_bytes.dec_by(self.bytes);
    }
}

/// The oldest settled record's ledger event, once Kafka answered: true when it took it.
async fn front_event(window: &mut Window<Waiting, Outcome>) -> bool {
    match window.front_mut() {
        Some((
            _,
            Outcome::Settled(Pending {
                delivery: Some(d), ..
            }),
        )) => matches!(d.await, Ok(Ok(_))),
        _ => false,
    }
}

/// The key a record's order is kept by: a hash of its Kafka key (the patient by default; records without a key
/// share one). Two keys with one hash are merely kept in one order.
fn key_hash(m: &OwnedMessage) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.key().unwrap_or_default().hash(&mut h);
    h.finish()
}

/// How a record's attempts ended in a dead letter.
struct Ending {
    /// Tries in this delivery (more than one: it was counted as retrying).
    tries: u32,
    /// The attempt count the envelope records.
    attempt: u32,
    /// `rejected`, `gave_up`, `unauthorized`, ...
    reason: &'static str,
    detail: String,
    /// The receiver's last answer.
    answer: Answer,
}

/// The receiver's last answer kept in a dead letter: its bytes (an ACK, or an HTTP response body) and, for
/// HTTP, the status.
#[derive(Debug, Default)]
struct Answer {
    body: bytes::Bytes,
    http_status: u32,
}

impl Answer {
    fn ack(frame: bytes::Bytes) -> Self {
        Self {
            body: frame,
            http_status: 0,
        }
    }

    fn http(body: bytes::Bytes, status: u16) -> Self {
        Self {
            body,
            http_status: u32::from(status),
        }
    }
}

/// What a delivery carries into its destination's send loop besides the envelope.
struct Delivery<'a> {
    m: &'a OwnedMessage,
    key: Option<hl7gw_runtime::dedup::Key>,
    generation: u64,
    head: &'a Head,
    span: &'a tracing::Span,
    stop: &'a CancellationToken,
}

/// What an HTTP status makes of a delivery.
#[derive(Debug, PartialEq, Eq)]
enum HttpVerdict {
    /// 2xx.
    Delivered,
    /// 408, 429, 5xx: the server cannot take it now (the label says which).
    RetryLater(&'static str),
    /// 401, 403: our credentials, not the message: retried like a receiver that is down.
    Unauthorized,
    /// Any other status (a 4xx, or a redirect, which is not followed): sending it again cannot help.
    Refused,
}

fn http_verdict(status: u16) -> HttpVerdict {
    match status {
        200..=299 => HttpVerdict::Delivered,
        408 => HttpVerdict::RetryLater("http_408"),
        429 => HttpVerdict::RetryLater("http_429"),
        500..=599 => HttpVerdict::RetryLater("http_5xx"),
        401 | 403 => HttpVerdict::Unauthorized,
        _ => HttpVerdict::Refused,
    }
}

/// A dead letter's detail for an HTTP refusal: the status and, for a FHIR OperationOutcome, its issues'
/// severities and codes (not their diagnostics, which may quote the message).
fn http_detail(status: u16, content_type: &str, body: &[u8]) -> String {
    let mut detail = format!("receiver answered HTTP {status}");
    if !content_type.contains("json") {
        return detail;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return detail;
    };
    if v.get("resourceType").and_then(|t| t.as_str()) != Some("OperationOutcome") {
        return detail;
    }
    let issues = v.get("issue").and_then(|i| i.as_array());
    let n = issues.map_or(0, Vec::len);
    let codes: Vec<String> = issues
        .into_iter()
        .flatten()
        .take(5)
        .map(|i| {
            let field = |k: &str| i.get(k).and_then(|x| x.as_str()).unwrap_or("?").to_owned();
            format!("{}/{}", field("severity"), field("code"))
        })
        .collect();
    detail.push_str(&format!(
        " (OperationOutcome, {n} issue{}: {}{})",
        if n == 1 { "" } else { "s" },
        codes.join(", "),
        if n > 5 { ", ..." } else { "" }
    ));
    detail
}

/// A record over librdkafka's or the topic's size limit.
fn is_too_large(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge)
    )
}

/// Encodes `env` into `buf` and returns the size Kafka counts for its record ([`envelope::record_size`]).
fn encode_record(env: &Envelope, traceparent: &str, buf: &mut Vec<u8>) -> usize {
    envelope::encode_into(env, buf);
    envelope::record_size(env, buf.len(), env.key.len(), traceparent)
}

/// Shrinks a dead letter until its record fits `max` bytes (see [`shrink_one`]); `buf` is scratch space.
fn shrink_to_fit(env: &mut Envelope, traceparent: &str, max: usize, buf: &mut Vec<u8>) {
    while encode_record(env, traceparent, buf) > max && shrink_one(env) {}
}

/// Drops the next part of a dead letter that may be dropped: the receiver's answer, then the message itself,
/// each noted in the rejection's detail (the message with its size and SHA-256; the ids, header and reason
/// stay). False when nothing is left to drop.
fn shrink_one(env: &mut Envelope) -> bool {
    let Some(rej) = env.rejection.as_mut() else {
        return false;
    };
    if !rej.ack.is_empty() {
        let n = std::mem::take(&mut rej.ack).len();
        rej.detail = format!(
            "{}; the receiver's answer ({n} bytes) is not stored",
            rej.detail
        );
        return true;
    }
    if !env.raw.is_empty() {
        let raw = std::mem::take(&mut env.raw);
        rej.message_dropped = true;
        rej.detail = format!(
            "{}; the message itself ({} bytes, sha256 {}) is not stored",
            rej.detail,
            raw.len(),
            String::from_utf8_lossy(&envelope::salted_key(b"", &raw)),
        );
        return true;
    }
    false
}

/// What tells one replay of an output from another: the time of its last `replay` stage (empty for an output
/// never replayed). Part of the duplicate window's key, so a replay (forced ones too) is a delivery of its own,
/// while Kafka's redeliveries of that same replay record are still suppressed.
fn replay_mark(env: &Envelope) -> String {
    env.stages
        .iter()
        .rev()
        .find(|s| s.name == "replay")
        .map(|s| {
            let at = s.at.unwrap_or_default();
            format!("replay@{}.{:09}", at.seconds, at.nanos)
        })
        .unwrap_or_default()
}

/// The bytes to send: the message, with MSH-15 set to `AL` when it asks for no accept ACK and the policy says
/// so (a receiver that stays silent could never let the offset be committed).
fn outgoing(raw: &bytes::Bytes, policy: &crate::config::AckPolicy) -> bytes::Bytes {
    // The header alone decides (no full parse for the common case: MSH-15 empty or AL).
    let msh15 = hl7v2::Header::salvage(raw).accept_ack_type;
    if !policy.rewrite_msh15 || msh15.is_empty() || msh15 == b"AL" {
        return raw.clone();
    }
    let Ok(m) = hl7v2::Message::parse(raw) else {
        return raw.clone();
    };
    let mut e = m.edit();
    match e.set("MSH-15", b"AL") {
        Ok(()) => e.encode().into(),
        Err(_) => raw.clone(),
    }
}

/// The table 0357 code of a negative answer: ERR-3 (v2.5+) or ERR-1's fourth component (v2.3/2.4).
fn err_code(ack: &[u8]) -> Option<u16> {
    let m = hl7v2::Message::parse(ack).ok()?;
    ["ERR-3-1", "ERR-1-4-1"]
        .iter()
        .find_map(|p| m.get(p).filter(|v| !v.is_empty()))
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn dead_letter(raw: usize, ack: usize) -> Envelope {
        Envelope {
            id: "e1".into(),
            key: "FAC|P1".into(),
            raw: vec![b'M'; raw].into(),
            rejection: Some(Rejection {
                stage: "egress".into(),
                reason: "rejected".into(),
                detail: "receiver answered AE".into(),
                ack: vec![b'A'; ack].into(),
                hl7_error_code: 0,
                http_status: 0,
                ..Rejection::default()
            }),
            ..Envelope::default()
        }
    }

    /// Issue 36, item 5: two replays of one output are two deliveries for the duplicate window; a record read
    /// twice is one; an output never replayed keeps the key it had.
    #[test]
    fn each_replay_is_its_own_delivery_for_the_duplicate_window() {
        let mut env = dead_letter(10, 0);
        assert_eq!(replay_mark(&env), "");
        envelope::push_stage(&mut env, "egress");
        assert_eq!(replay_mark(&env), "");
        let mut first = env.clone();
        envelope::push_stage(&mut first, "replay");
        std::thread::sleep(Duration::from_millis(2));
        let mut forced = env.clone();
        envelope::push_stage(&mut forced, "replay");
        assert_ne!(replay_mark(&first), "");
        assert_ne!(replay_mark(&first), replay_mark(&forced));
        // Routed again after its replay (a transformer letter): still that replay's.
        let mut routed = first.clone();
        envelope::push_stage(&mut routed, "transformer");
        assert_eq!(replay_mark(&routed), replay_mark(&first));
    }

    #[test]
    fn http_statuses_settle_like_acks() {
        assert_eq!(http_verdict(200), HttpVerdict::Delivered);
        assert_eq!(http_verdict(201), HttpVerdict::Delivered);
        assert_eq!(http_verdict(429), HttpVerdict::RetryLater("http_429"));
        assert_eq!(http_verdict(408), HttpVerdict::RetryLater("http_408"));
        assert_eq!(http_verdict(503), HttpVerdict::RetryLater("http_5xx"));
        assert_eq!(http_verdict(401), HttpVerdict::Unauthorized);
        assert_eq!(http_verdict(403), HttpVerdict::Unauthorized);
        assert_eq!(http_verdict(400), HttpVerdict::Refused);
        assert_eq!(http_verdict(422), HttpVerdict::Refused);
        assert_eq!(http_verdict(302), HttpVerdict::Refused);
    }

    #[test]
    fn an_operation_outcome_is_summarised_without_its_diagnostics() {
        let body = br#"{"resourceType":"OperationOutcome","issue":[{"severity":"error","code":"processing","diagnostics":"Patient Jane Doe: bad birthDate"},{"severity":"warning","code":"invalid"}]}"#;
        let d = http_detail(422, "application/fhir+json;charset=utf-8", body);
        assert_eq!(
            d,
            "receiver answered HTTP 422 (OperationOutcome, 2 issues: error/processing, warning/invalid)"
        );
        assert_eq!(
            http_detail(400, "text/html", b"<html>"),
            "receiver answered HTTP 400"
        );
        assert_eq!(
            http_detail(400, "application/json", b"{"),
            "receiver answered HTTP 400"
        );
    }

    /// Issue 24, item 6: a dead letter over the record limit loses the receiver's answer first, then the
    /// message (its size and SHA-256 noted), never its ids or reason; one that fits is left alone.
    #[test]
    fn a_dead_letter_is_shrunk_answer_first_until_it_fits() {
        let mut buf = Vec::new();
        let mut env = dead_letter(10_000, 5_000);
        shrink_to_fit(&mut env, "", 20_000, &mut buf);
        assert_eq!(
            (env.raw.len(), env.rejection.as_ref().unwrap().ack.len()),
            (10_000, 5_000)
        );

        shrink_to_fit(&mut env, "", 12_000, &mut buf);
        let rej = env.rejection.clone().unwrap();
        assert_eq!((env.raw.len(), rej.ack.len()), (10_000, 0));
        assert!(
            rej.detail.contains("answer (5000 bytes) is not stored"),
            "{}",
            rej.detail
        );
        assert!(encode_record(&env, "", &mut buf) <= 12_000);

        assert!(!env.rejection.as_ref().unwrap().message_dropped);
        shrink_to_fit(&mut env, "", 2_000, &mut buf);
        let rej = env.rejection.clone().unwrap();
        assert!(env.raw.is_empty());
        assert!(
            rej.message_dropped,
            "a replay must know the message is not here"
        );
        assert!(
            rej.detail.contains("(10000 bytes, sha256 "),
            "{}",
            rej.detail
        );
        assert_eq!((env.id.as_str(), rej.reason.as_str()), ("e1", "rejected"));
        assert!(encode_record(&env, "", &mut buf) <= 2_000);
        // Nothing left to drop: Kafka refusing it now is not a size it can fix.
        assert!(!shrink_one(&mut env));
    }
}
