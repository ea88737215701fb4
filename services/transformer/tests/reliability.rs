//! The transformer's reliability promises (docs/reliability-transformer.md), each against the real binary and
//! the real test broker: nothing is consumed before the routes are loaded, an unmatched message goes to the
//! DLQ, a slow batch commits before its transaction times out, a broker outage is recovered in-process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_runtime::proto::v1::Envelope;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::{KillOnDrop, broker, http_get, read_topic};

/// One test's topics and consumer group.
struct Topics {
    id: String,
}

impl Topics {
    fn new() -> Self {
        Self {
            id: uuid::Uuid::now_v7().simple().to_string(),
        }
    }
    fn inbound(&self) -> String {
        format!("r{}.inbound", self.id)
    }
    fn dlq(&self) -> String {
        format!("r{}.dlq", self.id)
    }
    fn out(&self, destination: &str) -> String {
        format!("r{}.out.{destination}", self.id)
    }
    fn group(&self) -> String {
        format!("r{}", self.id)
    }
    /// The transformer's environment for these topics against `brokers`.
    fn env(&self, brokers: &str) -> Vec<(String, String)> {
        [
            ("HL7GW_KAFKA__BROKERS", brokers.to_owned()),
            ("HL7GW_INBOUND_TOPIC", self.inbound()),
            ("HL7GW_DLQ_TOPIC", self.dlq()),
            ("HL7GW_OUT_TOPIC_PREFIX", format!("r{}.out.", self.id)),
            ("HL7GW_GROUP_ID", self.group()),
            ("HL7GW_TRANSACTIONAL_ID", format!("r{}-0", self.id)),
            ("HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS", "3".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
    /// [`Topics::env`] with `routes` as the routes file.
    fn env_with_routes(&self, brokers: &str, routes: &Path) -> Vec<(String, String)> {
        let mut env = self.env(brokers);
        env.push((
            "HL7GW_ROUTES__FILE".into(),
            routes.to_str().unwrap().to_owned(),
        ));
        env
    }
}

/// `n` ADT^A01 messages, control ids `<prefix>0`, `<prefix>1`, ..., patient `MRN<i>` each.
fn adts(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| message("ADT^A01", &format!("{prefix}{i}"), &format!("MRN{i}")))
        .collect()
}

/// A running transformer and its admin address.
struct Transformer {
    proc: KillOnDrop,
    admin: SocketAddr,
}

impl Transformer {
    fn start(env: &[(String, String)]) -> Self {
        Self::start_without(env, &[])
    }

    /// Starts with `env`, and without the variables named in `remove` (inherited otherwise).
    fn start_without(env: &[(String, String)], remove: &[&str]) -> Self {
        Self::spawn(env, remove, Stdio::inherit())
    }

    /// Starts with `env`, its log (stderr) to the file `log`.
    fn start_logging(env: &[(String, String)], log: &Path) -> Self {
        Self::spawn(env, &[], std::fs::File::create(log).unwrap().into())
    }

    fn spawn(env: &[(String, String)], remove: &[&str], stderr: Stdio) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hl7gw-transformer"));
        cmd.args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(stderr);
        for k in remove {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starting hl7gw-transformer");
        let stdout = child.stdout.take().unwrap();
        let mut proc = KillOnDrop(child);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let admin = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("admin="))
            .and_then(|a| a.parse().ok());
        let Some(admin) = admin else {
            let status = proc.0.wait().ok();
            panic!("the transformer printed no listening line ({line:?}); it exited: {status:?}");
        };
        Self { proc, admin }
    }

    fn running(&mut self) -> bool {
        matches!(self.proc.0.try_wait(), Ok(None))
    }

    fn ready(&self) -> u16 {
        http_get(self.admin, "/readyz").0
    }

    fn wait_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.ready() != 200 {
            assert!(Instant::now() < deadline, "not ready within {limit:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The value of a metric series (exact name with labels), 0 when absent.
    fn metric(&self, series: &str) -> f64 {
        let (_, body) = http_get(self.admin, "/metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

fn message(kind: &str, control_id: &str, patient: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|APP|FAC|X|Y|20260101||{kind}|{control_id}|P|2.5\rPID|1||{patient}^^^FAC^MR||DOE^JANE\r"
    )
    .into_bytes()
}

/// Produces one envelope per message to `topic`, keyed by facility and patient as the ingress does.
async fn produce(brokers: &str, topic: &str, messages: &[Vec<u8>]) {
    let producer = support::EnvelopeProducer::new(brokers);
    for (i, raw) in messages.iter().enumerate() {
        let m = hl7v2::Message::parse(raw).unwrap();
        let env = Envelope {
            id: format!("e{i}"),
            raw: raw.clone().into(),
            header: Some(hl7gw_runtime::envelope::header(
                m.header(),
                hl7v2::Charset::Utf8,
            )),
            key: format!("FAC|P{i}"),
            ..Envelope::default()
        };
        producer.send(topic, &env.key, &env).await;
    }
}

/// The offsets the group committed on the topic's three partitions (None where nothing was committed).
fn committed(brokers: &str, group: &str, topic: &str) -> Vec<Option<i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        })
        .collect()
}

fn route_file(path: &Path) {
    std::fs::write(
        path,
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {name: adt}\nspec:\n  match: {messageTypes: ['ADT^*']}\n  destinations: [adt]\n",
    )
    .unwrap();
}

/// `read_topic` on a blocking thread (it polls a consumer synchronously).
async fn read_out(brokers: &str, topic: String, n: usize, limit: Duration) -> Vec<support::Record> {
    let brokers = brokers.to_owned();
    tokio::task::spawn_blocking(move || read_topic(&brokers, &topic, n, limit))
        .await
        .unwrap()
}

/// The control ids (MSH-10) of `records`, sorted.
fn sorted_control_ids(records: &[support::Record]) -> Vec<String> {
    let mut ids: Vec<String> = records
        .iter()
        .map(|r| r.envelope.header.clone().unwrap_or_default().control_id)
        .collect();
    ids.sort();
    ids
}

/// Item 2: with the routes file missing at start, the transformer stays up, not ready, and consumes and commits
/// nothing; once the file appears every message is routed, and the unmatched one goes to the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_consumed_before_the_routes_are_loaded() {
    let t = Topics::new();
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.yaml");
    let brokers = broker();
    let adts = adts("W", 4);
    let mut all = adts.clone();
    all.push(message("ORU^R01", "W-ORU", "MRN9"));
    produce(brokers, &t.inbound(), &all).await;

    let mut env = t.env_with_routes(brokers, &routes);
    env.push(("HL7GW_ROUTES__RELOAD_INTERVAL".into(), "200ms".into()));
    let mut tr = Transformer::start(&env);

    // Several seconds without routes: up, not ready, nothing routed, nothing committed.
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        assert!(tr.running(), "the transformer exited without routes");
        assert_eq!(tr.ready(), 503, "ready without routes");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        committed(brokers, &t.group(), &t.inbound()),
        [None, None, None],
        "offsets committed before any route was loaded"
    );
    assert_eq!(
        tr.metric("hl7gw_transformer_messages_total{message_type=\"ADT\",outcome=\"unmatched\"}"),
        0.0
    );

    // The routes appear: ready, and every message is routed or dead-lettered as unmatched.
    route_file(&routes);
    tr.wait_ready(Duration::from_secs(30));
    let out = read_topic(brokers, &t.out("adt"), adts.len(), Duration::from_secs(60));
    let ids = sorted_control_ids(&out);
    assert_eq!(ids, ["W0", "W1", "W2", "W3"]);
    let dlq = read_topic(brokers, &t.dlq(), 1, Duration::from_secs(30));
    assert_eq!(dlq.len(), 1);
    let rej = dlq[0].envelope.rejection.clone().unwrap_or_default();
    assert_eq!(
        (rej.stage.as_str(), rej.reason.as_str()),
        ("transformer", "unmatched")
    );
    assert_eq!(
        tr.metric("hl7gw_transformer_dlq_writes_total{reason=\"unmatched\"}"),
        1.0
    );
    assert!(tr.running());
}

/// Item 2, Kubernetes source: an API server that does not answer (a closed port) means no routes: the
/// transformer stays up and not ready, and consumes and commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_means_nothing_is_consumed() {
    let t = Topics::new();
    let dir = tempfile::tempdir().unwrap();
    let closed = support::free_port();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://127.0.0.1:{closed}'}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: hl7gw}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
    let brokers = broker();
    let msgs = adts("K", 3);
    produce(brokers, &t.inbound(), &msgs).await;
    let mut env = t.env(brokers);
    env.push(("HL7GW_ROUTES__KUBERNETES".into(), "true".into()));
    env.push(("KUBECONFIG".into(), kubeconfig.to_str().unwrap().to_owned()));
    let mut tr = Transformer::start(&env);
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        assert!(tr.running(), "the transformer exited");
        assert_eq!(tr.ready(), 503);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        committed(brokers, &t.group(), &t.inbound()),
        [None, None, None],
        "offsets committed while no route list was ever loaded"
    );
    assert!(read_topic(brokers, &t.dlq(), 0, Duration::from_secs(4)).is_empty());
}

/// A plugin that answers every call after `delay` with a ZPL segment appended.
struct SlowPlugin {
    delay: Duration,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl hl7gw_runtime::proto::v1::transform_server::Transform for SlowPlugin {
    async fn transform(
        &self,
        req: tonic::Request<hl7gw_runtime::proto::v1::TransformRequest>,
    ) -> Result<tonic::Response<hl7gw_runtime::proto::v1::TransformResponse>, tonic::Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let mut m = req.into_inner().message.to_vec();
        m.extend_from_slice(b"ZPL|slow\r");
        Ok(tonic::Response::new(
            hl7gw_runtime::proto::v1::TransformResponse {
                message: m.into(),
                ..Default::default()
            },
        ))
    }
}

/// Serves a plugin on 127.0.0.1 (plain gRPC) and returns its address and its count of calls.
async fn serve_plugin(delay: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                hl7gw_runtime::proto::v1::transform_server::TransformServer::new(SlowPlugin {
                    delay,
                    calls: calls.clone(),
                }),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, calls)
}

/// What the plugin tests start from: a route `slow` sending every message through the plugin at `plugin`
/// (`timeout_ms` per call) to destination `slow`; `n` ADT^A01 messages (control ids `<prefix><i>`) already in
/// the inbound topic; and the transformer's environment with that route, `transaction_timeout` and a 1 s
/// batch linger. The directory returned holds the routes file.
async fn slow_route(
    t: &Topics,
    brokers: &str,
    plugin: SocketAddr,
    timeout_ms: u32,
    prefix: &str,
    n: usize,
    transaction_timeout: &str,
) -> (tempfile::TempDir, Vec<(String, String)>) {
    let (dir, routes) = support::temp_file(
        "routes.yaml",
        format!(
            "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: slow}}\nspec:\n  transforms: [{{plugin: {{endpoint: 'http://{plugin}', timeoutMs: {timeout_ms}}}}}]\n  destinations: [slow]\n"
        ),
    );
    let msgs = adts(prefix, n);
    produce(brokers, &t.inbound(), &msgs).await;
    let mut env = t.env_with_routes(brokers, &routes);
    env.push((
        "HL7GW_TRANSACTION_TIMEOUT".into(),
        transaction_timeout.into(),
    ));
    env.push(("HL7GW_BATCH_LINGER".into(), "1s".into()));
    (dir, env)
}

/// Waits (up to 60 s) until the plugin has been called once.
async fn first_call(calls: &AtomicUsize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the plugin was never called");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Item 8: one batch whose plugin calls together take far longer than `transaction_timeout` (24 messages x
/// 500 ms against a 2 s timeout). The transformer commits what it has done before the timeout nears and reads
/// the rest again: it stays up, is not fenced, and routes every message exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_slower_than_the_transaction_timeout_is_cut_not_fenced() {
    let _timing = TIMING.lock().await;
    let t = Topics::new();
    let (plugin, _) = serve_plugin(Duration::from_millis(500)).await;
    let brokers = broker();
    let n = 24;
    // All in the topic before the transformer starts, so its first batches hold many of them.
    let (_dir, env) = slow_route(&t, brokers, plugin, 3000, "S", n, "2s").await;
    let mut tr = Transformer::start(&env);
    let out = read_out(brokers, t.out("slow"), n, Duration::from_secs(90)).await;
    assert!(tr.running(), "the transformer exited (fenced?)");
    let ids = sorted_control_ids(&out);
    let mut want: Vec<String> = (0..n).map(|i| format!("S{i}")).collect();
    want.sort();
    assert_eq!(ids, want, "every message once");
    assert!(out.iter().all(|r| r.envelope.raw.ends_with(b"ZPL|slow\r")));
    assert!(
        tr.metric("hl7gw_transformer_batches_cut_total") >= 1.0,
        "no batch was cut"
    );
}

/// The tests that stop brokers, fence producers or race a transaction timeout run one at a time: on a 2-core
/// machine, several at once stretch their timings past what they measure.
static TIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A private broker for a test that stops and restarts it (not the shared one).
const OUTAGE_PORT: u16 = 29292;

/// Item 7: the broker goes away while a batch is in hand (its commit times out, the transaction cannot be
/// finished) and comes back. The transformer stays up, is not ready while it cannot commit, then recovers
/// in-process and routes every message exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_during_a_commit_is_recovered_in_process() {
    let _timing = TIMING.lock().await;
    let brokers = support::broker_on(OUTAGE_PORT);
    let t = Topics::new();
    let (plugin, calls) = serve_plugin(Duration::from_millis(1500)).await;
    let n = 6;
    let (_dir, env) = slow_route(&t, &brokers, plugin, 5000, "O", n, "4s").await;
    let mut tr = Transformer::start(&env);
    tr.wait_ready(Duration::from_secs(60));

    // The first batch is being routed (the plugin has its first call): the broker goes away before its
    // transaction can commit, and stays away longer than the transaction timeout.
    first_call(&calls).await;
    tokio::task::spawn_blocking(|| support::stop_broker(OUTAGE_PORT))
        .await
        .unwrap();
    let mut saw_not_ready = false;
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        assert!(tr.running(), "the transformer exited during the outage");
        saw_not_ready |= tr.ready() != 200;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(saw_not_ready, "ready while the broker was down");
    tokio::task::spawn_blocking(|| support::broker_on(OUTAGE_PORT))
        .await
        .unwrap();

    let out = read_out(&brokers, t.out("slow"), n, Duration::from_secs(150)).await;
    let running = tr.running();
    let ids = sorted_control_ids(&out);
    let want: Vec<String> = (0..n).map(|i| format!("O{i}")).collect();
    let recoveries = tr.metric("hl7gw_transformer_producer_recoveries_total");
    drop(tr);
    tokio::task::spawn_blocking(|| support::stop_broker(OUTAGE_PORT))
        .await
        .unwrap();
    assert!(running, "the transformer exited after the outage");
    assert_eq!(ids, want, "every message exactly once after the outage");
    eprintln!("producer recoveries: {recoveries}");
}

/// Item 7, the fatal path: another producer takes the transformer's `transactional.id` while a batch is in
/// hand (as a zombie pod would), so the transformer's producer is fenced. It closes it, makes a new one with
/// the same id, rewinds to the committed offsets and routes every message exactly once, without exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_producer_is_recreated_in_process() {
    let _timing = TIMING.lock().await;
    let t = Topics::new();
    let (plugin, calls) = serve_plugin(Duration::from_millis(1000)).await;
    let brokers = broker();
    let n = 4;
    let (_dir, env) = slow_route(&t, brokers, plugin, 5000, "F", n, "10s").await;
    let transactional_id = env
        .iter()
        .find(|(k, _)| k == "HL7GW_TRANSACTIONAL_ID")
        .map(|(_, v)| v.clone())
        .unwrap();
    let mut tr = Transformer::start(&env);
    first_call(&calls).await;
    // The zombie: same transactional.id, newer epoch.
    tokio::task::spawn_blocking(move || {
        use rdkafka::producer::{BaseProducer, Producer};
        let zombie: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("transactional.id", &transactional_id)
            .create()
            .unwrap();
        zombie.init_transactions(Duration::from_secs(30)).unwrap();
    })
    .await
    .unwrap();

    let out = read_out(brokers, t.out("slow"), n, Duration::from_secs(90)).await;
    assert!(tr.running(), "the transformer exited when fenced");
    let ids = sorted_control_ids(&out);
    let want: Vec<String> = (0..n).map(|i| format!("F{i}")).collect();
    assert_eq!(ids, want, "every message exactly once");
    assert!(tr.metric("hl7gw_transformer_producer_recoveries_total") >= 1.0);
    tr.wait_ready(Duration::from_secs(30));
}

/// Item 16: a route that hashes the patient id sets its output key from the hashed value (`keyPaths`, read
/// after the transforms), so neither the Kafka key nor `Envelope.key` of the de-identified topic carries the
/// patient id; a route without `keyPaths` keeps the inbound key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deidentifying_route_keys_its_output_without_the_patient_id() {
    let t = Topics::new();
    let (_dir, routes) = support::temp_file(
        "routes.yaml",
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {name: deid}\nspec:\n  transforms:\n    - hash: {path: PID-3-1}\n    - mask: {path: PID-5}\n  keyPaths: [MSH-4, PID-3-1]\n  destinations: [research]\n---\napiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {name: plain}\nspec:\n  destinations: [plain]\n",
    );
    let brokers = broker();
    let msgs = adts("D", 2);
    produce(brokers, &t.inbound(), &msgs).await;
    let env = t.env_with_routes(brokers, &routes);
    let _tr = Transformer::start(&env);
    let research = read_out(brokers, t.out("research"), 2, Duration::from_secs(60)).await;
    assert_eq!(research.len(), 2);
    for r in &research {
        let key = String::from_utf8(r.key.clone().unwrap_or_default()).unwrap();
        let (facility, id) = key.split_once('|').unwrap_or(("", ""));
        assert_eq!(facility, "FAC", "{key}");
        assert_eq!(id.len(), 64, "the hashed id: {key}");
        assert!(!key.contains("MRN"), "the patient id in the key: {key}");
        assert_eq!(r.envelope.key, key, "Envelope.key is the record key");
        let raw = String::from_utf8_lossy(&r.envelope.raw);
        assert!(raw.contains(id), "the key's hash is the message's PID-3-1");
        assert!(!raw.contains("MRN") && !raw.contains("DOE"), "{raw}");
    }
    let plain = read_out(brokers, t.out("plain"), 2, Duration::from_secs(60)).await;
    let mut keys: Vec<String> = plain.iter().map(|r| r.envelope.key.clone()).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["FAC|P0", "FAC|P1"],
        "the inbound key where no keyPaths is set"
    );
}

/// Item 17: an `https://` plugin endpoint is called over TLS (here mutual TLS, the test PKI): the plugin's
/// answer is in the output. Before, the channel had no TLS and every call failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_plugins_are_called_over_mutual_tls() {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let pki = support::pki();
    let read = |n: &str| std::fs::read(pki.path(n)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let server = tonic::transport::Server::builder()
        .tls_config(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(read("server.pem"), read("server.key")))
                .client_ca_root(Certificate::from_pem(read("ca.pem"))),
        )
        .unwrap()
        .add_service(
            hl7gw_runtime::proto::v1::transform_server::TransformServer::new(SlowPlugin {
                delay: Duration::ZERO,
                calls: calls.clone(),
            }),
        );
    tokio::spawn(
        server.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let t = Topics::new();
    let (_dir, routes) = support::temp_file(
        "routes.yaml",
        format!(
            "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: tls}}\nspec:\n  transforms: [{{plugin: {{endpoint: 'https://127.0.0.1:{}', timeoutMs: 5000}}}}]\n  destinations: [tls]\n",
            addr.port()
        ),
    );
    let brokers = broker();
    let msgs = adts("T", 2);
    produce(brokers, &t.inbound(), &msgs).await;
    let mut env = t.env_with_routes(brokers, &routes);
    env.push(("HL7GW_PLUGIN_TLS__CA".into(), pki.file("ca.pem")));
    env.push(("HL7GW_PLUGIN_TLS__CERT".into(), pki.file("client.pem")));
    env.push(("HL7GW_PLUGIN_TLS__KEY".into(), pki.file("client.key")));
    let _tr = Transformer::start(&env);
    let out = read_out(brokers, t.out("tls"), 2, Duration::from_secs(60)).await;
    assert_eq!(out.len(), 2, "no output through the TLS plugin");
    assert!(out.iter().all(|r| r.envelope.raw.ends_with(b"ZPL|slow\r")));
    assert!(calls.load(Ordering::SeqCst) >= 2);
    let dlq = read_topic(brokers, &t.dlq(), 0, Duration::from_secs(3));
    assert!(dlq.is_empty(), "plugin failures: {dlq:?}");
}

/// Two transformers of one group with neither POD_NAME nor HOSTNAME nor a configured transactional id: each
/// gets a transactional id of its own, so they do not fence each other (before: both were
/// `hl7gw-transformer-local`, and each transaction of one fenced the other, in a loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_without_a_pod_name_do_not_fence_each_other() {
    let _timing = TIMING.lock().await;
    let t = Topics::new();
    let (_dir, routes) = support::temp_file(
        "routes.yaml",
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {name: all}\nspec:\n  destinations: [all]\n",
    );
    let brokers = broker();
    let mut env: Vec<(String, String)> = t
        .env(brokers)
        .into_iter()
        .filter(|(k, _)| k != "HL7GW_TRANSACTIONAL_ID")
        .collect();
    env.push((
        "HL7GW_ROUTES__FILE".into(),
        routes.to_str().unwrap().to_owned(),
    ));
    let unset = ["POD_NAME", "HOSTNAME", "HL7GW_TRANSACTIONAL_ID"];
    let mut a = Transformer::start_without(&env, &unset);
    let mut b = Transformer::start_without(&env, &unset);
    a.wait_ready(Duration::from_secs(60));
    b.wait_ready(Duration::from_secs(60));
    // Messages over ten seconds, so both instances run transactions (three partitions, two consumers).
    let n = 20;
    for i in 0..n {
        let m = message("ADT^A01", &format!("N{i}"), &format!("MRN{i}"));
        produce(brokers, &t.inbound(), &[m]).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = read_out(brokers, t.out("all"), n, Duration::from_secs(60)).await;
    let recoveries = (
        a.metric("hl7gw_transformer_producer_recoveries_total"),
        b.metric("hl7gw_transformer_producer_recoveries_total"),
    );
    assert!(a.running() && b.running());
    assert_eq!(recoveries, (0.0, 0.0), "the instances fenced each other");
    assert_eq!(out.len(), n, "every message once");
}

/// The DLQ and output records of `t` read until every control id in `ids` is in one of them (or `limit`).
async fn settled(
    brokers: &str,
    t: &Topics,
    destination: &str,
    ids: &[String],
    limit: Duration,
) -> (Vec<support::Record>, Vec<support::Record>) {
    let deadline = Instant::now() + limit;
    loop {
        let out = read_out(
            brokers,
            t.out(destination),
            ids.len(),
            Duration::from_secs(3),
        )
        .await;
        let dlq = read_out(brokers, t.dlq(), ids.len(), Duration::from_secs(3)).await;
        let mut seen = sorted_control_ids(&out);
        seen.extend(sorted_control_ids(&dlq));
        let missing: Vec<&String> = ids.iter().filter(|id| !seen.contains(id)).collect();
        if missing.is_empty() {
            return (out, dlq);
        }
        assert!(
            Instant::now() < deadline,
            "not delivered nor dead-lettered within {limit:?}: {missing:?} ({} outputs, {} dead letters)",
            out.len(),
            dlq.len()
        );
    }
}

/// An ADT^A01 whose message is `len` bytes, padded with an NTE segment.
fn padded(control_id: &str, patient: &str, len: usize) -> Vec<u8> {
    let mut m = message("ADT^A01", control_id, patient);
    m.extend_from_slice(b"NTE|1||");
    let pad = len.saturating_sub(m.len() + 1);
    m.extend(std::iter::repeat_n(b'X', pad));
    m.push(b'\r');
    m
}

/// Issue 24, item 5: outputs from a few hundred bytes under `kafka.max_message_bytes` to just over it. Those
/// whose envelope fits but whose record (key, headers, record overhead) does not were refused by librdkafka,
/// and their transaction aborted and retried forever: no partition committed again. Each must now be
/// delivered or dead-lettered as `too_large`, and the messages after them delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_just_under_the_record_limit_do_not_stop_the_partitions() {
    const MAX: usize = 20_000;
    let t = Topics::new();
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.yaml");
    route_file(&routes);
    let brokers = broker();
    // An output envelope is about 250 bytes more than its message (ids, header, stage, trace context).
    let mut msgs: Vec<Vec<u8>> = (0..16)
        .map(|i| padded(&format!("B{i:02}"), &format!("MRN{i}"), MAX - 700 + 50 * i))
        .collect();
    msgs.extend(adts("S", 4));
    produce(brokers, &t.inbound(), &msgs).await;
    let mut env = t.env_with_routes(brokers, &routes);
    env.push(("HL7GW_KAFKA__MAX_MESSAGE_BYTES".into(), MAX.to_string()));
    let mut tr = Transformer::start(&env);
    let ids: Vec<String> = (0..16)
        .map(|i| format!("B{i:02}"))
        .chain((0..4).map(|i| format!("S{i}")))
        .collect();
    let (out, dlq) = settled(brokers, &t, "adt", &ids, Duration::from_secs(40)).await;
    assert!(tr.running());
    for d in &dlq {
        let rej = d.envelope.rejection.clone().unwrap_or_default();
        assert_eq!(rej.reason, "too_large", "{rej:?}");
    }
    let delivered = sorted_control_ids(&out);
    let dead = sorted_control_ids(&dlq);
    assert!(
        delivered.iter().all(|id| !dead.contains(id)),
        "delivered and dead-lettered: {delivered:?} {dead:?}"
    );
    assert!(delivered.contains(&"B00".to_owned()), "{delivered:?}");
    assert!(dead.contains(&"B15".to_owned()), "{dead:?}");
    // Every partition committed past its last record.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c: i64 = committed(brokers, &t.group(), &t.inbound())
            .into_iter()
            .map(|o| o.unwrap_or(0))
            .sum();
        if c == msgs.len() as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "committed {c} of {}", msgs.len());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "near the limit: {} delivered, {} dead-lettered as too_large",
        delivered.len(),
        dead.len()
    );
}

/// librdkafka's metadata requests made by the service itself (`application requested`) after it first logged
/// `ready`, in the log at `log` of a service run with `RUST_LOG=...,librdkafka=debug` and
/// `kafka.properties.debug: metadata`: (for every topic, for named topics).
fn metadata_requests_after_ready(log: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap();
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| l.contains("hl7gw_runtime::service") && l.trim_end().ends_with("ready"))
        .expect("the service logged ready");
    let asked: Vec<&str> = lines
        .filter(|l| l.contains("Request metadata for") && l.contains("application requested"))
        .collect();
    let all = asked.iter().filter(|l| l.contains("all topics")).count();
    (all, asked.len() - all)
}

/// Issue 24, item 13: once its topics exist, the readiness probe (every 2 s) asks Kafka for the inbound
/// topic's metadata only, not for every topic of the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readiness_probe_asks_for_the_inbound_topic_only() {
    let t = Topics::new();
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.yaml");
    route_file(&routes);
    let log = dir.path().join("transformer.log");
    let mut env = t.env_with_routes(broker(), &routes);
    env.retain(|(k, _)| k != "RUST_LOG");
    env.push((
        "RUST_LOG".into(),
        "warn,hl7gw_runtime::service=info,librdkafka=debug".into(),
    ));
    env.push(("HL7GW_KAFKA__PROPERTIES__DEBUG".into(), "metadata".into()));
    let tr = Transformer::start_logging(&env, &log);
    tr.wait_ready(Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (all, named) = metadata_requests_after_ready(&log);
    assert_eq!(
        all, 0,
        "metadata requests for every topic ({named} for named ones)"
    );
    assert!(
        named >= 2,
        "the probe asked for {named} named topics' metadata"
    );
}

/// Issue 24, item 7: a destination topic whose own `max.message.bytes` is smaller than
/// `kafka.max_message_bytes` (made by hand with the broker's defaults, say). The broker refuses the output for
/// good; its transaction was aborted and retried forever, and nothing after it was routed. The output now goes
/// to the DLQ as `too_large` (without the message, the DLQ may be as small), and the rest is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_the_broker_refuses_for_its_size_is_a_dead_letter() {
    let t = Topics::new();
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.yaml");
    route_file(&routes);
    let brokers = broker();
    support::create_topic(&t.out("adt"), 3, &[("max.message.bytes", "8000")]).await;
    let mut msgs = vec![padded("BIG", "MRN1", 12_000)];
    msgs.extend(adts("S", 3));
    produce(brokers, &t.inbound(), &msgs).await;
    let tr = Transformer::start(&t.env_with_routes(brokers, &routes));
    let ids: Vec<String> = ["BIG", "S0", "S1", "S2"].map(String::from).to_vec();
    let (delivered, dead) = settled(brokers, &t, "adt", &ids, Duration::from_secs(40)).await;
    assert_eq!(sorted_control_ids(&delivered), ["S0", "S1", "S2"]);
    let (d, rej) = support::only_dead_letter(&dead);
    assert_eq!(rej.reason, "too_large", "{rej:?}");
    assert!(
        d.envelope.raw.is_empty() && rej.detail.contains("sha256"),
        "{rej:?}"
    );
    tr.wait_ready(Duration::from_secs(10));
}
