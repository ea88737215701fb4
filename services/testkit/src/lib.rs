//! hl7gw-testkit: what the integration tests of every crate share: a real Kafka broker (or a 3-broker
//! cluster, or a secured one) started by the project's script, the PKI, the workspace's binaries started and
//! killed on drop, an MLLP client, and a Kafka reader to check what a topic holds.
// A test kit: a step that fails is a failed test, so unwrap and expect are its way of saying so.
#![allow(clippy::unwrap_used, missing_debug_implementations)]

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use hl7gw_runtime::proto::v1::Envelope;
use hl7v2::MllpCodec;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

pub mod examples;
pub mod fhir;
pub mod pipeline;
pub mod pki;
pub use pki::{Pki, pki};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shared corpus of real HL7 v2 messages: `TESTDATA_HL7`, else `../shared/testdata/hl7` beside the
/// checkout (read from there, never copied into the repository).
pub fn corpus_dir() -> PathBuf {
    std::env::var_os("TESTDATA_HL7")
        .map_or_else(|| repo_root().join("../shared/testdata/hl7"), PathBuf::from)
}

/// The `.hl7` files of `dir` in name order, as (`prefix` + file stem, bytes); none when `dir` is missing.
pub fn hl7_files(dir: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        println!("no messages at {}", dir.display());
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "hl7"))
        .filter_map(|p| {
            let bytes = std::fs::read(&p).ok()?;
            let stem = p.file_stem()?.to_str()?.to_owned();
            Some((format!("{prefix}{stem}"), bytes))
        })
        .collect()
}

/// Starts (once per port) a single-node KRaft broker on 127.0.0.1 with the project's script.
pub fn broker_on(port: u16) -> String {
    let root = repo_root();
    let status = Command::new("bash")
        .arg(root.join("scripts/kafka.sh"))
        .arg("up")
        .env("KAFKA_PORT", port.to_string())
        .env(
            "KAFKA_DATA_DIR",
            root.join(format!("target/kafka-test/{port}")),
        )
        .env("KAFKA_PARTITIONS", "3")
        .env("KAFKA_NODES", "1")
        .status()
        .expect("running scripts/kafka.sh");
    assert!(
        status.success(),
        "scripts/kafka.sh up failed for port {port}"
    );
    format!("127.0.0.1:{port}")
}

pub fn stop_broker(port: u16) {
    let root = repo_root();
    let _ = Command::new("bash")
        .arg(root.join("scripts/kafka.sh"))
        .arg("down")
        .env("KAFKA_PORT", port.to_string())
        .env("KAFKA_NODES", "1")
        .env(
            "KAFKA_DATA_DIR",
            root.join(format!("target/kafka-test/{port}")),
        )
        .status();
}

/// The shared test broker (port 29092 unless TEST_KAFKA_PORT says otherwise; not an `HL7GW_` name, since the
/// services the tests start inherit the environment and refuse unknown `HL7GW_` keys).
pub fn broker() -> &'static str {
    static B: OnceLock<String> = OnceLock::new();
    B.get_or_init(|| {
        let port = std::env::var("TEST_KAFKA_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(29092);
        broker_on(port)
    })
}

/// A file `name` holding `contents` in a fresh temporary folder (removed when the `TempDir` drops).
pub fn temp_file(name: &str, contents: impl AsRef<[u8]>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(name);
    std::fs::write(&file, contents).expect("writing a temporary file");
    (dir, file)
}

/// Waits until the service `name` whose admin server is at `admin` answers `/readyz` with 200; panics at
/// `deadline`.
pub fn wait_ready(name: &str, admin: SocketAddr, deadline: Instant) {
    while http_get(admin, "/readyz").0 != 200 {
        assert!(Instant::now() < deadline, "{name} not ready");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A topic name no other test uses.
pub fn unique_topic(prefix: &str) -> String {
    format!("{prefix}.{}", uuid::Uuid::now_v7().simple())
}

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

/// The shared test broker and the topics of one test's ingress ([`Ingress::on_fresh_topics`]).
#[derive(Debug)]
pub struct Topics {
    pub brokers: &'static str,
    pub inbound: String,
    pub dlq: String,
}

impl Topics {
    /// [`read_topic`] of the inbound topic.
    pub fn inbound_records(&self, expected: usize, limit: Duration) -> Vec<Record> {
        read_topic(self.brokers, &self.inbound, expected, limit)
    }

    /// [`read_topic`] of the DLQ topic.
    pub fn dlq_records(&self, expected: usize, limit: Duration) -> Vec<Record> {
        read_topic(self.brokers, &self.dlq, expected, limit)
    }
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

/// A minimal blocking HTTP GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A synthetic ADT^A01 with the given control id and patient id.
pub fn adt(control_id: &str, patient: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|TESTAPP|TESTFAC|HL7GW|HL7GW|20261122120000||ADT^A01^ADT_A01|{control_id}|P|2.5.1\r\
         EVN|A01|20261122120000\r\
         PID|1||{patient}^^^TESTFAC^MR||DOE^JANE||19700101|F\r"
    )
    .into_bytes()
}

/// An MLLP client connection.
pub struct Mllp(pub Framed<TcpStream, MllpCodec>);

impl Mllp {
    pub async fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Self(Framed::new(s, MllpCodec::default()))
    }

    /// A connection from another local address (e.g. 127.0.0.2: a second client machine, as the listener's
    /// per-address bounds see it).
    pub async fn connect_from(local: std::net::IpAddr, addr: SocketAddr) -> std::io::Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(local, 0))?;
        let s = socket.connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(Self(Framed::new(s, MllpCodec::default())))
    }

    pub async fn send(&mut self, payload: &[u8]) {
        self.0.send(payload).await.expect("send");
    }

    /// The next ACK payload, or None on close/timeout.
    pub async fn recv(&mut self, limit: Duration) -> Option<BytesMut> {
        match tokio::time::timeout(limit, self.0.next()).await {
            Ok(Some(Ok(f))) => Some(f),
            _ => None,
        }
    }

    pub async fn call(&mut self, payload: &[u8]) -> Option<BytesMut> {
        self.send(payload).await;
        self.recv(Duration::from_secs(30)).await
    }
}

/// MSA-1 of an ACK.
pub fn ack_code(ack: &[u8]) -> String {
    field(ack, "MSA-1")
        .unwrap_or_else(|| format!("unparseable: {:?}", String::from_utf8_lossy(ack)))
}

/// The value at terser `path` (`MSH-10`, `ERR-3-1`) of a message, as text; None when the message does not
/// parse or has no such field.
pub fn field(msg: &[u8], path: &str) -> Option<String> {
    let m = hl7v2::Message::parse(msg).ok()?;
    m.get(path).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// A record read back from Kafka.
#[derive(Debug)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub partition: i32,
    pub offset: i64,
    pub headers: Vec<(String, Vec<u8>)>,
    pub envelope: Envelope,
}

impl Record {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Reads every record of `topic` from the beginning until `expected` arrived or `limit` passed.
pub fn read_topic(brokers: &str, topic: &str, expected: usize, limit: Duration) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("test-{}", uuid::Uuid::now_v7().simple()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                quiet_since = Instant::now();
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| (x.key.to_owned(), x.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Record {
                    key: m.key().map(<[u8]>::to_vec),
                    partition: m.partition(),
                    offset: m.offset(),
                    headers,
                    envelope: hl7gw_runtime::envelope::decode(m.payload().unwrap_or_default())
                        .expect("envelope decodes"),
                });
            }
            Some(Err(e)) => eprintln!("consumer: {e}"),
            None => {
                // Once the expected count is reached, wait a little more to see any extra record.
                if out.len() >= expected && quiet_since.elapsed() > Duration::from_secs(2) {
                    break;
                }
            }
        }
    }
    out
}

/// A child process killed (SIGKILL) when the test ends, whether it passed or panicked.
pub struct KillOnDrop(pub std::process::Child);

/// Starts `cmd` with its stdout piped and reads the listening line every service prints first (`... grpc=<addr>
/// admin=<addr>`, or the receiver's `listening on <addr>`); the process, killed on drop, and the line.
pub fn spawn_listening(cmd: &mut Command) -> (KillOnDrop, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", cmd.get_program().to_string_lossy()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("reading the listening line");
    (KillOnDrop(child), line)
}

/// The value of `key=` in a listening line.
pub fn listening_field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// Sends SIGTERM to `child` and waits up to `limit` for it to exit; its exit status. Panics, naming the
/// process `name`, when it is still running then.
pub fn sigterm_and_wait(
    child: &mut Child,
    name: &str,
    limit: Duration,
) -> std::process::ExitStatus {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -TERM {name}");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end; its stdout, or a panic naming the program with its stderr when it failed.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{:?} did not start: {e}", cmd.get_program()));
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        cmd.get_program(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tool `scripts/tools.sh` installs (`helm`, `grpcurl`, `kubeconform`), installed first when missing
/// (instant once cached in .cache/tools).
pub fn tool(name: &str) -> PathBuf {
    let script = repo_root().join("scripts/tools.sh");
    run_ok(Command::new("bash").arg(&script));
    run_ok(Command::new("bash").arg(&script).arg("path"))
        .trim()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} is not among scripts/tools.sh's tools"))
}

/// A workspace binary (`hl7gw-ingress`, `hl7gw-load`, `hl7gw`, ...) next to the test's own directory:
/// `cargo test --workspace --all-targets` builds every binary before any test runs.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test step");
    let dir = exe.parent().and_then(Path::parent).expect("test step");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} missing: run the tests with `cargo test --workspace --all-targets` (make test)",
        bin.display()
    );
    bin
}

/// `hl7gw-load`.
pub fn load_binary() -> PathBuf {
    bin("hl7gw-load")
}

/// Runs `hl7gw-load` for `secs` seconds with `clients` connections, recording every ACKed id in `record`;
/// stdout (the JSON summary) is piped.
pub fn start_load(port: u16, clients: u32, secs: u32, record: &Path) -> Child {
    load_command(port, clients, secs, record)
        .args(["--timeout", "10"])
        .spawn()
        .expect("starting hl7gw-load")
}

/// `hl7gw-load` to the MLLP port for `secs` seconds with `clients` connections, no warmup, every ACKed id
/// recorded in `record`, the JSON summary on a piped stdout, stderr discarded; add options and spawn it.
pub fn load_command(port: u16, clients: u32, secs: u32, record: &Path) -> Command {
    let mut cmd = Command::new(load_binary());
    cmd.args(["--to", &format!("127.0.0.1:{port}")])
        .args(["--clients", &clients.to_string()])
        .args(["--duration", &secs.to_string(), "--warmup", "0", "--json"])
        .arg("--record-acked")
        .arg(record)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("test step")
        .local_addr()
        .expect("test step")
        .port()
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

/// A 3-node KRaft cluster (scripts/kafka.sh, `KAFKA_NODES=3`) on `port`, `port`+10, `port`+20, for failover
/// tests: RF 3 and `min.insync.replicas=2` by default.
pub struct Cluster {
    pub port: u16,
}

impl Cluster {
    /// Starts the cluster (once per port) and waits until its three brokers are registered.
    pub fn up(port: u16) -> Self {
        let c = Self { port };
        assert!(
            c.run(&["up"]).0,
            "scripts/kafka.sh up failed for the cluster on {port}"
        );
        c
    }

    /// Runs `scripts/kafka.sh <args>` for this cluster: (success, stdout).
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let root = repo_root();
        let out = Command::new("bash")
            .arg(root.join("scripts/kafka.sh"))
            .args(args)
            .env("KAFKA_NODES", "3")
            .env("KAFKA_PORT", self.port.to_string())
            .env(
                "KAFKA_DATA_DIR",
                root.join(format!("target/kafka-test/cluster-{}", self.port)),
            )
            .stderr(Stdio::inherit())
            .output()
            .expect("running scripts/kafka.sh");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    }

    pub fn brokers(&self) -> String {
        self.run(&["brokers"]).1
    }

    /// SIGKILLs node `n` (1-3).
    pub fn kill(&self, n: u32) {
        assert!(self.run(&["kill", &n.to_string()]).0, "kill {n}");
    }

    /// Stops node `n` cleanly (SIGTERM, as in a rolling restart).
    pub fn stop(&self, n: u32) {
        assert!(self.run(&["stop", &n.to_string()]).0, "stop {n}");
    }

    /// Starts node `n` again and waits until it is back in the cluster.
    pub fn start(&self, n: u32) {
        assert!(self.run(&["start", &n.to_string()]).0, "start {n}");
    }

    /// The node id of the active KRaft controller.
    pub fn controller(&self) -> u32 {
        let (ok, out) = self.run(&["controller"]);
        assert!(ok, "controller: {out}");
        out.parse()
            .unwrap_or_else(|_| panic!("controller id: {out:?}"))
    }

    pub fn down(&self) {
        let _ = self.run(&["down"]);
    }
}

/// Stopped when the test ends, passed or failed (its data stays in target/kafka-test for a look).
impl Drop for Cluster {
    fn drop(&mut self) {
        self.down();
    }
}

/// The broker with TLS and SASL listeners (scripts/kafka.sh `KAFKA_SECURE=1`, port 29392): SASL_SSL with
/// SCRAM-SHA-512 on 29394, mTLS on 29395, plaintext on 29392 for the test's own readers; the test PKI in `pki`.
#[derive(Debug, Clone)]
pub struct SecureBroker {
    pub plaintext: String,
    pub sasl_ssl: String,
    pub mtls: String,
    pub pki: PathBuf,
}

pub const SECURE_PORT: u16 = 29392;

impl SecureBroker {
    /// Starts it once (stopped by scripts/test.sh at the end).
    pub fn get() -> &'static SecureBroker {
        static B: OnceLock<SecureBroker> = OnceLock::new();
        B.get_or_init(|| {
            let out = Self::script(&["up"]);
            assert!(
                out.status.success(),
                "scripts/kafka.sh up (KAFKA_SECURE=1) failed"
            );
            SecureBroker {
                plaintext: format!("127.0.0.1:{SECURE_PORT}"),
                sasl_ssl: format!("127.0.0.1:{}", SECURE_PORT + 2),
                mtls: format!("127.0.0.1:{}", SECURE_PORT + 3),
                pki: Self::data_dir().join("pki"),
            }
        })
    }

    fn data_dir() -> PathBuf {
        repo_root().join(format!("target/kafka-test/{SECURE_PORT}"))
    }

    fn script(args: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(repo_root().join("scripts/kafka.sh"))
            .args(args)
            .env("KAFKA_PORT", SECURE_PORT.to_string())
            .env("KAFKA_DATA_DIR", Self::data_dir())
            .env("KAFKA_PARTITIONS", "3")
            .env("KAFKA_NODES", "1")
            .env("KAFKA_SECURE", "1")
            .stderr(Stdio::inherit())
            .output()
            .expect("running scripts/kafka.sh")
    }

    /// Creates a SCRAM-SHA-512 user, or sets its password.
    pub fn scram_user(&self, name: &str, password: &str) {
        let out = Self::script(&["scram-user", name, password]);
        assert!(out.status.success(), "scram-user {name} failed");
    }

    /// A file of the test PKI.
    pub fn file(&self, name: &str) -> String {
        self.pki.join(name).display().to_string()
    }

    /// `HL7GW_` variables for SASL_SSL as user `hl7gw` (the password file given).
    pub fn sasl_env(&self, password_file: &str) -> Vec<(&'static str, String)> {
        vec![
            ("HL7GW_KAFKA__BROKERS", self.sasl_ssl.clone()),
            ("HL7GW_KAFKA__SECURITY__PROTOCOL", "SASL_SSL".into()),
            ("HL7GW_KAFKA__SECURITY__CA_FILE", self.file("ca.crt")),
            (
                "HL7GW_KAFKA__SECURITY__SASL_MECHANISM",
                "SCRAM-SHA-512".into(),
            ),
            ("HL7GW_KAFKA__SECURITY__USERNAME", "hl7gw".into()),
            ("HL7GW_KAFKA__SECURITY__PASSWORD_FILE", password_file.into()),
        ]
    }

    /// `HL7GW_` variables for the mTLS listener with the client certificate `client` (`client` or
    /// `other-client`, signed by a CA the broker does not know) and the CA file `ca`.
    pub fn mtls_env(&self, client: &str, ca: &str) -> Vec<(&'static str, String)> {
        vec![
            ("HL7GW_KAFKA__BROKERS", self.mtls.clone()),
            ("HL7GW_KAFKA__SECURITY__PROTOCOL", "SSL".into()),
            ("HL7GW_KAFKA__SECURITY__CA_FILE", self.file(ca)),
            (
                "HL7GW_KAFKA__SECURITY__CERT_FILE",
                self.file(&format!("{client}.crt")),
            ),
            (
                "HL7GW_KAFKA__SECURITY__KEY_FILE",
                self.file(&format!("{client}.key")),
            ),
        ]
    }
}

/// A service run in-process on port 0, as mini-redis's `start_server` does: its task, the token that stops
/// it and the addresses it bound.
pub struct InProcess<E> {
    pub bound: hl7gw_runtime::service::Bound,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), E>>,
}

impl<E: Send + 'static> InProcess<E> {
    /// Validates `cfg`, then builds and runs the service `S` on a task, as its binary would, and waits until
    /// it has bound its ports.
    pub async fn service<S>(cfg: S::Config) -> Self
    where
        S: hl7gw_runtime::service::Service<Error = E>,
    {
        use hl7gw_runtime::service::ServiceConfig;
        cfg.validate().expect("a valid config");
        let stop = tokio_util::sync::CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let app = S::build(std::sync::Arc::new(cfg)).await?;
            let _ = tx.send(app.bound());
            app.run(token).await
        });
        let bound = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("the service bound its ports within 30 s")
            .expect("the service started (it returned before binding)");
        Self { bound, stop, task }
    }

    /// Waits until `/readyz` answers 200 (within `limit`); the last answer otherwise.
    pub async fn ready(&self, limit: Duration) -> Result<(), String> {
        let admin = self.bound.admin;
        let deadline = Instant::now() + limit;
        loop {
            let (status, body) = tokio::task::spawn_blocking(move || http_get(admin, "/readyz"))
                .await
                .unwrap();
            if status == 200 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{status} {body}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Checks the service is alive (`/healthz` 200) and waits up to 60 s until it is ready; its `/metrics`.
    pub async fn serving(&self) -> String {
        assert_eq!(self.admin_get("/healthz").await.0, 200);
        self.ready(Duration::from_secs(60)).await.expect("ready");
        self.admin_get("/metrics").await.1
    }

    /// `GET path` on the admin server.
    pub async fn admin_get(&self, path: &'static str) -> (u16, String) {
        let admin = self.bound.admin;
        tokio::task::spawn_blocking(move || http_get(admin, path))
            .await
            .unwrap()
    }

    /// Cancels the stop token and waits for the service to drain and return.
    pub async fn stop(self, limit: Duration) -> Result<(), E> {
        self.stop.cancel();
        tokio::time::timeout(limit, self.task)
            .await
            .expect("the service drained in time")
            .expect("the service task did not panic")
    }
}

/// Starts the worker `S` (no MLLP listener) in-process, waits until it serves, checks that its `/metrics`
/// holds `series`, and stops it: each worker's in-process test.
pub async fn worker_serves<S>(cfg: S::Config, series: &str)
where
    S: hl7gw_runtime::service::Service,
    S::Error: std::fmt::Debug + Send + 'static,
{
    let worker = InProcess::service::<S>(cfg).await;
    assert!(worker.bound.mllp.is_none());
    let metrics = worker.serving().await;
    assert!(metrics.contains(series), "{series} in {metrics}");
    worker.stop(Duration::from_secs(30)).await.unwrap();
}

/// [`broker`] from async code (starting it blocks).
pub async fn broker_async() -> &'static str {
    tokio::task::spawn_blocking(broker).await.unwrap()
}

/// A service config listening on loopback port 0 (gRPC and admin) against `brokers`, with `yaml`'s keys
/// (which must not hold a `service:` or `kafka:` section of their own).
pub fn config_on_port_0<T>(brokers: &str, yaml: &str) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize + Default,
{
    config(&format!(
        "service: {{grpc_addr: 127.0.0.1:0, admin_addr: 127.0.0.1:0}}\nkafka: {{brokers: '{brokers}'}}\n{yaml}"
    ))
}

/// A service config from YAML, as the service would load it from its file (defaults under it, no `HL7GW_`
/// variables over it).
pub fn config<T>(yaml: &str) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize + Default,
{
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, yaml).unwrap();
    let no_flags = std::collections::BTreeMap::<String, String>::new();
    let no_env = figment::providers::Env::prefixed("HL7GW_TESTKIT_NOTHING_");
    hl7gw_runtime::config::load_with_env(Some(&file), &no_flags, no_env)
        .unwrap_or_else(|e| panic!("config {yaml}: {e}"))
}
