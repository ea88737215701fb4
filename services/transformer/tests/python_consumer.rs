//! The consumer contract (docs/consuming.md) seen from outside: a real Kafka, the ingress and transformer
//! binaries, ADT messages over MLLP, and the Python example consumer (examples/consumer-python, set up by
//! scripts/python-env.sh) reading `hl7.inbound`, a `toJson` destination topic and `hl7.dlq` with code
//! generated from proto/. What it prints must match what was sent: control ids, types, keys, raw bytes,
//! patient ids in the flat view, per-patient order, DLQ reasons.
#![allow(clippy::unwrap_used)]

use hl7gw_testkit as support;

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{KillOnDrop, bin, broker, repo_root};

/// Starts a service binary on ephemeral ports and returns it with its `listening` line's addresses.
fn start_service(
    bin: &Path,
    args: &[&str],
    env: &[(&str, String)],
) -> (KillOnDrop, HashMap<String, SocketAddr>) {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let stdout = child.stdout.take().unwrap();
    let proc = KillOnDrop(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addrs: HashMap<String, SocketAddr> = line
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        .collect();
    assert!(
        addrs.contains_key("admin"),
        "{} printed no listening line: {line:?}",
        bin.display()
    );
    let admin = addrs["admin"];
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_status(admin, "/readyz") != 200 {
        assert!(
            Instant::now() < deadline,
            "{} not ready within 60 s",
            bin.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (proc, addrs)
}

fn http_status(addr: SocketAddr, path: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A minimal MLLP client: 0x0B, message, 0x1C 0x0D; the answer is read up to its 0x1C 0x0D.
struct Mllp(TcpStream);

impl Mllp {
    fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Self(s)
    }

    fn call(&mut self, msg: &[u8]) -> String {
        let mut frame = vec![0x0b];
        frame.extend_from_slice(msg);
        frame.extend_from_slice(&[0x1c, 0x0d]);
        self.0.write_all(&frame).unwrap();
        let mut ack = Vec::new();
        let mut byte = [0u8; 1];
        while !ack.ends_with(&[0x1c, 0x0d]) {
            let n = self.0.read(&mut byte).expect("reading the ACK");
            assert!(n == 1, "connection closed before the ACK ended");
            ack.push(byte[0]);
        }
        let start = ack.iter().position(|&b| b == 0x0b).expect("start block") + 1;
        String::from_utf8_lossy(&ack[start..ack.len() - 2]).into_owned()
    }
}

/// MSA-1 and MSA-2 of an ACK.
fn msa(ack: &str) -> (String, String) {
    let seg = ack
        .split(['\r', '\n'])
        .find(|s| s.starts_with("MSA|"))
        .unwrap_or_else(|| panic!("no MSA in {ack:?}"));
    let f: Vec<&str> = seg.split('|').collect();
    (
        f.get(1).copied().unwrap_or("").to_owned(),
        f.get(2).copied().unwrap_or("").to_owned(),
    )
}

/// One message sent: what the consumer must report for it.
struct Sent {
    control_id: String,
    trigger: &'static str,
    /// PID-3.1 as written (the Kafka key holds it so).
    pid_raw: &'static str,
    /// PID-3.1 escape-decoded (the canonical JSON holds it so).
    pid_decoded: &'static str,
    bytes: Vec<u8>,
}

fn adt(control_id: &str, trigger: &str, pid: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|PYAPP|PYFAC|HL7GW|HL7GW|20261122120000||ADT^{trigger}^ADT_A01|{control_id}|P|2.5.1||||||UNICODE UTF-8\r\
         EVN|{trigger}|20261122120000\r\
         PID|1||{pid}^^^PYFAC^MR||MÜLLER^JÖRG||19700101|M\r\
         PV1|1|I|WARD^1^1\r"
    )
    .into_bytes()
}

fn sha256_hex(b: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

/// Runs consumer.py with `args`; returns its output and the summaries it printed.
fn run_consumer(python: &str, args: &[&str]) -> (Output, Vec<Value>) {
    let script = repo_root().join("examples/consumer-python/consumer.py");
    let out = Command::new(python)
        .arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running consumer.py");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (out, lines)
}

#[test]
fn the_python_consumer_reads_inbound_json_and_dlq_topics() {
    let root = repo_root();
    // The Python setup is the slow part on a fresh machine: it runs while Kafka and the services start.
    let setup_dir = tempfile::tempdir().unwrap();
    let setup_log = setup_dir.path().join("python-env.log");
    let setup_started = Instant::now();
    let setup = Command::new("bash")
        .arg(root.join("scripts/python-env.sh"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&setup_log).unwrap())
        .spawn()
        .expect("running scripts/python-env.sh");

    let brokers = broker().to_owned();
    let run = uuid::Uuid::now_v7().simple().to_string();
    let inbound = format!("hl7.inbound.pyc-{run}");
    let dlq = format!("hl7.dlq.pyc-{run}");
    let destination = format!("json-{run}");
    let out_topic = format!("hl7.out.{destination}");
    let route = "adt-to-json";
    // Fails on every A03 (there is no third OBX to set): a transformer DLQ record beside the JSON output.
    let broken = "a03-broken";

    let (_dir, routes) = support::temp_file(
        "routes.yaml",
        format!(
            "apiVersion: hl7gw.io/v1alpha1\n\
             kind: HL7Route\n\
             metadata:\n  name: {route}\n\
             spec:\n  match:\n    messageTypes: ['ADT^*']\n  transforms:\n    - toJson: {{}}\n  destinations: [{destination}]\n\
             ---\n\
             apiVersion: hl7gw.io/v1alpha1\n\
             kind: HL7Route\n\
             metadata:\n  name: {broken}\n\
             spec:\n  match:\n    messageTypes: ['ADT^A03']\n  transforms:\n    - set: {{path: 'OBX(3)-5', value: x}}\n  destinations: [never-{run}]\n"
        ),
    );

    let ports = ["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"];
    let (_transformer, _) = start_service(
        Path::new(env!("CARGO_BIN_EXE_hl7gw-transformer")),
        &ports,
        &[
            ("HL7GW_KAFKA__BROKERS", brokers.clone()),
            ("HL7GW_ROUTES__FILE", routes.display().to_string()),
            ("HL7GW_INBOUND_TOPIC", inbound.clone()),
            ("HL7GW_DLQ_TOPIC", dlq.clone()),
            ("HL7GW_OUT_TOPIC_PREFIX", "hl7.out.".into()),
            ("HL7GW_GROUP_ID", format!("pyc-{run}")),
            ("HL7GW_TRANSACTIONAL_ID", format!("pyc-{run}")),
        ],
    );
    let mut ingress_args = vec!["--mllp-addr", "127.0.0.1:0"];
    ingress_args.extend_from_slice(&ports);
    let (_ingress, addrs) = start_service(
        &bin("hl7gw-ingress"),
        &ingress_args,
        &[
            ("HL7GW_KAFKA__BROKERS", brokers.clone()),
            ("HL7GW_INBOUND_TOPIC", inbound.clone()),
            ("HL7GW_DLQ_TOPIC", dlq.clone()),
        ],
    );

    // Four ADT messages on one connection; patient P1 twice (order must hold), one id with an escape sequence
    // (`\T\` is the subcomponent separator `&`: raw in the key, decoded in the JSON), names outside ASCII.
    let tag = &run[run.len() - 8..];
    let sent: Vec<Sent> = [
        ("A01", "P1-4711", "P1-4711"),
        ("A08", "P2-0815", "P2-0815"),
        ("A03", "P1-4711", "P1-4711"),
        ("A01", "P3\\T\\X", "P3&X"),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (trigger, pid_raw, pid_decoded))| {
        let control_id = format!("PYC{tag}-{}", i + 1);
        Sent {
            bytes: adt(&control_id, trigger, pid_raw),
            control_id,
            trigger,
            pid_raw,
            pid_decoded,
        }
    })
    .collect();
    let mut mllp = Mllp::connect(addrs["mllp"]);
    for m in &sent {
        let (code, acked) = msa(&mllp.call(&m.bytes));
        assert_eq!(
            (code.as_str(), acked.as_str()),
            ("AA", m.control_id.as_str())
        );
    }
    // An unsupported version: AR, and the message goes to the DLQ from the ingress.
    let rejected_id = format!("PYC{tag}-bad");
    let rejected = String::from_utf8(adt(&rejected_id, "A01", "P9"))
        .unwrap()
        .replace("|P|2.5.1|", "|P|9.9|");
    let (code, _) = msa(&mllp.call(rejected.as_bytes()));
    assert_eq!(code, "AR");

    let status = setup.wait_with_output().unwrap();
    let setup_secs = setup_started.elapsed().as_secs_f64();
    let log = std::fs::read_to_string(&setup_log).unwrap_or_default();
    assert!(
        status.status.success(),
        "scripts/python-env.sh failed ({}): the Python example cannot run.\n{log}",
        status.status
    );
    let python = String::from_utf8(status.stdout).unwrap().trim().to_owned();
    assert!(
        Path::new(&python).exists(),
        "scripts/python-env.sh printed {python:?}, which does not exist\n{log}"
    );
    eprintln!("python environment ready after {setup_secs:.1}s: {python}");

    let want = 2 * sent.len();
    let schema = repo_root()
        .join("proto/hl7gw/v1/canonical.schema.json")
        .display()
        .to_string();
    let started = Instant::now();
    let count = want.to_string();
    let (out, lines) = run_consumer(
        &python,
        &[
            "--brokers",
            &brokers,
            "--count",
            &count,
            "--timeout",
            "90",
            "--schema",
            &schema,
            &inbound,
            &out_topic,
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "consumer.py failed ({}) after {} records\nstdout: {}\nstderr: {stderr}",
        out.status,
        lines.len(),
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!(
        "consumer.py read {} records in {:.1}s",
        lines.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(lines.len(), want, "{lines:#?}");

    let on =
        |topic: &str| -> Vec<&Value> { lines.iter().filter(|l| l["topic"] == topic).collect() };
    let inbound_lines = on(&inbound);
    let json_lines = on(&out_topic);
    assert_eq!(inbound_lines.len(), sent.len(), "{lines:#?}");
    assert_eq!(json_lines.len(), sent.len(), "{lines:#?}");
    let by_id = |set: &[&Value], id: &str| -> Value {
        let found: Vec<&&Value> = set.iter().filter(|l| l["control_id"] == id).collect();
        assert_eq!(found.len(), 1, "control id {id}: {found:#?}");
        (*found[0]).clone()
    };

    for (i, m) in sent.iter().enumerate() {
        let key = format!("PYFAC|{}", m.pid_raw);
        let ty = format!("ADT^{}", m.trigger);

        // hl7.inbound: the message exactly as received, keyed by MSH-4|PID-3.1.
        let r = by_id(&inbound_lines, &m.control_id);
        assert_eq!(s(&r, "key"), key, "{r}");
        assert_eq!(s(&r, "type"), ty, "{r}");
        assert_eq!(s(&r, "message_type"), ty, "{r}");
        assert_eq!(s(&r, "envelope_control_id"), m.control_id, "{r}");
        assert_eq!(s(&r, "envelope_key"), key, "{r}");
        assert_eq!(s(&r, "content_type"), "application/hl7-v2", "{r}");
        assert_eq!(s(&r, "charset"), "UNICODE UTF-8", "{r}");
        assert_eq!(s(&r, "raw_sha256"), sha256_hex(&m.bytes), "{r}");
        assert_eq!(r["raw_bytes"], m.bytes.len(), "{r}");
        assert_eq!(r["sequence"], i + 1, "position on the connection: {r}");
        assert_eq!(r["stages"], serde_json::json!(["ingress"]), "{r}");
        assert_eq!(s(&r, "destination"), "", "{r}");
        assert!(r.get("rejection").is_none(), "{r}");
        assert!(
            s(&r, "traceparent").starts_with("00-"),
            "W3C traceparent header: {r}"
        );

        // hl7.out.<destination>: the canonical JSON, same key and envelope id, route and destination set.
        let j = by_id(&json_lines, &m.control_id);
        assert_eq!(s(&j, "key"), key, "{j}");
        assert_eq!(s(&j, "type"), ty, "{j}");
        assert_eq!(s(&j, "envelope_id"), s(&r, "envelope_id"), "{j}");
        assert_eq!(s(&j, "content_type"), "application/json", "{j}");
        assert_eq!(s(&j, "destination"), destination, "{j}");
        assert_eq!(s(&j, "destination_header"), destination, "{j}");
        assert_eq!(s(&j, "route"), route, "{j}");
        let trace_id = |v: &Value| {
            s(v, "traceparent")
                .split('-')
                .nth(1)
                .unwrap_or("")
                .to_owned()
        };
        assert_eq!(
            trace_id(&j),
            trace_id(&r),
            "the transformer continues the trace: {j}"
        );
        assert_eq!(
            j["stages"],
            serde_json::json!(["ingress", "transformer"]),
            "{j}"
        );
        let doc = &j["json"];
        assert_eq!(
            doc["schema_errors"],
            serde_json::json!([]),
            "the canonical JSON conforms to proto/hl7gw/v1/canonical.schema.json: {j}"
        );
        assert_eq!(s(doc, "format"), "hl7gw.canonical.v1", "{j}");
        assert_eq!(s(doc, "messageType"), "ADT", "{j}");
        assert_eq!(s(doc, "triggerEvent"), m.trigger, "{j}");
        assert_eq!(s(doc, "controlId"), m.control_id, "{j}");
        assert_eq!(s(doc, "pid3"), m.pid_decoded, "flat PID(1)-3(1)-1-1: {j}");
        assert_eq!(
            doc["segments"],
            serde_json::json!(["MSH", "EVN", "PID", "PV1"]),
            "{j}"
        );
    }

    // One patient's messages stay in one partition, in the order sent, on both topics.
    for set in [&inbound_lines, &json_lines] {
        let a = by_id(set, &sent[0].control_id);
        let b = by_id(set, &sent[2].control_id);
        assert_eq!(a["partition"], b["partition"], "same key, same partition");
        assert!(
            a["offset"].as_i64().unwrap() < b["offset"].as_i64().unwrap(),
            "order kept: {a} before {b}"
        );
    }

    // hl7.dlq: the ingress's rejection (no key, the reason and HL7 error code) and the transformer's failed step
    // (the inbound key, the route), each with the message as received.
    let (out, dlq_lines) = run_consumer(
        &python,
        &[
            "--brokers",
            &brokers,
            "--count",
            "2",
            "--timeout",
            "60",
            &dlq,
        ],
    );
    assert!(
        out.status.success(),
        "consumer.py on the DLQ failed ({}): {dlq_lines:#?}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let at = |stage: &str| -> &Value {
        dlq_lines
            .iter()
            .find(|l| l["rejection"]["stage"] == stage)
            .unwrap_or_else(|| panic!("no {stage} record: {dlq_lines:#?}"))
    };
    let d = at("ingress");
    assert_eq!(s(d, "control_id"), rejected_id, "{d}");
    assert!(d["key"].is_null(), "ingress DLQ records have no key: {d}");
    assert_eq!(s(&d["rejection"], "reason"), "unsupported_version", "{d}");
    assert_eq!(d["rejection"]["hl7_error_code"], 203, "{d}");
    assert_eq!(s(d, "raw_sha256"), sha256_hex(rejected.as_bytes()), "{d}");
    assert_eq!(d["stages"], serde_json::json!(["ingress"]), "{d}");
    let d = at("transformer");
    let a03 = &sent[2];
    assert_eq!(s(d, "control_id"), a03.control_id, "{d}");
    assert_eq!(s(d, "key"), format!("PYFAC|{}", a03.pid_raw), "{d}");
    assert_eq!(s(d, "route"), broken, "{d}");
    assert_eq!(s(&d["rejection"], "reason"), "edit", "{d}");
    assert_eq!(s(d, "raw_sha256"), sha256_hex(&a03.bytes), "{d}");
    assert_eq!(
        d["stages"],
        serde_json::json!(["ingress", "transformer"]),
        "{d}"
    );

    // Fewer records than asked within the timeout: a non-zero exit, after printing what there was.
    let more = (want + 1).to_string();
    let (out, lines) = run_consumer(
        &python,
        &[
            "--brokers",
            &brokers,
            "--count",
            &more,
            "--timeout",
            "5",
            &inbound,
            &out_topic,
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1 for too few records; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lines.len() <= want, "{lines:#?}");

    // The same consumer with the services' security settings: SASL_SSL (SCRAM-SHA-512) to the secured test
    // broker, where an ingress with the same kafka.security has just stored one message.
    let secure = support::SecureBroker::get();
    let secure_topic = format!("hl7.inbound.pyc-secure-{run}");
    let mut secure_env = secure.sasl_env(&secure.file("password"));
    secure_env.extend([
        ("HL7GW_INBOUND_TOPIC", secure_topic.clone()),
        ("HL7GW_DLQ_TOPIC", format!("{secure_topic}.dlq")),
    ]);
    let (_secure_ingress, addrs) = start_service(
        &bin("hl7gw-ingress"),
        &support::INGRESS_ON_PORT_0,
        &secure_env,
    );
    let (code, _) = msa(&Mllp::connect(addrs["mllp"]).call(&adt("PYC-SEC-1", "A01", "SEC-P1")));
    assert_eq!(code, "AA");
    let (out, lines) = run_consumer(
        &python,
        &[
            "--brokers",
            &secure.sasl_ssl,
            "--security-protocol",
            "SASL_SSL",
            "--ca-file",
            &secure.file("ca.crt"),
            "--sasl-mechanism",
            "SCRAM-SHA-512",
            "--username",
            "hl7gw",
            "--password-file",
            &secure.file("password"),
            "--count",
            "1",
            "--timeout",
            "60",
            &secure_topic,
        ],
    );
    assert!(
        out.status.success() && lines.len() == 1,
        "consumer.py over SASL_SSL: {lines:#?}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s(&lines[0], "control_id"), "PYC-SEC-1", "{lines:#?}");
}
