//! `hl7gw-egress`: reads the config, starts telemetry, runs the egress until SIGTERM.

use clap::Parser;
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Flags override the config file and `HL7GW_...` variables.
#[derive(Debug, Parser, Serialize)]
#[command(
    name = "hl7gw-egress",
    version,
    about = "hl7gw egress: delivers hl7.out.<destination> to receivers over MLLP"
)]
struct Flags {
    /// YAML config file (every key also settable as HL7GW_<KEY>, nested keys with __).
    #[arg(long, env = "HL7GW_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Validate the configuration and exit.
    #[arg(long)]
    #[serde(skip)]
    check_config: bool,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_addr: Option<SocketAddr>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_addr: Option<SocketAddr>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kafka_brokers: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    dlq_topic: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    let cfg: hl7gw_egress::config::Config =
        hl7gw_runtime::config::load(flags.config.as_deref(), &flags)?;
    cfg.validate()?;
    if flags.check_config {
        println!("configuration is valid");
        return Ok(());
    }
    hl7gw_runtime::shutdown::block_on("hl7gw-egress", cfg.log_json, |stop| {
        hl7gw_egress::run(cfg, stop, |b| {
            hl7gw_runtime::shutdown::print_listening(format_args!(
                "hl7gw-egress listening grpc={} admin={}",
                b.grpc, b.admin
            ))
        })
    })?;
    Ok(())
}
