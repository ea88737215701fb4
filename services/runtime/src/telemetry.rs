//! Logs and traces: `tracing` to stderr (text or JSON), OpenTelemetry spans exported over OTLP when the
//! standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and W3C trace context
//! in and out of Kafka headers.
//!
//! Spans and log lines carry message type, control id, facility names, sizes and codes, never patient data.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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
/// is set).
pub fn init(service: &'static str, json: bool) -> Result<TelemetryGuard, TelemetryError> {
    let mut builder = SdkTracerProvider::builder().with_resource(
        opentelemetry_sdk::Resource::builder()
            .with_service_name(service)
            .build(),
    );
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
    let res = if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
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
    Ok(TelemetryGuard { provider })
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
