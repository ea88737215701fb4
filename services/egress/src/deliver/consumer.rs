//! The consumer loop of one destination: records read from `hl7.out.<destination>` handed to one worker per
//! partition, partitions paused when their lane is full, records held across a rebalance.

use super::ctx::DestCtx;
use super::lanes::Held;
use super::lanes::Lane;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
                    self.state.unreadable.clear();
                    m.detach()
                }
                Err(e) => {
                    tracing::warn!(destination = %self.name, error = %e, "consumer error");
                    if hl7gw_runtime::kafka::stops_reading(&e) {
                        let generation = self.consumer.context().generation();
                        self.state.unreadable.set(generation, e.to_string());
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
    pub(super) fn hand_over_held(
        &self,
        held: &mut HashMap<i32, Held>,
        workers: &HashMap<i32, Lane>,
    ) -> bool {
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
    pub(super) fn pause(&self, partition: i32, pause: bool) {
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
}
