//! Fault injection for tests: with the `failpoints` feature (turned on only by the services' dev-dependencies,
//! so `cargo test` builds have it and release builds do not) and `FAILPOINT_KAFKA_FATAL_AFTER=N` in the
//! environment, the N-th record a service produces raises librdkafka's own fatal error on its producer, as an
//! idempotent producer that lost its sequence would. The recovery path can then be tested on real processes.

/// Called after each record a producer accepted; raises the fatal error at the configured count.
#[cfg(feature = "failpoints")]
pub fn after_send<C: rdkafka::ClientContext>(client: &rdkafka::client::Client<C>) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static AFTER: OnceLock<Option<u64>> = OnceLock::new();
    static SENT: AtomicU64 = AtomicU64::new(0);
    let Some(after) = *AFTER.get_or_init(|| {
        std::env::var("FAILPOINT_KAFKA_FATAL_AFTER")
            .ok()
            .and_then(|v| v.parse().ok())
    }) else {
        return;
    };
    if SENT.fetch_add(1, Ordering::AcqRel) + 1 == after {
        tracing::warn!("failpoint: raising a fatal producer error");
        raise_fatal(client);
    }
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn after_send<C: rdkafka::ClientContext>(_client: &rdkafka::client::Client<C>) {}

#[cfg(feature = "failpoints")]
#[allow(unsafe_code)]
fn raise_fatal<C: rdkafka::ClientContext>(client: &rdkafka::client::Client<C>) {
    // SAFETY: `native_ptr` is the live rd_kafka_t owned by `client`, borrowed for the call; the reason is a
    // NUL-terminated static string that librdkafka copies.
    unsafe {
        rdkafka::bindings::rd_kafka_test_fatal_error(
            client.native_ptr(),
            rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
            c"failpoint".as_ptr(),
        );
    }
}
