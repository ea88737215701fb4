//! `hl7gw`: flat, ack, fhir, send and receive — the integration engineer's HL7 v2 tool —; status, trace,
//! deadletters, replay, dry-run and senders, the operator's side of the gRPC admin API (connect.rs: the one
//! connection they share); tail, reading envelopes straight from Kafka; completions and man, for the shell.
//! Each command is a module of `commands/`, named as the command is; the command line itself is `cli.rs`, the
//! operator's stderr lines `log.rs`.

use std::io::Write;
use std::process::ExitCode;

/// One line on stderr for the operator, named after the command's module (`hl7gw send: ...`).
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log::line(module_path!(), format_args!($($arg)*))
    };
}

mod cli;
mod commands;
mod connect;
mod files;
mod log;
mod sanitise;
mod when;

use clap::Parser;
use cli::{Cli, Command};
use commands::*;

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
            // Each cause once (as the services print theirs): a typed error that writes its source into its own
            // text would be said twice by `{e:#}`.
            let _ = writeln!(
                std::io::stderr(),
                "hl7gw: {}",
                hl7gw_runtime::error_chain(e.as_ref())
            );
            ExitCode::from(2)
        }
    }
}
