//! The worker's part of readiness.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The worker's part of readiness: down while it cannot commit (retrying a commit, recreating the producer),
/// and while the consumer cannot read the inbound topic (not authorised, missing), each with the reason.
#[derive(Debug)]
pub struct WorkerHealth {
    pub(super) ok: AtomicBool,
    /// The last error while recovering.
    pub(super) why: Mutex<String>,
    /// A consumer error that stops all reading, and the rebalance generation it came in: it holds until a
    /// record is read or the assignment changes (librdkafka may report it once only).
    pub(super) unreadable: hl7gw_runtime::kafka::Unreadable,
}

impl Default for WorkerHealth {
    fn default() -> Self {
        Self {
            ok: AtomicBool::new(true),
            why: Mutex::new(String::new()),
            unreadable: hl7gw_runtime::kafka::Unreadable::default(),
        }
    }
}

impl WorkerHealth {
    /// True unless the worker is recovering.
    pub fn is_ok(&self) -> bool {
        self.ok.load(Ordering::Acquire)
    }

    /// Why the worker makes the transformer unready, if it does; `generation` is the consumer's now.
    pub fn failure(&self, generation: u64) -> Option<String> {
        if !self.is_ok() {
            let why = self.why.lock().map(|w| w.clone()).unwrap_or_default();
            return Some(format!("recovering: cannot commit to Kafka yet ({why})"));
        }
        self.unreadable
            .reason(generation)
            .map(|e| format!("cannot read the inbound topic: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 24, item 7: readiness names why the worker cannot go on: the error it is recovering from, or a
    /// consumer error that stops all reading, until the assignment changes or a record is read.
    #[test]
    fn worker_health_names_the_error() {
        let h = WorkerHealth::default();
        assert_eq!(h.failure(1), None);
        h.unreadable
            .set(1, "Broker: Topic authorization failed".into());
        let why = h.failure(1).expect("unready");
        assert!(why.contains("Topic authorization failed"), "{why}");
        assert_eq!(h.failure(2), None, "the assignment changed since");
        h.unreadable.clear();
        *h.why.lock().unwrap() = "Broker: Transactional Id authorization failed".into();
        h.ok.store(false, Ordering::Release);
        let why = h.failure(1).expect("unready");
        assert!(
            why.contains("recovering") && why.contains("Transactional Id"),
            "{why}"
        );
    }
}
