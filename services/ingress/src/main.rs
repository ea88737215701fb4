//! `hl7gw-ingress`: reads the config, starts telemetry, runs the ingress until SIGTERM.

use clap::Parser;
use hl7gw_ingress::config::{AckMode, Config};
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
    hl7gw_runtime::exit(run())
}

fn run() -> anyhow::Result<()> {
    let flags = Flags::parse();
    let cfg: Config = hl7gw_runtime::config::load(flags.common.config.as_deref(), &flags)?;
    cfg.validate()?;
    if flags.common.check_config {
        cfg.read_key_salt()?;
        hl7gw_runtime::service::check_config(&cfg.kafka, &cfg.grpc)?;
        println!("configuration is valid");
        return Ok(());
    }
    hl7gw_runtime::shutdown::block_on("hl7gw-ingress", cfg.service.log_json, |stop| async move {
        let app = hl7gw_ingress::build(cfg).await?;
        app.bound().print("hl7gw-ingress");
        app.run(stop).await
    })?;
    Ok(())
}
