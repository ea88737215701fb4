//! `hl7gw deadletters`: the egress's dead letters (gRPC Egress/ListDeadLetters), one JSON line each, page
//! after page; the message bodies only with `--with-message` (the ReadMessages permission).

use crate::connect::{Conn, runtime, status_error};
use crate::when::{rfc3339, timestamp};
use hl7gw_proto::v1::ListDeadLettersRequest;
use hl7gw_proto::v1::egress_client::EgressClient;
use serde_json::json;
use std::process::ExitCode;

/// Which dead letters: of a destination, of a stage, within a time range.
#[derive(Debug, clap::Args)]
pub struct Selection {
    /// Of this destination
    #[arg(long)]
    pub(super) destination: Option<String>,
    /// Of this stage: egress (a receiver refused it or it could not be delivered), transformer (no route
    /// took it, or a route failed) or ingress (input the ingress refused with a NAK: listed, never replayed;
    /// their senders resend)
    #[arg(long)]
    pub(super) stage: Option<String>,
    /// Of this reason (e.g. rejected, gave_up, unmatched)
    #[arg(long)]
    pub(super) reason: Option<String>,
    /// From this time: RFC 3339, or a time ago (1h, 30m, 2d)
    #[arg(long)]
    pub(super) since: Option<String>,
    /// Until this time: RFC 3339, or a time ago
    #[arg(long)]
    pub(super) until: Option<String>,
    /// Go on where an earlier page stopped (the cursor it printed); --since is then not used
    #[arg(long)]
    pub(super) cursor: Option<String>,
}

/// `hl7gw deadletters`: list dead letters of the egress.
#[derive(Debug, clap::Args)]
pub struct DeadLettersArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(flatten)]
    select: Selection,
    /// At most this many (0: the server's page size)
    #[arg(long, default_value_t = 0)]
    limit: u32,
    /// Also print each message (patient data). Needs the ReadMessages permission on top of ListDeadLetters:
    /// `grpc.allow` ReadMessages, or RBAC `get messages.hl7gw.io` (the chart's operator role, not the viewer)
    #[arg(long)]
    with_message: bool,
    /// Every page, not only the first (each page asked with the previous one's cursor)
    #[arg(long)]
    all: bool,
}

pub(crate) fn dead_letter_line(d: &hl7gw_proto::v1::DeadLetter) -> serde_json::Value {
    let mut line = json!({
        "id": d.id,
        "at": rfc3339(d.at.as_ref()),
        "stage": d.stage,
        "destination": d.destination,
        "reason": d.reason,
        "ack_code": d.ack_code,
        "attempts": d.attempts,
        "message_type": d.message_type,
        "control_id": d.control_id,
        "dlq": format!("{}/{}", d.partition, d.offset),
    });
    if d.http_status != 0 {
        line["http_status"] = json!(d.http_status);
    }
    if !d.replayed_by.is_empty() {
        line["replayed_by"] = json!(d.replayed_by);
        line["replayed_at"] = json!(rfc3339(d.replayed_at.as_ref()));
    }
    line
}

/// Prints one JSON line per dead letter (no message unless `--with-message`), page after page with `--all`;
/// the last page's cursor goes to stderr.
pub fn run(a: DeadLettersArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let mut client = EgressClient::new(ch);
        let mut cursor = a.select.cursor.clone().unwrap_or_default();
        let mut total = 0usize;
        loop {
            let r = client
                .list_dead_letters(ListDeadLettersRequest {
                    destination: a.select.destination.clone().unwrap_or_default(),
                    stage: a.select.stage.clone().unwrap_or_default(),
                    reason: a.select.reason.clone().unwrap_or_default(),
                    since: timestamp(&a.select.since)?,
                    until: timestamp(&a.select.until)?,
                    limit: a.limit,
                    include_envelope: a.with_message,
                    cursor: cursor.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            for d in &r.dead_letters {
                let mut line = dead_letter_line(d);
                if let Some(env) = &d.envelope {
                    line["message"] = json!(String::from_utf8_lossy(&env.raw));
                }
                println!("{line}");
            }
            total += r.dead_letters.len();
            let stuck = r.next_cursor == cursor;
            cursor = r.next_cursor;
            if !(r.truncated && a.all) || stuck {
                eprintln!(
                    "hl7gw deadletters: {total} dead letter(s){}",
                    if r.truncated {
                        format!("; more match: continue with --cursor {cursor}")
                    } else {
                        format!("; next time, --cursor {cursor} lists only newer ones")
                    }
                );
                return Ok(ExitCode::SUCCESS);
            }
        }
    })
}
