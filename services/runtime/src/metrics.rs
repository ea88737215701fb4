//! Prometheus metrics: one registry per process, encoded in the text format for `/metrics`.

use prometheus_client::encoding::text::encode;
pub use prometheus_client::registry::Registry;

/// The `hl7gw` prefix every metric name carries.
pub const PREFIX: &str = "hl7gw";

/// A registry whose metric names start with `hl7gw_`.
pub fn registry() -> Registry {
    Registry::with_prefix(PREFIX)
}

/// The registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

/// Latency buckets in seconds, from 50 µs to 10 s.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
        1.0, 2.5, 5.0, 10.0,
    ]
    .into_iter()
}
