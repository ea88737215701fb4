//! The delivery context of one destination (its config, clients, metrics, state) and what a delivery ends in.

use super::state::DestState;
use crate::config::{Config, Destination};
use crate::metrics::{DestMetrics, EgressMetrics};
use crate::mllp_client::Tls;
use hl7gw_runtime::dedup::Dedup;
use hl7gw_runtime::proto::v1::Event;
use rdkafka::consumer::StreamConsumer;
use std::sync::Arc;

pub type DestConsumer = StreamConsumer<hl7gw_runtime::kafka::Assignment>;

/// The stage name the egress writes in dead letters and events.
pub(super) const STAGE: &str = "egress";

/// Everything a destination's workers share.
pub struct DestCtx {
    pub name: String,
    pub topic: String,
    pub dest: Arc<Destination>,
    pub tls: Option<Tls>,
    /// The pooled HTTP(S) client of a destination with a `url` (shared by its partition workers).
    pub http: Option<Arc<crate::http::HttpClient>>,
    pub cfg: Arc<Config>,
    pub consumer: Arc<DestConsumer>,
    pub producer: Arc<hl7gw_runtime::kafka::producer::ProducerSlot>,
    /// The ledger's events' producer (lingering; see `ledger.linger`).
    pub ledger: Arc<hl7gw_runtime::kafka::producer::ProducerSlot>,
    pub metrics: EgressMetrics,
    /// This destination's per-message handles.
    pub m: DestMetrics,
    pub dedup: Dedup,
    pub state: DestState,
}

impl std::fmt::Debug for DestCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DestCtx")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How a delivery ended.
#[derive(Debug, PartialEq)]
pub(super) enum Done {
    /// Accepted or dead-lettered (with the ledger's event, written before the offset is stored) or
    /// suppressed (no event: the first delivery has one): the offset may be committed.
    Settled(Option<Box<Event>>),
    /// Shutdown or the partition moved: the offset stays, the message will be read again.
    Abandoned,
}
