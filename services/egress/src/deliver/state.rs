//! What a destination's state says to readiness, `hl7gw status` and the metrics: connected, retrying,
//! the oldest record in the air, the last answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

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
    pub unreadable: hl7gw_runtime::kafka::Unreadable,
}

/// Takes a delivery's [`Head`] out of the destination's state when the delivery ends.
pub(super) struct HeadGone<'a>(pub(super) &'a DestState, pub(super) (i32, u64));

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
        self.unreadable
            .reason(generation)
            .map(|why| format!("cannot read the topic: {why}"))
    }

    pub(super) fn dlq_failing(&self, why: Option<&str>) {
        failing(&self.dlq_failing, why);
    }

    pub(super) fn ledger_failing(&self, why: Option<&str>) {
        failing(&self.ledger_failing, why);
    }
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

/// Records since when (and the latest why) writes of one kind fail; `None` clears it.
pub(super) fn failing(m: &Mutex<Option<(Instant, String)>>, why: Option<&str>) {
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
    pub(super) received_ms: std::sync::atomic::AtomicI64,
    pub(super) retrying_ms: std::sync::atomic::AtomicI64,
}

pub(super) fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

pub(super) fn set(m: &Mutex<String>, v: &str) {
    if let Ok(mut g) = m.lock() {
        v.clone_into(&mut g);
    }
}
