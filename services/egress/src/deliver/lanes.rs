//! The records read ahead per partition: the lane a partition worker takes them from, the records held while a
//! partition has no worker, and the bytes they count against `queue_bytes_per_partition`.

use rdkafka::message::{Message, OwnedMessage};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;

/// A record on its way to a partition worker, with the rebalance generation it was read in.
pub(super) type Item = (u64, OwnedMessage);

/// The queue to one partition's worker, bounded in records (the channel) and in payload bytes.
pub(super) struct Lane {
    pub(super) tx: mpsc::Sender<Item>,
    pub(super) bytes: Arc<AtomicUsize>,
    pub(super) max_bytes: usize,
}

impl Lane {
    /// Queues `item` unless the lane is full in records or bytes (an empty lane takes any one record).
    // The same signature as `mpsc::Sender::try_send`: a full lane hands the record back to be held.
    #[allow(clippy::result_large_err)]
    pub(super) fn try_send(&self, item: Item) -> Result<(), mpsc::error::TrySendError<Item>> {
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

pub(super) fn payload_len(item: &Item) -> usize {
    item.1.payload().map_or(0, <[u8]>::len)
}

/// Records of one partition read while its lane was full, in order, waiting for room.
#[derive(Default)]
pub(super) struct Held {
    pub(super) q: VecDeque<Item>,
    pub(super) bytes: usize,
    /// Fetching is paused: more than `queue_bytes_per_partition` is held.
    pub(super) paused: bool,
}

impl Held {
    pub(super) fn push(&mut self, item: Item) {
        self.bytes += payload_len(&item);
        self.q.push_back(item);
    }

    pub(super) fn pop(&mut self) -> Option<Item> {
        let item = self.q.pop_front()?;
        self.bytes -= payload_len(&item);
        Some(item)
    }

    pub(super) fn unpop(&mut self, item: Item) {
        self.bytes += payload_len(&item);
        self.q.push_front(item);
    }
}

/// Takes a record's bytes off its lane's count when dropped (the record is settled, abandoned or dropped), and
/// tells the reader there is room for a held record.
pub(super) struct QueuedBytes(
    pub(super) Arc<AtomicUsize>,
    pub(super) usize,
    pub(super) Arc<tokio::sync::Notify>,
);

impl Drop for QueuedBytes {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
        self.2.notify_one();
    }
}
