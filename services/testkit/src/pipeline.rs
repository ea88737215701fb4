//! The pipeline of real processes the end-to-end tests share: ingress → transformer → egress →
//! `hl7gw receive` against the test broker, each test with its own topics, consumer groups and folder.

use crate::{KillOnDrop, bin, broker, free_port, recorded};
use hl7gw_runtime::proto::v1::egress_client::EgressClient;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

pub const ROUTES: &str = "\
apiVersion: hl7gw.io/v1alpha1
kind: HL7Route
metadata: {name: adt-to-lab}
spec:
  match: {messageTypes: ['ADT^A*']}
  transforms:
    - set: {path: MSH-5, value: LAB}
    - mask: {path: PID-5}
  destinations: [lab]
";

/// A route sending ORU^R01 to the destination `flaky` (where a test has nothing listen, so that the egress
/// gives up and dead-letters them), to follow [`ROUTES`] after a `---` line.
pub const ORU_TO_FLAKY: &str = "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {name: oru-to-flaky}\n\
    spec:\n  match: {messageTypes: ['ORU^R01']}\n  destinations: [flaky]\n";

/// Topics, groups and files of one test's pipeline.
pub struct Pipeline {
    pub dir: tempfile::TempDir,
    /// What this pipeline's topic and group names begin with (`t<uuid>.`).
    prefix: String,
    /// Environment of every process (the receiver ignores it): brokers, the inbound and DLQ topics, logs.
    pub env: Vec<(&'static str, String)>,
    /// Extra environment of the three services (not the receiver), e.g. `OTEL_*`; empty unless a test sets it.
    pub service_env: Vec<(&'static str, String)>,
    /// When set, each service's log (stderr) goes to `<dir>/<binary>.log` instead of the test's output.
    pub log_dir: Option<PathBuf>,
    pub mllp: u16,
    pub receiver_port: u16,
    pub egress_grpc: u16,
    pub ingress: Part,
    pub transformer: Part,
    pub egress: Part,
    pub receiver: Option<KillOnDrop>,
}

/// One service of a [`Pipeline`]: its own environment, and once started its process and admin address.
pub struct Part {
    /// `ingress`, `transformer` or `egress`.
    pub name: &'static str,
    pub env: Vec<(&'static str, String)>,
    /// The process (dropping it kills it).
    pub process: Option<KillOnDrop>,
    /// The admin (`/healthz`, `/readyz`, `/metrics`) address it printed when it started.
    pub admin: Option<SocketAddr>,
}

impl Part {
    fn new(name: &'static str, env: Vec<(&'static str, String)>) -> Self {
        Self {
            name,
            env,
            process: None,
            admin: None,
        }
    }

    fn started(&mut self, (process, admin): (KillOnDrop, Option<SocketAddr>)) {
        self.process = Some(process);
        self.admin = admin;
    }
}

impl Default for Pipeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Pipeline {
    /// Fresh topics, groups and folder, nothing started yet.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let prefix = format!("t{}.", uuid::Uuid::now_v7().simple());
        let t = |s: &str| format!("{prefix}{s}");
        let env = vec![
            ("HL7GW_KAFKA__BROKERS", broker().to_owned()),
            ("HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS", "3".into()),
            ("HL7GW_INBOUND_TOPIC", t("inbound")),
            ("HL7GW_DLQ_TOPIC", t("dlq")),
            ("RUST_LOG", "warn".into()),
        ];
        let ingress = Part::new("ingress", Vec::new());
        let transformer = Part::new(
            "transformer",
            vec![
                ("HL7GW_OUT_TOPIC_PREFIX", t("out.")),
                ("HL7GW_GROUP_ID", t("transformer")),
                ("HL7GW_TRANSACTIONAL_ID", t("transformer-0")),
                ("HL7GW_LEDGER__TOPIC", t("events")),
            ],
        );
        let egress = Part::new(
            "egress",
            vec![
                ("HL7GW_OUT_TOPIC_PREFIX", t("out.")),
                ("HL7GW_GROUP_PREFIX", t("egress")),
                ("HL7GW_LEDGER__TOPIC", t("events")),
            ],
        );
        std::fs::write(dir.path().join("routes.yaml"), ROUTES).unwrap();
        let receiver_port = free_port();
        // The egress's admin methods are refused to anonymous callers: the tests call them as `token:ops`.
        let tokens = dir.path().join("grpc-tokens");
        std::fs::write(&tokens, format!("ops {OPS_TOKEN}\n")).unwrap();
        std::fs::write(
            dir.path().join("egress.yaml"),
            format!(
                "grpc:\n  tokens_file: {}\n  allow: {{Status: [token:ops], ListDeadLetters: [token:ops], ReadMessages: [token:ops], Replay: [token:ops], Trace: [token:ops]}}\n\
                 destinations:\n  lab:\n    address: 127.0.0.1:{receiver_port}\n    response_timeout: 5s\n    retry: {{initial_backoff: 100ms, max_backoff: 1s}}\n",
                tokens.display()
            ),
        )
        .unwrap();
        Self {
            dir,
            prefix,
            env,
            mllp: free_port(),
            receiver_port,
            egress_grpc: free_port(),
            service_env: Vec::new(),
            log_dir: None,
            ingress,
            transformer,
            egress,
            receiver: None,
        }
    }

    /// Replaces the egress's destinations (the YAML under `destinations:`, indented by four spaces), keeping
    /// the gRPC settings the tests call with. Before `start_egress`.
    pub fn set_destinations(&self, destinations: &str) {
        let tokens = self.dir.path().join("grpc-tokens");
        std::fs::write(
            self.dir.path().join("egress.yaml"),
            format!(
                "grpc:\n  tokens_file: {}\n  allow: {{Status: [token:ops], ListDeadLetters: [token:ops], ReadMessages: [token:ops], Replay: [token:ops], Trace: [token:ops]}}\n\
                 destinations:\n{destinations}",
                tokens.display()
            ),
        )
        .unwrap();
    }

    /// Sets the environment variable `key` of every process to `value` (replacing the one it had). Before the
    /// processes start.
    pub fn set_env(&mut self, key: &'static str, value: impl Into<String>) {
        self.env.retain(|(k, _)| *k != key);
        self.env.push((key, value.into()));
    }

    /// Makes every refusal of the receiver a dead letter at once (the default ACK policy retries AR with ERR
    /// 207, which `hl7gw receive --reject-every` answers). Before `start_egress`.
    pub fn dead_letter_refusals(&self) {
        let cfg = self.dir.path().join("egress.yaml");
        let yaml = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&cfg, format!("{yaml}    ack_policy: {{retry: []}}\n")).unwrap();
    }

    /// Replaces the transformer's routes. Before `start_transformer`.
    pub fn set_routes(&self, routes: &str) {
        std::fs::write(self.dir.path().join("routes.yaml"), routes).unwrap();
    }

    /// The full name of this pipeline's topic `name` (`inbound`, `dlq`, `out.lab`).
    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The ingress, the transformer and the egress.
    pub fn parts(&self) -> [&Part; 3] {
        [&self.ingress, &self.transformer, &self.egress]
    }

    /// The ingress, the transformer and the egress, to stop or check their processes.
    pub fn parts_mut(&mut self) -> [&mut Part; 3] {
        [&mut self.ingress, &mut self.transformer, &mut self.egress]
    }

    pub fn received_dir(&self) -> PathBuf {
        self.dir.path().join("received")
    }

    /// Starts `name` and waits for its listening line; returns the process and the `admin=` address it printed.
    fn spawn(
        &self,
        name: &str,
        args: &[String],
        extra: &[(&str, String)],
    ) -> (KillOnDrop, Option<SocketAddr>) {
        let mut cmd = Command::new(bin(name));
        // The receiver logs a line per message: keep the test output readable.
        let stderr = match &self.log_dir {
            _ if name == "hl7gw" => Stdio::null(),
            Some(dir) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("{name}.log")))
                .unwrap()
                .into(),
            None => Stdio::inherit(),
        };
        cmd.args(args).stderr(stderr);
        let service = if name == "hl7gw" {
            &[][..]
        } else {
            &self.service_env[..]
        };
        for (k, v) in self
            .env
            .iter()
            .chain(service)
            .map(|(k, v)| (*k, v))
            .chain(extra.iter().map(|(k, v)| (*k, v)))
        {
            cmd.env(k, v);
        }
        // Each service prints one line once its ports are bound.
        let (child, line) = crate::spawn_listening(&mut cmd);
        if line.is_empty() {
            // Its log says why (when it went to a file rather than to the test's output).
            let log = self
                .log_dir
                .as_ref()
                .and_then(|d| std::fs::read_to_string(d.join(format!("{name}.log"))).ok())
                .unwrap_or_default();
            panic!("{name} exited before listening\n{log}");
        }
        let admin = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("admin="))
            .map(|a| a.parse().expect("admin address"));
        (child, admin)
    }

    /// An ingress on MLLP `port` (the test's topics): the process and its admin address.
    fn spawn_ingress(&self, port: u16) -> (KillOnDrop, Option<SocketAddr>) {
        let args = [
            "--mllp-addr".into(),
            format!("127.0.0.1:{port}"),
            "--grpc-addr".into(),
            "127.0.0.1:0".into(),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        self.spawn("hl7gw-ingress", &args, &self.ingress.env)
    }

    /// A transformer of the test's group; instance `n` gets its own `transactional_id`, `None` the first one's.
    fn spawn_transformer(&self, n: Option<u32>) -> (KillOnDrop, Option<SocketAddr>) {
        let args = [
            "--grpc-addr".into(),
            "127.0.0.1:0".into(),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        let routes = self.dir.path().join("routes.yaml").display().to_string();
        let mut env: Vec<(&str, String)> = self
            .transformer
            .env
            .iter()
            .map(|(k, v)| match n {
                Some(n) if *k == "HL7GW_TRANSACTIONAL_ID" => (*k, format!("{v}-{n}")),
                _ => (*k, v.clone()),
            })
            .collect();
        env.push(("HL7GW_ROUTES__FILE", routes));
        self.spawn("hl7gw-transformer", &args, &env)
    }

    /// An egress of the test's consumer groups, its gRPC on `grpc`.
    fn spawn_egress(&self, grpc: String) -> (KillOnDrop, Option<SocketAddr>) {
        let args = [
            "--config".into(),
            self.dir.path().join("egress.yaml").display().to_string(),
            "--grpc-addr".into(),
            grpc,
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        self.spawn("hl7gw-egress", &args, &self.egress.env)
    }

    pub fn start_ingress(&mut self) {
        let started = self.spawn_ingress(self.mllp);
        self.ingress.started(started);
    }

    pub fn start_transformer(&mut self) {
        let started = self.spawn_transformer(None);
        self.transformer.started(started);
    }

    pub fn start_egress(&mut self) {
        let started = self.spawn_egress(format!("127.0.0.1:{}", self.egress_grpc));
        self.egress.started(started);
    }

    pub fn start_receiver(&mut self, reject_every: Option<u32>) {
        let mut args = vec![
            "receive".to_owned(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.receiver_port),
            "--out".into(),
            self.received_dir().display().to_string(),
        ];
        if let Some(n) = reject_every {
            args.extend(["--reject-every".into(), n.to_string()]);
        }
        self.receiver = Some(self.spawn("hl7gw", &args, &[]).0);
    }

    /// Another ingress on its own MLLP port (same topics): (process, MLLP port).
    pub fn extra_ingress(&self) -> (KillOnDrop, u16) {
        let port = free_port();
        (self.spawn_ingress(port).0, port)
    }

    /// Another transformer in the same group, with its own `transactional_id` (instance `n`).
    pub fn extra_transformer(&self, n: u32) -> KillOnDrop {
        self.spawn_transformer(Some(n)).0
    }

    /// Another egress in the same consumer groups.
    pub fn extra_egress(&self) -> KillOnDrop {
        self.spawn_egress("127.0.0.1:0".into()).0
    }

    /// Starts `hl7gw-load` (2 clients for 20 s, the ACKed control ids recorded in `record`), then kills
    /// (SIGKILL) and restarts the transformer after 5 s and the egress 5 s later; returns the load, still
    /// running.
    pub fn load_through_sigkills(&mut self, record: &Path) -> std::process::Child {
        let load = crate::start_load(self.mllp, 2, 20, record);
        std::thread::sleep(Duration::from_secs(5));
        self.transformer.process = None; // SIGKILL
        self.start_transformer();
        std::thread::sleep(Duration::from_secs(5));
        self.egress.process = None; // SIGKILL
        self.start_egress();
        load
    }

    pub fn start_all(&mut self, reject_every: Option<u32>) {
        self.start_receiver(reject_every);
        self.start_services();
    }

    /// The egress, the transformer and the ingress, in that order (consumers first), without a receiver: for
    /// tests that answer as the receiver themselves.
    pub fn start_services(&mut self) {
        self.start_egress();
        self.start_transformer();
        self.start_ingress();
    }

    /// An MLLP connection to the ingress.
    pub async fn mllp_client(&self) -> crate::Mllp {
        crate::Mllp::connect(SocketAddr::from(([127, 0, 0, 1], self.mllp))).await
    }

    /// Runs `hl7gw-load` in count mode, recording ACKed control ids; returns them (all must be AA/CA).
    pub fn load(&self, clients: u32, per_client: u32) -> Vec<String> {
        let (out, acked) = self.run_load(clients, per_client);
        assert!(
            out.status.success(),
            "hl7gw-load: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        acked
    }

    /// [`Pipeline::load`] where a few NAKs are no failure (a broker just started answers its first writes
    /// slowly, and the ingress NAKs what Kafka did not confirm within `ack_timeout`): the ACKed control ids.
    pub fn load_acked(&self, clients: u32, per_client: u32) -> Vec<String> {
        self.run_load(clients, per_client).1
    }

    fn run_load(&self, clients: u32, per_client: u32) -> (std::process::Output, Vec<String>) {
        let record = self
            .dir
            .path()
            .join(format!("acked-{}.txt", uuid::Uuid::now_v7().simple()));
        let out = Command::new(bin("hl7gw-load"))
            .args(["--to", &format!("127.0.0.1:{}", self.mllp)])
            .args([
                "--clients",
                &clients.to_string(),
                "--messages",
                &per_client.to_string(),
            ])
            .args(["--warmup", "0", "--timeout", "20", "--record-acked"])
            .arg(&record)
            .output()
            .unwrap();
        (out, recorded(&record))
    }

    pub fn egress_addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.egress_grpc)
    }

    /// Waits until every id reached the receiver or is a `lab` dead letter; returns the dead letters and what
    /// the receiver holds. Panics after `limit` with the egress's status.
    pub async fn wait_settled(
        &self,
        ids: &[String],
        limit: Duration,
    ) -> (Vec<hl7gw_runtime::proto::v1::DeadLetter>, Received) {
        let mut egress = self.egress_client().await;
        let deadline = Instant::now() + limit;
        loop {
            let dead = lab_dead_letters(&mut egress).await;
            let r = received(&self.received_dir());
            let settled = ids
                .iter()
                .filter(|id| r.first.contains_key(*id) || dead.iter().any(|d| &d.control_id == *id))
                .count();
            if settled == ids.len() {
                return (dead, r);
            }
            if Instant::now() > deadline {
                let status = egress_status(&mut egress).await;
                let missing: Vec<&String> = ids
                    .iter()
                    .filter(|id| {
                        !r.first.contains_key(*id) && !dead.iter().any(|d| &d.control_id == *id)
                    })
                    .take(10)
                    .collect();
                panic!(
                    "{settled} of {} settled ({} received, {} dead letters; missing {missing:?}); egress: \
                     {status:?}\n{}",
                    ids.len(),
                    r.first.len(),
                    dead.len(),
                    self.metrics_summary()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until every started service's `/readyz` answers 200 (Kafka answers, topics known, routes
    /// loaded); panics after `limit`.
    pub fn wait_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        for part in self.parts() {
            if let Some(admin) = part.admin {
                crate::wait_ready(part.name, admin, deadline);
            }
        }
    }

    /// Each service's non-zero `hl7gw_` series (no histogram buckets), for a failure message.
    pub fn metrics_summary(&self) -> String {
        let mut out = String::new();
        for part in self.parts() {
            let Some(admin) = part.admin else { continue };
            let (_, body) = crate::http_get(admin, "/metrics");
            let lines: Vec<&str> = body
                .lines()
                .filter(|l| l.starts_with("hl7gw_") && !l.contains("_bucket") && !l.ends_with(" 0"))
                .collect();
            out.push_str(&format!(
                "--- {} metrics:\n{}\n",
                part.name,
                lines.join("\n")
            ));
        }
        out
    }

    /// A client of the egress's admin API, calling as `token:ops`.
    pub async fn egress_client(&self) -> Egress {
        let channel = tonic::transport::Endpoint::from_shared(self.egress_addr())
            .unwrap()
            .connect()
            .await
            .unwrap();
        EgressClient::with_interceptor(channel, Bearer(OPS_TOKEN))
    }
}

/// What docs/observability.md says the ingress's `hl7.ingest` span of an ADT^A01 written to `inbound` carries
/// (besides its kind and `messaging.system`): (attribute, value), `None` where any value but an empty one will
/// do.
pub fn ingest_span_attributes<'a>(
    inbound: &'a str,
    control_id: &'a str,
) -> Vec<(&'static str, Option<&'a str>)> {
    vec![
        ("messaging.operation.type", Some("send")),
        ("messaging.destination.name", Some(inbound)),
        ("messaging.destination.partition.id", None),
        ("messaging.kafka.offset", None),
        ("hl7.control_id", Some(control_id)),
        ("hl7.message_type", Some("ADT")),
        ("hl7.trigger_event", Some("A01")),
    ]
}

/// What docs/observability.md says the egress's `deliver` span of a message read from `topic` by the consumer
/// group `group` carries (besides its kind and `messaging.system`), as [`ingest_span_attributes`]; `route`
/// `None` where any route will do.
pub fn deliver_span_attributes<'a>(
    topic: &'a str,
    group: &'a str,
    control_id: &'a str,
    destination: &'a str,
    route: Option<&'a str>,
) -> Vec<(&'static str, Option<&'a str>)> {
    vec![
        ("messaging.operation.type", Some("process")),
        ("messaging.destination.name", Some(topic)),
        ("messaging.destination.partition.id", None),
        ("messaging.kafka.offset", None),
        ("messaging.consumer.group.name", Some(group)),
        ("hl7.control_id", Some(control_id)),
        ("hl7.destination", Some(destination)),
        ("hl7.route", route),
        ("hl7.ack_code", None),
        ("hl7.attempts", None),
    ]
}

/// Keeps a test's pipeline the only one running in its test binary while the guard lives: each is a handful of
/// processes on a 2-core machine.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the async `test` with a fresh pipeline, the only one running ([`one_at_a_time`]), on a 2-worker
/// runtime.
pub fn run_alone<F: Future<Output = ()>>(test: impl FnOnce(Pipeline) -> F) {
    let _serial = one_at_a_time();
    crate::runtime().block_on(test(Pipeline::new()));
}

/// Every record of the ledger topic `topic` (from the beginning, committed only), read until none came for
/// 3 s or `limit` passed: (partition, offset, event).
pub fn read_events(
    topic: &str,
    limit: Duration,
) -> Vec<(i32, i64, hl7gw_runtime::proto::v1::Event)> {
    use rdkafka::message::Message;
    let consumer = crate::topic::reader(broker(), topic);
    let deadline = Instant::now() + limit;
    let mut quiet_since = Instant::now();
    let mut out = Vec::new();
    while Instant::now() < deadline
        && (out.is_empty() || quiet_since.elapsed() < Duration::from_secs(3))
    {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            quiet_since = Instant::now();
            let e =
                hl7gw_runtime::ledger::decode(m.payload().unwrap_or_default()).expect("an Event");
            out.push((m.partition(), m.offset(), e));
        }
    }
    out
}

/// The bearer token of `token:ops`, allowed every egress admin method in the tests' egress.yaml.
pub const OPS_TOKEN: &str = "ops-token-0123456789abcdef";

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone, Copy)]
pub struct Bearer(pub &'static str);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", self.0).parse().expect("ascii token"),
        );
        Ok(req)
    }
}

/// The egress admin client the tests use.
pub type Egress = EgressClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

/// The egress's `Status`.
pub async fn egress_status(egress: &mut Egress) -> hl7gw_runtime::proto::v1::StatusResponse {
    egress
        .status(hl7gw_runtime::proto::v1::StatusRequest::default())
        .await
        .unwrap()
        .into_inner()
}

/// Every dead letter of destination `lab`, as `ListDeadLetters` returns them, page after page.
pub async fn lab_dead_letters(egress: &mut Egress) -> Vec<hl7gw_runtime::proto::v1::DeadLetter> {
    dead_letters(egress, "lab", false).await
}

/// Every dead letter of `destination` (with their envelopes when `envelopes`), page after page.
pub async fn dead_letters(
    egress: &mut Egress,
    destination: &str,
    envelopes: bool,
) -> Vec<hl7gw_runtime::proto::v1::DeadLetter> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = egress
            .list_dead_letters(hl7gw_runtime::proto::v1::ListDeadLettersRequest {
                destination: destination.into(),
                include_envelope: envelopes,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        out.extend(page.dead_letters);
        if !page.truncated || page.next_cursor == cursor {
            return out;
        }
        cursor = page.next_cursor;
    }
}

/// What the receiver stored: control id to (sequence, file content), and how many times each id arrived.
pub struct Received {
    pub first: HashMap<String, (u64, Vec<u8>)>,
    pub copies: HashMap<String, usize>,
}

pub fn received(dir: &Path) -> Received {
    let mut first = HashMap::new();
    let mut copies: HashMap<String, usize> = HashMap::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".hl7") else {
            continue;
        };
        let Some((seq, _)) = stem.split_once('-') else {
            continue;
        };
        let Ok(seq) = seq.parse::<u64>() else {
            continue;
        };
        let bytes = std::fs::read(e.path()).unwrap();
        let cid = crate::field(&bytes, "MSH-10").unwrap_or_default();
        *copies.entry(cid.clone()).or_default() += 1;
        first
            .entry(cid)
            .and_modify(|(s, b): &mut (u64, Vec<u8>)| {
                if seq < *s {
                    *s = seq;
                    b.clone_from(&bytes);
                }
            })
            .or_insert((seq, bytes));
    }
    Received { first, copies }
}

/// Waits until every id in `ids` is at the receiver.
pub fn wait_delivered(dir: &Path, ids: &[String], limit: Duration) -> Received {
    let deadline = Instant::now() + limit;
    loop {
        let r = received(dir);
        let missing = ids.iter().filter(|id| !r.first.contains_key(*id)).count();
        if missing == 0 {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} ACKed messages never reached the receiver",
            ids.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Checks transforms and per-patient order (except for `replayed` ids, which arrive when replayed); returns
/// the number of duplicate deliveries.
pub fn check_delivery(r: &Received, replayed: &[String]) -> usize {
    // Control ids are RUN-<client>-<seq>; the patient (PID-3.1) is per client, so a patient's messages must
    // reach the receiver in increasing <seq>.
    let mut by_patient: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for (cid, (rseq, bytes)) in &r.first {
        let m = hl7v2::Message::parse(bytes).unwrap();
        assert_eq!(
            m.get("MSH-5"),
            Some(&b"LAB"[..]),
            "route set MSH-5 on {cid}"
        );
        assert_eq!(
            m.get("PID-5"),
            Some(&b"***"[..]),
            "route masked PID-5 on {cid}"
        );
        if replayed.contains(cid) {
            continue;
        }
        // Patient ids repeat across load runs (LOAD<client>-<n>); runs differ in the control id's prefix.
        let run = cid.split('-').next().unwrap_or_default();
        let patient = format!(
            "{run}/{}",
            String::from_utf8_lossy(m.get("PID-3-1").unwrap())
        );
        let seq: u64 = cid.rsplit('-').next().unwrap().parse().unwrap();
        by_patient.entry(patient).or_default().push((*rseq, seq));
    }
    assert!(
        by_patient.len() > 10,
        "several patients: {}",
        by_patient.len()
    );
    for (patient, mut v) in by_patient {
        v.sort();
        assert!(
            v.windows(2).all(|w| w[0].1 < w[1].1),
            "patient {patient}: messages delivered out of order: {:?}",
            &v[..v.len().min(20)]
        );
    }
    r.copies.values().map(|n| n - 1).sum()
}
