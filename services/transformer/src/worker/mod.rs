//! Consume, transform, produce — in Kafka transactions. A batch of inbound records becomes the output (and DLQ)
//! records plus the consumer offsets, committed together: after a crash either all of a batch's effects are
//! visible to read_committed consumers or none are, and the batch is consumed again.
//!
//! The files: `transaction` (the loop), `route` (one record, no Kafka), `records` (what routing makes),
//! `dead_letters`, `produce` (records and ledger events to the producer), `health` (readiness), `blocking`
//! (librdkafka's blocking calls).

mod blocking;
mod dead_letters;
mod health;
mod produce;
mod records;
mod route;
mod transaction;

pub use blocking::{MAX_ABANDONED_CALLS, abandoned_reason};
pub use health::WorkerHealth;
pub use records::{Consumed, OutRecord, Routed};
pub use route::{route_consumed, route_one};
pub use transaction::{Consumer_, ProducerFactory, Worker, WorkerError};
