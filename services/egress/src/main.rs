//! `hl7gw-egress`: reads the config, starts telemetry, runs the egress until SIGTERM.

use clap::Parser;
use serde::Serialize;

/// Flags override the config file and `HL7GW_...` variables.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "hl7gw-egress",
    version,
    about = "hl7gw egress: delivers hl7.out.<destination> to receivers over MLLP"
)]
struct Flags {
    #[command(flatten)]
    #[serde(flatten)]
    common: hl7gw_runtime::config::CommonFlags,
}

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    let run =
        hl7gw_runtime::service::main::<hl7gw_egress::App>("hl7gw-egress", &flags.common, &flags);
    hl7gw_runtime::exit(run)
}
