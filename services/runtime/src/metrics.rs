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
    // When each TLS certificate the process presents expires (crate::certs).
    crate::certs::TlsMetrics::register(&mut r);
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
/// default: `Default`). `register` puts every metric under `hl7gw_<prefix>_`. A `with { field: OtherSet }` after
/// the table holds other sets made by this macro, registered with this one (each under its own prefix).
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
        $(with { $($(#[$nmeta:meta])* $nvis:vis $nested:ident: $nty:ty),* $(,)? })?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $ty, )*
            $($( $(#[$nmeta])* $nvis $nested: $nty, )*)?
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
                    $($( $nested: <$nty>::register(r), )*)?
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

/// A histogram of [`latency_buckets`] continued to an hour (30 s, 1, 5, 15, 30 and 60 min): end-to-end times,
/// where a receiver outage of minutes must show as such, not as "more than 10 s".
pub fn end_to_end_histogram() -> prometheus_client::metrics::histogram::Histogram {
    prometheus_client::metrics::histogram::Histogram::new(
        latency_buckets().chain([30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0]),
    )
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

/// HL7 table 0076 (message type), v2.1 to v2.9, sorted: the only values the `message_type` label takes
/// besides `other`, so a sender cannot create series by making types up.
pub const KNOWN_TYPES: [&[u8; 3]; 158] = [
    b"ACK", b"ADR", b"ADT", b"ARD", b"BAR", b"BPS", b"BRP", b"BRT", b"BTS", b"CCF", b"CCI", b"CCM",
    b"CCQ", b"CCU", b"CNQ", b"CQU", b"CRM", b"CSU", b"DBC", b"DBU", b"DEL", b"DEO", b"DER", b"DFT",
    b"DOC", b"DPR", b"DRC", b"DRG", b"DSR", b"EAC", b"EAN", b"EAR", b"EDR", b"EHC", b"EQQ", b"ERP",
    b"ESR", b"ESU", b"INR", b"INU", b"LSR", b"LSU", b"MCF", b"MDM", b"MFD", b"MFK", b"MFN", b"MFQ",
    b"MFR", b"NMD", b"NMQ", b"NMR", b"OMB", b"OMD", b"OMG", b"OMI", b"OML", b"OMN", b"OMP", b"OMQ",
    b"OMS", b"OPL", b"OPR", b"OPU", b"ORA", b"ORB", b"ORD", b"ORF", b"ORG", b"ORI", b"ORL", b"ORM",
    b"ORN", b"ORP", b"ORR", b"ORS", b"ORU", b"ORX", b"OSM", b"OSQ", b"OSR", b"OSU", b"OUL", b"PEX",
    b"PGL", b"PIN", b"PMU", b"PPG", b"PPP", b"PPR", b"PPT", b"PPV", b"PRR", b"PTR", b"QBP", b"QCK",
    b"QCN", b"QRY", b"QSB", b"QSX", b"QVR", b"RAR", b"RAS", b"RCI", b"RCL", b"RDE", b"RDO", b"RDR",
    b"RDS", b"RDY", b"REF", b"RER", b"RGR", b"RGV", b"ROC", b"ROD", b"ROR", b"RPA", b"RPI", b"RPL",
    b"RPR", b"RQA", b"RQC", b"RQI", b"RQP", b"RQQ", b"RRA", b"RRD", b"RRE", b"RRG", b"RRI", b"RSP",
    b"RTB", b"SCN", b"SDN", b"SDR", b"SIU", b"SLN", b"SLR", b"SMD", b"SPQ", b"SQM", b"SQR", b"SRM",
    b"SRR", b"SSR", b"SSU", b"STC", b"STI", b"SUR", b"TBR", b"TCR", b"TCU", b"UDM", b"VBA", b"VQQ",
    b"VXQ", b"VXR",
];

/// MSH-9.1 as a label: a type of HL7 table 0076 ([`KNOWN_TYPES`]); anything else (site-defined Z types,
/// made-up or unreadable codes) is `other`, so the label has a bounded set of values whatever senders send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MsgType([u8; 3]);

impl MsgType {
    /// The label for a message type code.
    pub fn new(code: &[u8]) -> Self {
        match <[u8; 3]>::try_from(code) {
            Ok(c) if KNOWN_TYPES.binary_search(&&c).is_ok() => Self(c),
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

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;

    /// Issue 24, item 10: message types come from input, so the label takes only HL7's own types (table
    /// 0076) and `other`; 10,000 made-up types from a sender make a bounded scrape, not 10,000 series.
    #[test]
    fn made_up_message_types_give_a_bounded_scrape() {
        let family = Family::<MessageLabels, Counter>::default();
        let mut r = registry();
        r.register("messages", "test", family.clone());
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        for i in 0..10_000usize {
            let code = [
                alphabet[i % 36],
                alphabet[(i / 36) % 36],
                alphabet[(i / 1296) % 36],
            ];
            count_message(&family, MsgType::new(&code), "rejected");
        }
        count_message(&family, MsgType::new(b"ADT"), "accepted");
        let text = render(&r);
        let series = text
            .lines()
            .filter(|l| l.starts_with("hl7gw_messages_total{"))
            .count();
        assert!(series <= KNOWN_TYPES.len() + 2, "{series} series");
        assert!(
            KNOWN_TYPES.is_sorted(),
            "binary search needs a sorted table"
        );
        assert!(text.contains(r#"message_type="ADT",outcome="accepted""#));
        assert!(text.contains(r#"message_type="other",outcome="rejected""#));
        assert_eq!(MsgType::new(b"ORU").as_str(), "ORU");
        assert_eq!(MsgType::new(b"ZZZ").as_str(), "other");
    }

    crate::metric_set! {
        struct Inner under "inner" {
            lines: Counter = "Lines", unit Bytes;
        }
    }

    crate::metric_set! {
        struct Outer under "outer" {
            calls: Counter = "Calls";
        }
        with { inner: Inner }
    }

    /// A set held `with` another is registered with it, under its own prefix, and shares its handles.
    #[test]
    fn a_nested_metric_set_is_registered_under_its_own_prefix() {
        let (r, m) = Outer::registered();
        m.calls.inc();
        m.inner.lines.inc_by(3);
        let text = render(&r);
        assert!(text.contains("hl7gw_outer_calls_total 1"), "{text}");
        assert!(text.contains("hl7gw_inner_lines_bytes_total 3"), "{text}");
        let (alone, _) = Inner::registered();
        assert!(!render(&alone).contains("outer"));
    }
}
