//! The subcommands.

use crate::read;
use hl7v2::ack::{AckError, AckIds, Outcome, ack_code, hl7_timestamp, write_ack};
use hl7v2::{Header, Message};
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

/// `--outcome` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OutcomeArg {
    Accept,
    Error,
    Reject,
}

/// Bytes to a string one char per byte (ISO-8859-1), as the flat format compares values.
fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| char::from(c)).collect()
}

/// `hl7gw flat`: one JSON line per file; exit 1 when any file failed to parse.
pub fn flat(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
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

/// `hl7gw ack`: the ACK for a file's message, or the NAK for one that does not parse.
pub fn ack(path: &PathBuf, outcome: OutcomeArg) -> anyhow::Result<ExitCode> {
    let bytes = read(path)?;
    let now = hl7_timestamp(SystemTime::now());
    let control_id = format!("ACK{}", String::from_utf8_lossy(&now[..14]));
    let ids = AckIds {
        control_id: control_id.as_bytes(),
        timestamp: &now,
    };
    let mut out = Vec::with_capacity(512);
    let code = match Message::parse(&bytes) {
        Ok(m) => {
            let outcome = match outcome {
                OutcomeArg::Accept => Outcome::Accept,
                OutcomeArg::Error => Outcome::Error,
                OutcomeArg::Reject => Outcome::Reject,
            };
            let err = (outcome != Outcome::Accept).then_some(AckError::error(
                hl7v2::ErrorCode::ApplicationInternalError,
                "rejected on request",
            ));
            let code = ack_code(m.header(), outcome);
            write_ack(&mut out, m.header(), code, err.as_ref(), &ids);
            code
        }
        Err(e) => {
            let h = Header::salvage(&bytes);
            let text = e.to_string();
            let err = AckError::error(e.code(), &text);
            let code = ack_code(&h, Outcome::Reject);
            write_ack(&mut out, &h, code, Some(&err), &ids);
            code
        }
    };
    let mut stdout = std::io::stdout().lock();
    for seg in out.split(|&b| b == b'\r').filter(|s| !s.is_empty()) {
        stdout.write_all(seg)?;
        stdout.write_all(b"\n")?;
    }
    Ok(match code.outcome() {
        Outcome::Accept => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    })
}
