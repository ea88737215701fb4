//! The one client context every Kafka client of the services has: librdkafka's errors and logs (bounded,
//! never secrets), its statistics, and what they say for readiness.

use rdkafka::client::ClientContext;
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;

/// The last errors the Kafka clients of this process reported (librdkafka's error callback), for readiness:
/// the last authentication/TLS failure is kept apart, so the "all brokers down" that follows it does not hide it.
#[derive(Default)]
struct ClientErrors {
    credentials: Option<(std::time::Instant, String)>,
    other: Option<(std::time::Instant, String)>,
    logged_credentials: Option<std::time::Instant>,
    logged_other: Option<std::time::Instant>,
}

static CLIENT_ERRORS: std::sync::Mutex<Option<ClientErrors>> = std::sync::Mutex::new(None);

/// Partition leadership in motion (a topic just created, a broker failing over, a leader election): the same
/// metadata or offsets request succeeds once the cluster has settled, so callers retry it for a while.
pub fn leadership_moving(error: &rdkafka::error::KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownLeaderEpoch
                | RDKafkaErrorCode::FencedLeaderEpoch
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::OperationTimedOut
        )
    )
}

/// One log line per kind of client error per this long (librdkafka reports each failed connection attempt).
const CLIENT_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// Records a client error (called from every client context's `error` callback) and logs it, at most once
/// per 10 s per kind: at ERROR for authentication and TLS failures (a configuration or a Secret to fix), at
/// WARN for broker transport errors, which every failover and rolling restart produces and the services ride
/// out.
pub fn client_error(error: &rdkafka::error::KafkaError, reason: &str) {
    use rdkafka::types::RDKafkaErrorCode as C;
    let credentials = matches!(
        error.rdkafka_error_code(),
        Some(
            C::Authentication
                | C::SaslAuthenticationFailed
                | C::SSL
                | C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::TransactionalIdAuthorizationFailed
        )
    );
    let now = std::time::Instant::now();
    let mut guard = CLIENT_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    let e = guard.get_or_insert_with(ClientErrors::default);
    let logged = if credentials {
        e.credentials = Some((
            now,
            format!("kafka authentication/TLS/authorization failed: {reason}"),
        ));
        &mut e.logged_credentials
    } else {
        e.other = Some((now, format!("kafka: {reason}")));
        &mut e.logged_other
    };
    if logged.is_some_and(|at| now.duration_since(at) < CLIENT_ERROR_LOG_EVERY) {
        return;
    }
    *logged = Some(now);
    drop(guard);
    if credentials {
        tracing::error!(error = %error, reason, "kafka: authentication, TLS or authorization (ACL) failed; check kafka.security and the user's ACLs (repeats are logged every 10 s)");
    } else {
        tracing::warn!(error = %error, reason, "kafka client error (repeats are logged every 10 s)");
    }
}

/// librdkafka's log lines through `tracing`. Connection failures (`FAIL`) go at WARN: the error callback
/// ([`client_error`]) already says, at the right level, what they mean.
pub fn client_log(level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
    use rdkafka::config::RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error if fac != "FAIL" => {
            tracing::error!(target: "librdkafka", "{fac} {message}")
        }
        L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => {
            tracing::warn!(target: "librdkafka", "{fac} {message}")
        }
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "{fac} {message}"),
        L::Debug => tracing::debug!(target: "librdkafka", "{fac} {message}"),
    }
}

/// The last client error reported within `within`, if any: an authentication/TLS failure first.
pub fn recent_client_error(within: Duration) -> Option<String> {
    let guard = CLIENT_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    let e = guard.as_ref()?;
    let recent = |x: &Option<(std::time::Instant, String)>| {
        x.as_ref()
            .filter(|(at, _)| at.elapsed() <= within)
            .map(|(_, what)| what.clone())
    };
    recent(&e.credentials).or_else(|| recent(&e.other))
}

/// Whether Kafka answered a readiness probe's metadata request (`None` if not) and, when it was for a `named` topic, whether that
/// topic has partitions.
pub fn metadata_ok(
    answer: rdkafka::error::KafkaResult<rdkafka::metadata::Metadata>,
    named: Option<&str>,
) -> Option<bool> {
    let m = answer.ok()?;
    Some(named.is_none_or(|name| {
        m.topics()
            .iter()
            .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
    }))
}

/// The readiness failure of a metadata probe (see [`metadata_ok`]) for `named`, if any.
pub fn metadata_failure(ok: Option<bool>, named: Option<&str>) -> Option<String> {
    match ok {
        None => Some(unreachable_reason()),
        Some(false) => Some(format!(
            "topic {} does not exist or has no partitions",
            named.unwrap_or_default()
        )),
        Some(true) => None,
    }
}

/// A consumer error that stops all reading until someone fixes it (authorisation, a missing topic), as
/// opposed to a broker away for a while, which librdkafka recovers from by itself.
pub fn stops_reading(e: &rdkafka::error::KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
        )
    )
}

/// Why Kafka did not answer a readiness probe: the clients' last error when recent (a refused password or
/// certificate says so), else that no broker answered.
pub fn unreachable_reason() -> String {
    recent_client_error(Duration::from_secs(60))
        .unwrap_or_else(|| "kafka: no broker answered the metadata request".to_owned())
}

/// The context of the services' producers and admin clients: errors go to [`client_error`], librdkafka's
/// log lines through `tracing`.
#[derive(Debug, Clone, Copy, Default)]
pub struct KafkaContext;

impl ClientContext for KafkaContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        client_error(&error, reason);
    }
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        client_log(level, fac, message);
    }
    fn stats_raw(&self, statistics: &[u8]) {
        super::stats::record(statistics);
    }
}

impl rdkafka::consumer::ConsumerContext for KafkaContext {}
