//! Counting and reporting: per-client counters and latency histogram, merged into a [`Summary`] that prints
//! as text, as a table row, or as JSON.

use crate::ack::{AckClass, CLASS_NAMES, CLASSES};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Highest latency the histogram holds exactly (1 hour in µs); longer ones are clamped.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// A latency histogram in µs, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // 1..=1h with 3 significant digits is always a valid configuration.
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
        .unwrap_or_else(|e| unreachable!("histogram bounds: {e}"))
}

/// Why a message got no ACK (or a connection could not be made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// TCP connect or TLS handshake failed (when reconnecting).
    Connect,
    /// Reading or writing the socket failed (reset, broken pipe).
    Io,
    /// The peer closed the connection before answering.
    Closed,
    /// No ACK within `--timeout`.
    Timeout,
    /// The answer was not a valid MLLP frame.
    Framing,
    /// The run's time limit (`--max-seconds`) cut the wait short.
    Deadline,
}

/// Error counters by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ErrorCounts {
    pub connect: u64,
    pub io: u64,
    pub closed: u64,
    pub timeout: u64,
    pub framing: u64,
    pub deadline: u64,
}

impl ErrorCounts {
    pub fn add(&mut self, kind: ErrorKind) {
        *match kind {
            ErrorKind::Connect => &mut self.connect,
            ErrorKind::Io => &mut self.io,
            ErrorKind::Closed => &mut self.closed,
            ErrorKind::Timeout => &mut self.timeout,
            ErrorKind::Framing => &mut self.framing,
            ErrorKind::Deadline => &mut self.deadline,
        } += 1;
    }

    pub fn total(&self) -> u64 {
        self.connect + self.io + self.closed + self.timeout + self.framing + self.deadline
    }

    fn merge(&mut self, o: &Self) {
        self.connect += o.connect;
        self.io += o.io;
        self.closed += o.closed;
        self.timeout += o.timeout;
        self.framing += o.framing;
        self.deadline += o.deadline;
    }

    /// `connect 2, closed 1` (kinds with a count only).
    fn describe(&self) -> String {
        let mut s = String::new();
        for (name, n) in [
            ("connect", self.connect),
            ("io", self.io),
            ("closed", self.closed),
            ("timeout", self.timeout),
            ("framing", self.framing),
            ("deadline", self.deadline),
        ] {
            if n > 0 {
                if !s.is_empty() {
                    s.push_str(", ");
                }
                let _ = write!(s, "{name} {n}");
            }
        }
        s
    }
}

/// What one client saw.
#[derive(Debug, Clone)]
pub struct ClientStats {
    /// Latency of every measured message that got an ACK, in µs.
    pub hist: Histogram<u64>,
    /// Measured messages sent (answered or failed).
    pub messages: u64,
    /// ACKs by class (see [`CLASS_NAMES`]).
    pub acks: [u64; CLASSES],
    /// ACKs whose MSA-2 was not the control id sent.
    pub mismatches: u64,
    pub errors: ErrorCounts,
    /// Connections re-established after a failure (both phases).
    pub reconnects: u64,
    pub warmup_messages: u64,
    pub warmup_errors: u64,
    /// Time spent building measured messages (outside the latency timer).
    pub build: Duration,
    /// The run's time limit stopped this client before its count.
    pub stopped_early: bool,
    /// With `--rate`: measured messages whose turn came more than 1 ms after their scheduled time (the previous
    /// ACK came late); their latency counts from the schedule.
    pub late_sends: u64,
    /// The measured phase of this client.
    pub start: Option<Instant>,
    pub end: Option<Instant>,
}

impl Default for ClientStats {
    fn default() -> Self {
        Self {
            hist: new_histogram(),
            messages: 0,
            acks: [0; CLASSES],
            mismatches: 0,
            errors: ErrorCounts::default(),
            reconnects: 0,
            warmup_messages: 0,
            warmup_errors: 0,
            build: Duration::ZERO,
            stopped_early: false,
            late_sends: 0,
            start: None,
            end: None,
        }
    }
}

impl ClientStats {
    /// Counts one measured ACK.
    pub fn ack(&mut self, class: AckClass, id_matches: bool, latency: Duration) {
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        self.hist.saturating_record(us.min(MAX_LATENCY_US));
        self.acks[class.index()] += 1;
        if !id_matches {
            self.mismatches += 1;
        }
    }

    /// Adds another client's numbers to these.
    pub fn merge(&mut self, o: &Self) {
        // Same bounds on both sides, so adding cannot fail; keep going if it somehow did.
        let _ = self.hist.add(&o.hist);
        self.messages += o.messages;
        for (a, b) in self.acks.iter_mut().zip(o.acks) {
            *a += b;
        }
        self.mismatches += o.mismatches;
        self.errors.merge(&o.errors);
        self.reconnects += o.reconnects;
        self.warmup_messages += o.warmup_messages;
        self.warmup_errors += o.warmup_errors;
        self.build += o.build;
        self.stopped_early |= o.stopped_early;
        self.late_sends += o.late_sends;
        self.start = match (self.start, o.start) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.end = match (self.end, o.end) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Latency percentiles in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    pub p50: u64,
    pub p90: u64,
    pub p95: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
}

impl Latency {
    /// p50, p90, p95, p99, p99.9 and max in milliseconds, as the reports print them.
    pub fn ms(&self) -> [String; 6] {
        [self.p50, self.p90, self.p95, self.p99, self.p999, self.max].map(ms)
    }

    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

/// ACK counts by code, in a fixed order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[allow(non_snake_case)]
pub struct Acks {
    pub AA: u64,
    pub AE: u64,
    pub AR: u64,
    pub CA: u64,
    pub CE: u64,
    pub CR: u64,
    pub invalid: u64,
}

impl Acks {
    fn of(a: &[u64; CLASSES]) -> Self {
        Self {
            AA: a[0],
            AE: a[1],
            AR: a[2],
            CA: a[3],
            CE: a[4],
            CR: a[5],
            invalid: a[6],
        }
    }

    fn as_array(&self) -> [u64; CLASSES] {
        [
            self.AA,
            self.AE,
            self.AR,
            self.CA,
            self.CE,
            self.CR,
            self.invalid,
        ]
    }

    /// Every ACK counted.
    pub fn total(&self) -> u64 {
        self.as_array().iter().sum()
    }

    /// AA + CA.
    pub fn accepted(&self) -> u64 {
        self.AA + self.CA
    }
}

/// The warm-up phase, reported apart (not in any other number).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Warmup {
    pub messages: u64,
    pub errors: u64,
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// What the run was (its fields first in the JSON).
    #[serde(flatten)]
    pub run: RunInfo,
    /// Measured messages sent (answered or failed; connection attempts are not messages).
    pub messages: u64,
    /// Wall time of the measured phase (first client start to last client end).
    pub seconds: f64,
    /// ACKs read per second of `seconds`.
    pub msgs_per_sec: f64,
    pub latency_us: Latency,
    pub acks: Acks,
    /// Every error, `error_kinds` summed.
    pub errors: u64,
    pub error_kinds: ErrorCounts,
    pub mismatches: u64,
    pub reconnects: u64,
    pub warmup: Warmup,
    /// Mean time to build one message (splice control and patient ids), outside the latency timer.
    pub build_ns_mean: f64,
    /// The `--max-seconds` limit ended the run before its message count.
    pub stopped_by_limit: bool,
    /// With `--rate`: messages sent more than 1 ms behind their schedule (the gateway did not keep up).
    pub late_sends: u64,
    /// Control ids written to the `--record-acked` file by this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<u64>,
    /// Why the `--record-acked` file is incomplete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record_error: Option<String>,
}

/// What a run is, for the summary.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    pub to: String,
    pub run_id: String,
    /// The messages sent (fixture or files).
    pub source: String,
    /// `count` or `duration`.
    pub mode: &'static str,
    pub clients: u32,
    /// Messages each connection had in flight at most (`--in-flight`).
    pub in_flight: u32,
}

impl Summary {
    pub fn new(info: RunInfo, s: &ClientStats) -> Self {
        let seconds = match (s.start, s.end) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let acks = Acks::of(&s.acks);
        let msgs_per_sec = if seconds > 0.0 {
            acks.total() as f64 / seconds
        } else {
            0.0
        };
        let build_ns_mean = if s.messages > 0 {
            s.build.as_nanos() as f64 / s.messages as f64
        } else {
            0.0
        };
        Self {
            run: info,
            messages: s.messages,
            seconds,
            msgs_per_sec,
            latency_us: Latency::of(&s.hist),
            acks,
            errors: s.errors.total(),
            error_kinds: s.errors,
            mismatches: s.mismatches,
            reconnects: s.reconnects,
            warmup: Warmup {
                messages: s.warmup_messages,
                errors: s.warmup_errors,
            },
            build_ns_mean,
            stopped_by_limit: s.stopped_early,
            late_sends: s.late_sends,
            recorded: None,
            record_error: None,
        }
    }

    /// Every measured message got AA/CA for its own control id, with no error: exit code 0.
    pub fn ok(&self) -> bool {
        self.messages > 0
            && self.errors == 0
            && self.mismatches == 0
            && !self.stopped_by_limit
            && self.record_error.is_none()
            && self.acks.accepted() == self.messages
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let l = &self.latency_us;
        let mut s = String::new();
        if let Some(name) = &self.run.scenario {
            let _ = writeln!(s, "scenario     {name}");
        }
        let _ = writeln!(s, "target       {}  (run {})", self.run.to, self.run.run_id);
        let _ = writeln!(s, "sending      {}", self.run.source);
        let _ = writeln!(
            s,
            "clients      {}{}  (warm-up: {} messages, {} errors, not counted)",
            self.run.clients,
            if self.run.in_flight > 1 {
                format!(", {} messages in flight each", self.run.in_flight)
            } else {
                String::new()
            },
            self.warmup.messages,
            self.warmup.errors
        );
        let _ = writeln!(
            s,
            "messages     {} in {:.3} s ({} mode){}",
            self.messages,
            self.seconds,
            self.run.mode,
            if self.stopped_by_limit {
                ", STOPPED by --max-seconds"
            } else {
                ""
            }
        );
        let _ = writeln!(s, "throughput   {:.0} msg/s", self.msgs_per_sec);
        let [p50, p90, p95, p99, p999, max] = l.ms();
        let _ = writeln!(
            s,
            "latency ms   p50 {p50}  p90 {p90}  p95 {p95}  p99 {p99}  p99.9 {p999}  max {max}  mean {:.3}",
            l.mean / 1000.0
        );
        let mut acks = String::new();
        for (name, n) in CLASS_NAMES.iter().zip(self.acks.as_array()) {
            if n > 0 {
                let _ = write!(acks, "{name} {n}  ");
            }
        }
        let acks = match acks.trim_end() {
            "" => "none",
            listed => listed,
        };
        let _ = writeln!(s, "acks         {acks}");
        let kinds = self.error_kinds.describe();
        let _ = writeln!(
            s,
            "errors       {}{}  mismatches {}  reconnects {}",
            self.errors,
            if kinds.is_empty() {
                String::new()
            } else {
                format!(" ({kinds})")
            },
            self.mismatches,
            self.reconnects
        );
        let _ = writeln!(
            s,
            "build        {:.0} ns per message (outside the latency timer)",
            self.build_ns_mean
        );
        if self.late_sends > 0 {
            let _ = writeln!(
                s,
                "late sends   {} behind the --rate schedule (their latency counts from the schedule)",
                self.late_sends
            );
        }
        if let Some(n) = self.recorded {
            let _ = writeln!(s, "recorded     {n} acknowledged control ids");
        }
        if let Some(e) = &self.record_error {
            let _ = writeln!(s, "record file  INCOMPLETE: {e}");
        }
        let result = match self.ok() {
            true => "OK: every message got AA/CA",
            false => "FAILED: not every message got AA/CA",
        };
        let _ = writeln!(s, "result       {result}");
        s
    }
}

/// Microseconds as milliseconds with 3 decimals.
pub fn ms(us: u64) -> String {
    format!("{}.{:03}", us / 1000, us % 1000)
}

/// A table of several runs (the scenario report).
pub fn table(rows: &[Summary]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:>7} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6}",
        "scenario",
        "clients",
        "messages",
        "seconds",
        "msg/s",
        "p50 ms",
        "p90 ms",
        "p95 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "AA/CA",
        "other",
        "errors"
    );
    for r in rows {
        let [p50, p90, p95, p99, p999, max] = r.latency_us.ms();
        let _ = writeln!(
            s,
            "{:<12} {:>7} {:>9} {:>8.3} {:>9.0} {p50:>8} {p90:>8} {p95:>8} {p99:>8} {p999:>8} {max:>8} {:>9} {:>6} {:>6}",
            r.run.scenario.as_deref().unwrap_or("-"),
            r.run.clients,
            r.messages,
            r.seconds,
            r.msgs_per_sec,
            r.acks.accepted(),
            r.acks.total() - r.acks.accepted(),
            r.errors
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use hl7v2::ack::AckCode;

    fn info() -> RunInfo {
        RunInfo {
            scenario: None,
            to: "127.0.0.1:1".into(),
            run_id: "RUN".into(),
            source: "fixture adt".into(),
            mode: "count",
            clients: 2,
            in_flight: 1,
        }
    }

    fn stats_with(latencies_us: impl IntoIterator<Item = u64>) -> ClientStats {
        let mut s = ClientStats::default();
        for us in latencies_us {
            s.messages += 1;
            s.ack(AckClass::Code(AckCode::AA), true, Duration::from_micros(us));
        }
        s
    }

    #[test]
    fn percentiles_of_a_uniform_series() {
        let mut s = stats_with(1..=10_000);
        let t0 = Instant::now();
        s.start = Some(t0);
        s.end = Some(t0 + Duration::from_secs(2));
        let sum = Summary::new(info(), &s);
        let l = sum.latency_us;
        // 3 significant digits: within 0.1 % of the exact value.
        for (got, want) in [
            (l.p50, 5_000),
            (l.p90, 9_000),
            (l.p95, 9_500),
            (l.p99, 9_900),
            (l.p999, 9_990),
            (l.max, 10_000),
        ] {
            assert!(got.abs_diff(want) <= want / 1000 + 1, "{got} vs {want}");
        }
        assert!((l.mean - 5_000.5).abs() < 5.0);
        assert_eq!(sum.messages, 10_000);
        assert!((sum.msgs_per_sec - 5_000.0).abs() < 1e-6);
        assert!(sum.ok());
    }

    #[test]
    fn a_single_outlier_shows_in_max_and_p999_only() {
        let mut s = stats_with(std::iter::repeat_n(100, 999));
        s.merge(&stats_with([250_000]));
        let l = Latency::of(&s.hist);
        assert_eq!((l.p50, l.p99), (100, 100));
        assert!(l.p999 <= 100, "p99.9 = {}", l.p999);
        assert!(l.max.abs_diff(250_000) <= 250);
    }

    #[test]
    fn zero_latency_is_counted() {
        let s = stats_with([0, 0]);
        assert_eq!(s.hist.len(), 2);
        assert_eq!(Latency::of(&s.hist).max, 1);
    }

    #[test]
    fn empty_runs_report_zeros_and_fail() {
        let sum = Summary::new(info(), &ClientStats::default());
        assert_eq!(sum.latency_us, Latency::default());
        assert_eq!(sum.msgs_per_sec, 0.0);
        assert!(!sum.ok());
        assert!(sum.text().contains("acks         none"));
    }

    #[test]
    fn merge_adds_counts_and_spans_times() {
        let t0 = Instant::now();
        let mut a = stats_with([10, 20]);
        a.start = Some(t0 + Duration::from_millis(5));
        a.end = Some(t0 + Duration::from_millis(50));
        a.errors.add(ErrorKind::Closed);
        a.reconnects = 1;
        let mut b = stats_with([30]);
        b.ack(AckClass::Code(AckCode::AR), true, Duration::from_micros(40));
        b.ack(AckClass::Invalid, false, Duration::from_micros(40));
        b.messages += 2;
        b.start = Some(t0);
        b.end = Some(t0 + Duration::from_millis(100));
        a.merge(&b);
        let sum = Summary::new(info(), &a);
        assert_eq!(sum.messages, 5);
        assert_eq!(sum.acks.AA, 3);
        assert_eq!(sum.acks.AR, 1);
        assert_eq!(sum.acks.invalid, 1);
        assert_eq!(sum.mismatches, 1);
        assert_eq!(sum.errors, 1);
        assert_eq!(sum.error_kinds.closed, 1);
        assert_eq!(sum.reconnects, 1);
        assert!((sum.seconds - 0.1).abs() < 1e-9);
        assert!(!sum.ok());
        let text = sum.text();
        assert!(text.contains("AA 3  AR 1  invalid 1"), "{text}");
        assert!(text.contains("errors       1 (closed 1)"), "{text}");
    }

    #[test]
    fn mismatches_and_limits_fail_the_run() {
        let mut s = stats_with([10]);
        s.mismatches = 1;
        assert!(!Summary::new(info(), &s).ok());
        let mut s = stats_with([10]);
        s.stopped_early = true;
        assert!(!Summary::new(info(), &s).ok());
    }

    #[test]
    fn json_has_the_documented_keys() {
        let s = stats_with([1_000, 2_000]);
        let v = serde_json::to_value(Summary::new(info(), &s)).expect("serialises");
        for key in [
            "clients",
            "messages",
            "seconds",
            "msgs_per_sec",
            "latency_us",
            "acks",
            "errors",
            "mismatches",
            "reconnects",
            "late_sends",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        for key in ["p50", "p90", "p95", "p99", "p999", "max", "mean"] {
            assert!(
                v["latency_us"].get(key).is_some(),
                "missing latency_us.{key}"
            );
        }
        assert_eq!(v["acks"]["AA"], 2);
        assert_eq!(v["latency_us"]["max"], 2_000);
        assert!(v.get("scenario").is_none());
    }

    #[test]
    fn milliseconds_have_three_decimals() {
        assert_eq!(ms(0), "0.000");
        assert_eq!(ms(45), "0.045");
        assert_eq!(ms(1_234_567), "1234.567");
    }

    #[test]
    fn table_has_a_row_per_run() {
        let mut a = Summary::new(info(), &stats_with([10]));
        a.run.scenario = Some("1x10000".into());
        let t = table(&[a.clone(), a]);
        assert_eq!(t.lines().count(), 3);
        assert!(t.lines().nth(1).is_some_and(|l| l.starts_with("1x10000")));
    }
}
