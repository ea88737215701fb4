//! `hl7gw`: flat, ack, fhir, send and receive — the integration engineer's HL7 v2 tool —; status, trace,
//! deadletters, replay, dry-run and senders, the operator's side of the gRPC admin API (connect.rs: the one
//! connection they share); tail, reading envelopes straight from Kafka; completions and man, for the shell.
//! Each command is a module of `commands/`, named as the command is.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// One line on stderr for the operator, named after the command's module (`hl7gw send: ...`).
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log_line(module_path!(), format_args!($($arg)*))
    };
}

mod commands;
mod connect;
mod sanitise;
mod when;

use commands::*;

#[derive(Debug, Parser)]
#[command(name = "hl7gw", version, about = "HL7 v2 tool of the hl7gw gateway")]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the canonical flat view of each file as one JSON line (docs/flat-format.md in the repository).
    Flat {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the ACK the gateway would send for a message (segments on separate lines).
    Ack {
        file: PathBuf,
        /// Outcome to acknowledge: accept, error or reject.
        #[arg(long, default_value = "accept")]
        outcome: ack::OutcomeArg,
    },
    /// Convert message files to FHIR R4 Bundles as a route's toFhir step would, offline (settings from a
    /// routes file or flags): each Bundle on stdout, what was not mapped on stderr.
    Fhir(fhir::FhirArgs),
    /// Send message files to an MLLP receiver (TLS optional) and print each ACK.
    Send(send::SendArgs),
    /// Listen for MLLP connections, store each message as a file and ACK it.
    Receive(receive::ReceiveArgs),
    /// List the egress's dead letters (gRPC Egress/ListDeadLetters; TLS, token), one JSON line each.
    Deadletters(deadletters::DeadLettersArgs),
    /// Send dead letters back (gRPC Egress/Replay; TLS, token): once each, unless --force.
    Replay(replay::ReplayArgs),
    /// Each destination of an egress pod: connected, backlog, oldest undelivered age, last ACK (Egress/Status).
    Status(status::StatusArgs),
    /// Where a message went, by envelope id or control id: received, routed, delivered, dead-lettered,
    /// replayed (Egress/Trace, from the inbound topic and the hl7.events ledger).
    Trace(trace::TraceArgs),
    /// Show what the transformer's live routes would do with a message (gRPC Transform; TLS, token).
    DryRun(dry_run::DryRunArgs),
    /// Show an ingress pod's senders and connections: messages, NAKs, last message (gRPC Ingest/Senders).
    Senders(senders::SendersArgs),
    /// Read a topic's envelopes (default hl7.inbound) from a time or from the end: one JSON line each, ids and
    /// header only (the message with --with-message), filtered by type, sender, destination.
    Tail(tail::TailArgs),
    /// Print a shell completion script: `source <(hl7gw completions bash)`.
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) of hl7gw or of one command: `hl7gw man tail | man -l -`.
    Man {
        /// A command (default: hl7gw itself, which lists them)
        command: Option<String>,
    },
}

/// Writes `args` to stderr as `hl7gw <command>: ...`, the command being the module under `commands` that
/// `module` is in (`hl7gw::commands::receive::http` logs as `hl7gw receive: ...`).
fn log_line(module: &str, args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "hl7gw {}: {args}", command_of(module));
}

/// The command a module path belongs to: the part after `commands`, `_` written `-` (`dry_run` is `dry-run`).
fn command_of(module: &str) -> String {
    let mut parts = module.split("::");
    let command = match parts.by_ref().position(|p| p == "commands") {
        Some(_) => parts.next(),
        None => None,
    };
    command
        .unwrap_or_else(|| module.rsplit("::").next().unwrap_or(module))
        .replace('_', "-")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Flat { files } => flat::run(&files),
        Command::Ack { file, outcome } => ack::run(&file, outcome),
        Command::Fhir(args) => fhir::run(args),
        Command::Send(args) => send::run(args),
        Command::Receive(args) => receive::run(args),
        Command::Deadletters(args) => deadletters::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Status(args) => status::run(args),
        Command::Trace(args) => trace::run(args),
        Command::DryRun(args) => dry_run::run(args),
        Command::Senders(args) => senders::run(args),
        Command::Tail(args) => tail::run(args),
        Command::Completions { shell } => completions::run(shell),
        Command::Man { command } => man::run(command.as_deref()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "hl7gw: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Reads a file, naming it in the error.
fn read(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_lines_are_named_after_their_command() {
        assert_eq!(super::command_of("hl7gw::commands::send"), "send");
        assert_eq!(
            super::command_of("hl7gw::commands::receive::http"),
            "receive"
        );
        assert_eq!(super::command_of("hl7gw::commands::dry_run"), "dry-run");
        assert_eq!(super::command_of("hl7gw::connect"), "connect");
    }
}
