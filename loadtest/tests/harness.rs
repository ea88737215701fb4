//! The real `hl7gw-load` binary against small in-test MLLP servers on 127.0.0.1 (plain and TLS): ACK
//! accounting, `--record-acked`, exit codes, and surviving a server that drops connections, goes silent, or
//! is killed and restarted mid-run. Every run is bounded by a timeout and killed if it overstays.

use futures_util::{SinkExt, StreamExt};
use hl7v2::{Message, MllpCodec};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::Framed;

/// Longest a harness run may take in these tests.
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// How the test server answers the n-th message it receives (counted over all connections, from 1).
#[derive(Debug, Clone, Copy)]
enum Policy {
    AcceptAll,
    /// AR to every k-th message.
    RejectEvery(u64),
    /// Close the connection instead of answering every k-th message.
    DropEvery(u64),
    /// Never answer every k-th message (the connection stays open).
    SilentEvery(u64),
    /// Answer the k-th message (once) only after this long: a stall.
    StallOnce(u64, Duration),
    /// Answer a connection's messages k at a time, in order, once k have arrived: a sender with fewer than k
    /// in flight waits for ever.
    Batches(usize),
}

/// What the server saw: control id → the code it answered (written before the ACK is sent, so an id the
/// harness records is always here), and the message types received.
#[derive(Debug, Default)]
struct Log {
    received: u64,
    answered: HashMap<String, &'static str>,
    types: HashSet<String>,
}

type SharedLog = Arc<Mutex<Log>>;

struct Server {
    addr: SocketAddr,
    log: SharedLog,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(policy: Policy) -> Self {
        Self::start_at("127.0.0.1:0", policy, Arc::default(), None).await
    }

    async fn start_at(
        addr: &str,
        policy: Policy,
        log: SharedLog,
        tls: Option<TlsAcceptor>,
    ) -> Self {
        let listener = TcpListener::bind(addr).await.expect("binding 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(serve(listener, policy, log.clone(), tls));
        Self { addr, log, task }
    }

    /// Like a SIGKILL: the listener and every connection go away at once.
    fn kill(self) -> (SocketAddr, SharedLog) {
        self.task.abort();
        (self.addr, self.log)
    }

    fn to(&self) -> String {
        self.addr.to_string()
    }

    fn received(&self) -> u64 {
        self.log.lock().expect("log").received
    }
}

async fn serve(listener: TcpListener, policy: Policy, log: SharedLog, tls: Option<TlsAcceptor>) {
    // Dropped with the task: aborting the server closes every connection too.
    let mut conns = JoinSet::new();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let log = log.clone();
        match tls.clone() {
            None => conns.spawn(answer(tcp, policy, log)),
            Some(acceptor) => conns.spawn(async move {
                if let Ok(stream) = acceptor.accept(tcp).await {
                    answer(stream, policy, log).await;
                }
            }),
        };
    }
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(stream: S, policy: Policy, log: SharedLog) {
    let mut framed = Framed::new(stream, MllpCodec::default());
    let mut held = Vec::new();
    while let Some(Ok(frame)) = framed.next().await {
        let msg = Message::parse(&frame).expect("the harness sends valid HL7");
        let cid = String::from_utf8_lossy(msg.header().control_id).into_owned();
        let kind = String::from_utf8_lossy(msg.header().message_type).into_owned();
        let code = {
            let mut log = log.lock().expect("log");
            log.received += 1;
            log.types.insert(kind);
            let n = log.received;
            let code = match policy {
                Policy::RejectEvery(k) if n.is_multiple_of(k) => "AR",
                Policy::DropEvery(k) if n.is_multiple_of(k) => return,
                Policy::SilentEvery(k) if n.is_multiple_of(k) => continue,
                _ => "AA",
            };
            log.answered.insert(cid.clone(), code);
            (code, matches!(policy, Policy::StallOnce(k, _) if n == k))
        };
        let (code, stall) = code;
        if let (true, Policy::StallOnce(_, d)) = (stall, policy) {
            tokio::time::sleep(d).await;
        }
        let ack = format!(
            "MSH|^~\\&|TESTSRV|TEST|LOADGEN|LOADFAC|20260101000000||ACK^A01^ACK|S{cid}|P|2.5\rMSA|{code}|{cid}\r"
        );
        held.push(ack.into_bytes());
        if let Policy::Batches(k) = policy
            && held.len() < k
        {
            continue;
        }
        for ack in held.drain(..) {
            if framed.send(ack).await.is_err() {
                return;
            }
        }
    }
}

struct Run {
    code: i32,
    json: Value,
    stdout: String,
    stderr: String,
}

/// The arguments of `line` (split on whitespace) with each `{}` replaced by the next of `values`, which may
/// hold spaces (temporary paths).
fn argv(line: &str, values: &[&str]) -> Vec<String> {
    let mut values = values.iter();
    line.split_whitespace()
        .map(|a| match a {
            "{}" => (*values.next().expect("a value per {}")).to_owned(),
            a => a.to_owned(),
        })
        .collect()
}

async fn load(args: &[String]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hl7gw-load"));
    cmd.args(args).kill_on_drop(true);
    let out = tokio::time::timeout(RUN_LIMIT, cmd.output())
        .await
        .expect("hl7gw-load did not finish in time")
        .expect("running hl7gw-load");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Run {
        code: out.status.code().expect("exit code"),
        json: serde_json::from_str(&stdout).unwrap_or(Value::Null),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn recorded(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every recorded id is unique and was answered AA by the server.
fn check_recorded(ids: &[String], log: &SharedLog) {
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "duplicate ids in the record file");
    let log = log.lock().expect("log");
    for id in ids {
        assert_eq!(
            log.answered.get(id).copied(),
            Some("AA"),
            "{id} recorded but not acknowledged"
        );
    }
}

/// `hl7gw-load --to <server> <args> --json --record-acked <file>` against a server answering by `policy`,
/// expected to exit with `code`: the run, the ids it recorded (each unique and answered AA by the server) and
/// the server.
async fn recorded_run(policy: Policy, args: &str, code: i32) -> (Run, Vec<String>, Server) {
    let server = Server::start(policy).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("acked.txt");
    let mut line = vec!["--to".to_owned(), server.to()];
    line.extend(args.split_whitespace().map(str::to_owned));
    line.extend(["--json", "--record-acked"].map(str::to_owned));
    line.push(file.to_str().expect("utf-8").to_owned());
    let run = load(&line).await;
    assert_eq!(run.code, code, "{}\n{}", run.stdout, run.stderr);
    let ids = recorded(&file);
    check_recorded(&ids, &server.log);
    (run, ids, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_all_accepted() {
    let (run, ids, server) = recorded_run(Policy::AcceptAll, "--clients 2 --messages 200", 0).await;
    let j = &run.json;
    assert_eq!(j["clients"], 2);
    assert_eq!(j["messages"], 400);
    assert_eq!(j["acks"]["AA"], 400);
    assert_eq!(j["errors"], 0);
    assert_eq!(j["mismatches"], 0);
    assert_eq!(j["reconnects"], 0);
    assert_eq!(j["recorded"], 400);
    assert_eq!(j["warmup"]["messages"], 200);
    assert!(j["msgs_per_sec"].as_f64().expect("rate") > 0.0);
    let l = &j["latency_us"];
    let p = |k: &str| l[k].as_u64().expect("percentile");
    assert!(p("p50") <= p("p90") && p("p90") <= p("p95") && p("p95") <= p("p99"));
    assert!(p("p99") <= p("p999") && p("p999") <= p("max") && p("p50") >= 1);

    assert_eq!(ids.len(), 400);
    let run_id = j["run_id"].as_str().expect("run id");
    for client in 0..2 {
        for seq in [0, 199] {
            assert!(ids.contains(&format!("{run_id}-{client}-{seq}")));
        }
    }
    // Warm-up messages (200) plus measured ones (400) reached the server, each with its own MSH-10.
    let log = server.log.lock().expect("log");
    assert_eq!(log.received, 600);
    assert_eq!(log.answered.len(), 600);
    assert_eq!(log.types, HashSet::from(["ADT".to_owned()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_messages_fail_the_run_and_are_not_recorded() {
    let (run, ids, server) =
        recorded_run(Policy::RejectEvery(10), "--clients 2 --messages 200", 1).await;
    let j = &run.json;
    let (aa, ar) = (j["acks"]["AA"].as_u64(), j["acks"]["AR"].as_u64());
    let (aa, ar) = (aa.expect("AA"), ar.expect("AR"));
    assert_eq!(aa + ar, 400);
    assert!((35..=45).contains(&ar), "{ar} AR");
    assert_eq!(j["errors"], 0);

    assert_eq!(ids.len() as u64, aa);
    let rejected: Vec<String> = server
        .log
        .lock()
        .expect("log")
        .answered
        .iter()
        .filter(|(_, code)| **code == "AR")
        .map(|(id, _)| id.clone())
        .collect();
    assert!(rejected.len() >= 50, "warm-up and measured ARs");
    for id in &rejected {
        assert!(!ids.contains(id), "{id} got AR but was recorded");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_are_errors_and_the_run_goes_on() {
    let (run, ids, _server) = recorded_run(
        Policy::DropEvery(50),
        "--clients 2 --messages 300 --warmup 0",
        1,
    )
    .await;
    let j = &run.json;
    assert_eq!(j["messages"], 600);
    assert_eq!(j["errors"], 12, "one in 50 of 600: {}", run.stdout);
    assert_eq!(
        j["error_kinds"]["closed"].as_u64().expect("closed")
            + j["error_kinds"]["io"].as_u64().expect("io"),
        12
    );
    // A client whose last message was dropped has nothing left to send and does not reconnect.
    let reconnects = j["reconnects"].as_u64().expect("reconnects");
    assert!((11..=12).contains(&reconnects), "{reconnects}");
    assert_eq!(j["acks"]["AA"], 588);
    assert_eq!(ids.len(), 588);
}

/// `--in-flight 4`: each connection writes 4 messages before it needs an ACK (the server answers only in
/// fours), ACKs are matched in order, and every recorded id was answered AA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_clients_keep_n_messages_in_flight() {
    let (run, ids, _server) = recorded_run(
        Policy::Batches(4),
        "--clients 2 --messages 200 --warmup 0 --in-flight 4 --timeout 5",
        0,
    )
    .await;
    let j = &run.json;
    assert_eq!(j["in_flight"], 4);
    assert_eq!(j["messages"], 400);
    assert_eq!(j["acks"]["AA"], 400);
    assert_eq!(j["mismatches"], 0);
    assert_eq!(ids.len(), 400);
}

/// A connection dropped with messages in flight: each of them is an error, the client reconnects and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_messages_in_flight_on_a_dropped_connection_are_errors() {
    let (run, ids, _server) = recorded_run(
        Policy::DropEvery(50),
        "--messages 300 --warmup 0 --in-flight 4",
        1,
    )
    .await;
    let j = &run.json;
    assert_eq!(j["messages"], 300);
    let errors = j["errors"].as_u64().expect("errors");
    let aa = j["acks"]["AA"].as_u64().expect("AA");
    assert!(errors >= 1 && aa + errors == 300, "{}", run.stdout);
    assert!(j["reconnects"].as_u64().expect("reconnects") >= 1);
    assert_eq!(j["mismatches"], 0);
    assert_eq!(ids.len() as u64, aa);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_timeouts_are_errors_and_the_run_goes_on() {
    let server = Server::start(Policy::SilentEvery(25)).await;
    let to = server.to();
    let run = load(&argv(
        "--to {} --messages 100 --warmup 0 --timeout 0.2 --json",
        &[&to],
    ))
    .await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let j = &run.json;
    assert_eq!(j["messages"], 100);
    assert_eq!(j["error_kinds"]["timeout"], 4);
    assert_eq!(j["errors"], 4);
    assert_eq!(j["acks"]["AA"], 96);
    assert_eq!(j["mismatches"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_and_restarted_mid_run() {
    let server = Server::start(Policy::AcceptAll).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("acked.txt");
    let to = server.to();
    let file_arg = file.to_str().expect("utf-8").to_owned();
    let harness = tokio::spawn(async move {
        load(&argv(
            "--to {} --clients 2 --messages 3000 --warmup 10 --timeout 2 --json --record-acked {}",
            &[&to, &file_arg],
        ))
        .await
    });
    let waited = tokio::time::Instant::now();
    while server.received() < 500 {
        assert!(waited.elapsed() < RUN_LIMIT, "no traffic");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (addr, log) = server.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted = Server::start_at(&addr.to_string(), Policy::AcceptAll, log.clone(), None).await;
    let run = harness.await.expect("harness task");
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let j = &run.json;
    assert_eq!(j["messages"], 6000);
    assert!(
        j["reconnects"].as_u64().expect("reconnects") >= 2,
        "{}",
        run.stdout
    );
    assert!(j["errors"].as_u64().expect("errors") >= 2);
    let aa = j["acks"]["AA"].as_u64().expect("AA");
    assert!(aa >= 5_990, "{aa}");
    let ids = recorded(&file);
    assert_eq!(ids.len() as u64, aa);
    check_recorded(&ids, &log);
    drop(restarted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_mode_stops_by_itself() {
    let server = Server::start(Policy::AcceptAll).await;
    let to = server.to();
    let run = load(&argv(
        "--to {} --clients 2 --duration 1 --warmup 10 --rate 200 --fixture mix --json",
        &[&to],
    ))
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let j = &run.json;
    assert_eq!(j["mode"], "duration");
    let secs = j["seconds"].as_f64().expect("seconds");
    assert!((0.9..5.0).contains(&secs), "{secs}");
    // Paced at 200/s per client: about 400 messages in 1 s.
    let n = j["messages"].as_u64().expect("messages");
    assert!((300..=420).contains(&n), "{n}");
    assert_eq!(j["acks"]["AA"], n);
    let log = server.log.lock().expect("log");
    assert_eq!(
        log.types,
        HashSet::from(["ADT".to_owned(), "ORU".to_owned()])
    );
}

/// Issue 12: with `--rate`, latency counts from each message's scheduled time. One 300 ms stall at 100 msg/s
/// delays the ~30 messages scheduled behind it: they are late sends, and the percentiles show the stall
/// (timed from the actual send, only the stalled message itself would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shows_in_the_latency_of_the_messages_scheduled_behind_it() {
    let server = Server::start(Policy::StallOnce(50, Duration::from_millis(300))).await;
    let to = server.to();
    let run = load(&argv(
        "--to {} --clients 1 --messages 200 --warmup 0 --rate 100 --json",
        &[&to],
    ))
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let j = &run.json;
    let late = j["late_sends"].as_u64().expect("late_sends");
    assert!((20..=40).contains(&late), "late sends: {late}");
    // ~30 of 200 messages waited 10-300 ms: p90 is well above a loopback round trip.
    let p90 = j["latency_us"]["p90"].as_f64().expect("p90");
    assert!(p90 > 50_000.0, "p90 {p90} µs does not show the stall");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_sent_with_msh10_rewritten() {
    let server = Server::start(Policy::AcceptAll).await;
    let two = "MSH|^~\\&|A|B|C|D|20260101||SIU^S12|FIXED|P|2.5\nSCH|1\nMSH|^~\\&|A|B|C|D|20260101||MDM^T02|FIXED|P|2.5\n";
    let dir = tempfile::tempdir().expect("tempdir");
    let msgs = dir.path().join("msgs.hl7");
    std::fs::write(&msgs, two).expect("write");
    let to = server.to();
    let run = load(&argv(
        "--to {} --messages 20 --warmup 0 --files {}",
        &[&to, msgs.to_str().expect("utf-8")],
    ))
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("AA 20"), "{}", run.stdout);
    assert!(run.stdout.contains("p99.9"), "{}", run.stdout);
    let log = server.log.lock().expect("log");
    assert_eq!(log.answered.len(), 20);
    assert!(!log.answered.contains_key("FIXED"));
    assert_eq!(
        log.types,
        HashSet::from(["SIU".to_owned(), "MDM".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_and_usage_errors_exit_2() {
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let run = load(&argv("--to {} --messages 1", &[&closed])).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("connecting to"), "{}", run.stderr);
    assert_eq!(load(&argv("--clients 2", &[])).await.code, 2);
    assert_eq!(load(&argv("--to nowhere --messages 1", &[])).await.code, 2);
    let missing = load(&argv("--to {} --files /nonexistent/x.hl7", &[&closed])).await;
    assert_eq!(missing.code, 2);
}

fn pki(dir: &Path) {
    let mut ca = CertificateParams::new(Vec::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "hl7gw-load test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("leaf");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().expect("key");
    let cert = leaf.signed_by(&key, &issuer).expect("sign");
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("write");
    std::fs::write(dir.join("server.pem"), cert.pem()).expect("write");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    pki(dir.path());
    let certs = CertificateDer::pem_file_iter(dir.path().join("server.pem"))
        .expect("certs")
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = PrivateKeyDer::from_pem_file(dir.path().join("server.key")).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let server = Server::start_at(
        "127.0.0.1:0",
        Policy::AcceptAll,
        Arc::default(),
        Some(acceptor),
    )
    .await;
    let to = server.to();
    let ca = dir.path().join("ca.pem");
    let ca = ca.to_str().expect("utf-8");
    let run = load(&argv(
        "--to {} --clients 2 --messages 50 --warmup 5 --tls --ca {} --json",
        &[&to, ca],
    ))
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json["acks"]["AA"], 100);
    // The certificate does not name "gw.example": the handshake fails, a setup error.
    let wrong = load(&argv(
        "--to {} --messages 1 --tls --ca {} --server-name gw.example",
        &[&to, ca],
    ))
    .await;
    assert_eq!(wrong.code, 2, "{}", wrong.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_killed_mid_run_leaves_a_valid_record_file() {
    let server = Server::start(Policy::AcceptAll).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("acked.txt");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hl7gw-load"))
        .args(argv(
            "--to {} --clients 4 --messages 1000000 --warmup 0 --max-seconds 60 --record-acked {}",
            &[&server.to(), file.to_str().expect("utf-8")],
        ))
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting hl7gw-load");
    let waited = tokio::time::Instant::now();
    while recorded(&file).len() < 2_000 {
        assert!(waited.elapsed() < RUN_LIMIT, "nothing recorded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.start_kill().expect("SIGKILL");
    let status = tokio::time::timeout(RUN_LIMIT, child.wait())
        .await
        .expect("exit after SIGKILL")
        .expect("status");
    assert!(!status.success());
    let text = std::fs::read_to_string(&file).expect("record file");
    // Every complete line names a message the server acknowledged.
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    let ids: Vec<String> = complete.lines().map(str::to_owned).collect();
    assert!(ids.len() >= 2_000);
    check_recorded(&ids, &server.log);
}
