//! The consume-transform-produce loop: a batch gathered, routed, produced and committed with its offsets in one
//! Kafka transaction; aborted and re-read on an error, the producer recreated when it failed fatally.

use super::blocking::blocking_within;
use super::dead_letters::note_origin;
use super::dead_letters::record_size;
use super::dead_letters::refused_to_dlq;
use super::health::WorkerHealth;
use super::produce::OutputId;
use super::produce::Refused;
use super::produce::ledger_event;
use super::produce::send;
use super::produce::send_event;
use super::records::Consumed;
use super::records::Routed;
use super::records::consumed_at;
use super::route::route_consumed;
use crate::config::Config;
use crate::engine::PluginCaller;
use crate::metrics::TransformerMetrics;
use crate::source::LiveRoutes;
use hl7gw_runtime::kafka::TransactionalProducer as FutureProducer;
use hl7gw_runtime::kafka::errors::{
    blocking, is_fatal, is_retriable_transactional, refused_for_good,
};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The consumer type the transformer uses.
/// (A batch gathered across a rebalance is dropped: its partitions restart from the committed offsets.)
pub type Consumer_ = StreamConsumer<hl7gw_runtime::kafka::Assignment>;

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Creates a transactional producer (always with the same `transactional.id`), for the start and for every
/// recovery from a fatal producer error.
pub type ProducerFactory = Arc<dyn Fn() -> Result<FutureProducer, KafkaError> + Send + Sync>;

/// The consume-transform-produce loop.
pub struct Worker<P> {
    pub cfg: Arc<Config>,
    pub consumer: Arc<Consumer_>,
    pub producer: FutureProducer,
    /// Makes a new producer when the current one failed fatally.
    pub make_producer: ProducerFactory,
    pub live: Arc<LiveRoutes>,
    pub plugins: Arc<P>,
    pub metrics: TransformerMetrics,
    /// Readiness, dropped at once when the worker starts recovering.
    pub readiness: Arc<hl7gw_runtime::admin::Health>,
    pub health: Arc<WorkerHealth>,
}

impl<P> std::fmt::Debug for Worker<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").finish_non_exhaustive()
    }
}

impl<P: PluginCaller + 'static> Worker<P> {
    /// Runs until `stop`; the batch in hand when it fires is finished and committed first.
    ///
    /// Transaction errors follow librdkafka's rules: a retriable error (a commit that timed out while the
    /// coordinator is unreachable) retries the same call; an abortable one aborts and reads the batch again; a
    /// fatal one (fenced, or an abort that cannot finish) closes the producer, makes a new one with the same
    /// `transactional.id` and rewinds the consumer to the committed offsets. The process never exits for them;
    /// readiness is down while it recovers, and the retries back off (200 ms doubling to 10 s).
    pub async fn run(mut self, stop: CancellationToken) -> Result<(), WorkerError> {
        let timeout = self.cfg.transaction_timeout;
        let p = self.producer.clone();
        blocking(move || p.init_transactions(timeout)).await?;
        tracing::info!("transactions initialised");
        // Nothing is consumed before the first complete route list: a message read earlier would be routed
        // by no route at all (while the API server is slow or the routes file is missing).
        if !self.live.is_loaded() {
            tracing::warn!("waiting for the routes before consuming");
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = self.live.wait_loaded() => {}
        }
        crate::topics::ensure_destinations(
            &self.cfg,
            &self.live,
            &mut std::collections::BTreeSet::new(),
        )
        .await;
        self.consumer.subscribe(&[&self.cfg.inbound_topic])?;
        tracing::info!(topic = %self.cfg.inbound_topic, "routes loaded: consuming");
        let mut buf = Vec::new();
        let mut refused = Refused::new();
        let mut backoff = Backoff::default();
        let mut errors = ErrorLog::default();
        let mut last_start: Option<tokio::time::Instant> = None;
        while !stop.is_cancelled() {
            let (batch, generation) = self.gather(&stop, &mut errors, last_start).await?;
            if batch.is_empty() {
                continue;
            }
            last_start = Some(tokio::time::Instant::now());
            if self.consumer.context().generation() != generation {
                // Partitions moved while gathering: read the batch again from its first records (a partition
                // that left this pod is read by its new owner from the committed offset).
                tracing::info!(
                    records = batch.len(),
                    "rebalance during a batch: reading it again"
                );
                self.rewind(&batch).await;
                continue;
            }
            match self.transact(&batch, &mut buf, &mut refused).await {
                Ok(done) => {
                    backoff.reset();
                    self.set_recovering(None);
                    if done < batch.len() {
                        // The batch reached its time budget: what was routed is committed, the rest is read
                        // again.
                        self.metrics.batch_cut(done, batch.len() - done);
                        self.rewind(&batch[done..]).await;
                    }
                }
                Err(e) => {
                    self.metrics.aborted(&e);
                    self.set_recovering(Some(&e));
                    let aborted = if is_fatal(&e) {
                        false
                    } else {
                        match self.abort().await {
                            Ok(()) => true,
                            Err(e2) => {
                                tracing::warn!(error = %e2, "the transaction cannot be aborted");
                                false
                            }
                        }
                    };
                    if aborted {
                        self.rewind(&batch).await;
                    } else {
                        self.recover(&stop).await;
                    }
                    let wait = backoff.next();
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// Readiness down for `error` (at once, not at the next probe), or up again with `None`.
    pub(super) fn set_recovering(&self, error: Option<&dyn std::fmt::Display>) {
        let Some(e) = error else {
            self.health.ok.store(true, Ordering::Release);
            return;
        };
        if let Ok(mut why) = self.health.why.lock() {
            *why = e.to_string();
        }
        // The flag first: the readiness probe loop reads it before it sets readiness.
        self.health.ok.store(false, Ordering::Release);
        if let Some(reason) = self.health.failure(0) {
            self.readiness.set_dependency(Err(reason));
        }
    }

    /// Calls a transactional API again while librdkafka says its error is retriable ("retry call to resume":
    /// the coordinator did not answer in time). Other errors are returned.
    pub(super) async fn retrying<F>(&self, what: &'static str, call: F) -> Result<(), KafkaError>
    where
        F: Fn(&FutureProducer, &Consumer_, Duration) -> Result<(), KafkaError>
            + Clone
            + Send
            + 'static,
    {
        let mut backoff = Backoff::default();
        loop {
            let (p, c, f) = (self.producer.clone(), self.consumer.clone(), call.clone());
            let timeout = self.cfg.transaction_timeout;
            // librdkafka can block past its own timeout here (send_offsets_to_transaction while the group
            // coordinator's broker is gone: librdkafka issues #5456, #5511). A call that has not returned well
            // after its timeout is abandoned on its blocking thread and the producer treated as broken: the
            // caller recreates it (fencing the stuck one) instead of waiting forever.
            let limit = timeout * 2 + STUCK_MARGIN;
            let abandoned = &self.metrics.abandoned_calls;
            let Some(result) = blocking_within(limit, abandoned, move || f(&p, &c, timeout)).await
            else {
                self.metrics.stuck_calls.inc();
                tracing::warn!(
                    call = what,
                    timeout = ?timeout,
                    "librdkafka did not return from a transactional call: recreating the producer"
                );
                return Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fatal));
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) if is_retriable_transactional(&e) => {
                    self.set_recovering(Some(&e));
                    tracing::warn!(call = what, error = %e, "retriable transaction error: calling again");
                    tokio::time::sleep(backoff.next()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Aborts the open transaction (retrying while retriable).
    pub(super) async fn abort(&self) -> Result<(), KafkaError> {
        self.retrying("abort_transaction", |p, _, t| p.abort_transaction(t))
            .await
    }

    /// Replaces a producer that failed fatally (or whose transaction cannot be finished) by a new one with the
    /// same `transactional.id` (its `init_transactions` fences the old one and settles its open transaction),
    /// then seeks the consumer to the committed offsets, so the records of an unfinished transaction are read
    /// again and those of a committed one are not. Retries until it worked or `stop`.
    pub(super) async fn recover(&mut self, stop: &CancellationToken) {
        self.set_recovering(Some(&"recreating the transactional producer"));
        self.metrics.producer_recoveries.inc();
        tracing::warn!("recreating the transactional producer");
        let mut backoff = Backoff::default();
        loop {
            if stop.is_cancelled() {
                return;
            }
            match (self.make_producer)() {
                Ok(fresh) => {
                    let old = std::mem::replace(&mut self.producer, fresh);
                    // Closing a producer may block (it purges its queues): off the async workers.
                    tokio::task::spawn_blocking(move || drop(old));
                    let p = self.producer.clone();
                    let timeout = self.cfg.transaction_timeout;
                    let limit = timeout * 2 + STUCK_MARGIN;
                    let abandoned = &self.metrics.abandoned_calls;
                    match blocking_within(limit, abandoned, move || p.init_transactions(timeout))
                        .await
                    {
                        Some(Ok(())) => break,
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "the new producer cannot initialise transactions yet");
                            self.set_recovering(Some(&format_args!(
                                "recreating the transactional producer: {e}"
                            )));
                        }
                        None => {
                            self.metrics.stuck_calls.inc();
                            tracing::warn!(
                                "init_transactions did not return: trying a new producer"
                            );
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot create a producer"),
            }
            tokio::time::sleep(backoff.next()).await;
        }
        loop {
            if stop.is_cancelled() {
                return;
            }
            let c = self.consumer.clone();
            match blocking(move || rewind_to_committed(&c)).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot rewind to the committed offsets yet");
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        }
        tracing::info!("transactional producer recreated; reading from the committed offsets");
    }

    /// Waits for one record, then takes what else arrives within `batch_linger` (and until `batch_interval`
    /// after the previous batch's start, `previous`), up to `batch_max` records and `batch_max_bytes` of
    /// payload. Returns the batch and the rebalance generation its first record was read in.
    pub(super) async fn gather(
        &self,
        stop: &CancellationToken,
        errors: &mut ErrorLog,
        previous: Option<tokio::time::Instant>,
    ) -> Result<(Vec<OwnedMessage>, u64), WorkerError> {
        let mut batch = Vec::new();
        let first = tokio::select! {
            _ = stop.cancelled() => return Ok((batch, 0)),
            m = self.consumer.recv() => m,
        };
        // A rebalance runs inside `recv`, before it returns a record of the new assignment.
        let generation = self.consumer.context().generation();
        match first {
            Ok(m) => {
                batch.push(m.detach());
                self.health.unreadable.clear();
            }
            Err(e) => {
                errors.log(&e);
                if hl7gw_runtime::kafka::stops_reading(&e) {
                    self.health.unreadable.set(generation, e.to_string());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Ok((batch, generation));
            }
        }
        let deadline = batch_deadline(
            tokio::time::Instant::now(),
            previous,
            self.cfg.batch_linger,
            self.cfg.batch_interval,
        );
        let mut bytes = batch_bytes(&batch);
        while batch.len() < self.cfg.batch_max && bytes < self.cfg.batch_max_bytes {
            match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                Err(_) => break,
                Ok(Ok(m)) => {
                    bytes += m.payload_len();
                    batch.push(m.detach());
                }
                Ok(Err(e)) => {
                    errors.log(&e);
                    break;
                }
            }
        }
        Ok((batch, generation))
    }

    /// Routes the batch, then produces its records and offsets in one transaction. Routing (plugin calls
    /// included) happens before the transaction starts, so it does not count against the broker's
    /// `transaction.timeout.ms`; and it is bounded by [`Config::batch_time_budget`]: past the budget the
    /// records routed so far are committed and the count of them is returned (the caller reads the rest again).
    /// The first record is always routed whole (each plugin call bounded by its own timeout), so a batch
    /// always makes progress.
    pub(super) async fn transact(
        &self,
        batch: &[OwnedMessage],
        buf: &mut Vec<u8>,
        refused: &mut Refused,
    ) -> Result<usize, KafkaError> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.cfg.batch_time_budget();
        let routes = self.live.get();
        let mut routed: Vec<Routed> = Vec::with_capacity(batch.len());
        for m in batch {
            let consumed = Consumed {
                topic: m.topic(),
                partition: m.partition(),
                offset: m.offset(),
                group: &self.cfg.group_id,
            };
            let one = route_consumed(
                &self.cfg,
                &routes,
                m.payload().unwrap_or_default(),
                Some(consumed),
                self.plugins.as_ref(),
                &self.metrics,
            );
            let r = if routed.is_empty() {
                one.await
            } else {
                match tokio::time::timeout_at(deadline, one).await {
                    Ok(r) => r,
                    Err(_) => break,
                }
            };
            routed.push(r);
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        let done = routed.len();
        let routed_at = started.elapsed();
        let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for m in &batch[..done] {
            next.insert((m.topic().to_owned(), m.partition()), m.offset() + 1);
        }
        self.producer.begin_transaction()?;
        let outputs = routed.iter().map(|r| r.records.len()).sum();
        let mut deliveries = Vec::with_capacity(outputs);
        let mut ids: Vec<OutputId> = Vec::with_capacity(outputs);
        // The ledger's events go in the same transaction as what they describe: committed with it or not at all.
        let events_topic = self
            .cfg
            .ledger
            .enabled()
            .then_some(self.cfg.ledger.topic.as_str());
        let mut events = Vec::new();
        let mut ebuf = Vec::new();
        for (m, one) in batch.iter().zip(routed) {
            if let Some(topic) = events_topic {
                for e in &one.dropped {
                    events.push(send_event(&self.producer, topic, e, &mut ebuf)?);
                }
            }
            for (j, mut r) in one.records.into_iter().enumerate() {
                let id: OutputId = (
                    m.topic().to_owned(),
                    m.partition(),
                    m.offset(),
                    j,
                    r.topic.clone(),
                );
                if let Some(&reason) = refused.get(&id) {
                    // The broker refused it in an earlier attempt: a dead letter, without the message (the
                    // DLQ topic may be as small).
                    let detail = format!("Kafka refused the output for {} ({reason})", r.topic);
                    r = refused_to_dlq(&self.cfg, &mut r, reason, detail, true, &self.metrics);
                    note_origin(&mut r.envelope, Some(consumed_at(m, &self.cfg)));
                }
                let delivery = match send(&self.producer, &mut r, buf) {
                    Ok(d) => {
                        if let Some(topic) = events_topic {
                            let e = ledger_event(&self.cfg, &r);
                            events.push(send_event(&self.producer, topic, &e, &mut ebuf)?);
                        }
                        d
                    }
                    Err(e) => match refused_for_good(&e) {
                        // librdkafka refused it at once (its own size check): the dead letter goes in its place.
                        Some(reason) => {
                            let size = record_size(&r.envelope, &r.key, &r.traceparent);
                            self.metrics.output_refused(&r.envelope.route, size, &e);
                            let detail = format!("Kafka refused the output for {}: {e}", r.topic);
                            let mut dead = refused_to_dlq(
                                &self.cfg,
                                &mut r,
                                reason,
                                detail,
                                true,
                                &self.metrics,
                            );
                            note_origin(&mut dead.envelope, Some(consumed_at(m, &self.cfg)));
                            let d = send(&self.producer, &mut dead, buf)?;
                            if let Some(topic) = events_topic {
                                let e = ledger_event(&self.cfg, &dead);
                                events.push(send_event(&self.producer, topic, &e, &mut ebuf)?);
                            }
                            d
                        }
                        None => return Err(e),
                    },
                };
                deliveries.push(delivery);
                ids.push(id);
            }
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), offset) in next {
            offsets.add_partition_offset(&topic, partition, Offset::Offset(offset))?;
        }
        let offsets_sent = self
            .retrying("send_offsets_to_transaction", move |p, c, t| {
                let meta = c.group_metadata().ok_or(KafkaError::ConsumerCommit(
                    rdkafka::types::RDKafkaErrorCode::State,
                ))?;
                p.send_offsets_to_transaction(&offsets, &meta, t)
            })
            .await;
        if let Err(e) = offsets_sent {
            // A record the broker refused fails the transaction; its report is in (or about to be): note it
            // so the next attempt dead-letters it.
            if let Ok(reports) = tokio::time::timeout(
                Duration::from_secs(1),
                futures_util::future::join_all(deliveries),
            )
            .await
            {
                self.note_refused(&reports, ids, refused);
            }
            return Err(e);
        }
        // The deliveries are awaited here, not inside the commit: rdkafka's flush, which the commit starts with,
        // polls in steps of 100 ms while another thread serves the delivery reports, so each commit that still had
        // records in flight took 100 ms more (measured: 100-110 ms per transaction, docs/BENCHMARKS.md). A failed
        // delivery fails the commit, which aborts as before; librdkafka's own timeout bounds the wait.
        // An output reported delivered without an offset was only inferred to be written (librdkafka's implicit
        // ack; runtime kafka/delivery.rs, `confirmed`): abort rather than commit the inputs without it.
        let reports = futures_util::future::join_all(deliveries).await;
        // An output the broker refused for good (larger than the topic takes, an invalid record) would fail
        // every attempt at the batch: the next attempt dead-letters it instead.
        if self.note_refused(&reports, ids, refused) {
            return Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge,
            ));
        }
        if reports
            .iter()
            .any(|r| matches!(r, Ok(Ok(d)) if d.offset < 0))
        {
            return Err(KafkaError::MessageProduction(
                rdkafka::types::RDKafkaErrorCode::Inconsistent,
            ));
        }
        // An event not written fails the batch like an output: the ledger must miss nothing that commits.
        for r in futures_util::future::join_all(events).await {
            match r {
                Ok(Ok(d)) if d.offset >= 0 => {}
                Ok(Ok(_)) => {
                    return Err(KafkaError::MessageProduction(
                        RDKafkaErrorCode::Inconsistent,
                    ));
                }
                Ok(Err((e, _))) => return Err(e),
                Err(_) => return Err(KafkaError::Canceled),
            }
        }
        // A record is released just after its delivery callback ran: until then the flush still counts it.
        let settled = tokio::time::Instant::now() + Duration::from_millis(20);
        while self.producer.in_flight_count() > 0 && tokio::time::Instant::now() < settled {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let offsets_at = started.elapsed();
        self.retrying("commit_transaction", |p, _, t| p.commit_transaction(t))
            .await?;
        self.metrics
            .committed(done, started.elapsed(), routed_at, offsets_at);
        // What was refused of the committed inputs is done with.
        refused.retain(|(topic, partition, offset, ..), _| {
            batch[done..]
                .iter()
                .any(|m| m.partition() == *partition && m.offset() == *offset && m.topic() == topic)
        });
        Ok(done)
    }

    /// Remembers the outputs whose delivery `reports` (in the order of `ids`) say Kafka refused them for good;
    /// true when there was one. The broker refuses a whole produce batch at once, so of the outputs of one topic
    /// refused together only the largest is taken for the culprit: the others are sent again (and, should they
    /// be refused again, the largest of those is next).
    pub(super) fn note_refused<C>(
        &self,
        reports: &[Result<rdkafka::producer::future_producer::OwnedDeliveryResult, C>],
        ids: Vec<OutputId>,
        refused: &mut Refused,
    ) -> bool {
        let mut culprits: BTreeMap<String, (usize, OutputId, &'static str)> = BTreeMap::new();
        for (report, id) in reports.iter().zip(ids) {
            if let Ok(Err((e, m))) = report
                && let Some(reason) = refused_for_good(e)
            {
                tracing::warn!(topic = %id.4, error = %e, "Kafka refused an output for good");
                let size = m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len);
                match culprits.get(&id.4) {
                    Some((largest, ..)) if *largest >= size => {}
                    _ => {
                        culprits.insert(id.4.clone(), (size, id, reason));
                    }
                }
            }
        }
        let any = !culprits.is_empty();
        for (_, (_, id, reason)) in culprits {
            refused.insert(id, reason);
        }
        any
    }

    /// Seeks each partition of an aborted batch back to its first record.
    pub(super) async fn rewind(&self, batch: &[OwnedMessage]) {
        let mut first: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for m in batch {
            first
                .entry((m.topic().to_owned(), m.partition()))
                .or_insert(m.offset());
        }
        // `seek` blocks (up to its timeout): off the async workers.
        let consumer = self.consumer.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for ((topic, partition), offset) in first {
                if let Err(e) = consumer.seek(
                    &topic,
                    partition,
                    Offset::Offset(offset),
                    Duration::from_secs(5),
                ) {
                    tracing::warn!(error = %e, partition, "seek back failed");
                }
            }
        })
        .await;
    }
}

/// When a batch whose first record came at `now` stops gathering: after `linger`, and not before `interval`
/// from the previous batch's start (so transactions start at most 1/interval a second under a steady feed,
/// while a message after a quiet spell waits only `linger`).
pub(super) fn batch_deadline(
    now: tokio::time::Instant,
    previous: Option<tokio::time::Instant>,
    linger: Duration,
    interval: Duration,
) -> tokio::time::Instant {
    let lingered = now + linger;
    match previous {
        Some(p) if p + interval > lingered => p + interval,
        _ => lingered,
    }
}

/// Payload bytes of the records gathered so far.
pub(super) fn batch_bytes(batch: &[OwnedMessage]) -> usize {
    batch
        .iter()
        .map(|m| m.payload().map_or(0, <[u8]>::len))
        .sum()
}

/// How much longer than twice `transaction_timeout` a transactional call may block before it counts as stuck.
pub(super) const STUCK_MARGIN: Duration = Duration::from_secs(5);

/// Seeks every assigned partition to the group's committed offset (the beginning where none is committed,
/// as `auto.offset.reset: earliest`). Blocking.
pub(super) fn rewind_to_committed(c: &Consumer_) -> Result<(), KafkaError> {
    let assignment = c.assignment()?;
    if assignment.count() == 0 {
        return Ok(());
    }
    let committed = c.committed_offsets(assignment, Duration::from_secs(10))?;
    for e in committed.elements() {
        let offset = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        c.seek(e.topic(), e.partition(), offset, Duration::from_secs(5))?;
    }
    Ok(())
}

/// Consumer errors (the broker is away: librdkafka reconnects by itself) logged once per 10 s with the count
/// since the last line, not every 100 ms.
#[derive(Debug, Default)]
pub(super) struct ErrorLog {
    pub(super) last: Option<Instant>,
    pub(super) suppressed: u64,
}

impl ErrorLog {
    pub(super) fn log(&mut self, e: &KafkaError) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(error = %e, suppressed = self.suppressed, "consumer error");
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }
}

/// Waits between retries: 200 ms doubling to 10 s, with up to a quarter added at random so pods that failed
/// together do not retry together.
#[derive(Debug)]
pub(super) struct Backoff {
    pub(super) next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Backoff {
    pub(super) const FIRST: Duration = Duration::from_millis(200);
    pub(super) const MAX: Duration = Duration::from_secs(10);

    pub(super) fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(Self::MAX);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.subsec_nanos())
            .unwrap_or(0);
        d + d / 4 * (nanos % 1000) / 1000
    }

    pub(super) fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_gathers_until_the_interval_since_the_previous_start() {
        let t = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        // A steady feed: the previous batch started 2 ms ago, so this one gathers until 20 ms after it.
        assert_eq!(
            batch_deadline(t, Some(t - ms(2)), ms(5), ms(20)),
            t + ms(18)
        );
        // After a quiet spell (or with the interval off) only the linger counts.
        assert_eq!(
            batch_deadline(t, Some(t - ms(500)), ms(5), ms(20)),
            t + ms(5)
        );
        assert_eq!(batch_deadline(t, None, ms(5), ms(20)), t + ms(5));
        assert_eq!(batch_deadline(t, Some(t), ms(5), ms(0)), t + ms(5));
    }
}
