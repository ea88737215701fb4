//! Issue 26, item 3: "which sender stopped sending?" answered as an operator asks it, against the real ingress
//! binary and a real Kafka broker: two senders over MLLP (one named in the config), then the admin method
//! `Ingest/Senders` (messages, NAKs by code, last message time; connections listed while open, gone once
//! closed), the named sender's metrics on /metrics, `hl7gw senders` (table and `--json`), anonymous callers
//! refused, every call audited, sender identity in the reject log lines, and no patient data in any of them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a failed step fails the test

use hl7gw_runtime::proto::v1::SendersRequest;
use hl7gw_runtime::proto::v1::ingest_client::IngestClient;
use hl7gw_testkit as support;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};
use support::{INGRESS_ON_PORT_0, Mllp, ack_code, bin, broker, http_get, pki, spawn_listening};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

const OPS: &str = "ops-token-0123456789abcdef";

/// Patient data in every message: it must show up nowhere but in Kafka.
const PHI: [&str; 4] = ["QUIXOTEZ", "MARGARETHA", "19450317", "PHI7734519"];

/// An ADT^A01 from `app`/`fac` with MSH-12 `version` and MSH-15 `msh15` (empty: original mode).
fn adt(app: &str, fac: &str, control_id: &str, version: &str, msh15: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|{app}|{fac}|HL7GW|HL7GW|20261122120000||ADT^A01^ADT_A01|{control_id}|P|{version}|||{msh15}\r\
         EVN|A01|20261122120000\r\
         PID|1||PHI7734519^^^{fac}^MR||QUIXOTEZ^MARGARETHA||19450317|F\r"
    )
    .into_bytes()
}

fn metric(admin: SocketAddr, series: &str) -> Option<f64> {
    let (_, body) = http_get(admin, "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// `text` without its ANSI colour sequences (ESC [ ... m).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

async fn channel(addr: &str, ca: &Certificate) -> Channel {
    let tls = ClientTlsConfig::new()
        .ca_certificate(ca.clone())
        .domain_name("localhost");
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
}

fn with_token<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_each_sender_and_connection_and_the_named_senders_metrics() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("ops {OPS}\n")).unwrap();
    let config = dir.path().join("ingress.yaml");
    std::fs::write(
        &config,
        format!(
            "senders:\n  - {{name: lab, sending_application: LAB, sending_facility: NORTH}}\n\
             grpc:\n  tls: {{cert: {}, key: {}}}\n  tokens_file: {}\n  allow:\n    Senders: [token:ops]\n",
            pki.file("server.pem"),
            pki.file("server.key"),
            tokens.display()
        ),
    )
    .unwrap();
    let (_, _, env) = support::topics_env(broker(), "test.senders");
    let log = dir.path().join("ingress.log");
    let started = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut cmd = Command::new(bin("hl7gw-ingress"));
    cmd.args(INGRESS_ON_PORT_0)
        .args(["--config", config.to_str().unwrap()])
        .env("RUST_LOG", "warn,hl7gw_ingress=info,hl7gw::audit=info")
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let (_ingress, line) = spawn_listening(&mut cmd);
    let addr = |key: &str| -> SocketAddr { support::listening_field(&line, key).parse().unwrap() };
    let (mllp, grpc, admin) = (addr("mllp"), addr("grpc"), addr("admin"));
    support::wait_ready("ingress", admin, Instant::now() + Duration::from_secs(60));

    // Before any message, the named sender's last message time is the process start: silent since then.
    let last = "hl7gw_ingress_sender_last_message_timestamp_seconds{sender=\"lab\"}";
    let at_start = metric(admin, last).expect("the named sender's gauge exists from the start");
    assert!(
        at_start >= started - 1.0 && at_start <= started + 60.0,
        "{at_start} vs {started}"
    );

    // Sender LAB/NORTH (named `lab`; MSH-3 with its universal id): AA, AR (version), AE (no control id), AA.
    let mut lab = Mllp::connect(mllp).await;
    let lab_peer = lab.0.get_ref().local_addr().unwrap().to_string();
    let lab_app = "LAB^1.2.840.1^ISO";
    for (id, version, want) in [
        ("LAB-1", "2.5.1", "AA"),
        ("LAB-2", "9.9", "AR"),
        ("", "2.5.1", "AE"),
        ("LAB-4", "2.5.1", "AA"),
    ] {
        let ack = lab
            .call(&adt(lab_app, "NORTH", id, version, ""))
            .await
            .unwrap();
        assert_eq!(ack_code(&ack), want, "{id}");
    }
    // Sender RAD/SOUTH, not named, in enhanced mode: CA, then CE (no control id).
    let mut rad = Mllp::connect(mllp).await;
    let rad_peer = rad.0.get_ref().local_addr().unwrap().to_string();
    assert_eq!(
        ack_code(
            &rad.call(&adt("RAD", "SOUTH", "RAD-1", "2.5.1", "AL"))
                .await
                .unwrap()
        ),
        "CA"
    );
    assert_eq!(
        ack_code(
            &rad.call(&adt("RAD", "SOUTH", "", "2.5.1", "AL"))
                .await
                .unwrap()
        ),
        "CE"
    );

    let ca = Certificate::from_pem(std::fs::read(pki.path("ca.pem")).unwrap());
    let grpc_addr = grpc.to_string();
    let mut client = IngestClient::new(channel(&grpc_addr, &ca).await);
    let view = client
        .senders(with_token(SendersRequest::default(), Some(OPS)))
        .await
        .unwrap()
        .into_inner();
    let sender = |app: &str| {
        view.senders
            .iter()
            .find(|s| s.sending_application == app)
            .unwrap_or_else(|| panic!("{app} not in {view:?}"))
    };
    let l = sender("LAB");
    assert_eq!(l.sending_facility, "NORTH");
    assert_eq!(l.name, "lab");
    assert_eq!(l.last_peer, lab_peer);
    assert_eq!(l.last_listener, "mllp");
    assert_eq!(l.open_connections, 1);
    let lc = l.counts.clone().unwrap();
    assert_eq!(lc.messages, 4);
    assert_eq!(lc.naks.get("AR"), Some(&1));
    assert_eq!(lc.naks.get("AE"), Some(&1));
    assert_eq!(lc.naks.len(), 2, "{:?}", lc.naks);
    let lab_last = SystemTime::try_from(lc.last_message_at.unwrap()).unwrap();
    assert!(lab_last.elapsed().unwrap_or_default() < Duration::from_secs(60));
    let r = sender("RAD");
    assert_eq!(
        (r.sending_facility.as_str(), r.name.as_str()),
        ("SOUTH", "")
    );
    let rc = r.counts.clone().unwrap();
    assert_eq!(rc.messages, 2);
    assert_eq!(rc.naks.get("CE"), Some(&1));
    assert_eq!(view.connections.len(), 2, "{:?}", view.connections);
    let conn = |peer: &str| view.connections.iter().find(|c| c.peer == peer).unwrap();
    let lab_conn = conn(&lab_peer);
    assert_eq!(lab_conn.listener, "mllp");
    assert_eq!(lab_conn.protocol, "mllp");
    assert_eq!(lab_conn.sending_application, "LAB");
    assert_eq!(lab_conn.counts.as_ref().unwrap().messages, 4);
    assert!(lab_conn.connected_at.is_some());
    assert_eq!(conn(&rad_peer).sending_application, "RAD");
    assert_eq!(view.tracked, 2);
    assert_eq!(view.max_senders, 1000);

    // The named sender's metrics; the unnamed sender has none (labels come from the config only).
    let messages = metric(admin, "hl7gw_ingress_sender_messages_total{sender=\"lab\"}");
    assert_eq!(messages, Some(4.0));
    for (code, n) in [("AR", 1.0), ("AE", 1.0), ("CE", 0.0)] {
        let series = format!("hl7gw_ingress_sender_naks_total{{sender=\"lab\",code=\"{code}\"}}");
        assert_eq!(metric(admin, &series), Some(n), "{series}");
    }
    let after = metric(admin, last).unwrap();
    assert!(after >= at_start, "{after} < {at_start}");
    let (_, text) = http_get(admin, "/metrics");
    assert!(!text.contains("RAD"), "an unnamed sender made a series");

    // `hl7gw senders`, as the runbook shows it: a table, and JSON lines.
    let token_file = dir.path().join("ops.token");
    std::fs::write(&token_file, format!("{OPS}\n")).unwrap();
    let (to, ca) = (format!("https://{grpc}"), pki.file("ca.pem"));
    let cli = |extra: &[&str], token: bool| {
        let args = [&["senders"], extra].concat();
        let token = token.then_some(token_file.as_path());
        support::output_text(&mut support::admin_cli(&args, &to, Some(&ca), token))
    };
    let (ok, table, err) = cli(&[], true);
    assert!(ok, "{err}");
    let lab_row = table
        .lines()
        .find(|l| l.starts_with("LAB "))
        .unwrap_or_else(|| panic!("{table}"));
    for want in ["NORTH", "lab", " 4 ", "AE:1 AR:1", &lab_peer, "mllp"] {
        assert!(
            lab_row.contains(want),
            "{want:?} not in {lab_row:?}\n{table}"
        );
    }
    assert!(
        table.contains("CE:1") && table.contains(&rad_peer),
        "{table}"
    );
    assert!(
        table.contains("2 sender(s) tracked of at most 1000; 2 connection(s) open"),
        "{table}"
    );
    let (ok, json, err) = cli(&["--json"], true);
    assert!(ok, "{err}");
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lab_json = lines
        .iter()
        .find(|v| v["kind"] == "sender" && v["sending_application"] == "LAB")
        .unwrap();
    assert_eq!(lab_json["name"], "lab");
    assert_eq!(lab_json["messages"], 4);
    assert_eq!(lab_json["naks"], serde_json::json!({"AE": 1, "AR": 1}));
    assert!(lab_json["last_message_at"].is_string());
    assert_eq!(
        lines.iter().filter(|v| v["kind"] == "connection").count(),
        2
    );
    assert_eq!(lines.last().unwrap()["kind"], "summary");
    // One sender: `--application` (and the connections that last carried it).
    let (ok, one, err) = cli(&["--application", "RAD", "--json"], true);
    assert!(ok, "{err}");
    let one: Vec<serde_json::Value> = one
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let apps: Vec<&str> = one
        .iter()
        .filter(|v| v["kind"] != "summary")
        .map(|v| v["sending_application"].as_str().unwrap())
        .collect();
    assert_eq!(apps, ["RAD", "RAD"], "{one:?}");

    // Anonymous callers are refused, by the API and by the CLI.
    let anonymous = client
        .senders(with_token(SendersRequest::default(), None))
        .await;
    assert_eq!(anonymous.unwrap_err().code(), tonic::Code::Unauthenticated);
    let (ok, _, err) = cli(&[], false);
    assert!(!ok && err.contains("Unauthenticated"), "{err}");

    // A closed connection leaves the view; its sender stays, with its last message time.
    drop(lab);
    let deadline = Instant::now() + Duration::from_secs(10);
    let view = loop {
        let v = client
            .senders(with_token(SendersRequest::default(), Some(OPS)))
            .await
            .unwrap()
            .into_inner();
        if v.connections.len() == 1 || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view.connections.len(), 1, "{:?}", view.connections);
    assert_eq!(view.connections[0].peer, rad_peer);
    let l = view
        .senders
        .iter()
        .find(|s| s.sending_application == "LAB")
        .unwrap();
    assert_eq!(l.open_connections, 0);
    assert_eq!(l.counts.as_ref().unwrap().messages, 4);
    drop(rad);

    // Every call audited (who, result), the refusals too; reject lines name the sender; no patient data.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = plain(&std::fs::read_to_string(&log).unwrap());
    assert!(
        support::audited(&text, &["token:ops", "Senders", "ok: 2 senders"]),
        "{text}"
    );
    assert!(
        support::admin_calls(&text)
            .iter()
            .filter(|l| l.contains("Senders") && l.contains("refused"))
            .count()
            >= 2,
        "{text}"
    );
    let rejected: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("message rejected"))
        .collect();
    assert_eq!(rejected.len(), 3, "{text}");
    assert!(
        rejected.iter().any(|l| l.contains("unsupported_version")
            && l.contains("sending_application=LAB")
            && l.contains("sending_facility=NORTH")
            && l.contains(&format!("peer={lab_peer}"))
            && l.contains("listener=mllp")),
        "{text}"
    );
    for phi in PHI {
        assert!(!text.contains(phi), "the log holds patient data {phi}");
        assert!(
            !table.contains(phi) && !json.contains(phi),
            "the CLI shows patient data {phi}"
        );
        let (_, metrics) = http_get(admin, "/metrics");
        assert!(!metrics.contains(phi), "/metrics holds patient data {phi}");
        assert!(
            !format!("{view:?}").contains(phi),
            "the view holds patient data {phi}"
        );
    }
    assert!(!text.contains(OPS), "a token leaked into the log");
}
