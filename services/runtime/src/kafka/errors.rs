//! The classes of librdkafka's errors every service acts on: a producer broken for good, a record Kafka will
//! never take, a transactional call that may be made again.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// A fatal producer error: the producer cannot be used again (librdkafka's `__FATAL`: fenced, or an idempotent
/// producer that lost its sequence; for a transactional call, the error's own fatal flag).
pub fn is_fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => t.is_fatal(),
        _ => e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal),
    }
}

/// A transactional call librdkafka says may be made again as it is (not fatal, no abort needed).
pub fn is_retriable_transactional(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => t.is_retriable() && !t.is_fatal() && !t.txn_requires_abort(),
        _ => false,
    }
}

/// A record over librdkafka's or the topic's size limit.
pub fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::MessageBatchTooLarge
        )
    )
}

/// The dead-letter reason of an error that refuses one record for good (sending it again cannot help): a record
/// over a size limit (`too_large`), or one the broker finds invalid (`invalid_record`). `None` for every other
/// error.
pub fn refused_for_good(e: &KafkaError) -> Option<&'static str> {
    if is_too_large(e) {
        return Some("too_large");
    }
    (e.rdkafka_error_code() == Some(RDKafkaErrorCode::InvalidRecord)).then_some("invalid_record")
}

/// Runs a blocking librdkafka call (a transaction's begin, commit or abort, a consumer's seek, a flush) on
/// tokio's blocking threads; a call whose thread was lost ends as [`KafkaError::Canceled`].
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_errors_and_invalid_records_are_refused_for_good() {
        let e = |c| KafkaError::MessageProduction(c);
        assert_eq!(
            refused_for_good(&e(RDKafkaErrorCode::MessageSizeTooLarge)),
            Some("too_large")
        );
        assert_eq!(
            refused_for_good(&e(RDKafkaErrorCode::InvalidRecord)),
            Some("invalid_record")
        );
        assert_eq!(refused_for_good(&e(RDKafkaErrorCode::QueueFull)), None);
        assert!(is_fatal(&e(RDKafkaErrorCode::Fatal)));
        assert!(!is_fatal(&e(RDKafkaErrorCode::QueueFull)));
        assert!(!is_retriable_transactional(&e(RDKafkaErrorCode::QueueFull)));
    }
}
