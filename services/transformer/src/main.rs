//! `hl7gw-transformer`: reads the config, starts telemetry, runs the transformer until SIGTERM.
//! `hl7gw-transformer crd` prints the `HL7Route` CustomResourceDefinition generated from the Rust type.

use clap::{Parser, Subcommand};
use serde::Serialize;

/// Flags override the config file and `HL7GW_...` variables.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "hl7gw-transformer",
    version,
    about = "hl7gw transformer: routes and transforms hl7.inbound into hl7.out.<destination>"
)]
struct Flags {
    #[command(subcommand)]
    #[serde(skip)]
    command: Option<Command>,
    #[command(flatten)]
    #[serde(flatten)]
    common: hl7gw_runtime::config::CommonFlags,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    inbound_topic: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    group_id: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the HL7Route CRD (YAML).
    Crd,
}

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    if let Some(Command::Crd) = flags.command {
        let crd = hl7gw_transformer::route::crd_yaml();
        return hl7gw_runtime::exit(crd.map(|yaml| print!("{yaml}")));
    }
    let run = hl7gw_runtime::service::main::<hl7gw_transformer::App>(
        "hl7gw-transformer",
        &flags.common,
        &flags,
    );
    hl7gw_runtime::exit(run)
}
