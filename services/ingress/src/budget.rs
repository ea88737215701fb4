//! The bytes of messages the ingress holds between reading them and writing their answers. Each MLLP
//! connection and gRPC stream has its own bound (`max_in_flight_bytes_per_connection`) and all of them draw
//! from one budget for the process (`max_in_flight_bytes`), so what clients can make the process hold is
//! bounded whatever their number. A connection that finds either spent stops reading (TCP backpressure).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What each message costs besides its bytes: its envelope and record headers, the duplicate window's claim,
/// its span and queue slots (order of magnitude). A batch's messages are charged one by one, so a 1 MiB frame of
/// 26,000 tiny messages costs what its records cost, not 1 MiB.
pub const MESSAGE_OVERHEAD: usize = 1024;

/// Bytes of a frame still being read that a connection buffers without drawing on the process's budget;
/// beyond them the read buffer is reserved from it, so a thousand half-sent 1 MiB frames cannot take a GiB.
pub const FREE_READ_BYTES: usize = 64 * 1024;

/// The largest message a connection holding nothing else may take from the floor instead of the shared
/// budget.
pub const FLOOR_MESSAGE_BYTES: usize = 64 * 1024;

/// The process's budget.
#[derive(Debug)]
pub struct Budget {
    process: Arc<Semaphore>,
    /// Bytes for the one message of a connection that holds nothing else (a send-and-wait sender's every
    /// message): never waited for, so clients that spend the shared budget (never reading their answers, say)
    /// do not hold up a sender that waits for each answer. `FLOOR_MESSAGE_BYTES` per connection slot.
    floor: Arc<Semaphore>,
    total: usize,
    held: Gauge,
    waits: Counter,
}

impl Budget {
    /// A budget of `total` bytes (at most `u32::MAX`) and a floor of `floor` bytes, shown in `held` and
    /// counting waits in `waits`.
    pub fn new(total: usize, floor: usize, held: Gauge, waits: Counter) -> Self {
        let total = total.clamp(1, u32::MAX as usize);
        Self {
            process: Arc::new(Semaphore::new(total)),
            floor: Arc::new(Semaphore::new(floor.min(u32::MAX as usize))),
            total,
            held,
            waits,
        }
    }

    /// The bytes the whole process may hold.
    pub fn total(&self) -> usize {
        self.total
    }

    /// A new connection's (or stream's) share: at most `max` bytes at once, drawn from this budget.
    pub fn connection(self: &Arc<Self>, max: usize) -> ConnectionBudget {
        let max = max.clamp(1, self.total);
        ConnectionBudget {
            own: Arc::new(Semaphore::new(max)),
            max,
            process: self.clone(),
        }
    }
}

/// One connection's share of the [`Budget`].
#[derive(Debug)]
pub struct ConnectionBudget {
    own: Arc<Semaphore>,
    max: usize,
    process: Arc<Budget>,
}

impl ConnectionBudget {
    /// Waits until `cost` bytes (clamped to the connection's bound) are free in the connection's share and
    /// in the process's budget, and holds them until the returned [`Held`] is dropped. The connection's own
    /// share is taken first, so a connection waiting for the process holds nothing of it. A message of at most
    /// [`FLOOR_MESSAGE_BYTES`] on a connection that holds nothing else comes from the floor when it has room.
    pub async fn acquire(&self, cost: usize) -> Option<Held> {
        let n = cost.clamp(1, self.max) as u32;
        let alone = self.own.available_permits() == self.max;
        let own = self.own.clone().acquire_many_owned(n).await.ok()?;
        let p = &self.process;
        let floor = (alone && n as usize <= FLOOR_MESSAGE_BYTES)
            .then(|| p.floor.clone().try_acquire_many_owned(n).ok())
            .flatten();
        let process = match floor {
            Some(permit) => permit,
            None => self.shared(n).await?,
        };
        p.held.inc_by(i64::from(n));
        Some(Held {
            _own: Some(own),
            _process: process,
            bytes: n,
            held: p.held.clone(),
        })
    }

    /// `n` bytes of the shared budget, waiting (counted) when they are not free.
    async fn shared(&self, n: u32) -> Option<OwnedSemaphorePermit> {
        let p = &self.process;
        match p.process.clone().try_acquire_many_owned(n) {
            Ok(permit) => Some(permit),
            Err(_) => {
                p.waits.inc();
                p.process.clone().acquire_many_owned(n).await.ok()
            }
        }
    }

    /// Reserves `bytes` of the process's budget (not the connection's own share, which counts messages) for a
    /// read buffer holding a frame not yet complete.
    pub async fn reserve_reading(&self, bytes: usize) -> Option<Held> {
        let n = bytes.clamp(1, self.process.total) as u32;
        let process = self.shared(n).await?;
        let p = &self.process;
        p.held.inc_by(i64::from(n));
        Some(Held {
            _own: None,
            _process: process,
            bytes: n,
            held: p.held.clone(),
        })
    }
}

/// The bytes one message holds until its answer is written (or it is dropped unanswered).
#[derive(Debug)]
pub struct Held {
    _own: Option<OwnedSemaphorePermit>,
    _process: OwnedSemaphorePermit,
    bytes: u32,
    held: Gauge,
}

impl Held {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes as usize
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.dec_by(i64::from(self.bytes));
    }
}

/// What a frame costs: its bytes and [`MESSAGE_OVERHEAD`] for each message in it (one, or each `MSH` segment
/// of an FHS/BHS batch).
pub fn cost(frame: &[u8]) -> usize {
    let messages = if hl7v2::is_batch(frame) {
        memchr::memmem::find_iter(frame, b"\rMSH").count()
            + memchr::memmem::find_iter(frame, b"\nMSH").count()
    } else {
        1
    };
    frame
        .len()
        .saturating_add(messages.max(1).saturating_mul(MESSAGE_OVERHEAD))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn budget(total: usize) -> Arc<Budget> {
        Arc::new(Budget::new(total, 0, Gauge::default(), Counter::default()))
    }

    /// Issue 24, item 3: many connections together hold no more than the process's budget; one that waits
    /// goes on once another's message is answered.
    #[tokio::test]
    async fn connections_together_stay_within_the_process_budget() {
        let b = budget(10_000);
        let conns: Vec<_> = (0..8).map(|_| b.connection(4_000)).collect();
        let mut held = Vec::new();
        for c in &conns[..2] {
            held.push(c.acquire(4_000).await.expect("free"));
        }
        assert_eq!(b.held.get(), 8_000);
        let third = tokio::time::timeout(Duration::from_millis(100), conns[2].acquire(4_000)).await;
        assert!(
            third.is_err(),
            "a third 4,000-byte message fits no 10,000-byte budget"
        );
        assert_eq!(b.waits.get(), 1);
        held.pop();
        let third = tokio::time::timeout(Duration::from_secs(5), conns[2].acquire(4_000)).await;
        assert!(matches!(third, Ok(Some(_))));
        drop(third);
        drop(held);
        assert_eq!(b.held.get(), 0);
    }

    /// A connection holding nothing else takes a small message from the floor, so a send-and-wait sender is
    /// not held up by clients that spent the shared budget; its second message waits like any other.
    #[tokio::test]
    async fn a_lone_small_message_comes_from_the_floor() {
        let b = Arc::new(Budget::new(
            5_000,
            2 * FLOOR_MESSAGE_BYTES,
            Gauge::default(),
            Counter::default(),
        ));
        let hog = b.connection(5_000);
        let _floor = hog.acquire(1_000).await.expect("free");
        let _spent = hog.acquire(4_000).await.expect("free");
        let sender = b.connection(5_000);
        let first = tokio::time::timeout(Duration::from_millis(100), sender.acquire(1_000)).await;
        assert!(
            matches!(first, Ok(Some(_))),
            "the floor serves a lone message"
        );
        let second = tokio::time::timeout(Duration::from_millis(100), sender.acquire(2_000)).await;
        assert!(
            second.is_err(),
            "a second message waits for the shared budget"
        );
        assert_eq!(b.held.get(), 6_000);
    }

    /// Issue 24, item 4: a batch is charged per message, a lone message its bytes and one overhead.
    #[test]
    fn a_batch_costs_its_messages() {
        let one = b"MSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\rPID|1\r";
        assert_eq!(cost(one), one.len() + MESSAGE_OVERHEAD);
        let mut batch = b"FHS|^~\\&\rBHS|^~\\&\r".to_vec();
        for _ in 0..100 {
            batch.extend_from_slice(one);
        }
        batch.extend_from_slice(b"BTS|100\rFTS|1\r");
        assert_eq!(cost(&batch), batch.len() + 100 * MESSAGE_OVERHEAD);
    }
}
