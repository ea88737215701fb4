//! The command line of `hl7gw`: every command, its arguments (each command's own in its module of `commands/`)
//! and its one-line help.

use crate::commands::*;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(name = "hl7gw", version, about = "HL7 v2 tool of the hl7gw gateway")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
