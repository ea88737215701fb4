//! `hl7gw dry-run`: what the transformer's live routes would do with a message (gRPC Transform).

use crate::connect::{Conn, runtime, status_error};
use hl7gw_proto::v1::TransformRequest;
use hl7gw_proto::v1::transform_client::TransformClient;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// `hl7gw dry-run`: what the transformer's live routes would do with a message.
#[derive(Debug, clap::Args)]
pub struct DryRunArgs {
    #[command(flatten)]
    conn: Conn,
    /// Message file (ER7)
    file: PathBuf,
    /// Only this route
    #[arg(long)]
    route: Option<String>,
}

/// Prints one JSON line per output and per route that did not match.
pub fn run(a: DryRunArgs) -> anyhow::Result<ExitCode> {
    let message = crate::files::read(&a.file)?;
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let r = TransformClient::new(ch)
            .transform(TransformRequest {
                message: message.into(),
                route: a.route.unwrap_or_default(),
                ..TransformRequest::default()
            })
            .await
            .map_err(status_error)?
            .into_inner();
        for o in &r.outputs {
            println!(
                "{}",
                json!({
                    "route": o.route,
                    "destination": o.destination,
                    "topic": o.topic,
                    "content_type": o.content_type,
                    "error": o.error,
                    "message": String::from_utf8_lossy(&o.message),
                })
            );
        }
        for m in &r.misses {
            println!("{}", json!({"route": m.route, "no_match": m.reason}));
        }
        Ok(ExitCode::SUCCESS)
    })
}
