//! `hl7gw replay`: dead letters sent back (gRPC Egress/Replay), each whole or refused with where its original
//! was.

use super::deadletters::{Selection, dead_letter_line};
use crate::connect::{Conn, runtime, status_error};
use crate::when::timestamp;
use anyhow::bail;
use hl7gw_proto::v1::ReplayRequest;
use hl7gw_proto::v1::egress_client::EgressClient;
use std::process::ExitCode;

/// `hl7gw replay`: send dead letters back, each whole (a letter whose message was dropped to fit Kafka's record
/// limit is sent with the message re-read from the topic it came from); a letter that cannot be is refused,
/// named with why and where its original was, and the command exits 1.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    conn: Conn,
    /// Envelope ids to replay (from `hl7gw deadletters`); or everything the selection matches
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    select: Selection,
    /// List what would be replayed (one JSON line each); replay nothing
    #[arg(long)]
    dry_run: bool,
    /// Also replay letters that were replayed before (without it they are skipped)
    #[arg(long)]
    force: bool,
}

/// Replays what the selection matches, page after page (each page one Kafka transaction: a cut run can be run
/// again, letters already replayed are skipped unless `--force`), printing the ids sent back; with
/// `--dry-run`, the letters that would be, one JSON line each.
pub fn run(a: ReplayArgs) -> anyhow::Result<ExitCode> {
    if a.ids.is_empty() && a.select.destination.is_none() && a.select.stage.is_none() {
        bail!("name --id, or --destination or --stage (with --since/--until, --reason)");
    }
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let mut client = EgressClient::new(ch);
        let mut cursor = a.select.cursor.clone().unwrap_or_default();
        let (mut replayed, mut skipped, mut refused) = (0u64, 0u64, 0u64);
        loop {
            let r = client
                .replay(ReplayRequest {
                    ids: a.ids.clone(),
                    destination: a.select.destination.clone().unwrap_or_default(),
                    stage: a.select.stage.clone().unwrap_or_default(),
                    reason: a.select.reason.clone().unwrap_or_default(),
                    since: timestamp(&a.select.since)?,
                    until: timestamp(&a.select.until)?,
                    cursor: cursor.clone(),
                    dry_run: a.dry_run,
                    force: a.force,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if a.dry_run {
                for d in &r.letters {
                    println!("{}", dead_letter_line(d));
                }
            } else {
                for id in &r.ids {
                    println!("{id}");
                }
            }
            // Never sent without its message: why, and where the original was read.
            for f in &r.refused {
                eprintln!(
                    "hl7gw replay: not replayed {} (control id {}): {}; the original was read at {}",
                    f.id,
                    f.control_id,
                    f.why,
                    if f.origin.is_empty() {
                        "an unrecorded place"
                    } else {
                        f.origin.as_str()
                    }
                );
            }
            replayed += u64::from(r.replayed);
            skipped += u64::from(r.skipped);
            refused += r.refused.len() as u64;
            // A page that moved nothing ends it (the server's cursor did not advance).
            let stuck = r.next_cursor == cursor;
            cursor = r.next_cursor;
            if !r.truncated || stuck {
                break;
            }
        }
        eprintln!(
            "hl7gw replay: {replayed} {}{}",
            if a.dry_run {
                "would be replayed"
            } else {
                "replayed"
            },
            if skipped > 0 {
                format!("; {skipped} skipped: replayed before (--force sends them again)")
            } else {
                String::new()
            }
        );
        if refused > 0 {
            eprintln!(
                "hl7gw replay: {refused} refused: their message is neither in the dead letter nor still in the topic it was read from"
            );
            return Ok(ExitCode::FAILURE);
        }
        Ok(ExitCode::SUCCESS)
    })
}
