//! Command line.

use crate::messages::Fixture;
use clap::{Parser, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

/// MLLP load harness: N persistent connections, one message in flight each (or `--in-flight`), HDR latency
/// histogram, ACK codes.
///
/// Exit status: 0 when every measured message got AA/CA for its control id, 1 when any other ACK, mismatch
/// or error occurred, 2 for usage and connection-setup errors.
#[derive(Debug, Parser)]
#[command(name = "hl7gw-load", version)]
pub struct Args {
    /// Gateway (or any MLLP receiver) address.
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,

    /// Concurrent clients, each with one persistent connection.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub clients: u32,

    /// Measured messages per client (count mode; the default is 1000).
    #[arg(long, value_name = "N", conflicts_with = "duration",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub messages: Option<u64>,

    /// Run for this long instead of a count (duration mode).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub duration: Option<Duration>,

    /// Warm-up messages per client, sent before measuring and not counted.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub warmup: u64,

    /// Send the messages of these files (round-robin) instead of a fixture; MSH-10 is rewritten.
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with = "fixture")]
    pub files: Vec<PathBuf>,

    /// Built-in messages.
    #[arg(long, value_enum, default_value_t = Fixture::Adt)]
    pub fixture: Fixture,

    /// Print one JSON object (an array with --scenario) instead of text.
    #[arg(long)]
    pub json: bool,

    /// Append every control id that got AA/CA (measured messages) to FILE, one per line, as it is read.
    #[arg(long, value_name = "FILE")]
    pub record_acked: Option<PathBuf>,

    /// Longest wait for one ACK; past it the message is an error and the connection is re-made.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    pub timeout: Duration,

    /// Hard limit on a run (warm-up included) in count mode, and on the warm-up in duration mode.
    #[arg(long, value_name = "SECS", default_value = "600", value_parser = parse_secs)]
    pub max_seconds: Duration,

    #[command(flatten)]
    pub tls: hl7gw_tls::ClientFlags,

    /// Mark the fixture messages as test traffic: MSH-3 `HL7GW-TEST`, MSH-11 `T`. The transformer routes
    /// them only through routes that name that sending application (`helm test` uses this).
    #[arg(long)]
    pub test_traffic: bool,

    /// Pace each client at N messages per second (default: as fast as ACKs come back).
    #[arg(long, value_name = "N", value_parser = parse_rate)]
    pub rate: Option<f64>,

    /// Ramp each client's rate linearly from --rate to N messages per second over --duration (a latency
    /// curve in one run; like k6's `ramping-arrival-rate`).
    #[arg(long, value_name = "N", value_parser = parse_rate, requires_all = ["rate", "duration"])]
    pub rate_to: Option<f64>,

    /// Messages each connection sends ahead of their ACKs (pipelining; the receiver must answer in order, as
    /// hl7gw does). 1, the default, is how most HL7 senders work: send, wait for the ACK, send the next.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub in_flight: u32,

    /// Send over the ingress's gRPC API (`hl7gw.v1.Ingest/SendStream`, one stream per client) instead of MLLP;
    /// --to is the gRPC address. The TLS flags apply; --in-flight is the stream's window.
    #[arg(long)]
    pub grpc: bool,

    /// File holding a token sent as `authorization: Bearer` on the gRPC stream (needs --grpc).
    #[arg(long, value_name = "FILE", requires = "grpc")]
    pub token_file: Option<PathBuf>,

    /// Runtime worker threads (default: one per CPU). `--threads 1` keeps the harness on one core.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,

    /// Run a predefined series instead of one run: `rs7` = 1×10,000, 4×5,000, 8×5,000, 8 clients × 30 s.
    #[arg(long, value_enum, conflicts_with_all = ["messages", "duration", "clients"])]
    pub scenario: Option<Scenario>,
}

/// Predefined series of runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// RS7's methodology: 1 client × 10,000, 4 × 5,000, 8 × 5,000, 8 clients × 30 s sustained.
    Rs7,
}

/// Messages per client when neither --messages nor --duration is given.
pub const DEFAULT_MESSAGES: u64 = 1_000;

fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0 && v <= 1e9) {
        return Err(format!("{s:?}: seconds must be > 0"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{s:?}: the rate must be > 0"));
    }
    Ok(v)
}

/// Checks `HOST:PORT` (resolution happens at connect time).
pub fn check_addr(addr: &str) -> Result<(), String> {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(())
        }
        _ => Err(format!("--to {addr:?}: expected HOST:PORT")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("hl7gw-load").chain(args.iter().copied()))
    }

    #[test]
    fn a_ramp_needs_a_start_rate_and_a_duration() {
        assert!(parse(&["--to", "h:1", "--rate-to", "500", "--duration", "10"]).is_err());
        assert!(parse(&["--to", "h:1", "--rate", "100", "--rate-to", "500"]).is_err());
        let a = parse(&[
            "--to",
            "h:1",
            "--rate",
            "100",
            "--rate-to",
            "500",
            "--duration",
            "10",
        ])
        .expect("parses");
        assert_eq!(a.rate_to, Some(500.0));
    }

    #[test]
    fn defaults() {
        let a = parse(&["--to", "127.0.0.1:2575"]).expect("parses");
        assert_eq!(a.clients, 1);
        assert_eq!(a.messages, None);
        assert_eq!(a.warmup, 100);
        assert_eq!(a.timeout, Duration::from_secs(30));
        assert_eq!(a.max_seconds, Duration::from_secs(600));
        assert_eq!(a.fixture, Fixture::Adt);
        assert!(!a.json && !a.tls.enabled);
        assert_eq!(a.in_flight, 1);
    }

    #[test]
    fn usage_errors() {
        for bad in [
            &["--clients", "2"][..],
            &["--to", "h:1", "--messages", "5", "--duration", "3"],
            &["--to", "h:1", "--clients", "0"],
            &["--to", "h:1", "--messages", "0"],
            &["--to", "h:1", "--timeout", "0"],
            &["--to", "h:1", "--duration", "-1"],
            &["--to", "h:1", "--rate", "nan"],
            &["--to", "h:1", "--tls"],
            &["--to", "h:1", "--ca", "ca.pem"],
            &["--to", "h:1", "--tls", "--ca", "c", "--cert", "x"],
            &["--to", "h:1", "--scenario", "rs7", "--clients", "3"],
            &["--to", "h:1", "--scenario", "rs7", "--messages", "3"],
            &["--to", "h:1", "--files", "a.hl7", "--fixture", "oru"],
            &["--to", "h:1", "--fixture", "xyz"],
            &["--to", "h:1", "--threads", "0"],
            &["--to", "h:1", "--in-flight", "0"],
            &["--to", "h:1", "--in-flight", "1025"],
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn full_command_lines() {
        let line = "--to gw:2575 --clients 8 --duration 1.5 --files a.hl7 b.hl7 --json \
                    --record-acked acked.txt --tls --ca ca.pem --cert c.pem --key k.pem \
                    --server-name gw.local --rate 100 --warmup 0 --threads 1 --in-flight 16";
        let a = parse(&line.split_whitespace().collect::<Vec<_>>()).expect("parses");
        assert_eq!(a.duration, Some(Duration::from_millis(1500)));
        assert_eq!(a.files.len(), 2);
        assert_eq!(a.rate, Some(100.0));
        assert_eq!(a.warmup, 0);
        assert_eq!(a.threads, Some(1));
        assert_eq!(a.in_flight, 16);
        assert_eq!(a.tls.server_name.as_deref(), Some("gw.local"));
        let s =
            parse(&["--to", "gw:2575", "--scenario", "rs7", "--fixture", "mix"]).expect("parses");
        assert_eq!(s.scenario, Some(Scenario::Rs7));
    }

    #[test]
    fn addresses() {
        assert!(check_addr("127.0.0.1:2575").is_ok());
        assert!(check_addr("gw.ns.svc:2575").is_ok());
        assert!(check_addr("[::1]:2575").is_ok());
        for bad in ["gw", "gw:", ":2575", "gw:0", "gw:70000", "gw:x"] {
            assert!(check_addr(bad).is_err(), "{bad}");
        }
    }
}
