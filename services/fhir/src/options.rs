//! What a conversion is asked to do (`Options`: bundle type, write modes, senders, identifier rules, time zone,
//! code maps) and what it ends in (`Outcome`, `FhirError`); the message types it supports.

use crate::{CodeMap, FieldMap, TimeZone};
use hl7v2::Message;
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// How a transaction Bundle may change a resource on the server (docs/fhir.md, "Write semantics").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// `PUT`: a conditional update by the business identifier (else an update by the derived id); what the
    /// message carries replaces what the server holds. The default for the messages that own the resource.
    Update,
    /// `POST` with `ifNoneExist` on the business identifier: created when the server has none, else the
    /// server's is referenced and left as it is. The default for messages that only mention the resource.
    CreateIfAbsent,
    /// Not written at all: references name it by its business identifier (`Patient?identifier=...`), which
    /// the server resolves (and refuses the Bundle when it holds none). A resource without one is written as
    /// `CreateIfAbsent` would.
    Reference,
}

/// Which repetition of PID-3 identifies the patient (the match key), when a sender sends several.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentifierRule {
    /// The identifier type (CX-5), e.g. `MR`.
    pub type_code: Option<String>,
    /// The assigning authority's namespace id (CX-4.1, else CX-6.1), e.g. `HOSP_A`.
    pub authority: Option<String>,
}

/// Settings for one sender of a route that serves several (keyed in [`Options::senders`]).
#[derive(Debug, Clone, Default)]
pub struct Sender {
    /// The assigning authority (namespace id, looked up in `identifier_systems` like a CX-4) of this sender's
    /// identifiers that name none (no CX-4, no CX-6); before MSH-4.
    pub authority: Option<String>,
    /// The time zone of this sender's times written without an offset (instead of the route's).
    pub timezone: Option<TimeZone>,
    /// The patient's match key for this sender (instead of the route's).
    pub patient_identifier: Option<IdentifierRule>,
    /// This sender's code maps, before the route's (same keys as [`Options::code_maps`]).
    pub code_maps: BTreeMap<String, Arc<CodeMap>>,
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
    /// The time zone (an IANA name such as `America/New_York`, daylight saving applied per value, or a fixed
    /// offset) of v2 times written without an offset. Absent: such times keep only their date (FHIR needs an
    /// offset with a time of day).
    pub timezone: Option<TimeZone>,
    pub unmapped: Unmapped,
    /// When the gateway received the message (RFC 3339), for `Bundle.timestamp` and `Provenance.recorded`
    /// when MSH-7 has no offset.
    pub received_at: Option<String>,
    /// How each resource type may be written, over the defaults (transaction Bundles only): e.g.
    /// `Patient` → [`Write::Reference`] for a route whose Patients are owned by another system.
    pub write: BTreeMap<String, Write>,
    /// The patient's match key among PID-3's repetitions (default: the first identifier with a value).
    pub patient_identifier: Option<IdentifierRule>,
    /// Per sender: `APP^FAC` (MSH-3 and MSH-4 namespace ids), else `FAC`, else `APP`.
    pub senders: BTreeMap<String, Sender>,
    /// Allow a patient identifier with no assigning authority anywhere (no CX-4, CX-6, sender authority or
    /// MSH-4) into one global namespace (`urn:hl7gw:id:unknown`); default: such a message is refused
    /// ([`FhirError::UnscopedIdentity`]), since two senders' `55555` would become one person.
    pub unscoped_identifiers_global: bool,
    /// A site's concept maps: by the IG map they override and extend (`AdministrativeSex`), or by a v2 coding
    /// system name (CWE-3, `99LAB`) whose codes they translate (the translation first, the local code kept).
    pub code_maps: BTreeMap<String, Arc<CodeMap>>,
    /// v2 fields (Z-segments' above all) written as extensions of a resource type.
    pub field_maps: Vec<FieldMap>,
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
    /// The patient's identifier names no assigning authority (CX-4, CX-6), the route has none for the sender
    /// and MSH-4 is empty: it could be anyone's.
    #[error(
        "the patient identifier has no assigning authority (PID-3 CX-4/CX-6 empty, no sender authority in the route, MSH-4 empty)"
    )]
    UnscopedIdentity,
    /// The route names the patient's match key and no PID-3 repetition has it.
    #[error("no PID-3 repetition is the route's patient identifier ({0})")]
    NoMatchKey(String),
}

impl FhirError {
    /// The dead-letter reason (a bounded label): `unscoped_patient_identity`, `no_patient_match_key`, else
    /// `to_fhir`.
    pub fn kind(&self) -> &'static str {
        match self {
            FhirError::UnscopedIdentity => "unscoped_patient_identity",
            FhirError::NoMatchKey(_) => "no_patient_match_key",
            _ => "to_fhir",
        }
    }
}

/// The message types and triggers [`convert`] maps.
pub const SUPPORTED: &[&str] = &[
    "ADT^A01", "ADT^A02", "ADT^A03", "ADT^A04", "ADT^A05", "ADT^A06", "ADT^A07", "ADT^A08",
    "ADT^A09", "ADT^A10", "ADT^A11", "ADT^A12", "ADT^A13", "ADT^A14", "ADT^A17", "ADT^A28",
    "ADT^A31", "ADT^A34", "ADT^A40", "ORU^R01", "ORM^O01", "OML^O21", "VXU^V04", "MDM^T02",
    "MDM^T04", "MDM^T06", "MDM^T08", "MDM^T10", "SIU^S12", "SIU^S13", "SIU^S14", "SIU^S15",
    "SIU^S16", "SIU^S17", "SIU^S26",
];

/// Whether [`convert`] maps `msg`'s message type and trigger event (one of [`SUPPORTED`]).
pub fn supports(msg: &Message<'_>) -> bool {
    let h = msg.header();
    SUPPORTED.iter().any(|s| {
        s.split_once('^')
            .is_some_and(|(t, e)| t.as_bytes() == h.message_type && e.as_bytes() == h.trigger_event)
    })
}
