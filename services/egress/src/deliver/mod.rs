//! Delivery to one destination: a consumer group on `hl7.out.<destination>`, one worker per partition. A worker
//! delivers records of different keys (patients) at once and the records of one key one at a time in offset
//! order ([`window`]), up to the destination's `max_in_flight` deliveries (their bytes bounded with the rest of
//! the partition's by `queue_bytes_per_partition`); an MLLP destination's worker keeps `connections`
//! connections, one message in flight on each, an HTTP destination's share the pooled client. An offset is stored for commit only once every record up to it
//! was accepted by the receiver or went to the DLQ (and its ledger event was written), so a crash redelivers
//! at most what was in flight or waiting behind it.
//!
//! The files: `ctx` (a destination's context), `consumer` (its consumer loop), `lanes` (what is read ahead per
//! partition), `partition` (a partition's worker), `window` (the per-key order), `record` (one record, any
//! protocol), `mllp` and `http` (the protocols), `dead_letters`, `state` (readiness and status).

mod consumer;
mod ctx;
mod dead_letters;
mod http;
mod lanes;
mod mllp;
mod partition;
mod record;
mod state;
pub mod window;

pub use ctx::{DestConsumer, DestCtx};
pub use state::{DLQ_FAILING_UNREADY, DestState, Head};
