//! `hl7gw-ingress`: reads the config, starts telemetry, runs the ingress until SIGTERM.

use clap::Parser;
use hl7gw_ingress::config::AckMode;
use serde::Serialize;
use std::net::SocketAddr;

/// Flags override the config file and `HL7GW_...` variables.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "hl7gw-ingress",
    version,
    about = "hl7gw ingress: MLLP/gRPC in, ACK once Kafka holds it"
)]
struct Flags {
    #[command(flatten)]
    #[serde(flatten)]
    common: hl7gw_runtime::config::CommonFlags,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    mllp_addr: Option<SocketAddr>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    inbound_topic: Option<String>,
    /// durable (ACK after Kafka confirmed) or fast (ACK after parse).
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ack_mode: Option<AckMode>,
}

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    let run =
        hl7gw_runtime::service::main::<hl7gw_ingress::App>("hl7gw-ingress", &flags.common, &flags);
    hl7gw_runtime::exit(run)
}
