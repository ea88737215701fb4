//! `hl7gw ack`: the ACK the gateway would send for a message, or the NAK for one that does not parse.

use crate::files::read;
use hl7v2::ack::{AckError, AckIds, Outcome, ack_code, hl7_timestamp, write_ack};
use hl7v2::{Header, Message};
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

/// `hl7gw ack`: the ACK for a file's message, or the NAK for one that does not parse.
pub fn run(path: &PathBuf, outcome: OutcomeArg) -> anyhow::Result<ExitCode> {
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
