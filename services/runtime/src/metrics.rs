//! Prometheus metrics: one registry per process, encoded in the text format for `/metrics`.

use prometheus_client::encoding::text::encode;
pub use prometheus_client::registry::{Registry, Unit};

/// The `hl7gw` prefix every metric name carries.
pub const PREFIX: &str = "hl7gw";

/// A registry whose metric names start with `hl7gw_`.
pub fn registry() -> Registry {
    let mut r = Registry::with_prefix(PREFIX);
    // librdkafka's statistics (Kafka requests per broker and API, produce batch sizes) of every client.
    r.register_collector(Box::new(crate::kafka::stats::StatsCollector));
    r
}

/// The registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

/// Declares a service's metrics struct and its `register` from one table, so a metric is named, described and
/// registered in one place. Each row: the field (`as "name"` when the metric is named otherwise), its type,
/// its help text, then optionally `unit Seconds` (a [`Unit`] variant) and `new <expr>` (how it is made;
/// default: `Default`). `register` puts every metric under `hl7gw_<prefix>_`.
#[macro_export]
macro_rules! metric_set {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident under $prefix:literal {
            $(
                $(#[$fmeta:meta])*
                $fvis:vis $field:ident $(as $metric:literal)? : $ty:ty = $help:literal
                    $(, unit $unit:ident)? $(, new $make:expr)?;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $ty, )*
        }

        impl $name {
            /// A process's registry (`hl7gw_runtime::metrics::registry()`) holding these metrics.
            pub fn registered() -> ($crate::metrics::Registry, Self) {
                let mut r = $crate::metrics::registry();
                let m = Self::register(&mut r);
                (r, m)
            }

            /// Creates the metrics and registers them under `hl7gw_<prefix>_`.
            pub fn register(r: &mut $crate::metrics::Registry) -> Self {
                let m = Self {
                    $( $field: $crate::metric_set!(@make $ty $(, $make)?), )*
                };
                let r = r.sub_registry_with_prefix($prefix);
                $(
                    $crate::metric_set!(
                        @register r,
                        $crate::metric_set!(@name $field $(, $metric)?),
                        $help,
                        m.$field.clone()
                        $(, $unit)?
                    );
                )*
                m
            }
        }
    };
    (@make $ty:ty) => { <$ty>::default() };
    (@make $ty:ty, $make:expr) => { $make };
    (@name $field:ident) => { stringify!($field) };
    (@name $field:ident, $metric:literal) => { $metric };
    (@register $r:ident, $n:expr, $h:expr, $m:expr) => { $r.register($n, $h, $m) };
    (@register $r:ident, $n:expr, $h:expr, $m:expr, $unit:ident) => {
        $r.register_with_unit($n, $h, $crate::metrics::Unit::$unit, $m)
    };
}

/// A histogram with [`latency_buckets`]: what every duration metric uses.
pub fn latency_histogram() -> prometheus_client::metrics::histogram::Histogram {
    prometheus_client::metrics::histogram::Histogram::new(latency_buckets())
}

/// Declares the label sets of metric families, one struct a line: `pub struct CodeLabels { pub code: &'static
/// str }` derives what a `Family` key needs (the field names are the label names).
#[macro_export]
macro_rules! label_sets {
    ($($(#[$meta:meta])* pub struct $name:ident { $(pub $field:ident: $ty:ty),+ $(,)? })+) => {
        $(
            $(#[$meta])*
            #[derive(Debug, Clone, PartialEq, Eq, Hash, ::prometheus_client::encoding::EncodeLabelSet)]
            pub struct $name { $(pub $field: $ty),+ }
        )+
    };
}

crate::label_sets! {
    /// `message_type` and `outcome`: the labels of the ingress's and the transformer's `messages_total`.
    pub struct MessageLabels { pub message_type: MsgType, pub outcome: &'static str }
    /// `reason`: a bounded reason kind (DLQ writes, rejects, failures).
    pub struct ReasonLabels { pub reason: &'static str }
}

/// Counts one message of type `t` with `outcome` in a `messages_total` family.
pub fn count_message(
    family: &prometheus_client::metrics::family::Family<
        MessageLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    t: MsgType,
    outcome: &'static str,
) {
    family
        .get_or_create(&MessageLabels {
            message_type: t,
            outcome,
        })
        .inc();
}

/// Latency buckets in seconds, from 50 µs to 10 s.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
        1.0, 2.5, 5.0, 10.0,
    ]
    .into_iter()
}

/// MSH-9.1 as a label: three uppercase letters or digits, anything else is `other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MsgType([u8; 3]);

impl MsgType {
    /// The label for a message type code.
    pub fn new(code: &[u8]) -> Self {
        match code {
            [a, b, c]
                if [a, b, c]
                    .iter()
                    .all(|x| x.is_ascii_uppercase() || x.is_ascii_digit()) =>
            {
                Self([*a, *b, *c])
            }
            _ => Self::OTHER,
        }
    }

    /// Unknown or unreadable type.
    pub const OTHER: Self = Self([0, 0, 0]);

    /// The label text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0)
            .ok()
            .filter(|s| !s.starts_with('\0'))
            .unwrap_or("other")
    }
}

impl prometheus_client::encoding::EncodeLabelValue for MsgType {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
    ) -> std::fmt::Result {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}
