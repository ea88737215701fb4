//! `hl7gw-egress`: reads the config, starts telemetry, runs the egress until SIGTERM.

use anyhow::Context;
use clap::Parser;
use serde::Serialize;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let _telemetry = hl7gw_runtime::telemetry::init("hl7gw-egress", cfg.log_json)?;
        let stop = CancellationToken::new();
        hl7gw_runtime::shutdown::cancel_on_signal(stop.clone());
        hl7gw_egress::run(cfg, stop, |b| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "hl7gw-egress listening grpc={} admin={}",
                b.grpc, b.admin
            );
            let _ = out.flush();
        })
        .await?;
        Ok(())
    })
}
