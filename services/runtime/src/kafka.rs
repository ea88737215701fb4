//! Kafka client setup shared by the services: one settings builder per client role (producer, transactional
//! producer, consumer, DLQ reader, admin) that applies `kafka.security` and `kafka.properties` the same way for
//! all of them, topic creation, and what a client's errors say for readiness.
//!
//! The files: `settings` (the `kafka:` section), `clients` (a config per client role), `context` (the client
//! context: errors, logs, statistics, readiness), `topics`, `producer` and `delivery` (the producer that
//! recovers in-process, its reports on tokio), `assignment` (the consumer context), `errors`, `offsets`,
//! `security`, `stats`, `unreadable`.

pub mod assignment;
pub mod clients;
pub mod context;
pub mod delivery;
pub mod errors;
pub mod offsets;
pub mod producer;
pub mod security;
pub mod settings;
pub mod stats;
pub mod topics;
pub mod unreadable;

pub use assignment::Assignment;
pub use clients::{
    ClientConfigError, Commit, TransactionalProducer, admin_config, check_clients, check_config,
    consumer_config, producer_config, reader_config, transactional_producer_config,
};
pub use context::{
    KafkaContext, client_error, client_log, leadership_moving, metadata_failure, metadata_ok,
    recent_client_error, stops_reading, unreachable_reason,
};
/// The services' producer: delivery reports served on tokio.
pub use delivery::Producer;
pub use security::KafkaSecurity;
pub use settings::{DEFAULT_MAX_MESSAGE_BYTES, KafkaSettings, PROTECTED_PROPERTIES};
pub use topics::{TopicError, consumer_lag, ensure_topics, ensure_topics_with};
pub use unreadable::Unreadable;
