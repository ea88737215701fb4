//! `hl7gw`: flat, ack, send and receive — the integration engineer's HL7 v2 tool — and deadletters, replay and
//! dry-run, the operator's side of the gRPC admin API; tail, reading envelopes straight from Kafka; completions
//! and man, for the shell and `man`.

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

mod admin;
mod commands;
mod fhir;
mod ops;
mod receive;
mod receive_http;
mod sanitise;
mod send;
mod senders;
mod tail;
mod tls;

#[derive(Debug, Parser)]
#[command(name = "hl7gw", version, about = "HL7 v2 tool of the hl7gw gateway")]
struct Cli {
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
        outcome: commands::OutcomeArg,
    },
    /// Convert message files to FHIR R4 Bundles as a route's toFhir step would, offline (settings from a
    /// routes file or flags): each Bundle on stdout, what was not mapped on stderr.
    Fhir(fhir::FhirArgs),
    /// Send message files to an MLLP receiver (TLS optional) and print each ACK.
    Send(send::SendArgs),
    /// Listen for MLLP connections, store each message as a file and ACK it.
    Receive(receive::ReceiveArgs),
    /// List the egress's dead letters (gRPC Egress/ListDeadLetters; TLS, token), one JSON line each.
    Deadletters(admin::DeadLettersArgs),
    /// Send dead letters back (gRPC Egress/Replay; TLS, token): once each, unless --force.
    Replay(admin::ReplayArgs),
    /// Each destination of an egress pod: connected, backlog, oldest undelivered age, last ACK (Egress/Status).
    Status(ops::StatusArgs),
    /// Where a message went, by envelope id or control id: received, routed, delivered, dead-lettered,
    /// replayed (Egress/Trace, from the inbound topic and the hl7.events ledger).
    Trace(ops::TraceArgs),
    /// Show what the transformer's live routes would do with a message (gRPC Transform; TLS, token).
    DryRun(admin::DryRunArgs),
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

/// Writes `args` to stderr as `hl7gw <command>: ...`, the command being the last part of `module`.
fn log_line(module: &str, args: std::fmt::Arguments<'_>) {
    let command = module.rsplit("::").next().unwrap_or(module);
    let _ = writeln!(std::io::stderr(), "hl7gw {command}: {args}");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Flat { files } => commands::flat(&files),
        Command::Ack { file, outcome } => commands::ack(&file, outcome),
        Command::Fhir(args) => fhir::run(args),
        Command::Send(args) => send::run(args),
        Command::Receive(args) => receive::run(args),
        Command::Deadletters(args) => admin::deadletters(args),
        Command::Replay(args) => admin::replay(args),
        Command::Status(args) => ops::status(args),
        Command::Trace(args) => ops::trace(args),
        Command::DryRun(args) => admin::dry_run(args),
        Command::Senders(args) => senders::run(args),
        Command::Tail(args) => tail::run(args),
        Command::Completions { shell } => completions(shell),
        Command::Man { command } => man(command.as_deref()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "hl7gw: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `hl7gw completions <shell>`: the completion script on stdout.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "hl7gw", &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// `hl7gw man [command]`: the man page of hl7gw (`hl7gw(1)`) or of one command (`hl7gw-tail(1)`).
fn man(command: Option<&str>) -> anyhow::Result<ExitCode> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    cmd.build();
    let page = match command {
        None => clap_mangen::Man::new(cmd),
        Some(name) => {
            let sub = cmd
                .find_subcommand(name)
                .ok_or_else(|| anyhow::anyhow!("no command {name:?}: see hl7gw --help"))?;
            let title = format!("hl7gw-{}", sub.get_name());
            let sub = sub
                .clone()
                .display_name(title.clone())
                .bin_name(format!("hl7gw {}", sub.get_name()));
            clap_mangen::Man::new(sub).title(title)
        }
    };
    let mut out = Vec::new();
    page.render(&mut out)?;
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// Reads a file, naming it in the error.
fn read(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}
