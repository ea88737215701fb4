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
    hl7gw_runtime::exit(run())
}

fn run() -> anyhow::Result<()> {
    let flags = Flags::parse();
    let cfg: hl7gw_egress::config::Config =
        hl7gw_runtime::config::load(flags.common.config.as_deref(), &flags)?;
    cfg.validate()?;
    if flags.common.check_config {
        hl7gw_runtime::service::check_config(&cfg.kafka, &cfg.grpc)?;
        println!("configuration is valid");
        return Ok(());
    }
    hl7gw_runtime::shutdown::block_on("hl7gw-egress", cfg.service.log_json, |stop| async move {
        let app = hl7gw_egress::build(cfg).await?;
        app.bound().print("hl7gw-egress");
        app.run(stop).await
    })?;
    Ok(())
}
