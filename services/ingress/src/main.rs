//! `hl7gw-ingress`: reads the config, starts telemetry, runs the ingress until SIGTERM.

use hl7gw_ingress::config::AckMode;
use serde::Serialize;
use std::net::SocketAddr;

/// The ingress's own flags.
#[derive(Debug, clap::Args, Serialize)]
struct Own {
    #[arg(long)]
    mllp_addr: Option<SocketAddr>,
    #[arg(long)]
    inbound_topic: Option<String>,
    /// durable (ACK after Kafka confirmed) or fast (ACK after parse).
    #[arg(long, value_enum)]
    ack_mode: Option<AckMode>,
}

fn main() -> std::process::ExitCode {
    let about = "hl7gw ingress: MLLP/gRPC in, ACK once Kafka holds it";
    hl7gw_runtime::service::binary::<hl7gw_ingress::App, Own>("hl7gw-ingress", about)
}
