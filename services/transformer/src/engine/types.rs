//! A compiled route and its parts: matcher, conditions, steps, plugins, and the errors a route or a step ends in.

use super::glob::Glob;
use crate::route::OnFailure;
use hl7gw_runtime::proto::v1::TransformRequest;
use hl7v2::Path;
use regex::Regex;
use std::collections::BTreeMap;
use std::time::Duration;

/// Content type of an ER7 message.
pub const HL7_CONTENT_TYPE: &str = "application/hl7-v2";

/// Content type of the canonical JSON form.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// The content type of a `toFhir` step's output.
pub const FHIR_CONTENT_TYPE: &str = "application/fhir+json";

/// Why a route was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouteError {
    #[error("destinations: {0}")]
    Destination(String),
    #[error("match: {0}")]
    Match(SpecError),
    #[error("transforms[{index}]: {reason}")]
    Step { index: usize, reason: SpecError },
    #[error("keyPaths: {0}")]
    Key(SpecError),
}

/// Why one part of a route (a path, a condition, a step, a `toFhir` setting) cannot run as written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Path(#[from] hl7v2::PathError),
    #[error("segment {0:?}: three letters or digits, not MSH")]
    SegmentName(String),
    #[error("where {0}: exactly one of equals, in, regex, exists")]
    OneCondition(String),
    #[error("where {path}: regex: {source}")]
    Regex { path: String, source: regex::Error },
    #[error("renameSegment: from and to are both {0:?}; nothing to rename")]
    RenameToItself(String),
    #[error("hash: environment variable {0} is not set")]
    SaltUnset(String),
    #[error("plugin endpoint {0:?}: expected http://host:port or https://host:port")]
    PluginEndpoint(String),
    #[error(
        "exactly one of set, copy, clear, map, deleteSegment, renameSegment, mask, hash, toJson, plugin (found {0})"
    )]
    StepKinds(usize),
    #[error("only plugin steps may follow toJson and toFhir (step {0})")]
    AfterJson(usize),
    #[error(
        "onFailure: skip is not allowed in a route that de-identifies (mask or hash): a skipped plugin would pass \
         the message on unchanged; use deadLetter"
    )]
    SkipWhileDeidentifying,
    /// A `toFhir` time zone, field map or code map the converter refused (its words).
    #[error("toFhir {0}")]
    Fhir(String),
    #[error("toFhir write: {0:?} is not a resource type the converter writes ({list})", list = hl7gw_fhir::RESOURCE_TYPES.join(", "))]
    FhirResourceType(String),
    #[error("toFhir codeMaps.{name}: {reason}")]
    CodeMap { name: String, reason: String },
    #[error("senders.{name}: {source}")]
    Sender {
        name: String,
        source: Box<SpecError>,
    },
}

/// Why a route does not take a message: the first of its conditions that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("messageTypes")]
    MessageTypes,
    #[error("sendingApplications")]
    SendingApplications,
    #[error("test traffic (HL7GW-TEST) and the route does not name it")]
    TestTraffic,
    #[error("sendingFacilities")]
    SendingFacilities,
    #[error("versions")]
    Versions,
    /// A `where` condition, by its path.
    #[error("where {0}")]
    Where(String),
}

/// Why a transform step failed on a message. `kind` is a bounded label for metrics and the DLQ reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{route} step {step} ({kind}): {detail}")]
pub struct StepError {
    pub route: String,
    pub step: usize,
    pub kind: &'static str,
    pub detail: String,
}

/// A compiled route.
#[derive(Debug)]
pub struct Route {
    pub name: String,
    pub priority: i32,
    pub destinations: Vec<String>,
    pub(super) matcher: Matcher,
    pub(super) steps: Vec<Step>,
    /// Paths of the output key (empty: the inbound key).
    pub(super) key_paths: Vec<Path>,
}

/// What a route made of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub message: Vec<u8>,
    pub content_type: &'static str,
    /// The output key from the route's `keyPaths` (None: the route keeps the inbound key).
    pub key: Option<String>,
    /// Plugin steps that failed and were skipped (`onFailure: skip`).
    pub plugins_skipped: usize,
    /// What a `toFhir` step did not map: segment and field ids (`ZPI`, `PID-10`), never values.
    pub fhir_unmapped: Vec<String>,
    /// A `toFhir` step with `onUnsupported: skip` met a message type it does not map: the route makes no
    /// output for this message.
    pub skipped_unsupported: bool,
}

#[derive(Debug, Default)]
pub(super) struct Matcher {
    pub(super) types: Vec<(Glob, Option<Glob>)>,
    pub(super) applications: Vec<Glob>,
    pub(super) facilities: Vec<Glob>,
    pub(super) versions: Vec<Glob>,
    pub(super) predicates: Vec<(Path, String, Cond)>,
}

#[derive(Debug)]
pub(super) enum Cond {
    Equals(String),
    In(Vec<String>),
    Regex(Regex),
    Exists(bool),
}

#[derive(Debug)]
pub(super) enum Step {
    Set(Path, String),
    Copy(Path, Path),
    Clear(Path),
    Map {
        path: Path,
        table: BTreeMap<String, String>,
        default: Option<String>,
    },
    DeleteSegment(String),
    RenameSegment(String, String),
    Mask(Path, String),
    Hash(Path, String),
    ToJson,
    ToFhir(Box<FhirStep>),
    Plugin(Plugin),
}

/// A `toFhir` step: the converter's options, and whether a message type it does not map is skipped (the
/// route makes no output, counted and on the ledger) instead of dead-lettered.
#[derive(Debug, Clone)]
pub struct FhirStep {
    pub options: hl7gw_fhir::Options,
    pub skip_unsupported: bool,
    /// The files its options were read from (code maps): the routes are read again when one changes.
    pub files: Vec<std::path::PathBuf>,
}

/// A plugin step's settings.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub endpoint: String,
    pub timeout: Duration,
    pub on_failure: OnFailure,
    pub params: BTreeMap<String, String>,
}

/// Calls `hl7gw.v1.Transform` plugins; the engine is generic over it so tests can run without a network.
pub trait PluginCaller: Send + Sync {
    /// Sends `req` to the plugin and returns `(message, content_type)` or a bounded reason.
    fn call(
        &self,
        plugin: &Plugin,
        req: TransformRequest,
    ) -> impl Future<Output = Result<(Vec<u8>, String), String>> + Send;
}

/// What the steps made: the message, its content type, the last HL7 form when it is no longer HL7, the plugin
/// steps skipped, what `toFhir` did not map, whether `toFhir` skipped a type it does not map.
pub(super) type StepsDone = (
    Vec<u8>,
    &'static str,
    Option<Vec<u8>>,
    usize,
    Vec<String>,
    bool,
);
