//! Logs and traces: `tracing` to stderr (text or JSON), OpenTelemetry spans exported over OTLP when the
//! standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and W3C trace context
//! in and out of Kafka headers.
//!
//! Spans and log lines carry message type, control id, facility names, sizes and codes, never patient data.
//!
//! Span attributes follow one naming across the services: `hl7.*` for what the gateway knows of a message
//! (`hl7.message_type`, `hl7.trigger_event`, `hl7.control_id`, `hl7.route`, `hl7.destination`, `hl7.ack_code`,
//! `hl7.attempts`, ...), and OpenTelemetry's messaging semantic conventions on every span that writes to or reads
//! from Kafka: span kind `producer` or `consumer` (tracing-opentelemetry's `otel.kind` field),
//! `messaging.system`, `messaging.operation.type`, `messaging.destination.name`, and where known
//! `messaging.destination.partition.id`, `messaging.kafka.offset` and `messaging.consumer.group.name` (the names
//! are in [`semconv`]). `messaging.kafka.message.key` is never set: the Kafka key is derived from the patient id
//! by default (sending facility + PID-3), so it is patient data.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::ResourceDetector as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// OpenTelemetry semantic convention names and values used on the gateway's spans (messaging conventions as of
/// semconv 1.27+: `messaging.operation.type` is `send` for producers, `process` for consumers; `publish` and
/// `deliver` are the deprecated names). The spans themselves are made by [`kafka_span!`](crate::kafka_span)
/// (tracing wants literal field names); these are for tests and for code that reads spans back.
pub mod semconv {
    pub const MESSAGING_SYSTEM: &str = "messaging.system";
    pub const MESSAGING_OPERATION_TYPE: &str = "messaging.operation.type";
    pub const MESSAGING_DESTINATION_NAME: &str = "messaging.destination.name";
    pub const MESSAGING_DESTINATION_PARTITION_ID: &str = "messaging.destination.partition.id";
    pub const MESSAGING_KAFKA_OFFSET: &str = "messaging.kafka.offset";
    pub const MESSAGING_CONSUMER_GROUP_NAME: &str = "messaging.consumer.group.name";
    /// The value of `messaging.system`.
    pub const KAFKA: &str = "kafka";
    /// `messaging.operation.type` of a producer span.
    pub const SEND: &str = "send";
    /// `messaging.operation.type` of a consumer span that handles one record.
    pub const PROCESS: &str = "process";
    pub const SERVICE_VERSION: &str = "service.version";
    /// The resource's hostname (the pod's name in Kubernetes): what Jaeger's v3 query API tells hosts apart by.
    pub const HOST_NAME: &str = "host.name";
}

/// An info span of a record written to or read from Kafka, under OpenTelemetry's messaging conventions (see
/// [`semconv`]): `kafka_span!(producer, ...)` or `kafka_span!(consumer, ...)` sets `otel.kind`,
/// `messaging.system` and `messaging.operation.type` (`send`, `process`), declares the record's place
/// (`messaging.destination.name`, `messaging.destination.partition.id`, `messaging.kafka.offset`) for
/// [`record_placement`], then takes what `tracing::info_span!` takes (an optional `parent: ...,`, the name,
/// the span's other fields). What is known when the span is made is set then, not recorded after: `topic: t,`
/// (a producer's topic) or `record: (topic, partition, offset),` (a consumer's record) before the name.
#[macro_export]
macro_rules! kafka_span {
    (producer, $($rest:tt)+) => { $crate::kafka_span!(@ "producer", "send", $($rest)+) };
    (consumer, $($rest:tt)+) => { $crate::kafka_span!(@ "consumer", "process", $($rest)+) };
    (@span $kind:literal, $op:literal, [$($parent:tt)*] $name:literal, [$($topic:tt)+], [$($partition:tt)+],
        [$($offset:tt)+], $($fields:tt)+) => {
        tracing::info_span!(
            $($parent)*
            $name,
            otel.kind = $kind,
            messaging.system = "kafka",
            messaging.operation.type = $op,
            messaging.destination.name = $($topic)+,
            messaging.destination.partition.id = $($partition)+,
            messaging.kafka.offset = $($offset)+,
            $($fields)+
        )
    };
    (@ $kind:literal, $op:literal, $(parent: $parent:expr,)? record: ($topic:expr, $partition:expr, $offset:expr),
        $name:literal, $($fields:tt)+) => {
        $crate::kafka_span!(@span $kind, $op, [$(parent: $parent,)?] $name, [%$topic], [%$partition], [$offset],
            $($fields)+)
    };
    (@ $kind:literal, $op:literal, $(parent: $parent:expr,)? topic: $topic:expr, $name:literal, $($fields:tt)+) => {
        $crate::kafka_span!(@span $kind, $op, [$(parent: $parent,)?] $name, [%$topic], [tracing::field::Empty],
            [tracing::field::Empty], $($fields)+)
    };
    (@ $kind:literal, $op:literal, $(parent: $parent:expr,)? $name:literal, $($fields:tt)+) => {
        $crate::kafka_span!(@span $kind, $op, [$(parent: $parent,)?] $name, [tracing::field::Empty],
            [tracing::field::Empty], [tracing::field::Empty], $($fields)+)
    };
}

/// Records where the Kafka record of a [`kafka_span!`] is: its topic, and its partition and offset once known
/// (a negative offset, as a delivery report without one, is not recorded). Nothing is formatted for a span no
/// subscriber takes: it is called once per message.
pub fn record_placement(span: &tracing::Span, topic: Option<&str>, at: Option<(i32, i64)>) {
    if span.is_disabled() {
        return;
    }
    if let Some(topic) = topic {
        span.record(semconv::MESSAGING_DESTINATION_NAME, topic);
    }
    if let Some((partition, offset)) = at.filter(|&(_, offset)| offset >= 0) {
        span.record(
            semconv::MESSAGING_DESTINATION_PARTITION_ID,
            tracing::field::display(partition),
        );
        span.record(semconv::MESSAGING_KAFKA_OFFSET, offset);
    }
}

/// Keeps the tracer provider alive; flushes spans when dropped.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("tracing subscriber: {0}")]
    Subscriber(String),
}

/// Installs the global subscriber: `RUST_LOG` filter (default `info`), text or JSON lines on stderr, and the
/// OpenTelemetry layer (exporting only when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
/// is set). The resource's `service.name` is `OTEL_SERVICE_NAME` when set, else `service.name` from
/// `OTEL_RESOURCE_ATTRIBUTES`, else `service`; `service.version` is the gateway's version. JSON lines logged
/// inside a traced span carry its `trace_id` and `span_id` ([`TraceIds`]).
pub fn init(service: &'static str, json: bool) -> Result<TelemetryGuard, TelemetryError> {
    let from_attributes = opentelemetry_sdk::resource::EnvResourceDetector::new()
        .detect()
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .map(|v| v.to_string());
    let name = service_name(
        service,
        std::env::var("OTEL_SERVICE_NAME").ok().as_deref(),
        from_attributes.as_deref(),
    );
    let mut builder = SdkTracerProvider::builder().with_resource(resource(name));
    // The exporter reads the traces endpoint first, then the general one; TLS unless the scheme says http.
    let endpoint = std::env::var_os("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT"));
    if let Some(endpoint) = endpoint {
        use opentelemetry_otlp::WithTonicConfig;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
        if !endpoint
            .to_string_lossy()
            .to_ascii_lowercase()
            .starts_with("http://")
        {
            exporter = exporter.with_tls_config(otlp_tls()?);
        }
        let exporter = exporter
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    let tracer = provider.tracer(service);
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(otel_layer(tracer));
    let ids = WithTraceIds::default();
    let res = if json {
        let with_ids = ids.clone();
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .map_event_format(|f| with_ids.wrap(f))
                    .with_writer(std::io::stderr)
                    .with_filter(filter()),
            )
            .try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(filter()),
            )
            .try_init()
    };
    res.map_err(|e| TelemetryError::Subscriber(e.to_string()))?;
    ids.set_current();
    Ok(TelemetryGuard { provider })
}

/// The service name the resource carries: `OTEL_SERVICE_NAME` (the standard override), else a `service.name`
/// given in `OTEL_RESOURCE_ATTRIBUTES`, else the binary's own name.
fn service_name(default: &str, env_name: Option<&str>, from_attributes: Option<&str>) -> String {
    env_name
        .filter(|n| !n.trim().is_empty())
        .or(from_attributes.filter(|n| !n.trim().is_empty()))
        .unwrap_or(default)
        .trim()
        .to_owned()
}

/// The resource of every span: the standard detectors (`OTEL_RESOURCE_ATTRIBUTES`, the SDK's own attributes),
/// `service.name` as chosen by [`service_name`], `service.version` (the workspace's version, which every
/// service shares) and `host.name` (the pod's or machine's hostname, unless `OTEL_RESOURCE_ATTRIBUTES` gives one).
///
/// `host.name` is what tells one host's spans from another's: Jaeger's v3 query API compares a span's times with
/// its parent's only across hosts (by `host.id`, `host.ip` or `host.name`), and without any of them it took every
/// span for another host's (its v1 API, what Jaeger's UI reads, goes by an `ip` process tag only:
/// docs/observability.md, *What Jaeger shows*; issue 37).
fn resource(name: String) -> opentelemetry_sdk::Resource {
    let mut builder = opentelemetry_sdk::Resource::builder()
        .with_service_name(name)
        .with_attribute(opentelemetry::KeyValue::new(
            semconv::SERVICE_VERSION,
            env!("CARGO_PKG_VERSION"),
        ));
    let given = opentelemetry_sdk::resource::EnvResourceDetector::new()
        .detect()
        .get(&opentelemetry::Key::from_static_str(semconv::HOST_NAME))
        .is_some();
    if let Some(host) = host_name().filter(|_| !given) {
        builder = builder.with_attribute(opentelemetry::KeyValue::new(semconv::HOST_NAME, host));
    }
    builder.build()
}

/// The hostname (in Kubernetes the pod's name): the kernel's, else `HOSTNAME`; none when neither is usable.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        // A DNS name is at most 253 characters; anything else is not a hostname.
        .filter(|h| !h.is_empty() && h.len() <= 253 && !h.chars().any(char::is_control))
}

/// A JSON log line formatter that puts the OpenTelemetry `trace_id` and `span_id` of the event's span (its
/// explicit parent, else the current span) first in the line, so that a log line leads to its trace:
/// `{"trace_id":"4bf9...","span_id":"00f0...","timestamp":...}`. Lines outside any span, or in a span the
/// OpenTelemetry layer does not see (below INFO), carry neither. The ids exist whether or not spans are
/// exported (the tracer makes them either way; they are the ones in the `traceparent` Kafka header), but they
/// find a trace in Jaeger only when it was exported and sampled.
///
/// The OpenTelemetry context of a span is found through the subscriber (tracing-opentelemetry's
/// `get_otel_context`), which a formatter cannot ask for while it formats (the dispatcher refuses re-entry):
/// [`WithTraceIds::set_current`] hands it a weak reference to the installed subscriber once there is one.
#[derive(Clone, Default)]
pub struct WithTraceIds(std::sync::Arc<std::sync::OnceLock<tracing::dispatcher::WeakDispatch>>);

impl std::fmt::Debug for WithTraceIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithTraceIds")
            .field("set", &self.0.get().is_some())
            .finish()
    }
}

impl WithTraceIds {
    /// The formatter `inner` with the ids added.
    pub fn wrap<F>(&self, inner: F) -> TraceIds<F> {
        TraceIds {
            inner,
            dispatch: self.clone(),
        }
    }

    /// Remembers the current default subscriber (call it once the subscriber is installed).
    pub fn set_current(&self) {
        let _ = self
            .0
            .set(tracing::dispatcher::get_default(|d| d.downgrade()));
    }
}

/// The formatter of [`WithTraceIds::wrap`].
#[derive(Debug, Clone)]
pub struct TraceIds<F> {
    inner: F,
    dispatch: WithTraceIds,
}

impl<S, N, F> FormatEvent<S, N> for TraceIds<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let ids = ctx.parent_span().map(|s| s.id()).and_then(|id| {
            let dispatch = self.dispatch.0.get()?.upgrade()?;
            let cx = tracing_opentelemetry::get_otel_context(&id, &dispatch)?;
            let sc = cx.span().span_context().clone();
            sc.is_valid().then(|| (sc.trace_id(), sc.span_id()))
        });
        let Some((trace_id, span_id)) = ids else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => {
                write!(
                    writer,
                    "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\","
                )?;
                writer.write_str(rest)
            }
            None => writer.write_str(&line),
        }
    }
}

/// The OpenTelemetry layer: spans and events at INFO and above, whatever `RUST_LOG` says, so the W3C trace
/// context that goes into Kafka headers does not depend on the log level.
///
/// Its filter asks about every span (`Interest::sometimes`) instead of caching `always` per callsite: a
/// callsite cached as `always` skips `enabled()` and reads the per-layer verdict the previous `enabled()` call
/// left on the thread. rdkafka's `log_enabled!` question, asked for every client config made, leaves
/// "disabled" there when no layer wants librdkafka's debug lines, and the next message span on that thread
/// then had no OpenTelemetry span and no trace context (tokio-rs/tracing#2519).
fn otel_layer<S>(tracer: opentelemetry_sdk::trace::SdkTracer) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let info_and_above = tracing_subscriber::filter::dynamic_filter_fn(|meta, _| {
        *meta.level() <= tracing::Level::INFO
    })
    .with_max_level_hint(LevelFilter::INFO);
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(info_and_above)
}

/// TLS to an `https://` collector: the public CAs built in (Mozilla's, via webpki-roots: the image has no CA
/// store), plus the CA in `OTEL_EXPORTER_OTLP_CERTIFICATE` and, for mutual TLS, the client certificate and key
/// in `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` / `OTEL_EXPORTER_OTLP_CLIENT_KEY` (the OpenTelemetry variables).
fn otlp_tls() -> Result<tonic::transport::ClientTlsConfig, TelemetryError> {
    let read = |var: &str| -> Result<Option<Vec<u8>>, TelemetryError> {
        match std::env::var_os(var) {
            None => Ok(None),
            Some(path) => std::fs::read(&path).map(Some).map_err(|e| {
                TelemetryError::Exporter(format!("{var} {}: {e}", path.to_string_lossy()))
            }),
        }
    };
    let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
    if let Some(ca) = read("OTEL_EXPORTER_OTLP_CERTIFICATE")? {
        tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
    }
    match (
        read("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")?,
        read("OTEL_EXPORTER_OTLP_CLIENT_KEY")?,
    ) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(tonic::transport::Identity::from_pem(cert, key))
        }
        (None, None) => {}
        _ => {
            return Err(TelemetryError::Exporter(
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go together".into(),
            ));
        }
    }
    Ok(tls)
}

/// The W3C `traceparent` and `tracestate` of a span (empty strings when it has no valid context).
pub fn trace_context(span: &tracing::Span) -> (String, String) {
    #[derive(Default)]
    struct Capture(String, String);
    impl Injector for Capture {
        fn set(&mut self, key: &str, value: String) {
            match key {
                "traceparent" => self.0 = value,
                "tracestate" => self.1 = value,
                _ => {}
            }
        }
    }
    let cx = span.context();
    let mut c = Capture::default();
    TraceContextPropagator::new().inject_context(&cx, &mut c);
    (c.0, c.1)
}

/// Makes `span` a child of the remote context in `traceparent`/`tracestate` (from a Kafka header or envelope).
pub fn set_parent(span: &tracing::Span, traceparent: &str, tracestate: &str) {
    struct Carrier<'a>(&'a str, &'a str);
    impl Extractor for Carrier<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            match key {
                "traceparent" => Some(self.0),
                "tracestate" => Some(self.1),
                _ => None,
            }
        }
        fn keys(&self) -> Vec<&str> {
            vec!["traceparent", "tracestate"]
        }
    }
    if traceparent.is_empty() {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&Carrier(traceparent, tracestate));
    let _ = span.set_parent(cx);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn lines(&self) -> Vec<serde_json::Value> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect()
        }
    }

    /// A JSON log line inside a span carries the span's trace id and span id (those of its `traceparent`),
    /// with an explicit parent too; a line outside any span carries neither, and stays valid JSON.
    #[test]
    fn json_log_lines_carry_the_trace_and_span_ids_of_their_span() {
        let provider = SdkTracerProvider::builder().build();
        let out = Buf::default();
        let writer = out.clone();
        let ids = WithTraceIds::default();
        let with_ids = ids.clone();
        let subscriber = tracing_subscriber::registry()
            .with(otel_layer(provider.tracer("test")))
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .map_event_format(|f| with_ids.wrap(f))
                    .with_writer(move || writer.clone())
                    .with_filter(EnvFilter::new("info")),
            );
        let (inside, explicit) = tracing::subscriber::with_default(subscriber, || {
            ids.set_current();
            tracing::info!("outside");
            let span = tracing::info_span!("deliver", hl7.control_id = "CID1");
            let (inside, _) = trace_context(&span);
            span.in_scope(|| tracing::info!("inside"));
            let other = tracing::info_span!("transform");
            let (explicit, _) = trace_context(&other);
            tracing::info!(parent: &other, "explicit parent");
            (inside, explicit)
        });
        let lines = out.lines();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0]["fields"]["message"], "outside");
        assert!(lines[0].get("trace_id").is_none(), "{}", lines[0]);
        for (line, traceparent) in [(&lines[1], &inside), (&lines[2], &explicit)] {
            // traceparent: 00-<trace id>-<span id>-<flags>
            let parts: Vec<&str> = traceparent.split('-').collect();
            assert_eq!(line["trace_id"], parts[1], "{line}");
            assert_eq!(line["span_id"], parts[2], "{line}");
            assert!(line["timestamp"].is_string(), "{line}");
        }
        assert_eq!(lines[1]["fields"]["message"], "inside");
        assert_eq!(lines[1]["span"]["hl7.control_id"], "CID1");
    }

    /// A `kafka_span!` carries the messaging conventions for its kind, and its record's place once
    /// `record_placement` says it: a delivery report without an offset records no partition and offset.
    #[test]
    fn kafka_spans_carry_the_messaging_conventions_and_their_place() {
        let out = Buf::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(move || writer.clone())
                .with_filter(EnvFilter::new("info")),
        );
        tracing::subscriber::with_default(subscriber, || {
            let parent = tracing::info_span!("transform");
            let span =
                crate::kafka_span!(producer, parent: &parent, "publish", hl7.control_id = "C1");
            record_placement(&span, Some("hl7.inbound"), Some((2, -1)));
            span.in_scope(|| tracing::info!("placed, no offset"));
            record_placement(&span, None, Some((2, 7)));
            span.in_scope(|| tracing::info!("offset known"));
            let consumer = crate::kafka_span!(consumer, "deliver", hl7.destination = "lab");
            consumer.in_scope(|| tracing::info!("consumer"));
            let topic = String::from("hl7.out.lab");
            let read =
                crate::kafka_span!(consumer, record: (topic, 1, 42), "deliver", hl7.route = "r");
            read.in_scope(|| tracing::info!("a record read"));
            let dead = crate::kafka_span!(producer, parent: &read, topic: "hl7.dlq", "dead_letter", hl7.reason = "x");
            dead.in_scope(|| tracing::info!("a dead letter"));
        });
        let lines = out.lines();
        assert_eq!(lines.len(), 5, "{lines:?}");
        let span = &lines[0]["span"];
        assert_eq!(span["name"], "publish");
        assert_eq!(span["otel.kind"], "producer");
        assert_eq!(span["messaging.system"], "kafka");
        assert_eq!(span["messaging.operation.type"], "send");
        assert_eq!(span["messaging.destination.name"], "hl7.inbound");
        assert_eq!(span["hl7.control_id"], "C1");
        assert!(span.get("messaging.kafka.offset").is_none(), "{span}");
        assert!(
            span.get("messaging.destination.partition.id").is_none(),
            "{span}"
        );
        assert_eq!(lines[0]["spans"][0]["name"], "transform", "the parent");
        let span = &lines[1]["span"];
        assert_eq!(span["messaging.destination.partition.id"], "2");
        assert_eq!(span["messaging.kafka.offset"], 7);
        let span = &lines[2]["span"];
        assert_eq!(span["otel.kind"], "consumer");
        assert_eq!(span["messaging.operation.type"], "process");
        assert!(span.get("messaging.destination.name").is_none(), "{span}");
        let span = &lines[3]["span"];
        assert_eq!(span["messaging.destination.name"], "hl7.out.lab");
        assert_eq!(span["messaging.destination.partition.id"], "1");
        assert_eq!(span["messaging.kafka.offset"], 42);
        assert_eq!(span["hl7.route"], "r");
        let span = &lines[4]["span"];
        assert_eq!(span["otel.kind"], "producer");
        assert_eq!(span["messaging.destination.name"], "hl7.dlq");
        assert!(span.get("messaging.kafka.offset").is_none(), "{span}");
        assert_eq!(lines[4]["spans"][0]["name"], "deliver", "the parent");
    }

    /// `OTEL_SERVICE_NAME` wins, then `service.name` from `OTEL_RESOURCE_ATTRIBUTES`, then the binary's name;
    /// the resource carries `service.version`.
    #[test]
    fn service_name_and_version() {
        assert_eq!(service_name("hl7gw-egress", None, None), "hl7gw-egress");
        assert_eq!(service_name("hl7gw-egress", Some(""), None), "hl7gw-egress");
        assert_eq!(
            service_name("hl7gw-egress", None, Some("egress-eu")),
            "egress-eu"
        );
        assert_eq!(
            service_name("hl7gw-egress", Some("egress-lab"), Some("egress-eu")),
            "egress-lab"
        );
        let r = resource("hl7gw-egress".into());
        let get = |k: &'static str| {
            r.get(&opentelemetry::Key::from_static_str(k))
                .map(|v| v.to_string())
        };
        assert_eq!(get("service.name").as_deref(), Some("hl7gw-egress"));
        assert_eq!(
            get(semconv::SERVICE_VERSION).as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        // The hostname, so that a backend tells one host's spans from another's.
        assert_eq!(get(semconv::HOST_NAME), host_name());
        assert!(get(semconv::HOST_NAME).is_some_and(|h| !h.is_empty()));
    }

    /// A span continuing a remote context keeps its `tracestate` (vendors' entries travel with `traceparent`).
    #[test]
    fn tracestate_travels_with_traceparent() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry().with(otel_layer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("transform");
            set_parent(
                &span,
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "vendor=abc,other=1",
            );
            let (traceparent, tracestate) = trace_context(&span);
            assert!(traceparent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"));
            assert!(!traceparent.contains("b7ad6b7169203331"), "{traceparent}");
            assert_eq!(tracestate, "vendor=abc,other=1");
        });
    }

    /// rdkafka asks `log_enabled!(target: "librdkafka", DEBUG)` each time a client config is made (readiness
    /// checks make them): an answer "no" from every layer must not take the trace context away from the next
    /// message span on the same thread.
    #[test]
    fn a_refused_log_level_question_does_not_drop_the_next_span() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(otel_layer(provider.tracer("test")))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::sink)
                    .with_filter(EnvFilter::new("info,hl7gw_runtime=debug")),
            );
        tracing::subscriber::with_default(subscriber, || {
            for round in 0..3 {
                let question = log::Metadata::builder()
                    .level(log::Level::Debug)
                    .target("librdkafka")
                    .build();
                // No event follows the question: what the layers answered stays on the thread.
                let _ = log::Log::enabled(&tracing_log::LogTracer::new(), &question);
                let span = tracing::info_span!("message", round);
                let (traceparent, _) = trace_context(&span);
                assert!(
                    !traceparent.is_empty(),
                    "round {round}: the span after a refused log level question has no trace context"
                );
            }
        });
    }
}
