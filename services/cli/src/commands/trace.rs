//! `hl7gw trace`: where a message went (gRPC Egress/Trace): the ingress's record and the ledger's events, a
//! table or JSON lines.

use crate::connect::{Conn, runtime, status_error};
use crate::when::{rfc3339, timestamp};
use hl7gw_proto::v1::TraceRequest;
use hl7gw_proto::v1::egress_client::EgressClient;
use serde_json::json;
use std::process::ExitCode;

/// `hl7gw trace`.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    #[command(flatten)]
    conn: Conn,
    /// The message's envelope id (from a dead letter, a log line or the hl7.events topic)
    #[arg(long, value_name = "ID", conflicts_with = "control_id")]
    id: Option<String>,
    /// The message's control id (MSH-10)
    #[arg(long, value_name = "MSH-10", required_unless_present = "id")]
    control_id: Option<String>,
    /// With --control-id: only from this sending application (MSH-3 as sent)
    #[arg(long, value_name = "MSH-3")]
    sending_application: Option<String>,
    /// With --control-id: only from this sending facility (MSH-4 as sent)
    #[arg(long, value_name = "MSH-4")]
    sending_facility: Option<String>,
    /// Received from this time: RFC 3339 or a time ago (1h, 2d); default an hour before --until
    #[arg(long)]
    since: Option<String>,
    /// Received until this time: RFC 3339 or a time ago; default now
    #[arg(long)]
    until: Option<String>,
    /// At most this many messages (the server keeps it at 100 or fewer)
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// JSON lines (one per message, its events in it) instead of a table
    #[arg(long)]
    json: bool,
}

/// A delivery's answer as the trace prints it: the MSA-1 code, or `HTTP <status>` for an HTTP destination.
fn answer(e: &hl7gw_proto::v1::Event) -> String {
    match (e.ack_code.as_str(), e.http_status) {
        ("", 0) => String::new(),
        ("", status) => format!("HTTP {status}"),
        (code, _) => code.to_owned(),
    }
}

/// Prints where each message found went; exit 1 when none was found.
pub fn run(a: TraceArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let r = EgressClient::new(ch)
            .trace(TraceRequest {
                envelope_id: a.id.unwrap_or_default(),
                control_id: a.control_id.unwrap_or_default(),
                sending_application: a.sending_application.unwrap_or_default(),
                sending_facility: a.sending_facility.unwrap_or_default(),
                since: timestamp(&a.since)?,
                until: timestamp(&a.until)?,
                limit: a.limit,
            })
            .await
            .map_err(status_error)?
            .into_inner();
        for m in &r.messages {
            let h = m.header.clone().unwrap_or_default();
            let src = m.source.clone().unwrap_or_default();
            let events: Vec<serde_json::Value> = m
                .events
                .iter()
                .map(|e| {
                    let mut v = json!({
                        "at": rfc3339(e.at.as_ref()),
                        "kind": e.kind,
                        "stage": e.stage,
                        "route": e.route,
                        "destination": e.destination,
                        "topic": e.topic,
                        "partition": e.partition,
                        "offset": e.offset,
                        "pod": e.pod,
                    });
                    if e.http_status != 0 {
                        v["http_status"] = json!(e.http_status);
                    }
                    for (k, val) in [
                        ("ack_code", &e.ack_code),
                        ("reason", &e.reason),
                        ("replayed_by", &e.replayed_by),
                        ("replayed_from", &e.replayed_from),
                    ] {
                        if !val.is_empty() {
                            v[k] = json!(val);
                        }
                    }
                    if e.attempts > 0 {
                        v["attempts"] = json!(e.attempts);
                    }
                    if e.latency_ms > 0 {
                        v["latency_ms"] = json!(e.latency_ms);
                    }
                    v
                })
                .collect();
            if a.json {
                println!(
                    "{}",
                    json!({
                        "envelope_id": m.envelope_id,
                        "received_at": rfc3339(m.received_at.as_ref()),
                        "message_type": h.message_type,
                        "trigger_event": h.trigger_event,
                        "control_id": h.control_id,
                        "sending_application": h.sending_application,
                        "sending_facility": h.sending_facility,
                        "listener": src.listener,
                        "peer": src.peer,
                        "pod": src.pod,
                        "connection_id": src.connection_id,
                        "inbound": if m.topic.is_empty() { String::new() } else { format!("{}/{}/{}", m.topic, m.partition, m.offset) },
                        "events": events,
                    })
                );
                continue;
            }
            println!(
                "message {}  {}^{}  control id {}  from {} / {}",
                m.envelope_id,
                h.message_type,
                h.trigger_event,
                h.control_id,
                h.sending_application,
                h.sending_facility
            );
            if m.topic.is_empty() {
                println!("  received   (not in the inbound topic: retention, or another window)");
            } else {
                println!(
                    "  received   {}  by {} ({} {}, connection {})  -> {}/{}/{}",
                    rfc3339(m.received_at.as_ref()),
                    src.pod,
                    src.listener,
                    src.peer,
                    src.connection_id,
                    m.topic,
                    m.partition,
                    m.offset
                );
            }
            if m.events.is_empty() {
                println!("  (no events in the ledger yet: not routed, or the ledger is off)");
            }
            for e in &m.events {
                let mut what = match e.kind.as_str() {
                    "routed" => format!("route {} -> {} ({})", e.route, e.destination, e.topic),
                    "delivered" => format!(
                        "{} answered {} after {} attempt(s), {} ms after receipt",
                        e.destination,
                        answer(e),
                        e.attempts,
                        e.latency_ms
                    ),
                    "dead_lettered" => format!(
                        "by the {} for {}{} -> {}/{}/{}",
                        e.stage,
                        e.reason,
                        match answer(e) {
                            a if a.is_empty() => String::new(),
                            a => format!(" (answer {a})"),
                        },
                        e.topic,
                        e.partition,
                        e.offset
                    ),
                    "replayed" => format!(
                        "by {} from {} -> {}",
                        e.replayed_by, e.replayed_from, e.topic
                    ),
                    "dropped" => format!("no route took it ({})", e.reason),
                    _ => String::new(),
                };
                if !e.destination.is_empty() && e.kind == "dead_lettered" {
                    what = format!("{} [{}]", what, e.destination);
                }
                println!(
                    "  {:<10} {}  {}  ({})",
                    e.kind,
                    rfc3339(e.at.as_ref()),
                    what,
                    e.pod
                );
            }
        }
        eprintln!(
            "hl7gw trace: {} message(s), {} records read{}",
            r.messages.len(),
            r.records_scanned,
            if r.truncated {
                "; the search stopped at its bound: narrow --since/--until"
            } else {
                ""
            }
        );
        Ok(if r.messages.is_empty() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    })
}
