//! Compiling an `HL7Route` (paths parsed, regexes built, rules checked: a bad route is refused when it is loaded,
//! with a reason) and matching a message against it.

use super::glob::Glob;
use super::types::Cond;
use super::types::FhirStep;
use super::types::Matcher;
use super::types::Mismatch;
use super::types::Plugin;
use super::types::Route;
use super::types::RouteError;
use super::types::SpecError;
use super::types::Step;
use crate::route::{HL7RouteSpec, OnFailure, Predicate, Transform};
use hl7gw_runtime::proto::v1::{Envelope, Header};
use hl7v2::{Charset, Message, Path};
use regex::Regex;
use std::collections::BTreeMap;
use std::time::Duration;

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
                    reason: SpecError::AfterJson(j),
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
                reason: SpecError::SkipWhileDeidentifying,
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
    ) -> Result<(), Mismatch> {
        let none = Header::default();
        let h = env.header.as_ref().unwrap_or(&none);
        let m = &self.matcher;
        if !m.types.is_empty()
            && !m.types.iter().any(|(ty, tr)| {
                ty.matches(&h.message_type)
                    && tr.as_ref().is_none_or(|tr| tr.matches(&h.trigger_event))
            })
        {
            return Err(Mismatch::MessageTypes);
        }
        let hd = |patterns: &[Glob], whole: &str| {
            let first = whole.split('^').next().unwrap_or("");
            patterns.is_empty()
                || patterns
                    .iter()
                    .any(|p| p.matches(whole) || p.matches(first))
        };
        if !hd(&m.applications, &h.sending_application) {
            return Err(Mismatch::SendingApplications);
        }
        // Test traffic (`helm test`) only through routes that name its sending application.
        if hl7gw_runtime::envelope::is_test_traffic(h)
            && !m
                .applications
                .iter()
                .any(|p| p.pattern == hl7gw_runtime::envelope::TEST_SENDING_APPLICATION)
        {
            return Err(Mismatch::TestTraffic);
        }
        if !hd(&m.facilities, &h.sending_facility) {
            return Err(Mismatch::SendingFacilities);
        }
        if !m.versions.is_empty() && !m.versions.iter().any(|v| v.matches(&h.version)) {
            return Err(Mismatch::Versions);
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
                return Err(Mismatch::Where(text.clone()));
            }
        }
        Ok(())
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
}

pub(super) fn path(s: &str) -> Result<Path, SpecError> {
    Ok(Path::parse(s)?)
}

pub(super) fn segment_name(s: &str) -> Result<String, SpecError> {
    if s.len() == 3 && s.bytes().all(|b| b.is_ascii_alphanumeric()) && s != "MSH" {
        Ok(s.to_owned())
    } else {
        Err(SpecError::SegmentName(s.to_owned()))
    }
}

pub(super) fn compile_predicate(p: &Predicate) -> Result<(Path, String, Cond), SpecError> {
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
        return Err(SpecError::OneCondition(p.path.clone()));
    }
    let cond = if let Some(x) = &p.equals {
        Cond::Equals(x.clone())
    } else if let Some(xs) = &p.one_of {
        Cond::In(xs.clone())
    } else if let Some(r) = &p.regex {
        let anchored = format!("^(?:{r})$");
        Cond::Regex(Regex::new(&anchored).map_err(|source| SpecError::Regex {
            path: p.path.clone(),
            source,
        })?)
    } else {
        Cond::Exists(p.exists.unwrap_or(true))
    };
    Ok((at, p.path.clone(), cond))
}

pub(super) fn compile_step(t: &Transform) -> Result<Step, SpecError> {
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
            return Err(SpecError::RenameToItself(from));
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
            Some(var) => std::env::var(var).map_err(|_| SpecError::SaltUnset(var.clone()))?,
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
            return Err(SpecError::PluginEndpoint(p.endpoint.clone()));
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
        _ => Err(SpecError::StepKinds(n)),
    }
}

/// A `toFhir` step's settings as the converter's options; a bad time zone, resource type or write mode is
/// refused when the route loads.
pub fn fhir_options(f: &crate::route::ToFhirStep) -> Result<hl7gw_fhir::Options, SpecError> {
    use crate::route::{FhirBundleType, FhirUnmapped, FhirUnscoped, FhirWrite};
    let zone = |tz: &Option<String>| -> Result<Option<hl7gw_fhir::TimeZone>, SpecError> {
        tz.as_deref()
            .map(|t| hl7gw_fhir::TimeZone::parse(t).map_err(SpecError::Fhir))
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
            return Err(SpecError::FhirResourceType(rtype.clone()));
        }
        let mode = match mode {
            FhirWrite::Update => hl7gw_fhir::Write::Update,
            FhirWrite::CreateIfAbsent => hl7gw_fhir::Write::CreateIfAbsent,
            FhirWrite::Reference => hl7gw_fhir::Write::Reference,
        };
        write.insert(rtype.clone(), mode);
    }
    let code_maps = |maps: &BTreeMap<String, String>| -> Result<_, SpecError> {
        maps.iter()
            .map(|(name, path)| {
                hl7gw_fhir::CodeMap::load(std::path::Path::new(path))
                    .map(|m| (name.clone(), std::sync::Arc::new(m)))
                    .map_err(|reason| SpecError::CodeMap {
                        name: name.clone(),
                        reason,
                    })
            })
            .collect()
    };
    let mut senders = BTreeMap::new();
    for (name, s) in &f.senders {
        let in_sender = |source| SpecError::Sender {
            name: name.clone(),
            source: Box::new(source),
        };
        senders.insert(
            name.clone(),
            hl7gw_fhir::Sender {
                authority: s.authority.clone(),
                timezone: zone(&s.timezone).map_err(in_sender)?,
                patient_identifier: rule(&s.patient_identifier),
                code_maps: code_maps(&s.code_maps).map_err(in_sender)?,
            },
        );
    }
    let field_maps = f
        .field_maps
        .iter()
        .map(|m| hl7gw_fhir::FieldMap::parse(&m.from, &m.to).map_err(SpecError::Fhir))
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
pub(super) fn output_key(msg: &Message<'_>, paths: &[Path]) -> String {
    String::from_utf8_lossy(&hl7gw_runtime::envelope::kafka_key(msg, paths)).into_owned()
}
