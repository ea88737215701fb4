//! A partition's worker: records of different keys delivered at once, each key's in offset order
//! ([`super::window`]); the ledger look-up on assignment; offsets stored only past the finished prefix.

use super::ctx::DestCtx;
use super::ctx::Done;
use super::lanes::Item;
use super::lanes::QueuedBytes;
use super::state::Head;
use super::state::HeadGone;
use super::state::epoch_ms;
use super::window::Window;
use crate::metrics::DestMetrics;
use crate::mllp_client::MllpClient;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use hl7gw_runtime::ledger;
use hl7gw_runtime::proto::v1::Event;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Message, OwnedMessage};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Most records a partition's worker holds from its last stored offset on (in flight, waiting behind their key,
/// or settled with their ledger event still on its way): past it, the worker takes no new record until the
/// oldest is settled.
pub(super) const MAX_WINDOW: usize = 256;

/// A settled record: its offset is stored once its event (if any) is written.
pub(super) struct Pending {
    pub(super) event: Option<Box<Event>>,
    pub(super) delivery: Option<hl7gw_runtime::kafka::delivery::DeliveryFuture>,
}

/// How a record of a partition's window ended: settled, or abandoned (shutdown, the partition moved; its offset
/// and every later one stay unstored).
pub(super) enum Outcome {
    Settled(Pending),
    Abandoned,
}

/// A record taken into a partition's window and not yet started.
pub(super) struct Waiting {
    pub(super) generation: u64,
    pub(super) m: OwnedMessage,
    pub(super) queued: QueuedBytes,
    /// The envelope id and route the ledger says were delivered from this offset (by the partition's last
    /// owner, after its last commit).
    pub(super) known: Option<(String, String)>,
}

/// How far back the ledger is read for a partition's deliveries past its committed offset: from the committed
/// record's time, but not before this long ago (an older committed record means a backlog, and its last owner
/// delivered only just before it went).
pub(super) const LEDGER_LOOKBACK: Duration = Duration::from_secs(600);

/// Slack for the clocks of the transformer that timestamped a record and of the egress that wrote its event.
pub(super) const LEDGER_SKEW: Duration = Duration::from_secs(10);

/// A delivery that ended, back in its partition's worker.
pub(super) struct Finished {
    pub(super) seq: u64,
    pub(super) key: u64,
    pub(super) done: Done,
    pub(super) client: Option<MllpClient>,
}

impl DestCtx {
    /// One partition's deliveries (see the module doc): takes records from its lane into the window while it
    /// has room, starts every record whose key is free up to `max_in_flight` (and, for MLLP, on an idle
    /// connection), and stores the offsets of the settled prefix once their events are written. A record
    /// abandoned (the partition moved) drains the window first: the deliveries in the air end, the prefix they
    /// settled is stored, and the rest is read again from the committed offset, so an offset is never stored
    /// past a record of an earlier generation that did not finish.
    pub(super) async fn partition_worker(
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
    pub(super) async fn ledger_lookup(
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

    /// The delivery of one record, as a future the worker polls beside the others.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
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
    pub(super) fn finished(
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
    pub(super) async fn drain(
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
    pub(super) fn send_event(
        &self,
        e: &Event,
    ) -> Option<hl7gw_runtime::kafka::delivery::DeliveryFuture> {
        let mut buf = Vec::new();
        ledger::encode_into(e, &mut buf);
        let rec = ledger::record(&self.cfg.ledger.topic, e, &buf);
        self.ledger.get().send_result(rec).ok()
    }

    /// Takes the oldest record (settled) off the window: once its event is written (`written`, or written again
    /// here until Kafka takes it), its offset is stored. False when shutdown came first (the offset stays: the
    /// record is read again, delivered again, and its event written then).
    pub(super) async fn settle_front(
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
    pub(super) async fn write_event(&self, e: &Event, stop: &CancellationToken) -> bool {
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
                    if hl7gw_runtime::kafka::errors::is_fatal(&err) {
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
}

/// A delivery in the air, counted in the in-flight gauges while it lasts.
pub(super) struct InFlight {
    pub(super) bytes: i64,
    pub(super) in_flight: prometheus_client::metrics::gauge::Gauge,
    pub(super) in_flight_bytes: prometheus_client::metrics::gauge::Gauge,
}

impl InFlight {
    pub(super) fn new(m: &DestMetrics, len: usize) -> Self {
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
pub(super) async fn front_event(window: &mut Window<Waiting, Outcome>) -> bool {
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
pub(super) fn key_hash(m: &OwnedMessage) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.key().unwrap_or_default().hash(&mut h);
    h.finish()
}
