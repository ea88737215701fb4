//! End-to-end tests of the ingress binary against a real Kafka broker started by scripts/kafka.sh.
#![allow(clippy::unwrap_used)] // test helpers: a failed step fails the test

use hl7gw_testkit as support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;
use support::*;

fn topics_env(brokers: &str) -> (String, String, Vec<(&'static str, String)>) {
    support::topics_env(brokers, "test.inbound")
}

/// An ingress on fresh topics, with `extra` settings.
fn start(extra: impl IntoIterator<Item = (&'static str, String)>) -> (Ingress, Topics) {
    Ingress::on_fresh_topics("test.inbound", extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_connections_thousand_messages_each_are_acked_stored_and_ordered() {
    let (ingress, t) = start([]);
    let mut tasks = Vec::new();
    for c in 0..8 {
        let addr = ingress.mllp;
        tasks.push(tokio::spawn(async move {
            let mut conn = Mllp::connect(addr).await;
            let mut codes = Vec::new();
            for i in 0..1000 {
                let ack = conn
                    .call(&adt(&format!("C{c}-{i}"), &format!("P{c}-{}", i % 5)))
                    .await
                    .expect("an ACK");
                codes.push(ack_code(&ack));
            }
            codes
        }));
    }
    let mut aa = 0;
    for t in tasks {
        for code in t.await.unwrap() {
            assert_eq!(code, "AA");
            aa += 1;
        }
    }
    assert_eq!(aa, 8000);

    let records = t.inbound_records(8000, Duration::from_secs(120));
    assert_eq!(
        records.len(),
        8000,
        "the topic holds exactly the acknowledged messages"
    );
    let ids: HashSet<String> = records
        .iter()
        .map(|r| r.envelope.header.as_ref().unwrap().control_id.clone())
        .collect();
    assert_eq!(ids.len(), 8000, "no duplicates");
    // Per connection, per partition (one patient's messages share a partition): published in the order sent.
    let mut last: HashMap<(String, i32), (u64, i64)> = HashMap::new();
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    for r in sorted {
        let e = &r.envelope;
        let src = e.source.as_ref().unwrap();
        let h = e.header.as_ref().unwrap();
        let (c, i) = h.control_id[1..].split_once('-').unwrap();
        let i: u64 = i.parse().unwrap();
        assert_eq!(
            e.sequence,
            i + 1,
            "sequence is the position on the connection"
        );
        let k = (src.connection_id.clone(), r.partition);
        if let Some((prev, _)) = last.get(&k) {
            assert!(e.sequence > *prev, "order kept within connection {k:?}");
        }
        last.insert(k, (e.sequence, r.offset));
        // The envelope carries the frame unchanged, and the contract's fields.
        let patient = format!("P{c}-{}", i % 5);
        assert_eq!(&e.raw[..], &adt(&h.control_id, &patient)[..]);
        assert_eq!(h.message_type, "ADT");
        assert_eq!(h.trigger_event, "A01");
        assert_eq!(h.sending_facility, "TESTFAC");
        assert_eq!(h.version, "2.5.1");
        assert_eq!(e.charset, "UNICODE UTF-8");
        assert_eq!(src.protocol, "mllp");
        assert_eq!(e.stages[0].name, "ingress");
        assert!(e.received_at.is_some());
        assert_eq!(e.key, format!("TESTFAC|{patient}"));
        assert_eq!(r.key.as_deref(), Some(e.key.as_bytes()));
        assert_eq!(r.header("hl7.type"), Some(&b"ADT^A01"[..]));
        assert_eq!(r.header("hl7.control_id"), Some(h.control_id.as_bytes()));
        assert_eq!(
            r.header("content-type"),
            Some(hl7gw_runtime::envelope::headers::ENVELOPE_CONTENT_TYPE.as_bytes())
        );
        let tp = String::from_utf8(r.header("traceparent").unwrap().to_vec()).unwrap();
        assert!(tp.starts_with("00-") && tp.len() == 55, "{tp}");
        assert_eq!(e.trace.as_ref().unwrap().traceparent, tp);
    }
    // Keys keep one patient in one partition.
    let mut partition_of: HashMap<&str, i32> = HashMap::new();
    for r in &records {
        let p = *partition_of
            .entry(r.envelope.key.as_str())
            .or_insert(r.partition);
        assert_eq!(p, r.partition);
    }
    assert_eq!(
        ingress.metric("hl7gw_ingress_acks_total{code=\"AA\"}"),
        8000.0
    );
}

fn frame(payload: &[u8]) -> Vec<u8> {
    hl7v2::mllp::frame(payload).to_vec()
}

async fn raw_exchange(addr: std::net::SocketAddr, bytes: &[u8], wait: Duration) -> (Vec<u8>, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Ok(Err(_)) => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

fn acks_in(bytes: &[u8]) -> Vec<(String, String)> {
    use tokio_util::codec::Decoder;
    let mut codec = hl7v2::MllpCodec::default();
    let mut buf = bytes::BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Ok(Some(f)) = codec.decode(&mut buf) {
        let (code, id) = hl7v2::read_ack(&f).expect("an ACK");
        let err3 = field(&f, "ERR-3-1").unwrap_or_default();
        let _ = id;
        out.push((code.as_str().to_owned(), err3));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_defined_answer_and_the_process_stays_up() {
    let (mut ingress, t) = start([
        ("HL7GW_MAX_FRAME_BYTES", "4096".to_owned()),
        ("HL7GW_FRAME_TIMEOUT", "1s".to_owned()),
        ("HL7GW_IDLE_TIMEOUT", "2s".to_owned()),
    ]);
    let addr = ingress.mllp;
    let wait = Duration::from_secs(10);
    let ok = adt("OK1", "P1");

    // Junk between frames is skipped and counted; the message behind it is accepted.
    let mut junk = b"\r\nnoise before".to_vec();
    junk.extend(frame(&ok));
    let mut conn = Mllp::connect(addr).await;
    {
        use tokio::io::AsyncWriteExt;
        conn.0.get_mut().write_all(&junk).await.unwrap();
    }
    assert_eq!(ack_code(&conn.recv(wait).await.unwrap()), "AA");
    assert!(ingress.metric("hl7gw_ingress_skipped_bytes_total") >= 14.0);

    // Rejected messages: (payload, ACK code, ERR-3 code, reason label).
    let cases: Vec<(Vec<u8>, &str, &str, &str)> = vec![
        (b"PID|1||X".to_vec(), "AE", "100", "missing_msh"),
        (
            b"MSH|^~|A|B|C|D|E||ADT^A01|X|P|2.5".to_vec(),
            "AE",
            "101",
            "bad_encoding_characters",
        ),
        (
            b"MSH|^~\\&|A|B|C|D|2020||ADT^A01||P|2.5.1\rPID|1".to_vec(),
            "AE",
            "101",
            "missing_control_id",
        ),
        (
            b"MSH|^~\\&|A|B|C|D|2020||ADT^A01|V3|P|3.0\rPID|1".to_vec(),
            "AR",
            "203",
            "unsupported_version",
        ),
        (
            b"MSH|^~\\&|A|B|C|D|2020||ADT^A01|CS1|P|2.5||||||KLINGON\rPID|1".to_vec(),
            "AR",
            "103",
            "unsupported_charset",
        ),
        (
            b"MSH|^~\\&|A|B|C|D|2020||ADT^A01|CS2|P|2.5||||||UNICODE UTF-8\rPID|1||\xff\xfe"
                .to_vec(),
            "AE",
            "102",
            "charset_mismatch",
        ),
        (
            b"MSH|^~\\&|A|B|C|D|2020||ADT|T1|P|2.5".to_vec(),
            "AE",
            "200",
            "missing_message_type",
        ),
        // Issue 9, item 13: MSH-10 is at most 199 characters (HL7 2.7 ST); a longer one would let a few
        // crafted messages fill the duplicate window's memory.
        (
            format!(
                "MSH|^~\\&|A|B|C|D|2020||ADT^A01|{}|P|2.5\rPID|1",
                "L".repeat(200)
            )
            .into_bytes(),
            "AE",
            "104",
            "value_too_long",
        ),
    ];
    for (payload, code, err, reason) in &cases {
        let mut c = Mllp::connect(addr).await;
        let ack = c.call(payload).await.expect("a NAK");
        let m = hl7v2::Message::parse(&ack).expect("the NAK is a valid message");
        assert_eq!(m.get("MSA-1"), Some(code.as_bytes()), "{reason}");
        assert_eq!(m.get("ERR-3-1"), Some(err.as_bytes()), "{reason}");
        assert_eq!(
            ingress.metric(&format!(
                "hl7gw_ingress_rejects_total{{reason=\"{reason}\"}}"
            )),
            1.0,
            "{reason}"
        );
    }

    // Oversize: a NAK while the frame is still arriving, the rest discarded, the connection goes on.
    let mut big = frame(&vec![b'X'; 20_000]);
    big.extend(frame(&adt("AFTERBIG", "P1")));
    let (out, _) = raw_exchange(addr, &big, Duration::from_secs(3)).await;
    let acks = acks_in(&out);
    assert_eq!(acks.len(), 2, "{acks:?}");
    assert_eq!(acks[0], ("AE".to_owned(), "207".to_owned()));
    assert_eq!(acks[1].0, "AA");
    assert_eq!(
        ingress.metric("hl7gw_ingress_framing_errors_total{reason=\"frame_too_large\"}"),
        1.0
    );

    // Truncated frame then close: no answer, counted.
    let (out, closed) =
        raw_exchange(addr, b"\x0bMSH|^~\\&|partial", Duration::from_millis(300)).await;
    assert!(out.is_empty() && !closed);
    {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"\x0bMSH|^~\\&|partial").await.unwrap();
        s.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(ingress.metric("hl7gw_ingress_framing_errors_total{reason=\"truncated\"}") >= 1.0);

    // A sender that stalls mid-frame is cut off after frame_timeout (1 s).
    let since = std::time::Instant::now();
    let (out, closed) = raw_exchange(addr, b"\x0bMSH|^~\\&|stall", Duration::from_secs(5)).await;
    assert!(out.is_empty() && closed, "stalled frame closed");
    assert!(since.elapsed() < Duration::from_secs(4));
    assert!(ingress.metric("hl7gw_ingress_framing_errors_total{reason=\"frame_timeout\"}") >= 1.0);

    // An idle connection is closed after idle_timeout (2 s).
    let since = std::time::Instant::now();
    let (_, closed) = raw_exchange(addr, b"", Duration::from_secs(6)).await;
    assert!(closed && since.elapsed() >= Duration::from_millis(1500));

    // Memory stays bounded under a stream of oversized frames.
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.extend(frame(&vec![b'Y'; 256 * 1024]));
    }
    let (out, _) = raw_exchange(addr, &flood, Duration::from_secs(5)).await;
    assert_eq!(acks_in(&out).len(), 40);
    let rss_kb: u64 = std::fs::read_to_string(format!("/proc/{}/status", ingress.child.id()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(rss_kb < 200 * 1024, "RSS {rss_kb} kB");

    // Still up and accepting.
    assert!(ingress.is_running());
    let mut c = Mllp::connect(addr).await;
    assert_eq!(ack_code(&c.call(&adt("OK2", "P1")).await.unwrap()), "AA");

    // The rejected messages that could be stored are in the DLQ with their reason.
    let dlq_records = t.dlq_records(cases.len(), Duration::from_secs(60));
    let reasons: HashSet<String> = dlq_records
        .iter()
        .map(|r| r.envelope.rejection.as_ref().unwrap().reason.clone())
        .collect();
    for (_, _, _, reason) in &cases {
        assert!(reasons.contains(*reason), "{reason} in DLQ: {reasons:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_get_the_first_ack_and_are_published_once() {
    let (ingress, t) = start([]);
    let (mut c, mut other) = (
        Mllp::connect(ingress.mllp).await,
        Mllp::connect(ingress.mllp).await,
    );
    let dup = adt("DUP1", "P1");
    let first = c.call(&dup).await.unwrap();
    assert_eq!(ack_code(&first), "AA");
    assert_eq!(
        c.call(&dup).await.unwrap(),
        first,
        "resent on the same connection"
    );
    assert_eq!(
        other.call(&dup).await.unwrap(),
        first,
        "resent on another one"
    );
    let records = t.inbound_records(1, Duration::from_secs(30));
    assert_eq!(records.len(), 1);
    assert_eq!(
        ingress.metric("hl7gw_ingress_messages_total{message_type=\"ADT\",outcome=\"duplicate\"}"),
        2.0
    );
}

/// Issue 9, item 1: senders reuse control ids (a counter reset on restart, two interfaces with one MSH-3/4).
/// A message whose (MSH-3, MSH-4, MSH-10) was seen but whose bytes differ is a new message: published and
/// answered, never given the first message's ACK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_control_id_with_other_content_is_a_new_message() {
    let (ingress, t) = start([]);
    let mut c = Mllp::connect(ingress.mllp).await;
    let first = c.call(&adt("REUSED-1", "MRN111")).await.unwrap();
    let second = c.call(&adt("REUSED-1", "MRN222")).await.unwrap();
    assert_eq!(ack_code(&first), "AA");
    assert_eq!(ack_code(&second), "AA");
    assert_ne!(first, second, "the second patient got the first one's ACK");
    // A true resend of the second is still answered from memory.
    let resend = c.call(&adt("REUSED-1", "MRN222")).await.unwrap();
    assert_eq!(resend, second);
    let records = t.inbound_records(2, Duration::from_secs(30));
    let mut patients: Vec<String> = records
        .iter()
        .map(|r| {
            let raw = String::from_utf8_lossy(&r.envelope.raw).into_owned();
            if raw.contains("MRN111") {
                "MRN111"
            } else {
                "MRN222"
            }
            .to_owned()
        })
        .collect();
    patients.sort();
    assert_eq!(
        patients,
        ["MRN111", "MRN222"],
        "both admissions are stored, once each"
    );
    assert_eq!(ingress.metric("hl7gw_ingress_control_id_reused_total"), 1.0);
    assert_eq!(
        ingress.metric("hl7gw_ingress_messages_total{message_type=\"ADT\",outcome=\"duplicate\"}"),
        1.0
    );
}

/// An ADT^A01 of about `size` bytes (a long NTE), for the size limits.
fn big_adt(control_id: &str, size: usize) -> Vec<u8> {
    let mut m = adt(control_id, "P1");
    m.extend_from_slice(b"NTE|1||");
    m.resize(size - 1, b'x');
    m.push(b'\r');
    m
}

/// Issue 9, item 9: one limit for the whole way. A message under `max_frame_bytes` (1 MiB) is stored, not
/// answered "resend later" forever because librdkafka's own record limit (1,000,000 bytes by default) is
/// smaller; and a message a topic refuses as too large is a permanent error for that message (AE, DLQ with
/// reason `too_large`), never AR 207.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_size_limits_are_aligned_and_too_large_is_permanent() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let brokers = broker();
    let (inbound, dlq, env) = topics_env(brokers);
    let ingress = Ingress::start(&env);
    let mut c = Mllp::connect(ingress.mllp).await;
    let ack = c.call(&big_adt("BIG1", 1_040_000)).await.unwrap();
    assert_eq!(ack_code(&ack), "AA", "{}", String::from_utf8_lossy(&ack));
    let records = read_topic(brokers, &inbound, 1, Duration::from_secs(30));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].envelope.raw.len(), 1_040_000);
    drop(ingress);

    // A topic whose own limit is smaller than the message.
    let (small, dlq2, mut env) = topics_env(brokers);
    let admin: AdminClient<_> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let topic =
        NewTopic::new(&small, 1, TopicReplication::Fixed(1)).set("max.message.bytes", "200000");
    admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .unwrap();
    env.retain(|(k, _)| *k != "HL7GW_DLQ_TOPIC");
    env.push(("HL7GW_DLQ_TOPIC", dlq.clone()));
    let _ = dlq2;
    let ingress = Ingress::start(&env);
    let mut c = Mllp::connect(ingress.mllp).await;
    let ack = c.call(&big_adt("BIG2", 300_000)).await.unwrap();
    let m = hl7v2::Message::parse(&ack).unwrap();
    assert_eq!(
        m.get("MSA-1"),
        Some(&b"AE"[..]),
        "{}",
        String::from_utf8_lossy(&ack)
    );
    assert_eq!(
        ingress.metric("hl7gw_ingress_rejects_total{reason=\"too_large\"}"),
        1.0
    );
    let dead = read_topic(brokers, &dlq, 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].envelope.rejection.as_ref().unwrap().reason,
        "too_large"
    );
    // The ingress goes on with messages that fit.
    assert_eq!(ack_code(&c.call(&adt("SMALL1", "P1")).await.unwrap()), "AA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_answers_what_was_read_and_exits_zero() {
    let (mut ingress, t) = start([]);
    let mut c = Mllp::connect(ingress.mllp).await;
    for i in 0..300 {
        c.send(&adt(&format!("D{i}"), "P1")).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    ingress.sigterm();
    let mut acked = Vec::new();
    while let Some(ack) = c.recv(Duration::from_secs(20)).await {
        let (code, id) = hl7v2::read_ack(&ack).unwrap();
        assert_eq!(code.as_str(), "AA");
        acked.push(String::from_utf8_lossy(id).into_owned());
    }
    let status = tokio::task::spawn_blocking(move || ingress.child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    assert!(!acked.is_empty());
    let stored: HashSet<String> = t
        .inbound_records(acked.len(), Duration::from_secs(60))
        .into_iter()
        .map(|r| r.envelope.header.unwrap().control_id)
        .collect();
    for id in &acked {
        assert!(stored.contains(id), "{id} was ACKed but is not stored");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_ingest_follows_the_same_rules() {
    use hl7gw_runtime::proto::v1::SendRequest;
    use hl7gw_runtime::proto::v1::ingest_client::IngestClient;
    let (ingress, t) = start([]);
    let mut client = IngestClient::connect(format!("http://{}", ingress.grpc))
        .await
        .unwrap();
    let r = client
        .send(SendRequest {
            message: adt("G1", "P1").into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.ack_code, "AA");
    assert_eq!(r.control_id, "G1");
    assert!(!r.envelope_id.is_empty());
    let bad = client
        .send(SendRequest {
            message: bytes::Bytes::from_static(b"not hl7"),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bad.ack_code, "AE");
    assert_eq!(bad.reason, "missing_msh");

    let reqs: Vec<SendRequest> = (0..50)
        .map(|i| SendRequest {
            message: adt(&format!("GS{i}"), "P2").into(),
        })
        .collect();
    let mut stream = client
        .send_stream(tokio_stream::iter(reqs))
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    while let Some(resp) = stream.message().await.unwrap() {
        assert_eq!(resp.ack_code, "AA");
        assert_eq!(
            resp.control_id,
            format!("GS{n}"),
            "answers in request order"
        );
        n += 1;
    }
    assert_eq!(n, 50);
    let records = t.inbound_records(51, Duration::from_secs(60));
    assert_eq!(records.len(), 51);

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", ingress.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[test]
fn bad_config_is_refused_before_any_port_is_bound() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hl7gw-ingress"))
        .args(support::INGRESS_ON_PORT_0)
        .env("HL7GW_ACK_TIMEOUT", "soon")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .to_lowercase()
            .contains("ack_timeout")
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hl7gw-ingress"))
        .arg("--check-config")
        .env("HL7GW_NO_SUCH_KEY", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    // Issue 9, item 5: `kafka.properties` cannot switch off what the ACK promise rests on.
    let dir = tempfile::tempdir().unwrap();
    for (key, value) in [
        ("acks", "1"),
        ("enable.idempotence", "false"),
        ("request.required.acks", "1"),
        ("isolation.level", "read_uncommitted"),
        ("partition.assignment.strategy", "cooperative-sticky"),
        ("enable.auto.commit", "true"),
    ] {
        let file = dir.path().join("ingress.yaml");
        std::fs::write(
            &file,
            format!("kafka:\n  properties:\n    {key}: \"{value}\"\n"),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hl7gw-ingress"))
            .arg("--check-config")
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "kafka.properties.{key} accepted");
        assert!(stderr.contains(key), "{key}: {stderr}");
    }
    support::run_ok(
        std::process::Command::new(env!("CARGO_BIN_EXE_hl7gw-ingress")).args([
            "--check-config",
            "--ack-mode",
            "fast",
        ]),
    );
}

/// Issue 10: a resend that arrives while the first copy still waits for Kafka (the sender's ACK timeout is
/// shorter than the publish, or it resends on a second connection) is published once: it waits for the first
/// copy and gets the same ACK. 20 messages, each sent twice on one connection (pipelined) and once on another
/// at the same moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_while_the_first_copy_is_in_flight_is_published_once() {
    let (ingress, t) = start([]);
    let mut a = Mllp::connect(ingress.mllp).await;
    let mut b = Mllp::connect(ingress.mllp).await;
    const N: usize = 20;
    for i in 0..N {
        let m = adt(&format!("INFLIGHT-{i}"), "P1");
        a.send(&m).await;
        b.send(&m).await;
        a.send(&m).await;
    }
    let limit = Duration::from_secs(30);
    for i in 0..N {
        let first = a.recv(limit).await.unwrap();
        let again = a.recv(limit).await.unwrap();
        let other = b.recv(limit).await.unwrap();
        assert_eq!(ack_code(&first), "AA", "message {i}");
        assert_eq!(
            first, again,
            "message {i}: the pipelined resend got the first ACK"
        );
        assert_eq!(
            first, other,
            "message {i}: the resend on another connection got the first ACK"
        );
    }
    let records = t.inbound_records(N, Duration::from_secs(30));
    assert_eq!(records.len(), N, "each message published once");
    assert_eq!(
        ingress.metric("hl7gw_ingress_messages_total{message_type=\"ADT\",outcome=\"duplicate\"}"),
        (2 * N) as f64
    );
}

/// Issue 10: MSH-2 with a repeated character (`^~\\&`, as exported samples carry it) is accepted, as the
/// reference parser accepts it, and stored as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_encoding_character_in_msh2_is_accepted() {
    let (ingress, t) = start([]);
    let mut c = Mllp::connect(ingress.mllp).await;
    let msg = b"MSH|^~\\\\&|APP|FAC|GW|GW|20261123120000||ADT^A01^ADT_A01|MSH2-REPEAT|P|2.5.1\r\
                EVN|A01|20261123120000\rPID|1||MRN9^^^FAC^MR||DOE^JANE\r";
    let ack = c.call(msg).await.unwrap();
    assert_eq!(ack_code(&ack), "AA", "{}", String::from_utf8_lossy(&ack));
    let records = t.inbound_records(1, Duration::from_secs(30));
    assert_eq!(records.len(), 1);
    assert_eq!(&records[0].envelope.raw[..], &msg[..]);
}

/// Issue 24, item 4: the largest batch one frame can hold (1 MiB of ~20,000 tiny messages) is refused whole
/// with one clear answer (AE, `batch_too_large`) and dead-lettered once as received, instead of becoming
/// tens of thousands of records, claims and spans; the connection goes on serving. Before: every message was
/// published on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_batch_a_frame_holds_is_refused_whole_with_one_answer() {
    let (ingress, t) = start([]);
    let head = "FHS|^~\\&|LAB|FAC|GW|GW|20261123120000||||FILE-9\rBHS|^~\\&|LAB|FAC|GW|GW|20261123120000||||BATCH-9\r";
    let mut batch = head.to_owned();
    let mut n = 0;
    loop {
        let m = format!("MSH|^~\\&|LAB|FAC|GW|GW|2026||ADT^A01|T{n}|P|2.5\rPID|1||{n}\r");
        if batch.len() + m.len() + 32 > hl7v2::mllp::DEFAULT_MAX_FRAME {
            break;
        }
        batch.push_str(&m);
        n += 1;
    }
    batch.push_str(&format!("BTS|{n}\rFTS|1\r"));
    assert!(n > 10_000, "{n} messages");
    let mut c = Mllp::connect(ingress.mllp).await;
    let started = std::time::Instant::now();
    let answer = c.call(batch.as_bytes()).await.unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let msa: Vec<&str> = text.split('\r').filter(|s| s.starts_with("MSA|")).collect();
    assert_eq!(msa, ["MSA|AE|T0"], "{}", &text[..text.len().min(2000)]);
    assert!(text.contains(&format!("{n} messages")), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let dlq = t.dlq_records(1, Duration::from_secs(30));
    assert_eq!(dlq.len(), 1);
    let rejection = dlq[0].envelope.rejection.clone().unwrap();
    assert_eq!(rejection.reason, "batch_too_large");
    assert_eq!(dlq[0].envelope.raw.len(), batch.len());
    assert_eq!(
        ack_code(&c.call(&adt("AFTER-BATCH", "P1")).await.unwrap()),
        "AA"
    );
    assert_eq!(t.inbound_records(1, Duration::from_secs(10)).len(), 1);
}

/// Issue 10: an FHS/BHS batch over MLLP is cut into its messages; each is published (or rejected alone, to
/// the DLQ) and the answer is one acknowledgment batch: FHS/BHS with the original control ids as reference,
/// an ACK per message, BTS with their count, FTS. Sent again, the batch is answered from the duplicate window
/// and nothing is published twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_split_each_message_answered_and_a_bad_one_rejected_alone() {
    let (ingress, t) = start([]);
    let mut c = Mllp::connect(ingress.mllp).await;
    let mut batch = b"FHS|^~\\&|LAB|FAC|GW|GW|20261123120000||||FILE-7\rBHS|^~\\&|LAB|FAC|GW|GW|20261123120000||||BATCH-7\r"
        .to_vec();
    batch.extend_from_slice(&adt("B-1", "P1"));
    // No MSH-9: rejected alone.
    batch.extend_from_slice(b"MSH|^~\\&|LAB|FAC|GW|GW|20261123120000|||B-2|P|2.5\rPID|1||P2\r");
    batch.extend_from_slice(&adt("B-3", "P3"));
    // The same message twice in one batch: the copy waits for the first, not for the whole batch.
    batch.extend_from_slice(&adt("B-3", "P3"));
    batch.extend_from_slice(b"BTS|4\rFTS|1\r");
    let started = std::time::Instant::now();
    let answer = c.call(&batch).await.unwrap();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer).into_owned();
    assert!(
        took < Duration::from_secs(5),
        "answered in {took:?}: {text}"
    );
    let segments: Vec<&str> = text.split('\r').filter(|s| !s.is_empty()).collect();
    assert!(
        segments[0].starts_with("FHS|^~\\&|GW|GW|LAB|FAC|"),
        "{text}"
    );
    assert!(segments[0].ends_with("|FILE-7"), "{text}");
    assert!(
        segments[1].starts_with("BHS|^~\\&|GW|GW|LAB|FAC|"),
        "{text}"
    );
    assert!(segments[1].ends_with("|BATCH-7"), "{text}");
    let msa: Vec<&str> = segments
        .iter()
        .filter(|s| s.starts_with("MSA|"))
        .copied()
        .collect();
    assert_eq!(msa.len(), 4, "{text}");
    assert_eq!(msa[0], "MSA|AA|B-1");
    assert_eq!(msa[3], "MSA|AA|B-3");
    assert!(
        msa[1].starts_with("MSA|AE|B-2") || msa[1].starts_with("MSA|AR|B-2"),
        "{text}"
    );
    assert_eq!(msa[2], "MSA|AA|B-3");
    assert_eq!(segments[segments.len() - 2], "BTS|4");
    assert_eq!(segments[segments.len() - 1], "FTS|1");

    let records = t.inbound_records(2, Duration::from_secs(30));
    let mut ids: Vec<String> = records
        .iter()
        .map(|r| r.envelope.header.clone().unwrap().control_id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["B-1", "B-3"]);
    let rejected = t.dlq_records(1, Duration::from_secs(30));
    assert_eq!(rejected.len(), 1);
    assert!(String::from_utf8_lossy(&rejected[0].envelope.raw).contains("|B-2|"));

    // The same batch again: the accepted messages are resends now, answered with their first ACKs.
    let again = c.call(&batch).await.unwrap();
    let again = String::from_utf8_lossy(&again).into_owned();
    let first_acks: Vec<&str> = segments
        .iter()
        .filter(|s| s.starts_with("MSA|AA"))
        .copied()
        .collect();
    for a in first_acks {
        assert!(again.contains(a), "{again}");
    }
    assert_eq!(t.inbound_records(2, Duration::from_secs(5)).len(), 2);
    assert_eq!(ingress.metric("hl7gw_ingress_batches_total"), 2.0);
}
