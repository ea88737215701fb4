//! The services' producer: librdkafka's delivery reports served on a tokio worker (issue 12).
//!
//! rdkafka's `FutureProducer` polls on its own thread, so each report crosses three threads (librdkafka's
//! broker thread → the polling thread → a tokio worker): with one record in flight per sender that is a
//! futex wake-up per hop per message. Here librdkafka calls [`wake`] when its main queue goes from empty to
//! non-empty (`rd_kafka_queue_cb_event_enable`), and a tokio task drains the queue, completing each
//! record's future on the worker that will write the ACK. Measured: 13–20% less producer CPU per message
//! (docs/BENCHMARKS.md, "The durable ingress's own CPU"). The FFI is the few lines in [`QueueWake`].

#![allow(unsafe_code)]

use crate::kafka::KafkaContext;
use rdkafka::ClientConfig;
use rdkafka::bindings as rd;
use rdkafka::client::ClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message, ToBytes};
use rdkafka::producer::{BaseProducer, BaseRecord, FutureRecord, Producer as _, ProducerContext};

use std::ffi::c_void;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

/// Where a record was stored (partition, offset), or why not and the size of its payload.
pub type Stored = Result<(i32, i64), (KafkaError, usize)>;

/// Events handled per drain before the task yields to the worker's other tasks.
const EVENTS_PER_YIELD: usize = 64;

/// The queue is served at least this often, whatever the callback says.
const BACKSTOP: Duration = Duration::from_millis(100);

/// The producer's context: the shared client context, plus each record's completion.
#[derive(Debug)]
pub struct Reports(KafkaContext);

impl ClientContext for Reports {
    fn error(&self, error: KafkaError, reason: &str) {
        self.0.error(error, reason);
    }
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.log(level, fac, message);
    }
    fn stats_raw(&self, statistics: &[u8]) {
        self.0.stats_raw(statistics);
    }
}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<oneshot::Sender<Stored>>;

    fn delivery(&self, result: &DeliveryResult<'_>, done: Self::DeliveryOpaque) {
        let stored = match result {
            Ok(m) => confirmed(m.partition(), m.offset(), m.payload_len()),
            Err((e, m)) => Err((e.clone(), m.payload_len())),
        };
        // The sender may have given up on the record (a closed connection): nothing to tell.
        let _ = done.send(stored);
    }
}

/// A success report is a confirmation only with the offset Kafka wrote the record at. librdkafka's idempotent
/// producer also reports success, without an offset, for records it only infers were written ("implicitly
/// acked": a later request to the partition succeeded while theirs had failed). That inference is wrong when
/// theirs failed for sure: on a partition with no state yet for the producer (its first records after the
/// producer started, or a new topic), a first request refused with NOT_LEADER, then a pipelined second one
/// accepted, leaves the first one's records out of the log while both are reported delivered (seen: the
/// ingress ACKed two messages whose sequence numbers 0 and 1 the partition's log does not hold; it begins at
/// sequence 2). Such a report is a failure here (`Inconsistent`), so the ingress answers "resend later".
fn confirmed(partition: i32, offset: i64, payload_len: usize) -> Stored {
    if offset >= 0 {
        Ok((partition, offset))
    } else {
        Err((
            KafkaError::MessageProduction(RDKafkaErrorCode::Inconsistent),
            payload_len,
        ))
    }
}

/// A record's delivery: `Ok(Ok((partition, offset)))` once acknowledged by Kafka as configured,
/// `Ok(Err(e))` when it failed, `Err(_)` when the producer went away without a report.
#[derive(Debug)]
pub struct DeliveryFuture(oneshot::Receiver<Stored>);

impl Future for DeliveryFuture {
    type Output = Result<Stored, oneshot::error::RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// A Kafka producer whose delivery reports complete on tokio (see the module doc). Cheap to clone; the
/// last clone's drop purges and flushes (up to 500 ms): drop it on a blocking thread.
#[derive(Clone)]
pub struct Producer(Arc<Inner>);

struct Inner {
    // Declared first, so dropped first: no callback may run once the producer is being destroyed.
    wake: QueueWake,
    base: BaseProducer<Reports>,
}

impl Producer {
    /// Creates the producer and its draining task on the current tokio runtime.
    pub fn create(config: &ClientConfig) -> KafkaResult<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            KafkaError::ClientCreation("the producer needs a tokio runtime".to_owned())
        })?;
        let base = BaseProducer::from_config_and_context(config, Reports(KafkaContext))?;
        let waker = Arc::new(Waker::default());
        let wake = QueueWake::enable(&base, waker.clone());
        let inner = Arc::new(Inner { wake, base });
        runtime.spawn(drain(Arc::downgrade(&inner), waker));
        Ok(Self(inner))
    }

    /// How many times librdkafka has called back that the queue had events (for tests).
    pub fn wake_ups(&self) -> u64 {
        self.0.wake.waker.calls.load(Ordering::Relaxed)
    }

    /// Queues a record; its future completes from the delivery report. Fails at once when librdkafka
    /// refuses the record (queue full, too large, fatal error, unknown topic or partition).
    pub fn send_result<K, P>(
        &self,
        record: FutureRecord<'_, K, P>,
    ) -> Result<DeliveryFuture, KafkaError>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let (tx, rx) = oneshot::channel();
        match self.0.base.send(with_report(record, tx)) {
            Ok(()) => Ok(DeliveryFuture(rx)),
            Err((e, _)) => Err(e),
        }
    }

    /// Sends a record and waits for its report; a full queue is retried for up to `queue_timeout`.
    pub async fn send<K, P>(
        &self,
        record: FutureRecord<'_, K, P>,
        queue_timeout: Duration,
    ) -> KafkaResult<(i32, i64)>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let deadline = tokio::time::Instant::now() + queue_timeout;
        let mut record = record;
        loop {
            let (tx, rx) = oneshot::channel();
            match self.0.base.send(with_report(record, tx)) {
                Ok(()) => {
                    return match rx.await {
                        Ok(stored) => stored.map_err(|(e, _)| e),
                        Err(_) => Err(KafkaError::Canceled),
                    };
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if tokio::time::Instant::now() < deadline =>
                {
                    record = FutureRecord {
                        topic: back.topic,
                        partition: back.partition,
                        payload: back.payload,
                        key: back.key,
                        timestamp: back.timestamp,
                        headers: back.headers,
                    };
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

/// The record, its report to go to `tx`.
fn with_report<'a, K, P>(
    record: FutureRecord<'a, K, P>,
    tx: oneshot::Sender<Stored>,
) -> BaseRecord<'a, K, P, Box<oneshot::Sender<Stored>>>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    BaseRecord {
        topic: record.topic,
        partition: record.partition,
        payload: record.payload,
        key: record.key,
        timestamp: record.timestamp,
        headers: record.headers,
        delivery_opaque: Box::new(tx),
    }
}

impl std::ops::Deref for Producer {
    type Target = BaseProducer<Reports>;

    /// The librdkafka producer: `client()`, `flush`, `in_flight_count` (rdkafka's `Producer` trait).
    fn deref(&self) -> &Self::Target {
        &self.0.base
    }
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").finish_non_exhaustive()
    }
}

/// Serves the producer's main queue whenever librdkafka says it has events (and every [`BACKSTOP`], should a
/// wake-up ever be missed), until the producer is gone.
async fn drain(producer: Weak<Inner>, waker: Arc<Waker>) {
    loop {
        let _ = tokio::time::timeout(BACKSTOP, waker.notify.notified()).await;
        let Some(inner) = producer.upgrade() else {
            return;
        };
        // The callback fires again only once the queue was empty: serve it to the end. An event enqueued
        // after the last check leaves a permit in the `Notify`, so the next wait returns at once.
        let mut served = 0usize;
        loop {
            let before = inner.wake.pending();
            if before == 0 {
                break;
            }
            inner.base.poll(Duration::ZERO);
            served += 1;
            if served.is_multiple_of(EVENTS_PER_YIELD) {
                if inner.wake.pending() >= before {
                    // Nothing is being taken off the queue: leave it to the backstop, not a busy loop.
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        if Arc::strong_count(&inner) == 1 {
            // Every user dropped theirs meanwhile: the purge and flush must not run on a worker.
            tokio::task::spawn_blocking(move || drop(inner));
            return;
        }
    }
}

/// What librdkafka's callback touches: the drain task's wake-up, and a count of the calls.
#[derive(Debug, Default)]
struct Waker {
    notify: Notify,
    calls: AtomicU64,
}

/// librdkafka's main-queue event callback, enabled for a producer's life.
struct QueueWake {
    queue: *mut rd::rd_kafka_queue_t,
    /// The callback's opaque points here; held until the callback is disabled (`drop`).
    waker: Arc<Waker>,
}

// SAFETY: `queue` is a librdkafka queue handle, which librdkafka allows to use from any thread; `waker` is
// Send + Sync.
unsafe impl Send for QueueWake {}
unsafe impl Sync for QueueWake {}

impl QueueWake {
    fn enable(base: &BaseProducer<Reports>, waker: Arc<Waker>) -> Self {
        // SAFETY: `native_ptr` is the producer's live rd_kafka_t; `rd_kafka_queue_get_main` returns a new
        // reference to its main queue, destroyed in `drop` (before the producer, see `Inner`). The opaque is
        // the `Waker` this value holds until the callback is disabled.
        unsafe {
            let queue = rd::rd_kafka_queue_get_main(base.client().native_ptr());
            let opaque = Arc::as_ptr(&waker) as *mut c_void;
            rd::rd_kafka_queue_cb_event_enable(queue, Some(wake), opaque);
            Self { queue, waker }
        }
    }

    /// Events waiting in the main queue.
    fn pending(&self) -> usize {
        // SAFETY: the queue reference is valid until `drop`.
        unsafe { rd::rd_kafka_queue_length(self.queue) }
    }
}

impl Drop for QueueWake {
    fn drop(&mut self) {
        // SAFETY: librdkafka calls the callback with the queue's lock held and takes the same lock to
        // disable it, so once this returns no callback runs or will run, and `waker` may go.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.queue, None, std::ptr::null_mut());
            rd::rd_kafka_queue_destroy(self.queue);
        }
        // Wakes the drain task so it sees the producer gone and ends.
        self.waker.notify.notify_one();
    }
}

/// Called by a librdkafka thread, with the queue locked, when the main queue becomes non-empty.
unsafe extern "C" fn wake(_rk: *mut rd::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Waker` a live `QueueWake` holds (the callback is disabled before it goes).
    let waker = unsafe { &*(opaque as *const Waker) };
    waker.calls.fetch_add(1, Ordering::Relaxed);
    waker.notify.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An implicitly acked record (success, no offset) is not confirmed; one with its offset is.
    #[test]
    fn a_success_without_an_offset_is_no_confirmation() {
        assert_eq!(confirmed(2, 41, 10).ok(), Some((2, 41)));
        let invalid = rdkafka::Offset::Invalid.to_raw().expect("a raw offset");
        let Err((e, size)) = confirmed(2, invalid, 10) else {
            panic!("an implicit ack was taken as a confirmation")
        };
        assert_eq!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::Inconsistent));
        assert_eq!(size, 10);
    }

    /// A record to a broker that is not there fails through its future (message timeout), served by the
    /// drain task after librdkafka's callback (not only by the backstop tick).
    #[tokio::test]
    async fn a_report_completes_the_future_on_tokio() {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "200");
        let p = Producer::create(&cfg).expect("created without a broker");
        let d = p
            .send_result(FutureRecord::<(), _>::to("t").payload("x"))
            .expect("queued");
        let r = tokio::time::timeout(Duration::from_secs(10), d)
            .await
            .expect("reported before the timeout");
        assert!(matches!(r, Ok(Err(_))), "{r:?}");
        assert!(p.wake_ups() > 0, "librdkafka never called back");
        tokio::task::spawn_blocking(move || drop(p))
            .await
            .expect("dropped");
    }

    #[test]
    fn creating_outside_a_runtime_is_an_error_not_a_panic() {
        let cfg = ClientConfig::new();
        assert!(Producer::create(&cfg).is_err());
    }
}
