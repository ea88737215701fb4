//! `hl7gw fhir`: the transformer's `toFhir` step on message files, offline (no Kafka, no service), for people
//! developing a mapping: each file's Bundle on stdout, what was not mapped on stderr.

use crate::files::read;
use hl7gw_transformer::route::{FhirBundleType, FhirUnmapped, FhirUnscoped, ToFhirStep};
use hl7v2::{Charset, Message};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct FhirArgs {
    /// HL7 v2 message files (one message each).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Take the toFhir settings from a routes file (HL7Route documents, as the transformer reads them).
    #[arg(long)]
    route: Option<PathBuf>,
    /// The route of --route to use (default: the only one with a toFhir step).
    #[arg(long, requires = "route")]
    route_name: Option<String>,
    /// transaction or message (over the route's).
    #[arg(long, value_parser = ["transaction", "message"])]
    bundle_type: Option<String>,
    /// Time zone of times written without an offset: an IANA name or +hh:mm (over the route's).
    #[arg(long)]
    timezone: Option<String>,
    /// An identifier system by assigning authority: NAMESPACE=URI (repeatable).
    #[arg(long = "identifier-system", value_name = "NS=URI")]
    identifier_systems: Vec<String>,
    /// A coding system by CWE-3 name: NAME=URI (repeatable).
    #[arg(long = "code-system", value_name = "NAME=URI")]
    code_systems: Vec<String>,
    /// A site's code map file by IG map or CWE-3 name: NAME=FILE (repeatable).
    #[arg(long = "code-map", value_name = "NAME=FILE")]
    code_maps: Vec<String>,
    /// Patient identifiers without any authority share one namespace instead of being refused.
    #[arg(long)]
    unscoped_global: bool,
    /// Keep unmapped fields' values in the Bundle's meta.extension.
    #[arg(long)]
    keep_unmapped: bool,
    /// Indent the JSON (default: one Bundle per line).
    #[arg(long)]
    pretty: bool,
}

/// Runs `hl7gw fhir`: exit 0 when every file converted, 1 otherwise (each failure named on stderr).
pub fn run(args: FhirArgs) -> anyhow::Result<ExitCode> {
    let step = step_of(&args)?;
    let opts = hl7gw_transformer::engine::fhir_options(&step)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut all_ok = true;
    let mut bundle = Vec::new();
    for path in &args.files {
        let bytes = read(path)?;
        let name = path.display();
        let msg = match Message::parse(&bytes) {
            Ok(m) => m,
            Err(e) => {
                log!("{name}: does not parse: {e}");
                all_ok = false;
                continue;
            }
        };
        let charset = Charset::from_msh18(msg.header().charset).unwrap_or(Charset::Utf8);
        bundle.clear();
        match hl7gw_fhir::convert(&msg, charset, &opts, &mut bundle) {
            Ok(outcome) => {
                if args.pretty {
                    let v: serde_json::Value = serde_json::from_slice(&bundle)?;
                    serde_json::to_writer_pretty(&mut out, &v)?;
                } else {
                    out.write_all(&bundle)?;
                }
                writeln!(out)?;
                let unmapped = if outcome.unmapped.is_empty() {
                    "nothing unmapped".to_owned()
                } else {
                    format!("unmapped: {}", outcome.unmapped.join(", "))
                };
                log!("{name}: {} resources; {unmapped}", outcome.resources);
            }
            Err(e) => {
                log!("{name}: refused ({}): {e}", e.kind());
                all_ok = false;
            }
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The toFhir step: the route's (with --route), the flags over it.
fn step_of(args: &FhirArgs) -> anyhow::Result<ToFhirStep> {
    let mut step = match &args.route {
        Some(path) => route_step(path, args.route_name.as_deref())?,
        None => ToFhirStep::default(),
    };
    if let Some(t) = &args.bundle_type {
        step.bundle_type = Some(match t.as_str() {
            "message" => FhirBundleType::Message,
            _ => FhirBundleType::Transaction,
        });
    }
    if let Some(tz) = &args.timezone {
        step.timezone = Some(tz.clone());
    }
    let pair = |s: &str, what: &str| -> anyhow::Result<(String, String)> {
        s.split_once('=')
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .ok_or_else(|| anyhow::anyhow!("--{what} {s:?}: expected NAME=VALUE"))
    };
    for s in &args.identifier_systems {
        let (k, v) = pair(s, "identifier-system")?;
        step.identifier_systems.insert(k, v);
    }
    for s in &args.code_systems {
        let (k, v) = pair(s, "code-system")?;
        step.code_systems.insert(k, v);
    }
    for s in &args.code_maps {
        let (k, v) = pair(s, "code-map")?;
        step.code_maps.insert(k, v);
    }
    if args.unscoped_global {
        step.unscoped_identifiers = Some(FhirUnscoped::Global);
    }
    if args.keep_unmapped {
        step.unmapped = Some(FhirUnmapped::Extension);
    }
    Ok(step)
}

/// The toFhir step of a route in a routes file.
fn route_step(path: &PathBuf, name: Option<&str>) -> anyhow::Result<ToFhirStep> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let docs = hl7gw_transformer::source::parse_file(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut found = Vec::new();
    for (route, doc) in docs {
        let Ok(doc) = doc else { continue };
        if name.is_some_and(|n| n != route) {
            continue;
        }
        if let Some(step) = doc.spec.transforms.iter().find_map(|t| t.to_fhir.clone()) {
            found.push((route, step));
        }
    }
    match found.len() {
        1 => Ok(found.remove(0).1),
        0 => anyhow::bail!(
            "{}: no route {}with a toFhir step",
            path.display(),
            name.map(|n| format!("{n:?} ")).unwrap_or_default()
        ),
        _ => anyhow::bail!(
            "{}: several routes with a toFhir step ({}): name one with --route-name",
            path.display(),
            found
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
