//! Issue 26, item 3: senders in enhanced acknowledgment mode, as HAPI v2's own MLLP client sees the ingress
//! (real binary, real Kafka). The client is tests/hapi (a small Java program on HAPI 2.5.1), built here with
//! Maven into cargo's target/tmp; its jars come from Maven Central once and stay in ~/.m2.
//!
//! - MSH-15 `NE` under `accept_ack: msh15` (the default): no accept ACK, so HAPI's `Initiator` times out;
//!   under `accept_ack: always` it gets CA at once.
//! - `application_ack: on_store`: HAPI's MLLP reader gets CA, then the gateway's application ACK (AA, MSA-2
//!   the message's control id, its own MSH-10, MSH-15/16 empty), again for a resend; with MSH-15 `NE` and
//!   MSH-16 `AL`, HAPI's `Initiator` gets the AA as its answer. HAPI's `Initiator` returns the first message
//!   whose MSA-2 matches, so with AL/AL it returns the CA (the README says so).
#![allow(clippy::unwrap_used)] // test helpers: a failed step fails the test

use hl7gw_testkit as support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use support::*;

/// HAPI's Initiator timeout in the tests (its default is 10 s and more).
const HAPI_TIMEOUT_MS: u64 = 2000;

/// The probe's classpath, built once per test run (skipped when the jar is newer than its sources).
fn probe_classpath() -> &'static str {
    static CP: OnceLock<String> = OnceLock::new();
    CP.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hapi-probe");
        let jar = support::fhir::maven_package(
            &repo_root().join("services/ingress/tests/hapi"),
            &out,
            "hapi-probe-1.jar",
            "probe.out",
        );
        format!("{}:{}/*", jar.display(), out.join("libs").display())
    })
}

/// Runs the probe (`mode` and its arguments) and returns its output lines, each split at tabs.
fn hapi(mode: &str, port: u16, args: &[&str]) -> Vec<Vec<String>> {
    let out = Command::new("java")
        .args([
            "-Xmx128m",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            probe_classpath(),
            "io.hl7gw.hapi.HapiProbe",
            mode,
            "127.0.0.1",
        ])
        .arg(port.to_string())
        .arg(HAPI_TIMEOUT_MS.to_string())
        .args(args)
        .output()
        .expect("running java");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "HapiProbe {mode} {args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

fn start(extra: impl IntoIterator<Item = (&'static str, String)>) -> (Ingress, Topics) {
    Ingress::on_fresh_topics("test.hapi", extra)
}

/// MSH-15 NE: HAPI's client waits for an accept ACK the standard says not to send (it times out), unless the
/// listener says `accept_ack: always`.
#[test]
fn hapi_initiator_with_ne_times_out_under_msh15_and_gets_ca_under_always() {
    let (standard, _t1) = start([]);
    let lines = hapi(
        "initiator",
        standard.mllp.port(),
        &["HAPI-NE-STD", "NE", "NE"],
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0][0], "NOANSWER", "{lines:?}");
    let waited: u64 = lines[0][1].parse().unwrap();
    assert!(waited >= HAPI_TIMEOUT_MS - 100, "{lines:?}");
    assert!(lines[0][2].contains("Timeout"), "{lines:?}");

    let (always, _t2) = start([("HL7GW_ACCEPT_ACK", "always".to_owned())]);
    let lines = hapi(
        "initiator",
        always.mllp.port(),
        &["HAPI-NE-ALW", "NE", "NE"],
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0][..3], ["ANSWER", "CA", "HAPI-NE-ALW"], "{lines:?}");
    let took: u64 = lines[0][4].parse().unwrap();
    assert!(took < HAPI_TIMEOUT_MS, "{lines:?}");
}

/// `application_ack: on_store`: the application ACK reaches HAPI's client after the accept ACK (and again for a
/// resend, published once); with NE/AL HAPI's Initiator gets the AA as its answer.
#[test]
fn hapi_gets_the_application_ack_on_store() {
    let (ingress, t) = start([("HL7GW_APPLICATION_ACK", "on_store".to_owned())]);
    let port = ingress.mllp.port();

    // HAPI's MLLP writer and reader: the message twice (a resend), every message read until 2 s of silence.
    let lines = hapi("reader", port, &["HAPI-AL-AL", "AL", "AL", "2"]);
    assert_eq!(lines.len(), 5, "{lines:?}");
    for pair in [&lines[0..2], &lines[2..4]] {
        // MESSAGE, MSH-9, MSA-1, MSA-2, MSH-10, MSH-15, MSH-16
        assert_eq!(
            pair[0][..4],
            ["MESSAGE", "ACK^A01", "CA", "HAPI-AL-AL"],
            "{lines:?}"
        );
        assert_eq!(
            pair[1][..4],
            ["MESSAGE", "ACK^A01", "AA", "HAPI-AL-AL"],
            "{lines:?}"
        );
        assert_ne!(
            pair[0][4], pair[1][4],
            "the application ACK has its own MSH-10"
        );
        assert_eq!(
            pair[1][5..],
            ["-", "-"],
            "the application ACK asks for no ACK"
        );
    }
    assert_eq!(lines[4][0], "END", "{lines:?}");

    // NE/AL: no accept ACK; HAPI's Initiator takes the application ACK as its answer, at once.
    let lines = hapi("initiator", port, &["HAPI-NE-AL", "NE", "AL"]);
    assert_eq!(lines[0][..3], ["ANSWER", "AA", "HAPI-NE-AL"], "{lines:?}");
    assert!(lines[0][4].parse::<u64>().unwrap() < HAPI_TIMEOUT_MS);

    // AL/AL with HAPI's Initiator: it returns the first answer whose MSA-2 matches, the CA.
    let lines = hapi("initiator", port, &["HAPI-INIT-AL", "AL", "AL"]);
    assert_eq!(lines[0][..3], ["ANSWER", "CA", "HAPI-INIT-AL"], "{lines:?}");

    let records = t.inbound_records(3, Duration::from_secs(30));
    let mut ids: Vec<String> = records
        .iter()
        .map(|r| r.envelope.header.as_ref().unwrap().control_id.clone())
        .collect();
    ids.sort();
    assert_eq!(ids, ["HAPI-AL-AL", "HAPI-INIT-AL", "HAPI-NE-AL"]);
}
