//! `hl7gw status`: each destination of an egress pod (gRPC Egress/Status): connected, backlog, age of the oldest
//! undelivered message, retrying since, last ACK, dead letters by reason; a table or JSON lines.

use crate::connect::{Conn, runtime, status_error};
use crate::when::rfc3339;
use hl7gw_proto::v1::StatusRequest;
use hl7gw_proto::v1::egress_client::EgressClient;
use serde_json::json;
use std::process::ExitCode;

/// `hl7gw status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    conn: Conn,
    /// Only this destination
    #[arg(long)]
    destination: Option<String>,
    /// One JSON line per destination instead of a table
    #[arg(long)]
    json: bool,
}

/// Prints each destination's state.
pub fn run(a: StatusArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let r = EgressClient::new(ch)
            .status(StatusRequest {
                destination: a.destination.unwrap_or_default(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        if !a.json {
            println!(
                "{:<16} {:<9} {:>8} {:>12} {:<24} {:<4} {:<24} {:>9} {:>6}  DEAD LETTERS BY REASON",
                "DESTINATION",
                "CONNECTED",
                "BACKLOG",
                "OLDEST AGE",
                "RETRYING SINCE",
                "ACK",
                "LAST ACK",
                "DELIVERED",
                "DEAD"
            );
        }
        for d in &r.destinations {
            let reasons: Vec<String> = d
                .dead_lettered_by_reason
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if a.json {
                println!(
                    "{}",
                    json!({
                        "destination": d.name,
                        "address": d.address,
                        "connected": d.connected,
                        "backlog": d.lag,
                        "oldest_undelivered_age_seconds": d.oldest_undelivered_age_seconds,
                        "retrying": d.retrying,
                        "retrying_since": rfc3339(d.retrying_since.as_ref()),
                        "last_error": d.last_error,
                        "last_ack_code": d.last_ack_code,
                        "last_ack_at": rfc3339(d.last_ack_at.as_ref()),
                        "delivered": d.delivered,
                        "dead_lettered": d.dead_lettered,
                        "dead_lettered_by_reason": d.dead_lettered_by_reason,
                        "partitions": d.partitions,
                    })
                );
            } else {
                println!(
                    "{:<16} {:<9} {:>8} {:>12} {:<24} {:<4} {:<24} {:>9} {:>6}  {}",
                    d.name,
                    if d.connected { "yes" } else { "no" },
                    d.lag,
                    age(d.oldest_undelivered_age_seconds),
                    rfc3339(d.retrying_since.as_ref()),
                    d.last_ack_code,
                    rfc3339(d.last_ack_at.as_ref()),
                    d.delivered,
                    d.dead_lettered,
                    reasons.join(" ")
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// A duration in seconds as `3.2s`, `12m04s`, `5h02m`.
fn age(secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    let s = secs as u64;
    match s {
        0..60 => format!("{secs:.1}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_an_operator_would_say_them() {
        assert_eq!(age(0.0), "-");
        assert_eq!(age(3.25), "3.2s");
        assert_eq!(age(724.0), "12m04s");
        assert_eq!(age(18_120.0), "5h02m");
    }
}
