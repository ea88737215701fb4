//! Compiled routes: matching a message against `HL7Route`s and running their transform steps.
//!
//! A route is compiled once (paths parsed, regexes built, rules checked) so that a bad route is refused when it
//! is loaded, with a reason, instead of failing message by message.

use crate::route::{HL7RouteSpec, OnFailure, Predicate, Transform};
use hl7gw_runtime::proto::v1::{Envelope, Header, TransformRequest};
use hl7v2::{Charset, Message, Path};
use regex::Regex;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Content type of an ER7 message.
pub const HL7_CONTENT_TYPE: &str = "application/hl7-v2";
/// Content type of the canonical JSON form.
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// The content type of a `toFhir` step's output.
pub const FHIR_CONTENT_TYPE: &str = "application/fhir+json";

/// Why a route was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("destinations: {0}")]
    Destination(String),
    #[error("match: {0}")]
    Match(String),
    #[error("transforms[{index}]: {reason}")]
    Step { index: usize, reason: String },
    #[error("keyPaths: {0}")]
    Key(String),
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
    matcher: Matcher,
    steps: Vec<Step>,
    /// Paths of the output key (empty: the inbound key).
    key_paths: Vec<Path>,
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
struct Matcher {
    types: Vec<(Glob, Option<Glob>)>,
    applications: Vec<Glob>,
    facilities: Vec<Glob>,
    versions: Vec<Glob>,
    predicates: Vec<(Path, String, Cond)>,
}

#[derive(Debug)]
enum Cond {
    Equals(String),
    In(Vec<String>),
    Regex(Regex),
    Exists(bool),
}

#[derive(Debug)]
enum Step {
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

fn path(s: &str) -> Result<Path, String> {
    Path::parse(s).map_err(|e| e.to_string())
}

fn segment_name(s: &str) -> Result<String, String> {
    if s.len() == 3 && s.bytes().all(|b| b.is_ascii_alphanumeric()) && s != "MSH" {
        Ok(s.to_owned())
    } else {
        Err(format!("segment {s:?}: three letters or digits, not MSH"))
    }
}

impl Route {
    /// Compiles a route spec, or says why it cannot run.
    pub fn compile(name: &str, spec: &HL7RouteSpec) -> Result<Self, RouteError> {
        if spec.destinations.is_empty() {
            return Err(RouteError::Destination("at least one is required".into()));
        }
        for d in &spec.destinations {
            hl7gw_runtime::config::check_destination_name(d).map_err(RouteError::Destination)?;
        }
        let m = &spec.matches;
        let mut matcher = Matcher {
            types: m
                .message_types
                .iter()
                .map(|t| match t.split_once('^') {
                    Some((ty, tr)) => (Glob::new(ty), Some(Glob::new(tr))),
                    None => (Glob::new(t), None),
                })
                .collect(),
            applications: m
                .sending_applications
                .iter()
                .map(|p| Glob::new(p))
                .collect(),
            facilities: m.sending_facilities.iter().map(|p| Glob::new(p)).collect(),
            versions: m.versions.iter().map(|p| Glob::new(p)).collect(),
            predicates: Vec::new(),
        };
        for p in &m.predicates {
            matcher
                .predicates
                .push(compile_predicate(p).map_err(RouteError::Match)?);
        }
        let mut steps = Vec::new();
        let mut json_at = None;
        for (index, t) in spec.transforms.iter().enumerate() {
            let step = compile_step(t).map_err(|reason| RouteError::Step { index, reason })?;
            if let Some(j) = json_at
                && !matches!(step, Step::Plugin(_))
            {
                return Err(RouteError::Step {
                    index,
                    reason: format!("only plugin steps may follow toJson and toFhir (step {j})"),
                });
            }
            if matches!(step, Step::ToJson | Step::ToFhir(_)) {
                json_at = Some(index);
            }
            steps.push(step);
        }
        // A plugin skipped on failure would let the message through unchanged; in a route that de-identifies,
        // that can be the step that was meant to remove PHI.
        if steps
            .iter()
            .any(|s| matches!(s, Step::Mask(..) | Step::Hash(..)))
            && let Some(index) = steps
                .iter()
                .position(|s| matches!(s, Step::Plugin(p) if p.on_failure == OnFailure::Skip))
        {
            return Err(RouteError::Step {
                index,
                reason: "onFailure: skip is not allowed in a route that de-identifies (mask or hash): a \
                         skipped plugin would pass the message on unchanged; use deadLetter"
                    .into(),
            });
        }
        let key_paths = spec
            .key_paths
            .iter()
            .map(|p| path(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(RouteError::Key)?;
        Ok(Self {
            name: name.to_owned(),
            priority: spec.priority,
            destinations: spec.destinations.clone(),
            matcher,
            steps,
            key_paths,
        })
    }

    /// True when the route takes the message; otherwise the first condition that failed.
    pub fn matches(
        &self,
        env: &Envelope,
        msg: &Message<'_>,
        charset: Charset,
    ) -> Result<(), String> {
        let none = Header::default();
        let h = env.header.as_ref().unwrap_or(&none);
        let m = &self.matcher;
        if !m.types.is_empty()
            && !m.types.iter().any(|(ty, tr)| {
                ty.matches(&h.message_type)
                    && tr.as_ref().is_none_or(|tr| tr.matches(&h.trigger_event))
            })
        {
            return Err("messageTypes".into());
        }
        let hd = |patterns: &[Glob], whole: &str| {
            let first = whole.split('^').next().unwrap_or("");
            patterns.is_empty()
                || patterns
                    .iter()
                    .any(|p| p.matches(whole) || p.matches(first))
        };
        if !hd(&m.applications, &h.sending_application) {
            return Err("sendingApplications".into());
        }
        // Test traffic (`helm test`) only through routes that name its sending application.
        if hl7gw_runtime::envelope::is_test_traffic(h)
            && !m
                .applications
                .iter()
                .any(|p| p.pattern == hl7gw_runtime::envelope::TEST_SENDING_APPLICATION)
        {
            return Err("test traffic (HL7GW-TEST) and the route does not name it".into());
        }
        if !hd(&m.facilities, &h.sending_facility) {
            return Err("sendingFacilities".into());
        }
        if !m.versions.is_empty() && !m.versions.iter().any(|v| v.matches(&h.version)) {
            return Err("versions".into());
        }
        for (p, text, cond) in &m.predicates {
            let value = msg
                .get_path_decoded(p)
                .map(|v| hl7gw_runtime::envelope::text(&v, charset))
                .unwrap_or_default();
            let ok = match cond {
                Cond::Equals(x) => value == *x,
                Cond::In(xs) => xs.contains(&value),
                Cond::Regex(r) => r.is_match(&value),
                Cond::Exists(want) => value.is_empty() != *want,
            };
            if !ok {
                return Err(format!("where {text}"));
            }
        }
        Ok(())
    }

    /// Runs the steps on `raw` and returns the result and its content type.
    pub async fn apply<P: PluginCaller>(
        &self,
        env: &Envelope,
        raw: &[u8],
        charset: Charset,
        plugins: &P,
    ) -> Result<(Vec<u8>, &'static str), StepError> {
        self.run(env, raw, charset, plugins)
            .await
            .map(|a| (a.message, a.content_type))
    }

    /// The files the route's steps read when it was compiled (a `toFhir` step's code maps).
    pub fn files(&self) -> impl Iterator<Item = &std::path::Path> {
        self.steps
            .iter()
            .flat_map(|s| match s {
                Step::ToFhir(f) => f.files.as_slice(),
                _ => &[],
            })
            .map(std::path::PathBuf::as_path)
    }

    /// Runs the steps on `raw` and returns the result, its content type and its output key.
    pub async fn run<P: PluginCaller>(
        &self,
        env: &Envelope,
        raw: &[u8],
        charset: Charset,
        plugins: &P,
    ) -> Result<Applied, StepError> {
        let (message, content_type, last_hl7, plugins_skipped, fhir_unmapped, skipped_unsupported) =
            self.steps_on(env, raw, charset, plugins).await?;
        let key = if self.key_paths.is_empty() || skipped_unsupported {
            None
        } else {
            let hl7 = last_hl7.as_deref().unwrap_or(message.as_slice());
            let msg = Message::parse(hl7).map_err(|e| StepError {
                route: self.name.clone(),
                step: self.steps.len(),
                kind: "key",
                detail: format!("keyPaths: {e}"),
            })?;
            Some(output_key(&msg, &self.key_paths))
        };
        Ok(Applied {
            message,
            content_type,
            key,
            plugins_skipped,
            fhir_unmapped,
            skipped_unsupported,
        })
    }

    /// Runs the steps; also returns the last HL7 form when the result is not HL7 (for the key).
    async fn steps_on<P: PluginCaller>(
        &self,
        env: &Envelope,
        raw: &[u8],
        charset: Charset,
        plugins: &P,
    ) -> Result<StepsDone, StepError> {
        let mut last_hl7: Option<Vec<u8>> = None;
        let mut skipped = 0usize;
        let mut unmapped = Vec::new();
        let mut cur = raw.to_vec();
        let mut content_type = HL7_CONTENT_TYPE;
        for (i, step) in self.steps.iter().enumerate() {
            let fail = |kind: &'static str, detail: String| StepError {
                route: self.name.clone(),
                step: i,
                kind,
                detail,
            };
            if let Step::Plugin(p) = step {
                let req = TransformRequest {
                    message: cur.clone().into(),
                    envelope: Some(Envelope {
                        raw: Default::default(),
                        content_type: content_type.to_owned(),
                        ..env.clone()
                    }),
                    route: self.name.clone(),
                    params: p.params.clone().into_iter().collect(),
                };
                match plugins.call(p, req).await {
                    Ok((out, ct)) => {
                        if content_type == HL7_CONTENT_TYPE && ct == JSON_CONTENT_TYPE {
                            last_hl7 = Some(std::mem::take(&mut cur));
                        }
                        cur = out;
                        content_type = match ct.as_str() {
                            JSON_CONTENT_TYPE => JSON_CONTENT_TYPE,
                            FHIR_CONTENT_TYPE => FHIR_CONTENT_TYPE,
                            _ => HL7_CONTENT_TYPE,
                        };
                    }
                    Err(reason) => match p.on_failure {
                        OnFailure::Skip => {
                            skipped += 1;
                            tracing::warn!(route = %self.name, step = i, %reason, "plugin failed: step skipped");
                        }
                        OnFailure::DeadLetter => return Err(fail("plugin_failed", reason)),
                    },
                }
                continue;
            }
            if content_type != HL7_CONTENT_TYPE {
                return Err(fail("not_hl7", "the message is no longer HL7".into()));
            }
            let msg = Message::parse(&cur).map_err(|e| fail("parse", e.to_string()))?;
            let next = match step {
                Step::ToJson => {
                    content_type = JSON_CONTENT_TYPE;
                    last_hl7 = Some(cur.clone());
                    to_json(env, &msg, charset).map_err(|e| fail("to_json", e))?
                }
                Step::ToFhir(fhir) => {
                    content_type = FHIR_CONTENT_TYPE;
                    last_hl7 = Some(cur.clone());
                    let received = env.received_at.as_ref().map(|ts| ts.to_string());
                    let mut out = Vec::with_capacity(cur.len() * 4);
                    let done = match hl7gw_fhir::convert_received(
                        &msg,
                        charset,
                        &fhir.options,
                        received.as_deref(),
                        &mut out,
                    ) {
                        Ok(done) => done,
                        Err(hl7gw_fhir::FhirError::Unsupported(_)) if fhir.skip_unsupported => {
                            return Ok((
                                Vec::new(),
                                FHIR_CONTENT_TYPE,
                                None,
                                skipped,
                                unmapped,
                                true,
                            ));
                        }
                        Err(e) => return Err(fail(e.kind(), e.to_string())),
                    };
                    unmapped = done.unmapped;
                    out
                }
                other => edit(other, &msg, charset).map_err(|(k, d)| fail(k, d))?,
            };
            cur = next;
        }
        if content_type == HL7_CONTENT_TYPE {
            last_hl7 = None;
        }
        Ok((cur, content_type, last_hl7, skipped, unmapped, false))
    }
}

/// What the steps made: the message, its content type, the last HL7 form when it is no longer HL7, the plugin
/// steps skipped, what `toFhir` did not map, whether `toFhir` skipped a type it does not map.
type StepsDone = (
    Vec<u8>,
    &'static str,
    Option<Vec<u8>>,
    usize,
    Vec<String>,
    bool,
);

/// A `toFhir` step's settings as the converter's options; a bad time zone, resource type or write mode is
/// refused when the route loads.
pub fn fhir_options(f: &crate::route::ToFhirStep) -> Result<hl7gw_fhir::Options, String> {
    use crate::route::{FhirBundleType, FhirUnmapped, FhirUnscoped, FhirWrite};
    let zone = |tz: &Option<String>| -> Result<Option<hl7gw_fhir::TimeZone>, String> {
        tz.as_deref()
            .map(|t| hl7gw_fhir::TimeZone::parse(t).map_err(|e| format!("toFhir {e}")))
            .transpose()
    };
    let rule = |r: &Option<crate::route::FhirIdentifierRule>| {
        r.as_ref().map(|r| hl7gw_fhir::IdentifierRule {
            type_code: r.type_code.clone(),
            authority: r.authority.clone(),
        })
    };
    let mut write = BTreeMap::new();
    for (rtype, mode) in &f.write {
        if !hl7gw_fhir::RESOURCE_TYPES.contains(&rtype.as_str()) {
            return Err(format!(
                "toFhir write: {rtype:?} is not a resource type the converter writes ({})",
                hl7gw_fhir::RESOURCE_TYPES.join(", ")
            ));
        }
        let mode = match mode {
            FhirWrite::Update => hl7gw_fhir::Write::Update,
            FhirWrite::CreateIfAbsent => hl7gw_fhir::Write::CreateIfAbsent,
            FhirWrite::Reference => hl7gw_fhir::Write::Reference,
        };
        write.insert(rtype.clone(), mode);
    }
    let code_maps = |maps: &BTreeMap<String, String>| -> Result<_, String> {
        maps.iter()
            .map(|(name, path)| {
                hl7gw_fhir::CodeMap::load(std::path::Path::new(path))
                    .map(|m| (name.clone(), std::sync::Arc::new(m)))
                    .map_err(|e| format!("toFhir codeMaps.{name}: {e}"))
            })
            .collect()
    };
    let mut senders = BTreeMap::new();
    for (name, s) in &f.senders {
        senders.insert(
            name.clone(),
            hl7gw_fhir::Sender {
                authority: s.authority.clone(),
                timezone: zone(&s.timezone).map_err(|e| format!("senders.{name}: {e}"))?,
                patient_identifier: rule(&s.patient_identifier),
                code_maps: code_maps(&s.code_maps).map_err(|e| format!("senders.{name}: {e}"))?,
            },
        );
    }
    let field_maps = f
        .field_maps
        .iter()
        .map(|m| hl7gw_fhir::FieldMap::parse(&m.from, &m.to).map_err(|e| format!("toFhir {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(hl7gw_fhir::Options {
        bundle_type: match f.bundle_type.unwrap_or_default() {
            FhirBundleType::Transaction => hl7gw_fhir::BundleType::Transaction,
            FhirBundleType::Message => hl7gw_fhir::BundleType::Message,
        },
        identifier_systems: f.identifier_systems.clone(),
        identifier_system_prefix: f.identifier_system_prefix.clone(),
        code_systems: f.code_systems.clone(),
        timezone: zone(&f.timezone)?,
        unmapped: match f.unmapped.unwrap_or_default() {
            FhirUnmapped::Report => hl7gw_fhir::Unmapped::Report,
            FhirUnmapped::Extension => hl7gw_fhir::Unmapped::Extension,
        },
        received_at: None,
        write,
        patient_identifier: rule(&f.patient_identifier),
        senders,
        unscoped_identifiers_global: f.unscoped_identifiers == Some(FhirUnscoped::Global),
        code_maps: code_maps(&f.code_maps)?,
        field_maps,
    })
}

/// A route's output key: the ingress's key rule on the route's `keyPaths`.
fn output_key(msg: &Message<'_>, paths: &[Path]) -> String {
    String::from_utf8_lossy(&hl7gw_runtime::envelope::kafka_key(msg, paths)).into_owned()
}

fn compile_predicate(p: &Predicate) -> Result<(Path, String, Cond), String> {
    let at = path(&p.path)?;
    let set = [
        p.equals.is_some(),
        p.one_of.is_some(),
        p.regex.is_some(),
        p.exists.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if set != 1 {
        return Err(format!(
            "where {}: exactly one of equals, in, regex, exists",
            p.path
        ));
    }
    let cond = if let Some(x) = &p.equals {
        Cond::Equals(x.clone())
    } else if let Some(xs) = &p.one_of {
        Cond::In(xs.clone())
    } else if let Some(r) = &p.regex {
        let anchored = format!("^(?:{r})$");
        Cond::Regex(Regex::new(&anchored).map_err(|e| format!("where {}: regex: {e}", p.path))?)
    } else {
        Cond::Exists(p.exists.unwrap_or(true))
    };
    Ok((at, p.path.clone(), cond))
}

fn compile_step(t: &Transform) -> Result<Step, String> {
    let mut steps = Vec::new();
    if let Some(s) = &t.set {
        steps.push(Step::Set(path(&s.path)?, s.value.clone()));
    }
    if let Some(s) = &t.copy {
        steps.push(Step::Copy(path(&s.from)?, path(&s.to)?));
    }
    if let Some(s) = &t.clear {
        steps.push(Step::Clear(path(&s.path)?));
    }
    if let Some(s) = &t.map {
        steps.push(Step::Map {
            path: path(&s.path)?,
            table: s.table.clone(),
            default: s.default.clone(),
        });
    }
    if let Some(s) = &t.delete_segment {
        steps.push(Step::DeleteSegment(segment_name(&s.segment)?));
    }
    if let Some(s) = &t.rename_segment {
        let (from, to) = (segment_name(&s.from)?, segment_name(&s.to)?);
        // Renaming a segment to its own name would never finish (every pass finds it again).
        if from == to {
            return Err(format!(
                "renameSegment: from and to are both {from:?}; nothing to rename"
            ));
        }
        steps.push(Step::RenameSegment(from, to));
    }
    if let Some(s) = &t.mask {
        steps.push(Step::Mask(
            path(&s.path)?,
            s.with.clone().unwrap_or_else(|| "***".into()),
        ));
    }
    if let Some(s) = &t.hash {
        let salt = match &s.salt_env {
            Some(var) => std::env::var(var)
                .map_err(|_| format!("hash: environment variable {var} is not set"))?,
            None => String::new(),
        };
        steps.push(Step::Hash(path(&s.path)?, salt));
    }
    if t.to_json.is_some() {
        steps.push(Step::ToJson);
    }
    if let Some(f) = &t.to_fhir {
        steps.push(Step::ToFhir(Box::new(FhirStep {
            options: fhir_options(f)?,
            skip_unsupported: f.on_unsupported == Some(crate::route::FhirOnUnsupported::Skip),
            files: f
                .code_maps
                .values()
                .chain(f.senders.values().flat_map(|s| s.code_maps.values()))
                .map(std::path::PathBuf::from)
                .collect(),
        })));
    }
    if let Some(p) = &t.plugin {
        if !(p.endpoint.starts_with("http://") || p.endpoint.starts_with("https://")) {
            return Err(format!(
                "plugin endpoint {:?}: expected http://host:port or https://host:port",
                p.endpoint
            ));
        }
        steps.push(Step::Plugin(Plugin {
            endpoint: p.endpoint.clone(),
            timeout: Duration::from_millis(u64::from(p.timeout_ms.unwrap_or(1000).max(1))),
            on_failure: p.on_failure,
            params: p.params.clone(),
        }));
    }
    let n = steps.len();
    match (steps.pop(), n) {
        (Some(step), 1) => Ok(step),
        _ => Err(format!(
            "exactly one of set, copy, clear, map, deleteSegment, renameSegment, mask, hash, toJson, plugin (found {n})"
        )),
    }
}

/// Applies one editing step; errors are `(kind, detail)`.
fn edit(
    step: &Step,
    msg: &Message<'_>,
    charset: Charset,
) -> Result<Vec<u8>, (&'static str, String)> {
    let mut e = msg.edit();
    let ed = |r: Result<(), hl7v2::EditError>| r.map_err(|err| ("edit", err.to_string()));
    let text = |p: &Path| {
        msg.get_path_decoded(p)
            .map(|v| hl7gw_runtime::envelope::text(&v, charset))
            .unwrap_or_default()
    };
    let present = |p: &Path| msg.get_path(p).is_some_and(|v| !v.is_empty());
    match step {
        Step::Set(p, v) => ed(e.set(&p.to_string(), v.as_bytes()))?,
        Step::Copy(from, to) => {
            if let Some(v) = msg.get_path_decoded(from) {
                ed(e.set(&to.to_string(), &v))?;
            } else if msg.segment(&seg(to), to.occurrence).is_some() {
                ed(e.clear(&to.to_string()))?;
            }
        }
        Step::Clear(p) => {
            if present(p) {
                ed(e.clear(&p.to_string()))?;
            }
        }
        Step::Map {
            path: p,
            table,
            default,
        } => {
            let v = text(p);
            let out = table.get(&v).or(default.as_ref());
            if let Some(out) = out
                && msg.segment(&seg(p), p.occurrence).is_some()
            {
                ed(e.set(&p.to_string(), out.as_bytes()))?;
            }
        }
        Step::DeleteSegment(name) => {
            while msg_has(&e, name) {
                ed(e.remove_segment(name, 1))?;
            }
        }
        Step::RenameSegment(from, to) => {
            while msg_has(&e, from) {
                ed(e.rename_segment(from, 1, to))?;
            }
        }
        Step::Mask(p, with) => {
            if present(p) {
                ed(e.set(&p.to_string(), with.as_bytes()))?;
            }
        }
        Step::Hash(p, salt) => {
            if present(p) {
                let mut h = Sha256::new();
                h.update(salt.as_bytes());
                h.update(text(p).as_bytes());
                let hex = hex::encode(h.finalize());
                ed(e.set(&p.to_string(), hex.as_bytes()))?;
            }
        }
        Step::ToJson | Step::ToFhir(_) | Step::Plugin(_) => {}
    }
    Ok(e.encode())
}

fn seg(p: &Path) -> String {
    String::from_utf8_lossy(p.segment()).into_owned()
}

fn msg_has(e: &hl7v2::Edit<'_>, name: &str) -> bool {
    e.has_segment(name, 1)
}

/// A glob (`*` any run of characters, `?` one character, everything else itself) compiled once, when its route is: literals and `prefix*` compare bytes, the rest walks characters.
#[derive(Debug, Clone)]
pub struct Glob {
    /// The pattern as written.
    pub pattern: String,
    kind: GlobKind,
}

#[derive(Debug, Clone)]
enum GlobKind {
    Literal,
    /// `text*` with no other wildcard.
    Prefix(usize),
    Chars(Vec<char>),
}

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Self {
        let wild = |c: char| c == '*' || c == '?';
        let kind = match pattern.find(wild) {
            None => GlobKind::Literal,
            Some(i) if i + 1 == pattern.len() && pattern.ends_with('*') => GlobKind::Prefix(i),
            Some(_) => GlobKind::Chars(pattern.chars().collect()),
        };
        Self {
            pattern: pattern.to_owned(),
            kind,
        }
    }

    /// True when the pattern has no wildcard: it matches exactly one text.
    pub fn is_literal(&self) -> bool {
        matches!(self.kind, GlobKind::Literal)
    }

    /// True when `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        match &self.kind {
            GlobKind::Literal => self.pattern == text,
            GlobKind::Prefix(n) => text.as_bytes().starts_with(&self.pattern.as_bytes()[..*n]),
            GlobKind::Chars(p) => glob_chars(p, text),
        }
    }
}

fn glob_chars(p: &[char], text: &str) -> bool {
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The canonical JSON form: the header essentials and every non-empty value under its flat key, decoded as
/// text in the message's charset (docs/consuming.md).
pub fn to_json(env: &Envelope, msg: &Message<'_>, charset: Charset) -> Result<Vec<u8>, String> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Canonical<'a> {
        format: &'static str,
        id: &'a str,
        received_at: Option<String>,
        message_type: String,
        trigger_event: String,
        control_id: String,
        version: String,
        sending_application: String,
        sending_facility: String,
        charset: &'static str,
        segments: Vec<String>,
        flat: Flat,
    }
    struct Flat(Vec<(String, String)>);
    impl Serialize for Flat {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
        }
    }
    let h = msg.header();
    let t = |b: &[u8]| hl7gw_runtime::envelope::text(b, charset);
    let flat = msg
        .flat()
        .into_iter()
        .map(|e| (e.key(), t(&e.value)))
        .collect();
    let c = Canonical {
        format: "hl7gw.canonical.v1",
        id: &env.id,
        received_at: env.received_at.as_ref().map(|ts| ts.to_string()),
        message_type: t(h.message_type),
        trigger_event: t(h.trigger_event),
        control_id: t(h.control_id),
        version: t(h.version),
        sending_application: t(h.sending_application),
        sending_facility: t(h.sending_facility),
        charset: charset.name(),
        segments: msg.segments().map(|s| t(s.name())).collect(),
        flat: Flat(flat),
    };
    serde_json::to_vec(&c).map_err(|e| e.to_string())
}

/// The live set of compiled routes, in evaluation order, indexed by message type and trigger so a message is
/// matched only against the routes that can take it: the cost per message does not grow with the number of
/// routes for other types.
#[derive(Debug, Default)]
pub struct Routes {
    pub routes: Vec<Arc<Route>>,
    /// The files the routes read (code maps) as they were when compiled (`source::files_fingerprint`).
    pub files: u64,
    /// Positions in `routes` (ascending) by literal message type, then by literal trigger.
    by_type: HashMap<String, TypeIndex>,
    /// Routes any message may match: no `messageTypes`, or a type pattern with a wildcard.
    any_type: Vec<u32>,
}

#[derive(Debug, Default)]
struct TypeIndex {
    /// No trigger, or a trigger pattern with a wildcard.
    any_trigger: Vec<u32>,
    by_trigger: HashMap<String, Vec<u32>>,
}

impl Routes {
    /// Builds a set from compiled routes, sorted by priority then name.
    pub fn new(mut routes: Vec<Arc<Route>>) -> Self {
        routes.sort_by(|a, b| a.priority.cmp(&b.priority).then(a.name.cmp(&b.name)));
        let mut by_type: HashMap<String, TypeIndex> = HashMap::new();
        let mut any_type = Vec::new();
        for (i, r) in routes.iter().enumerate() {
            let i = i as u32;
            let types = &r.matcher.types;
            if types.is_empty() || types.iter().any(|(ty, _)| !ty.is_literal()) {
                any_type.push(i);
                continue;
            }
            for (ty, tr) in types {
                let t = by_type.entry(ty.pattern.clone()).or_default();
                let list = match tr {
                    Some(tr) if tr.is_literal() => {
                        t.by_trigger.entry(tr.pattern.clone()).or_default()
                    }
                    _ => &mut t.any_trigger,
                };
                // A route listing the same type twice is indexed once.
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
        }
        Self {
            routes,
            files: 0,
            by_type,
            any_type,
        }
    }

    /// The routes that may take a message of this type and trigger, in evaluation order (each still checked
    /// with [`Route::matches`]).
    pub fn candidates<'a>(
        &'a self,
        message_type: &str,
        trigger: &str,
    ) -> impl Iterator<Item = &'a Arc<Route>> + 'a {
        let t = self.by_type.get(message_type);
        let any_trigger = t.map_or(&[][..], |t| &t.any_trigger[..]);
        let by_trigger = t
            .and_then(|t| t.by_trigger.get(trigger))
            .map_or(&[][..], |v| &v[..]);
        Merge([&self.any_type[..], any_trigger, by_trigger]).map(|i| &self.routes[i as usize])
    }
}

/// The ascending union of sorted position lists, each position once.
struct Merge<'a>([&'a [u32]; 3]);

impl Iterator for Merge<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let next = self.0.iter().filter_map(|l| l.first().copied()).min()?;
        for l in &mut self.0 {
            if l.first() == Some(&next) {
                *l = &l[1..];
            }
        }
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::*;

    const ORU_R01: &[u8] = b"MSH|^~\\&|LAB|GOOD HOSP|EPIC|X|20260101||ORU^R01|C2|P|2.5\rPID|1||12345\rOBR|1\rOBX|1|NM|GLU||5.4\r";
    const ADT: &[u8] = b"MSH|^~\\&|EPIC|GOOD HOSP^1.2.3^ISO|LAB|X|20260101||ADT^A01^ADT_A01|C1|P|2.5\rPID|1||12345^^^MRN||DOE^JANE||19800101|F\rNK1|1|DOE^JOHN\rNK1|2|ROE^RICH\rZPI|1|x\r";

    struct NoPlugins;
    impl PluginCaller for NoPlugins {
        async fn call(
            &self,
            _: &Plugin,
            req: TransformRequest,
        ) -> Result<(Vec<u8>, String), String> {
            let mut m = req.message.to_vec();
            m.extend_from_slice(b"ZPL|called\r");
            Ok((m, String::new()))
        }
    }

    fn env_of(raw: &[u8]) -> Envelope {
        let m = Message::parse(raw).unwrap();
        Envelope {
            id: "id-1".into(),
            raw: raw.to_vec().into(),
            header: Some(hl7gw_runtime::envelope::header(m.header(), Charset::Utf8)),
            ..Envelope::default()
        }
    }

    fn spec(yaml: &str) -> HL7RouteSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    async fn run(yaml: &str) -> Result<(Vec<u8>, &'static str), StepError> {
        let r = Route::compile("r", &spec(yaml)).unwrap();
        r.apply(&env_of(ADT), ADT, Charset::Utf8, &NoPlugins).await
    }

    fn get(out: &[u8], path: &str) -> Option<String> {
        Message::parse(out)
            .unwrap()
            .get_decoded(path)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    fn glob(pattern: &str, text: &str) -> bool {
        Glob::new(pattern).matches(text)
    }

    #[test]
    fn routes_are_indexed_by_type_and_trigger_in_evaluation_order() {
        let specs = [
            ("a-any", "destinations: [a]"),
            ("b-adt", "{match: {messageTypes: [ADT]}, destinations: [a]}"),
            (
                "c-a01",
                "{match: {messageTypes: ['ADT^A01', 'ADT^A01']}, destinations: [a]}",
            ),
            (
                "d-a02",
                "{match: {messageTypes: ['ADT^A02']}, destinations: [a]}",
            ),
            (
                "e-oru",
                "{match: {messageTypes: ['ORU^R01', 'ADT^A0?']}, destinations: [a]}",
            ),
            (
                "f-glob",
                "{match: {messageTypes: ['A*^A01']}, destinations: [a]}",
            ),
            (
                "g-both",
                "{match: {messageTypes: ['ADT^A01', 'ADT^*']}, destinations: [a]}",
            ),
            (
                "h-oru",
                "{match: {messageTypes: ['ORU']}, destinations: [a]}",
            ),
        ];
        let routes = Routes::new(
            specs
                .iter()
                .rev()
                .map(|(n, y)| Arc::new(Route::compile(n, &spec(y)).unwrap()))
                .collect(),
        );
        let names = |ty: &str, tr: &str| -> Vec<String> {
            routes.candidates(ty, tr).map(|r| r.name.clone()).collect()
        };
        assert_eq!(
            names("ADT", "A01"),
            ["a-any", "b-adt", "c-a01", "e-oru", "f-glob", "g-both"]
        );
        assert_eq!(
            names("ADT", "A02"),
            ["a-any", "b-adt", "d-a02", "e-oru", "f-glob", "g-both"]
        );
        assert_eq!(names("ORU", "R01"), ["a-any", "e-oru", "f-glob", "h-oru"]);
        assert_eq!(names("SIU", "S12"), ["a-any", "f-glob"]);
        // The index only narrows: what matches is what a scan of every route matches.
        for raw in [ADT, ORU_R01] {
            let (m, env) = (Message::parse(raw).unwrap(), env_of(raw));
            let h = env.header.clone().unwrap_or_default();
            let scan: Vec<&str> = routes
                .routes
                .iter()
                .filter(|r| r.matches(&env, &m, Charset::Utf8).is_ok())
                .map(|r| r.name.as_str())
                .collect();
            let indexed: Vec<&str> = routes
                .candidates(&h.message_type, &h.trigger_event)
                .filter(|r| r.matches(&env, &m, Charset::Utf8).is_ok())
                .map(|r| r.name.as_str())
                .collect();
            assert_eq!(scan, indexed);
            assert!(!scan.is_empty());
        }
    }

    #[test]
    fn globs() {
        assert!(!Glob::new("ADT*").is_literal() && Glob::new("ADT").is_literal());
        assert!(glob("ADT*", "ADT"));
        assert!(glob("AD*", "ADT"));
        assert!(!glob("AD*", "AT"));
        assert!(glob("A*T", "ADT"));
        assert!(glob("A?T", "ADT"));
        assert!(!glob("A?", "ADT"));
        assert!(glob("ADT", "ADT"));
        assert!(glob("A0?", "A01"));
        assert!(glob("*", ""));
        assert!(glob("2.5*", "2.5.1"));
        assert!(!glob("A0?", "A011"));
        assert!(!glob("ORU", "ADT"));
    }

    #[test]
    fn matching_uses_type_trigger_sender_version_and_predicates() {
        let adt = (Message::parse(ADT).unwrap(), env_of(ADT));
        // Test traffic (MSH-11 T) only through a route that names HL7GW-TEST.
        let test = b"MSH|^~\\&|HL7GW-TEST|GOOD HOSP|B|G|20260101||ADT^A01|T1|T|2.5\rPID|1||P1\r";
        let test = (Message::parse(test).unwrap(), env_of(test));
        let takes = |(m, env): &(Message<'_>, Envelope), matches: &str| {
            let yaml = format!("{{match: {matches}, destinations: [a]}}");
            let route = Route::compile("r", &spec(&yaml)).unwrap();
            route.matches(env, m, Charset::Utf8)
        };
        for (taken, msg, matches) in [
            (true, &adt, "{}"),
            (true, &adt, "{messageTypes: ['ADT^A0?']}"),
            (true, &adt, "{messageTypes: [ADT]}"),
            (false, &adt, "{messageTypes: ['ORU^*']}"),
            (true, &adt, "{sendingFacilities: ['GOOD HOSP']}"),
            (false, &adt, "{sendingApplications: [LAB]}"),
            (true, &adt, "{versions: ['2.5*']}"),
            (false, &test, "{messageTypes: [ADT]}"),
            (false, &test, "{}"),
            (true, &test, "{sendingApplications: [HL7GW-TEST]}"),
            (true, &adt, "{where: [{path: PID-8, equals: F}]}"),
            (false, &adt, "{where: [{path: PID-8, in: [M, U]}]}"),
            (true, &adt, "{where: [{path: PID-3-1, regex: '[0-9]+'}]}"),
            (false, &adt, "{where: [{path: PID-3-1, regex: '[0-9]'}]}"),
            (true, &adt, "{where: [{path: PID-19, exists: false}]}"),
        ] {
            assert_eq!(takes(msg, matches).is_ok(), taken, "{matches}");
        }
        let miss = takes(&adt, "{where: [{path: PID-19, exists: true}]}");
        assert_eq!(miss.unwrap_err(), "where PID-19");
    }

    #[test]
    fn bad_routes_are_refused_with_a_reason() {
        let bad = [
            ("destinations: []", "destinations"),
            ("destinations: ['a b']", "destinations"),
            (
                "{transforms: [{set: {path: PID, value: x}}], destinations: [a]}",
                "transforms[0]",
            ),
            ("{transforms: [{}], destinations: [a]}", "exactly one"),
            (
                "{transforms: [{clear: {path: PID-5}, mask: {path: PID-5}}], destinations: [a]}",
                "exactly one",
            ),
            (
                "{transforms: [{toJson: {}}, {clear: {path: PID-5}}], destinations: [a]}",
                "toJson",
            ),
            (
                "{match: {where: [{path: PID-3, regex: '('}]}, destinations: [a]}",
                "regex",
            ),
            (
                "{match: {where: [{path: PID-3}]}, destinations: [a]}",
                "exactly one",
            ),
            (
                "{transforms: [{deleteSegment: {segment: MSH}}], destinations: [a]}",
                "MSH",
            ),
            (
                "{transforms: [{plugin: {endpoint: 'tcp://x'}}], destinations: [a]}",
                "endpoint",
            ),
            (
                "{transforms: [{hash: {path: PID-3, saltEnv: HL7GW_NO_SUCH_VAR}}], destinations: [a]}",
                "HL7GW_NO_SUCH_VAR",
            ),
            (
                "{transforms: [{renameSegment: {from: ZPI, to: ZPI}}], destinations: [a]}",
                "renameSegment",
            ),
            ("{keyPaths: [PID], destinations: [a]}", "keyPaths"),
            (
                "{transforms: [{plugin: {endpoint: 'https://deid:1', onFailure: skip}}, {hash: {path: PID-3-1}}], destinations: [a]}",
                "onFailure: skip is not allowed",
            ),
        ];
        for (y, want) in bad {
            let e = Route::compile("r", &spec(y)).unwrap_err().to_string();
            assert!(e.contains(want), "{y}: {e}");
        }
    }

    #[tokio::test]
    async fn transforms_edit_the_message() {
        let (out, ct) = run("{transforms: [
                {set: {path: MSH-5, value: 'NEW^APP'}},
                {copy: {from: PID-3-1, to: PID-2}},
                {clear: {path: PID-7}},
                {map: {path: PID-8, table: {F: female}, default: unknown}},
                {deleteSegment: {segment: NK1}},
                {renameSegment: {from: ZPI, to: ZPX}},
                {mask: {path: PID-5}},
                {hash: {path: PID-3-1}}
            ], destinations: [a]}")
        .await
        .unwrap();
        assert_eq!(ct, HL7_CONTENT_TYPE);
        assert_eq!(
            get(&out, "MSH-5").as_deref(),
            Some("NEW^APP"),
            "set escapes"
        );
        assert_eq!(get(&out, "PID-2").as_deref(), Some("12345"));
        assert_eq!(get(&out, "PID-7"), None);
        assert_eq!(get(&out, "PID-8").as_deref(), Some("female"));
        assert_eq!(get(&out, "NK1-1"), None);
        assert_eq!(get(&out, "ZPX-1").as_deref(), Some("1"));
        assert_eq!(get(&out, "PID-5").as_deref(), Some("***"));
        let hashed = get(&out, "PID-3-1").unwrap();
        assert_eq!(hashed.len(), 64);
        assert_ne!(hashed, "12345");
        assert!(
            !String::from_utf8_lossy(&out).contains("DOE"),
            "no PHI left: {}",
            String::from_utf8_lossy(&out)
        );
    }

    #[tokio::test]
    async fn key_paths_read_the_transformed_message() {
        let r = Route::compile(
            "r",
            &spec("{transforms: [{hash: {path: PID-3-1}}, {toJson: {}}], keyPaths: [MSH-4-1, PID-3-1], destinations: [a]}"),
        )
        .unwrap();
        let a = r
            .run(&env_of(ADT), ADT, Charset::Utf8, &NoPlugins)
            .await
            .unwrap();
        assert_eq!(a.content_type, JSON_CONTENT_TYPE);
        let key = a.key.unwrap();
        assert!(
            key.starts_with("GOOD HOSP|") && key.len() == 10 + 64,
            "{key}"
        );
        assert!(!key.contains("12345"));
        let plain = Route::compile("p", &spec("destinations: [a]")).unwrap();
        let a = plain
            .run(&env_of(ADT), ADT, Charset::Utf8, &NoPlugins)
            .await
            .unwrap();
        assert_eq!(a.key, None, "no keyPaths: the inbound key");
    }

    #[tokio::test]
    async fn to_json_is_the_canonical_form_and_plugins_run_after() {
        let (out, ct) = run("{transforms: [{toJson: {}}], destinations: [a]}")
            .await
            .unwrap();
        assert_eq!(ct, JSON_CONTENT_TYPE);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["format"], "hl7gw.canonical.v1");
        assert_eq!(v["messageType"], "ADT");
        assert_eq!(v["controlId"], "C1");
        assert_eq!(v["flat"]["PID(1)-3(1)-1-1"], "12345");
        assert_eq!(v["flat"]["NK1(2)-2(1)-1-1"], "ROE");
        assert_eq!(v["segments"][3], "NK1");

        let (out, _) =
            run("{transforms: [{plugin: {endpoint: 'http://127.0.0.1:1'}}], destinations: [a]}")
                .await
                .unwrap();
        assert!(out.ends_with(b"ZPL|called\r"));
    }

    #[tokio::test]
    async fn to_fhir_makes_a_bundle_and_takes_its_settings_from_the_route() {
        let (out, ct) = run(
            "{transforms: [{mask: {path: PID-5}}, {toFhir: {bundleType: message, identifierSystems: \
             {HOSP: 'https://hospital.example/mrn'}}}], destinations: [a]}",
        )
        .await
        .unwrap();
        assert_eq!(ct, FHIR_CONTENT_TYPE);
        let b: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(b["type"], "message");
        assert_eq!(b["entry"][0]["resource"]["resourceType"], "MessageHeader");
        let patient = &b["entry"][1]["resource"];
        assert_eq!(patient["resourceType"], "Patient");
        // The steps before it ran first: the name is masked.
        assert_ne!(patient["name"][0]["family"], "DOE");

        let e = Route::compile(
            "r",
            &spec("{transforms: [{toFhir: {}}, {toJson: {}}], destinations: [a]}"),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("only plugin steps may follow"),
            "{e}"
        );
        let e = Route::compile(
            "r",
            &spec("{transforms: [{toFhir: {timezone: 'Central/Europe'}}], destinations: [a]}"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("timezone"), "{e}");
        for bad in [
            "{toFhir: {senders: {LAB: {timezone: '+25:00'}}}}",
            "{toFhir: {write: {Patients: reference}}}",
            "{toFhir: {write: {Patient: replace}}}",
        ] {
            let yaml = format!("{{transforms: [{bad}], destinations: [a]}}");
            assert!(
                serde_saphyr::from_str::<HL7RouteSpec>(&yaml)
                    .map_err(|e| e.to_string())
                    .and_then(|s| Route::compile("r", &s).map_err(|e| e.to_string()))
                    .is_err(),
                "{bad} accepted"
            );
        }
    }

    #[tokio::test]
    async fn to_fhir_takes_iana_zones_write_modes_senders_and_refuses_unscoped_patients() {
        let (out, _) = run(
            "{transforms: [{toFhir: {timezone: America/New_York, write: {Patient: reference}, \
             patientIdentifier: {authority: MRN}, senders: {HIS: {authority: HIS_MRN, timezone: Europe/Berlin}}, \
             unscopedIdentifiers: refuse}}], destinations: [a]}",
        )
        .await
        .unwrap();
        let b: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(
            b["entry"]
                .as_array()
                .unwrap()
                .iter()
                .all(|e| e["resource"]["resourceType"] != "Patient"),
            "{b}"
        );
        // A patient identifier that names no authority, from a sender without MSH-4: refused by its own kind.
        let anonymous =
            b"MSH|^~\\&|APP||HL7GW|HL7GW|20240101||ADT^A04|1|P|2.5.1\rPID|1||55555||DOE^JANE\r";
        let r = Route::compile(
            "r",
            &spec("{transforms: [{toFhir: {}}], destinations: [a]}"),
        )
        .unwrap();
        let e = r
            .apply(&env_of(anonymous), anonymous, Charset::Utf8, &NoPlugins)
            .await
            .unwrap_err();
        assert_eq!(e.kind, "unscoped_patient_identity", "{e}");
        let global = Route::compile(
            "r",
            &spec("{transforms: [{toFhir: {unscopedIdentifiers: global}}], destinations: [a]}"),
        )
        .unwrap();
        let (out, _) = global
            .apply(&env_of(anonymous), anonymous, Charset::Utf8, &NoPlugins)
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&out).contains("urn:hl7gw:id:unknown"));
    }

    #[tokio::test]
    async fn a_failing_step_names_route_step_and_kind() {
        let e = run("{transforms: [{set: {path: 'OBX(3)-5', value: x}}], destinations: [a]}")
            .await
            .unwrap_err();
        assert_eq!((e.step, e.kind), (0, "edit"));
        assert!(e.to_string().contains("OBX"), "{e}");
    }
}
