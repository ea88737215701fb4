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
    hl7gw_runtime::exit(run())
}

fn run() -> anyhow::Result<()> {
    let flags = Flags::parse();
    if let Some(Command::Crd) = flags.command {
        print!("{}", hl7gw_transformer::route::crd_yaml()?);
        return Ok(());
    }
    let cfg: hl7gw_transformer::config::Config =
        hl7gw_runtime::config::load(flags.common.config.as_deref(), &flags)?;
    cfg.validate()?;
    if flags.common.check_config {
        hl7gw_runtime::service::check_config(&cfg.kafka, &cfg.grpc)?;
        if let Some(path) = &cfg.routes.file {
            let (_r, m) = hl7gw_transformer::metrics::TransformerMetrics::registered();
            let live = hl7gw_transformer::source::LiveRoutes::default();
            let verdicts = hl7gw_transformer::source::load_file(path, &live, &m)?;
            let mut bad = 0;
            for v in verdicts {
                match v.refused {
                    None => println!("route {}: accepted", v.name),
                    Some(r) => {
                        bad += 1;
                        println!("route {}: refused: {r}", v.name);
                    }
                }
            }
            anyhow::ensure!(bad == 0, "{bad} route(s) refused");
        }
        println!("configuration is valid");
        return Ok(());
    }
    hl7gw_runtime::shutdown::block_on(
        "hl7gw-transformer",
        cfg.service.log_json,
        |stop| async move {
            let app = hl7gw_transformer::build(cfg).await?;
            app.bound().print("hl7gw-transformer");
            app.run(stop).await
        },
    )?;
    Ok(())
}
