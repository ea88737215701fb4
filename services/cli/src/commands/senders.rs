//! `hl7gw senders`: an ingress pod's live view of its senders (gRPC `Ingest/Senders`, an admin method: TLS and a
//! token as for `hl7gw deadletters`). A readable table by default, the senders that have been silent longest
//! first; `--json` for one JSON line per sender, per connection and a summary.

use crate::connect::{Conn, runtime, status_error};
use hl7gw_proto::v1::ingest_client::IngestClient;
use hl7gw_proto::v1::{Sender, SenderConnection, SenderCounts, SendersRequest};
use serde_json::json;
use std::io::Write;
use std::process::ExitCode;
use std::time::SystemTime;

/// `hl7gw senders`: who is sending to an ingress pod.
#[derive(Debug, clap::Args)]
pub struct SendersArgs {
    #[command(flatten)]
    conn: Conn,
    /// Only this sending application (MSH-3, its first component)
    #[arg(long, value_name = "MSH-3")]
    application: Option<String>,
    /// One JSON line per sender and per connection, then a summary line
    #[arg(long)]
    json: bool,
}

/// Asks the ingress and prints its answer.
pub fn run(a: SendersArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        // A view of up to 10,000 senders is larger than tonic's default 4 MiB answer.
        let r = IngestClient::new(ch)
            .max_decoding_message_size(64 << 20)
            .senders(SendersRequest {
                sending_application: a.application.unwrap_or_default(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        let now = SystemTime::now();
        let mut senders = r.senders.clone();
        // Silent longest first: the question is usually "which sender stopped sending?".
        senders.sort_by_key(|s| last(s.counts.as_ref()));
        let other = r.other.clone().unwrap_or_default();
        let mut out = std::io::stdout().lock();
        if a.json {
            for s in &senders {
                writeln!(out, "{}", sender_json(s))?;
            }
            for c in &r.connections {
                writeln!(out, "{}", connection_json(c))?;
            }
            writeln!(
                out,
                "{}",
                json!({
                    "kind": "summary",
                    "pod": r.pod,
                    "tracked": r.tracked,
                    "max_senders": r.max_senders,
                    "other": counts_json(&other),
                })
            )?;
        } else {
            let mut rows = vec![row([
                "APPLICATION",
                "FACILITY",
                "NAME",
                "MESSAGES",
                "NAKS",
                "LAST MESSAGE",
                "SILENT FOR",
                "CONNS",
                "LAST PEER",
                "LISTENER",
            ])];
            for s in &senders {
                let c = s.counts.clone().unwrap_or_default();
                rows.push(vec![
                    clean(&s.sending_application),
                    clean(&s.sending_facility),
                    clean(&s.name),
                    c.messages.to_string(),
                    naks(&c),
                    time(c.last_message_at.as_ref()),
                    ago(now, c.last_message_at.as_ref()),
                    s.open_connections.to_string(),
                    clean(&s.last_peer),
                    clean(&s.last_listener),
                ]);
            }
            table(&mut out, &rows)?;
            writeln!(out)?;
            let mut rows = vec![row([
                "CONNECTION",
                "LISTENER",
                "PEER",
                "CONNECTED SINCE",
                "MESSAGES",
                "NAKS",
                "LAST MESSAGE",
                "APPLICATION",
                "FACILITY",
            ])];
            for k in &r.connections {
                let c = k.counts.clone().unwrap_or_default();
                rows.push(vec![
                    clean(&k.connection_id),
                    clean(&k.listener),
                    clean(&k.peer),
                    time(k.connected_at.as_ref()),
                    c.messages.to_string(),
                    naks(&c),
                    time(c.last_message_at.as_ref()),
                    clean(&k.sending_application),
                    clean(&k.sending_facility),
                ]);
            }
            table(&mut out, &rows)?;
            writeln!(
                out,
                "\npod {}: {} sender(s) tracked of at most {}; {} connection(s) open",
                clean(&r.pod),
                r.tracked,
                r.max_senders,
                r.connections.len()
            )?;
            if other.messages > 0 {
                writeln!(
                    out,
                    "{} message(s) from senders beyond max_senders (not listed), NAKs {}, last {}",
                    other.messages,
                    naks(&other),
                    time(other.last_message_at.as_ref())
                )?;
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| (*c).to_owned()).collect()
}

/// Left-aligned columns two spaces apart.
fn table(out: &mut impl Write, rows: &[Vec<String>]) -> std::io::Result<()> {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            line.push_str(c);
            if i + 1 < r.len() {
                let pad = widths[i].saturating_sub(c.chars().count()) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// A value from the wire for a terminal: control characters (escape sequences) shown as `?`, `-` when empty.
fn clean(v: &str) -> String {
    if v.is_empty() {
        return "-".to_owned();
    }
    v.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn last(c: Option<&SenderCounts>) -> Option<SystemTime> {
    c.and_then(|c| c.last_message_at)
        .and_then(|t| SystemTime::try_from(t).ok())
}

fn time(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| SystemTime::try_from(*t).ok()).map_or_else(
        || "-".to_owned(),
        |t| humantime::format_rfc3339_seconds(t).to_string(),
    )
}

/// How long ago `t` was, in whole seconds (`-` for never).
fn ago(now: SystemTime, t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| SystemTime::try_from(*t).ok()).map_or_else(
        || "-".to_owned(),
        |t| {
            let secs = now.duration_since(t).map_or(0, |d| d.as_secs());
            humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
        },
    )
}

/// `AE:1 AR:2`, or `-`.
fn naks(c: &SenderCounts) -> String {
    let mut v: Vec<_> = c.naks.iter().collect();
    v.sort();
    if v.is_empty() {
        return "-".to_owned();
    }
    v.iter()
        .map(|(code, n)| format!("{}:{n}", clean(code)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn rfc3339(t: Option<&prost_types::Timestamp>) -> serde_json::Value {
    t.and_then(|t| SystemTime::try_from(*t).ok())
        .map_or(serde_json::Value::Null, |t| {
            json!(humantime::format_rfc3339_millis(t).to_string())
        })
}

fn counts_json(c: &SenderCounts) -> serde_json::Value {
    let mut sorted: Vec<_> = c.naks.iter().collect();
    sorted.sort();
    let naks: serde_json::Map<String, serde_json::Value> = sorted
        .into_iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    json!({
        "messages": c.messages,
        "naks": naks,
        "last_message_at": rfc3339(c.last_message_at.as_ref()),
    })
}

fn sender_json(s: &Sender) -> serde_json::Value {
    let mut v = json!({
        "kind": "sender",
        "sending_application": s.sending_application,
        "sending_facility": s.sending_facility,
        "name": s.name,
        "first_seen_at": rfc3339(s.first_seen_at.as_ref()),
        "open_connections": s.open_connections,
        "last_peer": s.last_peer,
        "last_listener": s.last_listener,
    });
    merge(&mut v, counts_json(&s.counts.clone().unwrap_or_default()));
    v
}

fn connection_json(k: &SenderConnection) -> serde_json::Value {
    let mut v = json!({
        "kind": "connection",
        "connection_id": k.connection_id,
        "listener": k.listener,
        "protocol": k.protocol,
        "peer": k.peer,
        "tls_client": k.tls_client,
        "connected_at": rfc3339(k.connected_at.as_ref()),
        "sending_application": k.sending_application,
        "sending_facility": k.sending_facility,
    });
    merge(&mut v, counts_json(&k.counts.clone().unwrap_or_default()));
    v
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_from_the_wire_cannot_drive_the_terminal() {
        assert_eq!(clean("LAB\u{1b}[2J"), "LAB?[2J");
        assert_eq!(clean(""), "-");
    }

    #[test]
    fn columns_line_up() {
        let mut out = Vec::new();
        table(
            &mut out,
            &[row(["A", "BB", "C"]), row(["LONGER", "x", "y"])],
        )
        .unwrap_or_default();
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text, "A       BB  C\nLONGER  x   y\n");
    }

    #[test]
    fn naks_read_by_code() {
        let c = SenderCounts {
            messages: 3,
            naks: [("AR".to_owned(), 2), ("AE".to_owned(), 1)].into(),
            last_message_at: None,
        };
        assert_eq!(naks(&c), "AE:1 AR:2");
        assert_eq!(naks(&SenderCounts::default()), "-");
        let j = counts_json(&c);
        assert_eq!(j["naks"]["AR"], 2);
        assert_eq!(j["last_message_at"], serde_json::Value::Null);
    }
}
