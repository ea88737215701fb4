//! An ingress on topics of its own, and the checks of what it stored.

#![allow(clippy::unwrap_used)]

use crate::broker::broker;
use crate::broker::unique_topic;
use crate::process::KillOnDrop;
use crate::process::bin;
use crate::process::http_get;
use crate::process::listening_field;
use crate::process::wait_ready;
use crate::topic::Topics;
use crate::topic::read_topic;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An ingress's own inbound and DLQ topics (`<prefix>.<unique>`, `<prefix>.dlq.<unique>`) and the environment
/// that points it at them on `brokers`.
pub fn topics_env(brokers: &str, prefix: &str) -> (String, String, Vec<(&'static str, String)>) {
    let inbound = unique_topic(prefix);
    let dlq = unique_topic(&format!("{prefix}.dlq"));
    let env = vec![
        ("HL7GW_KAFKA__BROKERS", brokers.to_owned()),
        ("HL7GW_INBOUND_TOPIC", inbound.clone()),
        ("HL7GW_DLQ_TOPIC", dlq.clone()),
    ];
    (inbound, dlq, env)
}

/// `hl7gw-ingress` flags for every listener on a free port of 127.0.0.1 (the service prints the ones it got).
pub const INGRESS_ON_PORT_0: [&str; 6] = [
    "--mllp-addr",
    "127.0.0.1:0",
    "--grpc-addr",
    "127.0.0.1:0",
    "--admin-addr",
    "127.0.0.1:0",
];

/// A running `hl7gw-ingress` process, killed on drop.
pub struct Ingress {
    pub child: Child,
    pub mllp: SocketAddr,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
}

impl Ingress {
    /// An ingress on its own topics (named after `prefix`) of the shared test broker, with `extra` settings
    /// (HL7GW_... variables), ready: most ingress tests' start.
    pub fn on_fresh_topics(
        prefix: &str,
        extra: impl IntoIterator<Item = (&'static str, String)>,
    ) -> (Self, Topics) {
        let brokers = broker();
        let (inbound, dlq, mut env) = topics_env(brokers, prefix);
        env.extend(extra);
        let topics = Topics {
            brokers,
            inbound,
            dlq,
        };
        (Self::start(&env), topics)
    }

    /// Starts the ingress with `env` (HL7GW_... variables) on ephemeral ports and waits until it is ready.
    pub fn start(env: &[(&str, String)]) -> Self {
        Self::start_with(env, &[], true)
    }

    pub fn start_with(env: &[(&str, String)], args: &[&str], wait_ready: bool) -> Self {
        let mut cmd = Command::new(bin("hl7gw-ingress"));
        cmd.args(INGRESS_ON_PORT_0)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starting hl7gw-ingress");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("reading the listening line");
        let addr =
            |key: &str| -> SocketAddr { listening_field(&line, key).parse().expect("address") };
        let me = Self {
            mllp: addr("mllp"),
            grpc: addr("grpc"),
            admin: addr("admin"),
            child,
        };
        if wait_ready {
            me.wait_ready(Duration::from_secs(60));
        }
        me
    }

    pub fn wait_ready(&self, limit: Duration) {
        wait_ready("ingress", self.admin, Instant::now() + limit);
    }

    /// The value of a metric line (exact name with labels), 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        let (_, body) = http_get(self.admin, "/metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn sigterm(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Ingress {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the ingress on a fixed MLLP port (so a restarted one takes over the same address).
pub fn ingress_on(port: u16, env: &[(&str, String)]) -> KillOnDrop {
    let mut cmd = Command::new(bin("hl7gw-ingress"));
    cmd.args([
        "--mllp-addr",
        &format!("127.0.0.1:{port}"),
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ])
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = KillOnDrop(cmd.spawn().expect("test step"));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("test step");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "ingress did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

pub fn recorded(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Every recorded id is stored; returns (recorded, stored records, duplicates among them).
pub fn check_all_acked_are_stored(
    brokers: &str,
    topic: &str,
    ids: &[String],
) -> (usize, usize, usize) {
    let records = read_topic(brokers, topic, ids.len(), Duration::from_secs(120));
    let mut count: HashMap<String, usize> = HashMap::new();
    for r in &records {
        *count
            .entry(
                r.envelope
                    .header
                    .as_ref()
                    .expect("test step")
                    .control_id
                    .clone(),
            )
            .or_default() += 1;
    }
    let missing: Vec<&String> = ids.iter().filter(|id| !count.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} ACKed ids are not in the topic, e.g. {:?}",
        missing.len(),
        ids.len(),
        &missing[..missing.len().min(5)]
    );
    let duplicates = count.values().filter(|&&n| n > 1).map(|n| n - 1).sum();
    (ids.len(), records.len(), duplicates)
}
