//! `hl7gw tail` against a real broker (an ingress's inbound topic, and envelopes a test produces to a topic
//! of its own), `hl7gw send` of a folder, stdin and batch files to `hl7gw receive` and to the ingress with
//! `--json`, and the completions and man page.
// A test's helpers too: a step that fails is a failed test.
#![allow(clippy::unwrap_used)]

use hl7gw_runtime::proto::v1::{Envelope, Header, Source};
use hl7gw_testkit::{Ingress, KillOnDrop, adt, spawn_listening};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

const BIN: &str = env!("CARGO_BIN_EXE_hl7gw");

/// Runs `hl7gw args` (bounded: every command here ends by itself).
fn hl7gw(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running hl7gw")
}

fn ok_lines(args: &[&str]) -> Vec<Value> {
    let out = hl7gw(args);
    assert!(
        out.status.success(),
        "hl7gw {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// `hl7gw tail --brokers <brokers> --topic <topic> <args>`: its JSON lines.
fn tail_lines(brokers: &str, topic: &str, args: &[&str]) -> Vec<Value> {
    ok_lines(&[&["tail", "--brokers", brokers, "--topic", topic], args].concat())
}

/// An ORU^R01 from LAB/HOSP with the given control id.
fn oru(control_id: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|LAB|HOSP|HL7GW|HL7GW|20261122120000||ORU^R01^ORU_R01|{control_id}|P|2.5.1\r\
         PID|1||P42^^^HOSP^MR||ROE^RICHARD||19800101|M\r\
         OBR|1|||GLU\rOBX|1|NM|GLU||5.5|mmol/L\r"
    )
    .into_bytes()
}

/// A folder with a file of two messages (ADT^A01 T1, ORU^R01 T2), a FHS/BHS batch of two (ADT^A01 T3,
/// T4) and a hidden file that is left out.
fn outbox(dir: &Path) {
    let mut two = adt("T1", "P1");
    two.extend(oru("T2"));
    std::fs::write(dir.join("a-two.hl7"), two).unwrap();
    let mut batch = b"FHS|^~\\&|TESTAPP\rBHS|^~\\&|TESTAPP\r".to_vec();
    batch.extend(adt("T3", "P3"));
    batch.extend(adt("T4", "P4"));
    batch.extend(b"BTS|2\rFTS|1\r");
    std::fs::write(dir.join("b-batch.hl7"), batch).unwrap();
    std::fs::write(dir.join(".hidden"), b"not sent").unwrap();
}

fn control_ids(lines: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = lines
        .iter()
        .map(|l| l["control_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    ids
}

#[test]
fn send_a_folder_and_stdin_to_receive_with_json() {
    let dir = tempfile::tempdir().unwrap();
    let outbox_dir = dir.path().join("outbox");
    std::fs::create_dir(&outbox_dir).unwrap();
    outbox(&outbox_dir);
    let stored = dir.path().join("stored");
    let (_rx, line) = spawn_listening(
        Command::new(BIN)
            .args(["receive", "--listen", "127.0.0.1:0", "--out"])
            .arg(&stored),
    );
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();

    let lines = ok_lines(&[
        "send",
        "--to",
        &addr,
        "--timeout",
        "10",
        "--json",
        outbox_dir.to_str().unwrap(),
    ]);
    assert_eq!(lines.len(), 4, "{lines:?}");
    let got: Vec<(String, u64, String, String)> = lines
        .iter()
        .map(|l| {
            assert!(l["latency_ms"].as_f64().is_some(), "{l}");
            (
                l["file"].as_str().unwrap().to_owned(),
                l["index"].as_u64().unwrap(),
                l["control_id"].as_str().unwrap().to_owned(),
                l["ack_code"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = [
        ("a-two.hl7", 1, "T1"),
        ("a-two.hl7", 2, "T2"),
        ("b-batch.hl7", 1, "T3"),
        ("b-batch.hl7", 2, "T4"),
    ];
    for ((file, index, id, code), (wf, wi, wid)) in got.iter().zip(want) {
        assert_eq!(
            (file.as_str(), *index, id.as_str(), code.as_str()),
            (wf, wi, wid, "AA")
        );
    }
    // Each message stored on its own, byte for byte (the batch envelope not sent).
    let mut files: Vec<_> = std::fs::read_dir(&stored)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let bodies: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(
        bodies,
        [adt("T1", "P1"), oru("T2"), adt("T3", "P3"), adt("T4", "P4")]
    );

    // stdin: `-`, two messages in one stream; without --json the ACKs are printed.
    let mut child = Command::new(BIN)
        .args(["send", "--to", &addr, "--timeout", "10", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = oru("S1");
    input.extend(oru("S2"));
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("-#2: AA (control id S2)"), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("MSA|AA|"))
            .count(),
        2
    );
}

#[test]
fn completions_and_man_page() {
    for shell in ["bash", "zsh", "fish"] {
        let out = hl7gw(&["completions", shell]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("tail") && text.contains("--with-message"),
            "{shell}"
        );
    }
    let out = hl7gw(&["man"]);
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.contains(".TH hl7gw 1") && page.contains("tail"),
        "{page}"
    );
    let out = hl7gw(&["man", "tail"]);
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.contains(".TH hl7gw-tail") && page.contains("with\\-message"),
        "{page}"
    );
    assert_eq!(hl7gw(&["man", "nope"]).status.code(), Some(2));
}

#[test]
fn tail_an_ingress_topic_in_a_window_with_filters_and_follow() {
    let (ingress, topics) = Ingress::on_fresh_topics("cli.tail", []);
    let to = ingress.mllp.to_string();
    let brokers = topics.brokers;
    let dir = tempfile::tempdir().unwrap();
    outbox(dir.path());
    let sent = ok_lines(&["send", "--to", &to, "--json", dir.path().to_str().unwrap()]);
    assert!(sent.iter().all(|l| l["ack_code"] == "AA"), "{sent:?}");

    let tail = |extra: &[&str]| {
        tail_lines(
            brokers,
            &topics.inbound,
            &[&["--timeout", "20"], extra].concat(),
        )
    };
    let all = tail(&["--since", "10m"]);
    assert_eq!(control_ids(&all), ["T1", "T2", "T3", "T4"], "{all:?}");
    for l in &all {
        assert!(l.get("message").is_none(), "no body by default: {l}");
        assert!(!l.to_string().contains("DOE"), "no patient data: {l}");
        assert_eq!(l["topic"], topics.inbound.as_str());
        assert!(l["id"].as_str().is_some_and(|s| !s.is_empty()));
        assert!(l["received_at"].as_str().is_some_and(|s| s.ends_with('Z')));
        assert_eq!(l["source"]["listener"], "mllp", "{l}");
        assert!(l["partition"].is_i64() && l["offset"].is_i64());
    }
    let t2 = all.iter().find(|l| l["control_id"] == "T2").unwrap();
    assert_eq!(t2["type"], "ORU^R01");
    assert_eq!(t2["sending_application"], "LAB");
    assert_eq!(t2["sending_facility"], "HOSP");

    assert_eq!(
        control_ids(&tail(&["--since", "10m", "--type", "ORU"])),
        ["T2"]
    );
    assert_eq!(
        control_ids(&tail(&["--since", "10m", "--type", "ADT^A01"])),
        ["T1", "T3", "T4"]
    );
    assert!(tail(&["--since", "10m", "--type", "ADT^A08"]).is_empty());
    assert_eq!(
        control_ids(&tail(&["--since", "10m", "--sender", "HOSP"])),
        ["T2"]
    );
    assert_eq!(
        control_ids(&tail(&[
            "--since",
            "10m",
            "--sending-application",
            "TESTAPP"
        ])),
        ["T1", "T3", "T4"]
    );
    assert_eq!(tail(&["--since", "10m", "--limit", "2"]).len(), 2);
    // A window that ends before the messages came: nothing.
    assert!(tail(&["--since", "2h", "--until", "1h"]).is_empty());
    let with = tail(&["--since", "10m", "--control-id", "T3", "--with-message"]);
    assert_eq!(with.len(), 1);
    assert!(with[0]["message"].as_str().unwrap().contains("DOE^JANE"));

    // Without --since: from the end, new messages only, until --limit.
    let mut child = Command::new(BIN)
        .args(["tail", "--brokers", brokers, "--topic", &topics.inbound])
        .args(["--limit", "1", "--type", "ORU"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let child = KillOnDrop(child);
    let first = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(first.contains("waiting for new messages"), "{first}");
    let (_d, file) = hl7gw_testkit::temp_file("f.hl7", [adt("F1", "P5"), oru("F2")].concat());
    ok_lines(&["send", "--to", &to, "--json", file.to_str().unwrap()]);
    let out = wait_output(child, Duration::from_secs(30));
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(control_ids(&lines), ["F2"], "{out}");
}

/// The stdout of a child that is to exit by itself within `limit`.
fn wait_output(mut child: KillOnDrop, limit: Duration) -> String {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            let mut out = String::new();
            std::io::Read::read_to_string(&mut child.0.stdout.take().unwrap(), &mut out).unwrap();
            return out;
        }
        assert!(start.elapsed() < limit, "did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An envelope of an hl7.out topic.
fn out_envelope(control_id: &str, destination: &str) -> Envelope {
    Envelope {
        id: hl7gw_runtime::envelope::new_id(),
        received_at: Some(hl7gw_runtime::envelope::timestamp(SystemTime::now())),
        source: Some(Source {
            listener: "mllp".into(),
            peer: "10.0.0.1:4000".into(),
            pod: "ingress-0".into(),
            ..Source::default()
        }),
        raw: oru(control_id).into(),
        header: Some(Header {
            message_type: "ORU".into(),
            trigger_event: "R01".into(),
            control_id: control_id.into(),
            sending_application: "LAB".into(),
            sending_facility: "HOSP".into(),
            ..Header::default()
        }),
        destination: destination.into(),
        route: "labs".into(),
        ..Envelope::default()
    }
}

#[test]
fn tail_filters_by_destination_and_shows_what_is_not_an_envelope() {
    let brokers = hl7gw_testkit::broker();
    let topic = hl7gw_testkit::unique_topic("cli.tail.out");
    let settings = hl7gw_runtime::kafka::KafkaSettings {
        brokers: brokers.to_owned(),
        ..Default::default()
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            hl7gw_runtime::kafka::ensure_topics(&settings, &[&topic])
                .await
                .unwrap();
            let producer = hl7gw_testkit::EnvelopeProducer::new(brokers);
            for env in [out_envelope("D1", "lab"), out_envelope("D2", "ehr")] {
                producer.send(&topic, "", &env).await;
            }
            producer.send_bytes(&topic, b"not an envelope").await;
        });

    let tail = |extra: &[&str]| tail_lines(brokers, &topic, &[&["--since", "5m"], extra].concat());
    let lab = tail(&["--destination", "lab"]);
    assert_eq!(control_ids(&lab), ["D1"]);
    assert_eq!(lab[0]["destination"], "lab");
    assert_eq!(lab[0]["route"], "labs");
    assert_eq!(lab[0]["source"]["peer"], "10.0.0.1:4000");
    assert_eq!(lab[0]["source"]["pod"], "ingress-0");
    let all = tail(&[]);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(
        all.iter()
            .filter(|l| l["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("not an hl7gw envelope")))
            .count(),
        1
    );
    // --from-beginning reads the same small topic; a topic that is not there is an error.
    assert_eq!(tail_lines(brokers, &topic, &["--from-beginning"]).len(), 3);
    let missing = hl7gw(&[
        "tail",
        "--brokers",
        brokers,
        "--topic",
        "cli.tail.no-such-topic",
        "--since",
        "1h",
    ]);
    assert_eq!(missing.status.code(), Some(2));
}
