//! `hl7gw flat`: the canonical flat view of each file as one JSON line (docs/flat-format.md).

use crate::files::read;
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Bytes to a string one char per byte (ISO-8859-1), as the flat format compares values.
fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| char::from(c)).collect()
}

/// `hl7gw flat`: one JSON line per file; exit 1 when any file failed to parse.
pub fn run(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut all_ok = true;
    for path in files {
        let bytes = read(path)?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let line = match hl7v2::flat_file(&bytes) {
            Ok(entries) => {
                let flat: Map<String, Value> = entries
                    .iter()
                    .map(|e| (e.key(), Value::String(latin1(&e.value))))
                    .collect();
                json!({"file": name, "ok": true, "error": null, "flat": flat})
            }
            Err(e) => {
                all_ok = false;
                json!({"file": name, "ok": false, "error": e.to_string(), "flat": {}})
            }
        };
        writeln!(out, "{line}")?;
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
