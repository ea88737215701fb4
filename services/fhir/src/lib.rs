//! hl7gw-fhir: an HL7 v2 message as a FHIR R4 Bundle (JSON), following the HL7 Version 2 to FHIR
//! implementation guide (1.0.0 STU1): its message, segment and data type maps, and its concept maps, compiled
//! from the IG's own tables (`ig/`). Written straight from the parsed message into one output buffer.
//!
//! What the IG leaves to the implementer is in [`Options`]: the Bundle type, identifier systems, the time
//! zone of times without an offset, what happens to what is not mapped. Resource ids are derived from business
//! identifiers (or, without one, from the message), so converting the same message twice gives the same
//! Bundle, and a transaction Bundle updates what an earlier delivery created instead of duplicating it.

mod adt;
mod common;
mod dt;
mod extra;
pub mod json;
mod mdm;
mod order;
mod siu;
pub mod vocab;
mod vxu;

use hl7v2::{Charset, Message};
use std::collections::BTreeMap;

/// What kind of Bundle a route produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BundleType {
    /// `transaction`: each entry with its request (conditional update by business identifier, else an update
    /// by the derived id), for a FHIR server's base URL. Delivered twice, it changes nothing the second time.
    #[default]
    Transaction,
    /// `message`: a MessageHeader first, then the resources (for `$process-message` or a messaging system).
    Message,
}

/// What happens to segments and fields the maps do not cover (Z-segments among them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unmapped {
    /// Listed in [`Outcome::unmapped`] (field ids, never values); the Bundle carries only what is mapped.
    #[default]
    Report,
    /// Also kept, with their values, in extensions on the Bundle's `meta`
    /// (`https://hl7gw.io/fhir/StructureDefinition/unmapped`).
    Extension,
}

/// The route's choices where the IG leaves them open.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub bundle_type: BundleType,
    /// Identifier systems by assigning authority (CX-4 / EI-2 namespace id), e.g. `HOSP` to
    /// `https://hospital.example/mrn`. An authority with an ISO OID (HD-2, HD-3 `ISO`) is `urn:oid:<oid>`.
    pub identifier_systems: BTreeMap<String, String>,
    /// The system of an identifier whose authority is neither in `identifier_systems` nor an OID: this prefix
    /// and the namespace id (default `urn:hl7gw:id:`).
    pub identifier_system_prefix: Option<String>,
    /// Coding systems by v2 name of coding system (CWE-3), beyond the HL7 tables and the well-known ones
    /// (`LN`, `SCT`, `I10`, `UCUM`...), e.g. `L` or `99LAB` to a local code system's URI.
    pub code_systems: BTreeMap<String, String>,
    /// The UTC offset (`+01:00`, `-05:00`, `Z`) of v2 times written without one. Absent: such times keep only
    /// their date (FHIR needs an offset with a time of day).
    pub timezone: Option<String>,
    pub unmapped: Unmapped,
    /// When the gateway received the message (RFC 3339), for `Bundle.timestamp` and `Provenance.recorded`
    /// when MSH-7 has no offset.
    pub received_at: Option<String>,
}

/// What a conversion produced besides the Bundle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Resources in the Bundle.
    pub resources: usize,
    /// Segments and fields with a value that no map covers: `ZPI`, `PID-10`, ... (ids only, never values).
    pub unmapped: Vec<String>,
}

/// Why a message could not be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FhirError {
    /// No message map for this type and trigger (yet).
    #[error("no FHIR map for {0}")]
    Unsupported(String),
    /// A segment the map needs is missing.
    #[error("{message}: no {segment} segment")]
    Missing {
        message: String,
        segment: &'static str,
    },
    /// A value the resource cannot do without is empty.
    #[error("{0} is empty, and the FHIR resource needs it")]
    Required(&'static str),
}

/// The message types and triggers [`convert`] maps.
pub const SUPPORTED: &[&str] = &[
    "ADT^A01", "ADT^A02", "ADT^A03", "ADT^A04", "ADT^A05", "ADT^A06", "ADT^A07", "ADT^A08",
    "ADT^A11", "ADT^A13", "ADT^A28", "ADT^A31", "ORU^R01", "ORM^O01", "OML^O21", "VXU^V04",
    "MDM^T02", "MDM^T04", "MDM^T06", "MDM^T08", "MDM^T10", "SIU^S12", "SIU^S13", "SIU^S14",
    "SIU^S15", "SIU^S16", "SIU^S17", "SIU^S26",
];

/// Whether [`convert`] maps `msg`'s message type and trigger event (one of [`SUPPORTED`]).
pub fn supports(msg: &Message<'_>) -> bool {
    let h = msg.header();
    SUPPORTED.iter().any(|s| {
        s.split_once('^')
            .is_some_and(|(t, e)| t.as_bytes() == h.message_type && e.as_bytes() == h.trigger_event)
    })
}

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
    let mut cx = dt::Ctx::new(msg, charset, opts);
    cx.received_at = received_at.or(opts.received_at.as_deref());
    match h.message_type {
        b"ADT" => adt::convert(&mut cx, &kind, out),
        b"ORU" | b"ORM" | b"OML" => order::convert(&mut cx, &kind, out),
        b"VXU" => vxu::convert(&mut cx, &kind, out),
        b"MDM" => mdm::convert(&mut cx, &kind, out),
        b"SIU" => siu::convert(&mut cx, &kind, out),
        _ => Err(FhirError::Unsupported(kind)),
    }
}

#[cfg(test)]
mod tests;
