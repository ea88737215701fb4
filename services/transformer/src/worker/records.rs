//! What routing one inbound record makes: the records to produce in the transaction, and where the input was read.

use crate::config::Config;
use hl7gw_runtime::proto::v1::Envelope;
use rdkafka::message::{Message, OwnedMessage};

/// One record to produce inside the transaction.
#[derive(Debug)]
pub struct OutRecord {
    pub topic: String,
    pub key: String,
    pub envelope: Envelope,
    pub traceparent: String,
    /// The `transform` span the record comes from: its `publish` span, made when the record is produced, is
    /// that span's child (none for a record made of something that is not an envelope).
    pub parent: tracing::Span,
}

/// Where an inbound record was read: the consumer span's `messaging.*` attributes.
#[derive(Debug, Clone, Copy)]
pub struct Consumed<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub group: &'a str,
}

/// The result of routing one inbound record.
#[derive(Debug, Default)]
pub struct Routed {
    pub records: Vec<OutRecord>,
    pub outcome: &'static str,
    /// The ledger's `dropped` events: one per route whose `toFhir` skipped the message (`fhir_unsupported`), and
    /// one when nothing was made of the message (no route took it, nothing asked).
    pub dropped: Vec<hl7gw_runtime::proto::v1::Event>,
}

/// Where `m` was read, for a dead letter's origin.
pub(super) fn consumed_at<'a>(m: &'a OwnedMessage, cfg: &'a Config) -> Consumed<'a> {
    Consumed {
        topic: m.topic(),
        partition: m.partition(),
        offset: m.offset(),
        group: &cfg.group_id,
    }
}

pub(super) fn h_of(env: &Envelope) -> hl7gw_runtime::proto::v1::Header {
    env.header.clone().unwrap_or_default()
}
