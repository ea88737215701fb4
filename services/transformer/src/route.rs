//! `HL7Route`: the one schema for routes, as a Kubernetes custom resource (group `hl7gw.io`, `v1alpha1`) and as
//! the documents of a routes file outside a cluster. The CRD YAML is generated from these types
//! (`hl7gw-transformer crd`).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A route: which messages it takes, how it reshapes them, and where they go. Every route that matches a
/// message applies (a message can fan out to several routes); routes run in ascending `priority`, then name.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "hl7gw.io",
    version = "v1alpha1",
    kind = "HL7Route",
    plural = "hl7routes",
    shortname = "hl7r",
    namespaced,
    status = "HL7RouteStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.accepted"}"#,
    printcolumn = r#"{"name":"Destinations","type":"string","jsonPath":".spec.destinations"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HL7RouteSpec {
    /// Evaluation order: lower first (ties by name). Order matters only for logs and dry runs: every matching
    /// route applies.
    #[serde(default)]
    pub priority: i32,
    /// Which messages the route takes; an empty match takes every message.
    #[serde(default, rename = "match")]
    pub matches: Match,
    /// Steps applied in order to a copy of the message.
    #[serde(default)]
    pub transforms: Vec<Transform>,
    /// Destination names; each gets the result on topic `hl7.out.<name>`.
    pub destinations: Vec<String>,
    /// The Kafka key (and `Envelope.key`) of this route's outputs: the values at these terser paths, read
    /// from the message after every transform step (so a hashed field gives its hash; after `toJson`, from the
    /// message as it was before it), joined by `|` as the ingress does. Absent: the inbound key (the ingress's
    /// `key_paths`, by default `MSH-4|PID-3-1` as received), which stays readable even when the route masks or
    /// hashes those fields: a de-identifying route should set this (e.g. `[MSH-4, PID-3-1]` after hashing
    /// PID-3-1). The same patient keeps one key, so one partition and its order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_paths: Vec<String>,
}

/// What a message must look like for a route to take it. Every listed condition must hold; a list holds when
/// any of its patterns matches (`*` any run of characters, `?` one character).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Match {
    /// `TYPE^TRIGGER` patterns (`ADT^A0?`, `ORU^*`); a pattern without `^` matches the type alone (`ADT`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub message_types: Vec<String>,
    /// MSH-3 patterns, matched against the namespace id (MSH-3.1) and the whole field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sending_applications: Vec<String>,
    /// MSH-4 patterns, matched against the namespace id (MSH-4.1) and the whole field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sending_facilities: Vec<String>,
    /// MSH-12 patterns (`2.5*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<String>,
    /// Terser-path predicates on the message's values (escape-decoded, in the message's charset).
    #[serde(default, rename = "where", skip_serializing_if = "Vec::is_empty")]
    pub predicates: Vec<Predicate>,
}

/// A condition on the value at a terser path; exactly one of `equals`, `in`, `regex`, `exists`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Predicate {
    /// A terser path: `PID-3-1`, `OBX(2)-5`, `PID-3(2)-4-1`.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<String>>,
    /// A regular expression (Rust `regex` syntax) the whole value must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// true: the value is present and not empty; false: it is absent or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
}

/// One transform step; exactly one key is set (`- set: {path: MSH-5, value: LAB}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Transform {
    /// Write a value (escaped as needed); missing fields and components are created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<SetStep>,
    /// Copy the value at one path to another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<CopyStep>,
    /// Empty a value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear: Option<PathStep>,
    /// Replace a value through a table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<MapStep>,
    /// Remove every segment with this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_segment: Option<SegmentStep>,
    /// Rename every segment with a name (`ZPI` to `ZPX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename_segment: Option<RenameStep>,
    /// Replace a value with a fixed mask (PHI minimisation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<MaskStep>,
    /// Replace a value with the hex SHA-256 of a salt and the value: still joinable, no longer readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<HashStep>,
    /// Convert to the canonical JSON form (docs/consuming.md); only plugin steps may follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_json: Option<ToJsonStep>,
    /// Convert to a FHIR R4 Bundle (JSON) after the HL7 v2-to-FHIR IG's maps (docs/fhir.md); only plugin steps
    /// may follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_fhir: Option<ToFhirStep>,
    /// Call an external service implementing `hl7gw.v1.Transform`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginStep>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetStep {
    pub path: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CopyStep {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathStep {
    pub path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MapStep {
    pub path: String,
    /// Value to replacement.
    pub table: BTreeMap<String, String>,
    /// Written when the value is not in the table (absent: the value stays as it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SegmentStep {
    pub segment: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenameStep {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaskStep {
    pub path: String,
    /// The replacement (default `***`); an absent or empty value stays empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HashStep {
    pub path: String,
    /// Name of an environment variable of the transformer holding the salt (keep it in a Secret); unset:
    /// no salt, which makes short identifiers guessable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub salt_env: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToJsonStep {}

/// The `toFhir` step's choices where the v2-to-FHIR IG leaves them to the implementer (docs/fhir.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToFhirStep {
    /// `transaction` (default: each resource a conditional update by its business identifier, or an update
    /// by an id derived from it, for a FHIR server's base URL) or `message` (a MessageHeader first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_type: Option<FhirBundleType>,
    /// Identifier systems (URIs) by assigning authority (CX-4, EI-2 namespace id), e.g. `HOSP:
    /// https://hospital.example/mrn`. Authorities with an ISO OID become `urn:oid:<oid>` without this.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub identifier_systems: BTreeMap<String, String>,
    /// The system of other identifiers: this prefix and the authority's namespace id (default
    /// `urn:hl7gw:id:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identifier_system_prefix: Option<String>,
    /// Code system URIs by v2 coding system name (CWE-3) for local codes (`99LAB: https://lab.example/codes`);
    /// HL7 tables and LN, SCT, I10, UCUM, CVX... are known.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub code_systems: BTreeMap<String, String>,
    /// The time zone of the sender's times written without an offset: an IANA name (`America/New_York`,
    /// daylight saving applied per value) or a fixed offset (`+01:00`, `-05:00`, `Z`); absent: those times
    /// keep only their date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// How a transaction Bundle may change each resource type, over the defaults (the messages that own a
    /// resource update it, the others create it only if absent): `update`, `createIfAbsent` or `reference`
    /// (never written, only referenced by its business identifier), e.g. `{Patient: reference}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub write: BTreeMap<String, FhirWrite>,
    /// The patient's match key among PID-3's repetitions (default: the first with a value), e.g.
    /// `{type: MR, authority: HOSP_A}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patient_identifier: Option<FhirIdentifierRule>,
    /// Per sender (`APP^FAC`, MSH-3 and MSH-4 namespace ids, else `FAC`, else `APP`): the authority of its
    /// identifiers that name none, its time zone, its match key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub senders: BTreeMap<String, FhirSender>,
    /// `refuse` (default: a patient identifier with no authority anywhere, neither CX-4, CX-6, the sender's
    /// `authority` nor MSH-4, sends the message to the DLQ as `unscoped_patient_identity`) or `global` (such
    /// identifiers share one namespace: two senders' `55555` become one Patient).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unscoped_identifiers: Option<FhirUnscoped>,
    /// `deadLetter` (default: a message type the converter does not map goes to the DLQ as `to_fhir`) or
    /// `skip` (the route makes no output for it: counted in
    /// `hl7gw_transformer_fhir_skipped_total{route}` and a `dropped` event `fhir_unsupported` on the ledger),
    /// for an `ADT^*` route that should not fill the DLQ with events it does not map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_unsupported: Option<FhirOnUnsupported>,
    /// A site's concept maps, each a file (FHIR ConceptMap JSON, `.json`, or the IG's CSV layout; a mounted
    /// ConfigMap's key is a file too), by the IG concept map it overrides and extends (`AdministrativeSex`,
    /// `PatientClass[EncounterClass]`) or by a v2 coding system name (CWE-3, `99LAB`) whose codes it translates.
    /// Read when the route loads, and again when a file changes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub code_maps: BTreeMap<String, String>,
    /// v2 fields written as extensions: `{from: ZPI-3, to: "Patient.extension[<url>].valueString"}` (value
    /// types String, Code, Boolean, Integer, Decimal, DateTime, CodeableConcept, Identifier).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub field_maps: Vec<FhirFieldMap>,
    /// `report` (default: segments and fields with a value that no map covers are counted in
    /// `hl7gw_transformer_fhir_unmapped_total{route}` and listed by id, never value, in the message's span,
    /// `hl7.fhir.unmapped`) or `extension` (also kept with their values in the Bundle's `meta.extension`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmapped: Option<FhirUnmapped>,
}

/// `toFhir.bundleType`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FhirBundleType {
    #[default]
    Transaction,
    Message,
}

/// `toFhir.write.<resource type>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FhirWrite {
    Update,
    CreateIfAbsent,
    Reference,
}

/// `toFhir.patientIdentifier`: which PID-3 repetition identifies the patient.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FhirIdentifierRule {
    /// The identifier type (CX-5), e.g. `MR`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_code: Option<String>,
    /// The assigning authority's namespace id (CX-4.1, or CX-6.1), e.g. `HOSP_A`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
}

/// `toFhir.senders.<sender>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FhirSender {
    /// The assigning authority (a namespace id, mapped through `identifierSystems`) of this sender's
    /// identifiers that name none; before MSH-4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// This sender's time zone (an IANA name or a fixed offset), instead of the route's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// This sender's patient match key, instead of the route's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patient_identifier: Option<FhirIdentifierRule>,
    /// This sender's code maps (files, as the route's `codeMaps`), before the route's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub code_maps: BTreeMap<String, String>,
}

/// `toFhir.fieldMaps[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FhirFieldMap {
    /// The v2 field: `SEG-n` or `SEG-n-c` (the message's first segment of that name; every repetition).
    pub from: String,
    /// The extension: `<ResourceType>.extension[<url>].value<Type>`.
    pub to: String,
}

/// `toFhir.unscopedIdentifiers`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FhirUnscoped {
    #[default]
    Refuse,
    Global,
}

/// `toFhir.onUnsupported`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FhirOnUnsupported {
    #[default]
    DeadLetter,
    Skip,
}

/// `toFhir.unmapped`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FhirUnmapped {
    #[default]
    Report,
    Extension,
}

/// What a plugin step does when the call fails or times out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// The message goes to the DLQ with the reason (default).
    #[default]
    DeadLetter,
    /// The step is skipped: the message continues unchanged (counted in
    /// `hl7gw_transformer_plugin_skips_total{route}` and logged). Refused in a route with `mask` or `hash` steps.
    Skip,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginStep {
    /// The plugin's gRPC endpoint: `http://host:port` (plain) or `https://host:port` (TLS, checked against the
    /// transformer's `plugin_tls.ca`, with its client certificate when `plugin_tls.cert` is set).
    pub endpoint: String,
    /// Per-call deadline in milliseconds (default 1000).
    // `int32`, a format Kubernetes knows (schemars says `uint32`, which the API server warns about).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub timeout_ms: Option<u32>,
    #[serde(default)]
    pub on_failure: OnFailure,
    /// Passed to the plugin as `TransformRequest.params`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

/// Whether the transformer took the route, and why not.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HL7RouteStatus {
    /// True when the route compiled and is routing.
    pub accepted: bool,
    /// Why the route was refused (the previous version, if any, keeps routing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The `metadata.generation` this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CRD as YAML, as committed in the chart.
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    serde_saphyr::to_string(&HL7Route::crd())
}
