//! `hl7gw-transformer`: reads the config, starts telemetry, runs the transformer until SIGTERM.
//! `hl7gw-transformer crd` prints the `HL7Route` CustomResourceDefinition generated from the Rust type.

use clap::Subcommand;
use hl7gw_runtime::config::Flags;
use serde::Serialize;

/// The transformer's own flags, and its one subcommand.
#[derive(Debug, clap::Args, Serialize)]
struct Own {
    #[command(subcommand)]
    #[serde(skip)]
    command: Option<Command>,
    #[arg(long)]
    inbound_topic: Option<String>,
    #[arg(long)]
    group_id: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the HL7Route CRD (YAML).
    Crd,
}

const NAME: &str = "hl7gw-transformer";

fn main() -> std::process::ExitCode {
    let about = "hl7gw transformer: routes and transforms hl7.inbound into hl7.out.<destination>";
    let flags = Flags::<Own>::parse_as(NAME, about);
    if let Some(Command::Crd) = flags.own.command {
        let crd = hl7gw_transformer::route::crd_yaml();
        return hl7gw_runtime::exit(crd.map(|yaml| print!("{yaml}")));
    }
    let run = hl7gw_runtime::service::main::<hl7gw_transformer::App, _>(NAME, &flags);
    hl7gw_runtime::exit(run)
}
