//! librdkafka's blocking transactional calls on tokio's blocking threads, given up on after a bound and counted
//! while they have not returned.

use hl7gw_runtime::kafka::errors::blocking;
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::error::KafkaError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// [`blocking`], given up after `limit`: `None` when the call has not returned by then (it keeps its blocking
/// thread, and what it captured, until it does). `abandoned` counts the calls given up on that have not
/// returned yet.
pub(super) async fn blocking_within<T: Send + 'static>(
    limit: Duration,
    abandoned: &Gauge,
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Option<Result<T, KafkaError>> {
    // Set by whichever of the two ends first: the call returning, or the wait for it being given up.
    let ended = Arc::new(AtomicBool::new(false));
    let (ended_in_call, gauge) = (ended.clone(), abandoned.clone());
    let call = blocking(move || {
        let r = f();
        if ended_in_call.swap(true, Ordering::AcqRel) {
            // Given up on earlier: it has returned now.
            gauge.dec();
        }
        r
    });
    match tokio::time::timeout(limit, call).await {
        Ok(r) => Some(r),
        Err(_) => {
            if !ended.swap(true, Ordering::AcqRel) {
                abandoned.inc();
            }
            None
        }
    }
}

/// Most transactional calls given up on and still not returned before the transformer reports unready: each
/// holds a blocking thread and a whole producer, so past a few of them a restart is the way out.
pub const MAX_ABANDONED_CALLS: i64 = 4;

/// The readiness failure for `abandoned` outstanding abandoned calls, if it is over [`MAX_ABANDONED_CALLS`].
pub fn abandoned_reason(abandoned: i64) -> Option<String> {
    (abandoned > MAX_ABANDONED_CALLS).then(|| {
        format!(
            "{abandoned} librdkafka calls given up on have not returned (bound {MAX_ABANDONED_CALLS}); each holds \
             a thread and a producer: restart the pod"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A librdkafka call stuck past its own timeout (librdkafka#5456) is given up on, not waited for forever;
    /// issue 24, item 16: it is counted as abandoned until it returns.
    #[tokio::test]
    async fn a_stuck_blocking_call_is_given_up_on() {
        let abandoned = Gauge::default();
        let started = Instant::now();
        let r = blocking_within(Duration::from_millis(100), &abandoned, || {
            std::thread::sleep(Duration::from_millis(1500));
            Ok(())
        })
        .await;
        assert!(r.is_none());
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(abandoned.get(), 1, "outstanding while it has not returned");
        let r = blocking_within(Duration::from_secs(5), &abandoned, || Ok(7)).await;
        assert!(matches!(r, Some(Ok(7))));
        assert_eq!(
            abandoned.get(),
            1,
            "a call that returned in time is not counted"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while abandoned.get() != 0 {
            assert!(Instant::now() < deadline, "still counted after it returned");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Issue 24, item 16: more abandoned calls than the bound make the transformer unready, with the reason.
    #[test]
    fn abandoned_calls_past_the_bound_make_the_transformer_unready() {
        assert_eq!(abandoned_reason(0), None);
        assert_eq!(abandoned_reason(MAX_ABANDONED_CALLS), None);
        let why = abandoned_reason(MAX_ABANDONED_CALLS + 1).expect("unready");
        assert!(why.contains("5 librdkafka calls"), "{why}");
    }
}
