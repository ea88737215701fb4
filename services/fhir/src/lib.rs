//! hl7gw-fhir: an HL7 v2 message as a FHIR R4 Bundle (JSON), following the HL7 Version 2 to FHIR
//! implementation guide (1.0.0 STU1): its message, segment and data type maps, and its concept maps, compiled
//! from the IG's own tables (`ig/`). Written straight from the parsed message into one output buffer.
//!
//! What the IG leaves to the implementer is in [`Options`]: the Bundle type, identifier systems, the time
//! zone of times without an offset, what happens to what is not mapped. Resource ids are derived from business
//! identifiers (or, without one, from the message), so converting the same message twice gives the same
//! Bundle, and a transaction Bundle updates what an earlier delivery created instead of duplicating it.

mod bundle;
mod context;
mod datatypes;
mod ids;
pub mod json;
mod local;
mod location;
mod messages;
mod options;
mod segments;
mod target;
mod time;
pub mod vocab;

use hl7v2::{Charset, Message};

pub use local::{CodeMap, FieldMap, LocalConcept, ValueType};
pub use options::{
    BundleType, FhirError, IdentifierRule, Options, Outcome, SUPPORTED, Sender, Unmapped, Write,
    supports,
};
pub use time::TimeZone;
pub use vocab::RESOURCE_TYPES;

/// Converts `msg` (its text in `charset`) into a FHIR R4 Bundle appended to `out` as JSON.
pub fn convert(
    msg: &Message<'_>,
    charset: Charset,
    opts: &Options,
    out: &mut Vec<u8>,
) -> Result<Outcome, FhirError> {
    convert_received(msg, charset, opts, None, out)
}

/// [`convert`] with the time the gateway received this message (RFC 3339), which overrides
/// [`Options::received_at`]: the route's options stay shared, nothing is copied per message.
pub fn convert_received(
    msg: &Message<'_>,
    charset: Charset,
    opts: &Options,
    received_at: Option<&str>,
    out: &mut Vec<u8>,
) -> Result<Outcome, FhirError> {
    let h = msg.header();
    let kind = format!(
        "{}^{}",
        String::from_utf8_lossy(h.message_type),
        String::from_utf8_lossy(h.trigger_event)
    );
    if !supports(msg) {
        return Err(FhirError::Unsupported(kind));
    }
    let mut cx = context::Ctx::new(msg, charset, opts);
    cx.received_at = received_at.or(opts.received_at.as_deref());
    let start = out.len();
    let done = match h.message_type {
        b"ADT" => messages::adt::convert(&mut cx, &kind, out),
        b"ORU" | b"ORM" | b"OML" => messages::order::convert(&mut cx, &kind, out),
        b"VXU" => messages::vxu::convert(&mut cx, &kind, out),
        b"MDM" => messages::mdm::convert(&mut cx, &kind, out),
        b"SIU" => messages::siu::convert(&mut cx, &kind, out),
        _ => Err(FhirError::Unsupported(kind)),
    };
    // A refusal found while writing (an identity that could be anyone's) wins: nothing of the Bundle stays.
    match cx.take_refusal() {
        Some(e) => {
            out.truncate(start);
            Err(e)
        }
        None => done,
    }
}

#[cfg(test)]
mod tests;
