//! A Kafka producer that is recreated in-process after librdkafka's fatal error (issue: never exit on a
//! recoverable error), shared by the ingress and the egress.

use crate::kafka::Producer;
use rdkafka::producer::Producer as _;
use std::sync::atomic::Ordering;

/// A producer replaced in-process when librdkafka reports a fatal error: an idempotent producer
/// that lost its sequence (or was fenced) can never send again, and the service must neither fail forever nor
/// exit. Records in flight on the broken producer fail (the caller's usual error path); the next ones go through
/// the new one.
pub struct ProducerSlot {
    current: std::sync::RwLock<Producer>,
    make: Box<dyn Fn() -> rdkafka::error::KafkaResult<Producer> + Send + Sync>,
    recovering: std::sync::atomic::AtomicBool,
    recoveries: prometheus_client::metrics::counter::Counter,
    /// Replaced producers, kept a while: callers may still hold copies across an await, and the last copy's
    /// drop (purge, flush, thread joins) must not run on an async worker. Dropped on a blocking thread once
    /// more than [`RETIRED_KEPT`] wait.
    retired: std::sync::Mutex<std::collections::VecDeque<Producer>>,
}

/// Replaced producers kept before the oldest is closed.
const RETIRED_KEPT: usize = 2;

impl ProducerSlot {
    /// A slot holding `make()`'s producer; `make` is called again for each recovery.
    pub fn new(
        make: Box<dyn Fn() -> rdkafka::error::KafkaResult<Producer> + Send + Sync>,
        recoveries: prometheus_client::metrics::counter::Counter,
    ) -> rdkafka::error::KafkaResult<Self> {
        Ok(Self {
            current: std::sync::RwLock::new(make()?),
            make,
            recovering: std::sync::atomic::AtomicBool::new(false),
            recoveries,
            retired: std::sync::Mutex::new(std::collections::VecDeque::new()),
        })
    }

    /// A slot whose producers are [`crate::kafka::producer_config`]'s (acks=all, idempotent).
    pub fn from_config(
        client_id: &'static str,
        settings: crate::kafka::KafkaSettings,
        delivery_timeout: std::time::Duration,
        recoveries: prometheus_client::metrics::counter::Counter,
    ) -> rdkafka::error::KafkaResult<Self> {
        Self::new(
            Box::new(move || {
                Producer::create(&crate::kafka::producer_config(
                    client_id,
                    &settings,
                    delivery_timeout,
                )?)
            }),
            recoveries,
        )
    }

    /// The producer to use now.
    pub fn get(&self) -> Producer {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True while the current producer is broken (fatal error) or being replaced: not ready.
    pub fn is_broken(&self) -> bool {
        self.recovering.load(Ordering::Acquire) || self.get().client().fatal_error().is_some()
    }

    /// Replaces the current producer when librdkafka reports a fatal error on it; the broken one is dropped
    /// on a blocking thread (its queue was already failed). One recovery at a time.
    pub fn recover_if_fatal(&self) {
        if self.get().client().fatal_error().is_none() {
            return;
        }
        if self.recovering.swap(true, Ordering::AcqRel) {
            return;
        }
        // Checked again under the flag: another caller may have replaced the broken producer meanwhile.
        let current = self.get();
        if let Some((code, reason)) = current.client().fatal_error() {
            tracing::warn!(?code, %reason, "fatal producer error: recreating the producer");
            match (self.make)() {
                Ok(new) => {
                    let old = std::mem::replace(
                        &mut *self.current.write().unwrap_or_else(|p| p.into_inner()),
                        new,
                    );
                    self.recoveries.inc();
                    drop(current);
                    let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
                    retired.push_back(old);
                    if retired.len() > RETIRED_KEPT
                        && let Some(oldest) = retired.pop_front()
                    {
                        tokio::task::spawn_blocking(move || drop(oldest));
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot recreate the producer yet"),
            }
        }
        self.recovering.store(false, Ordering::Release);
    }
}

impl std::fmt::Debug for ProducerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerSlot").finish_non_exhaustive()
    }
}
