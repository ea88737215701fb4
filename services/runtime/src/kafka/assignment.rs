//! The one consumer context of the services: it tracks the consumer's assignment (a generation bumped on every
//! rebalance, the partitions held), wakes whoever waits for a rebalance, logs the changes, and reports client
//! errors, logs and statistics as every hl7gw Kafka client does.

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A consumer's assignment, as rebalances change it.
#[derive(Debug, Default)]
pub struct Assignment {
    generation: AtomicU64,
    partitions: Mutex<BTreeSet<i32>>,
    changed: tokio::sync::Notify,
}

impl Assignment {
    /// Bumped on every rebalance: work gathered under another generation belongs to partitions that may have
    /// moved (they restart from the committed offsets).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The partitions held now.
    pub fn partitions(&self) -> Vec<i32> {
        self.partitions
            .lock()
            .map(|p| p.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Resolves at the next rebalance (for a worker waiting out a backoff: it drops the work of a partition
    /// that moved). Create it before checking [`Assignment::generation`] so no rebalance falls in between.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}

impl ClientContext for Assignment {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        super::client_error(&error, reason);
    }
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        super::client_log(level, fac, message);
    }
    fn stats_raw(&self, statistics: &[u8]) {
        super::stats::record(statistics);
    }
}

impl ConsumerContext for Assignment {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, r: &Rebalance<'_>) {
        if let Ok(mut p) = self.partitions.lock() {
            match r {
                Rebalance::Assign(tpl) => {
                    p.clear();
                    p.extend(tpl.elements().iter().map(|e| e.partition()));
                }
                Rebalance::Revoke(_) => p.clear(),
                Rebalance::Error(_) => {}
            }
        }
        match r {
            Rebalance::Assign(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions assigned")
            }
            Rebalance::Revoke(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions revoked")
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }
}
