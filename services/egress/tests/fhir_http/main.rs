//! The HTTP destination against a real FHIR server (HAPI FHIR's RestfulServer, validating every write; the
//! harness in tests/fhir), the whole pipeline in front of it: MLLP → ingress → transformer (`toFhir`,
//! transaction Bundles) → egress → POST to the server's base.
//!
//! - every corpus message of a type the converter maps is delivered, none refused by the validator, and a
//!   second delivery of the same messages leaves the server's resource counts as they were;
//! - each patient's messages arrive in the order they were sent (the last update wins);
//! - the answers decide like ACKs: a server that is down is waited for, a 429 waits its `Retry-After`, a 400
//!   with an OperationOutcome is a dead letter with the status and the outcome, and its replay is delivered;
//! - refused credentials (403, a token endpoint's refusal, a discovered token endpoint that may not be used) are
//!   bounded, then a replayable dead letter; a token's `expires_in` is clamped;
//! - a replay is whole (re-read from its topic when the dead letter lost the message) or refused, and a forced
//!   one is sent.

use hl7gw_testkit as support;
use hl7gw_testkit::fhir::FhirServer;
use hl7gw_testkit::pipeline::{Pipeline, dead_letters};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A route sending every message type the converter maps to `fhir` as a transaction Bundle (times without an
/// offset are taken as US Eastern: appointments need instants). Three corpus senders name no assigning
/// authority anywhere (no CX-4/CX-6, no MSH-4): the route names one for each, as a site would, instead of
/// letting their patients be refused as `unscoped_patient_identity`.
fn routes() -> String {
    let types: Vec<String> = hl7gw_fhir::SUPPORTED
        .iter()
        .map(|t| format!("'{t}'"))
        .collect();
    format!(
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: to-fhir}}\nspec:\n  match: {{messageTypes: [{}]}}\n  transforms:\n    - toFhir:\n        bundleType: transaction\n        timezone: America/New_York\n        senders: {{ADT-HIS: {{authority: ADT-HIS}}, RADIS1: {{authority: RADIS1}}, DMCOE: {{authority: DMCOE}}}}\n  destinations: [fhir]\n",
        types.join(", ")
    )
}

/// The pipeline in front of the server: the [`routes`], the egress's `destinations` (YAML, four spaces in),
/// every service started and ready.
fn fhir_pipeline(destinations: &str) -> Pipeline {
    let mut p = Pipeline::new();
    p.set_routes(&routes());
    p.set_destinations(destinations);
    p.start_services();
    p.wait_ready(Duration::from_secs(60));
    p
}

fn destination(url: &str) -> String {
    format!(
        "  fhir:\n    url: {url}\n    response_timeout: 30s\n    retry: {{initial_backoff: 100ms, max_backoff: 1s}}\n"
    )
}

/// Left out of the corpus run: a patient identified only by an identifier without assigning authority
/// (`123456789`, `urn:hl7gw:id:unknown`) that another patient of the corpus (msfc__ADT-A06-02, A07-01/02,
/// updated by `ADT1|PATID1234`) also carries. The two go to different partitions, so whether the server finds
/// one Patient or two by that identifier depends on the order the partitions' deliveries happen to take, and two
/// make the conditional update a 412, dead-lettered as `rejected` (what the HTTP destination should do; the
/// test wants a run that does not depend on timing). Found by a run where it came out the other way.
const AMBIGUOUS: &[&str] = &["msfc__ADT04-23"];

/// The corpus's messages of a mapped type, by file name.
fn corpus() -> Vec<(String, Vec<u8>)> {
    support::hl7_files(&support::corpus_dir(), "")
        .into_iter()
        .filter(|(name, _)| !AMBIGUOUS.contains(&name.as_str()))
        .filter_map(|(name, bytes)| {
            let m = hl7v2::Message::parse(&bytes).ok()?;
            if !hl7gw_fhir::supports(&m) {
                return None;
            }
            // Every message asks for an accept ACK (some say NE, and the ingress honours it): the test counts
            // what the ingress accepted.
            let mut e = m.edit();
            e.set("MSH-15", b"AL").ok()?;
            Some((name, e.encode()))
        })
        .collect()
}

/// Sends each message on one MLLP connection; the control ids the ingress accepted (AA/CA).
async fn send_all(p: &Pipeline, messages: &[Vec<u8>]) -> Vec<String> {
    let mut mllp = p.mllp_client().await;
    let mut acked = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let Some(ack) = mllp.call(m).await else {
            panic!(
                "no ACK for message {i}: {:?}",
                String::from_utf8_lossy(&m[..m.len().min(300)])
            );
        };
        if matches!(support::ack_code(&ack).as_str(), "AA" | "CA") {
            acked.push(support::field(m, "MSH-10").unwrap_or_default());
        }
    }
    acked
}

/// POSTs to the server's base that it answered with 2xx.
fn delivered(server: &FhirServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["status"].as_u64().is_some_and(|s| s / 100 == 2))
        .count()
}

/// Waits until the server took `n` transactions; panics after `limit` with the dead letters and metrics.
async fn wait_delivered(p: &Pipeline, server: &FhirServer, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let got = delivered(server);
        if got >= n {
            return;
        }
        if Instant::now() > deadline {
            let mut egress = p.egress_client().await;
            let dead = dead_letters(&mut egress, "fhir", true).await;
            let reasons: Vec<String> = dead
                .iter()
                .take(10)
                .map(|d| {
                    let r = d
                        .envelope
                        .as_ref()
                        .and_then(|e| e.rejection.clone())
                        .unwrap_or_default();
                    format!(
                        "{} {}: {} {}",
                        d.control_id,
                        d.reason,
                        r.detail,
                        String::from_utf8_lossy(&r.ack[..r.ack.len().min(600)])
                    )
                })
                .collect();
            panic!(
                "{got} of {n} delivered; {} dead letters:\n{}\n{}",
                dead.len(),
                reasons.join("\n"),
                p.metrics_summary()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An ADT^A08 for `patient` whose family name is `family` (the last one sent must win).
fn a08(control_id: &str, patient: &str, family: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|TESTAPP|TESTFAC|HL7GW|HL7GW|20261122120000||ADT^A08^ADT_A01|{control_id}|P|2.5.1\r\
         EVN|A08|20261122120000\r\
         PID|1||{patient}^^^TESTFAC^MR||{family}^JANE||19700101|F\r\
         PV1|1|I\r"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corpus_reaches_a_fhir_server_once_in_order_and_validated() {
    let messages = corpus();
    assert!(
        messages.len() > 100,
        "the corpus has {} messages of mapped types",
        messages.len()
    );
    let server = FhirServer::start(0, &[]);
    let mut p = fhir_pipeline(&destination(&server.base()));

    let bytes: Vec<Vec<u8>> = messages.iter().map(|(_, b)| b.clone()).collect();
    let acked = send_all(&p, &bytes).await;
    assert!(
        acked.len() * 10 >= messages.len() * 9,
        "the ingress accepted {} of {}",
        acked.len(),
        messages.len()
    );
    wait_delivered(&p, &server, acked.len(), Duration::from_secs(600)).await;
    let mut egress = p.egress_client().await;
    let dead = dead_letters(&mut egress, "fhir", true).await;
    assert!(
        dead.is_empty(),
        "the server refused {} Bundles, e.g. {:?}",
        dead.len(),
        dead.first().map(|d| (
            &d.control_id,
            &d.reason,
            d.envelope
                .as_ref()
                .and_then(|e| e.rejection.as_ref())
                .map(|r| String::from_utf8_lossy(&r.ack).into_owned())
        ))
    );
    let first = server.counts();
    let total: u64 = first.values().sum();
    println!(
        "{} messages, {} accepted by the ingress, {} transactions; resources: {first:?}",
        messages.len(),
        acked.len(),
        delivered(&server)
    );
    assert!(first["Patient"] > 0 && first["Observation"] > 0 && total > 500);

    // Every output delivered a second time, as after an egress crash before its offsets were committed: an
    // egress in a new consumer group reads the destination topic from its start (the ingress would take the
    // same messages sent again as the sender's resends, and not pass them on). The conditional updates find
    // what the first delivery made.
    p.egress.process = None;
    for (k, v) in &mut p.egress.env {
        if *k == "HL7GW_GROUP_PREFIX" {
            v.push_str("-again");
        }
    }
    p.start_egress();
    wait_delivered(&p, &server, 2 * acked.len(), Duration::from_secs(600)).await;
    let second = server.counts();
    let grown: BTreeMap<&String, (u64, u64)> = first
        .iter()
        .filter(|(k, v)| second.get(*k) != Some(*v))
        .map(|(k, v)| (k, (*v, second.get(k).copied().unwrap_or(0))))
        .collect();
    assert!(
        grown.is_empty(),
        "a second delivery changed the counts: {grown:?}"
    );

    // Issue 38: the first delivery had many transactions in the air at once (max_in_flight 16 per partition). The same outputs
    // delivered one at a time per partition (max_in_flight 1, the order before it) into an emptied server make
    // the same resources.
    p.egress.process = None;
    p.set_destinations(
        &destination(&server.base()).replace("    retry:", "    max_in_flight: 1\n    retry:"),
    );
    for (k, v) in &mut p.egress.env {
        if *k == "HL7GW_GROUP_PREFIX" {
            v.push_str("-sequential");
        }
    }
    server.call("POST", "/admin/reset");
    p.start_egress();
    wait_delivered(&p, &server, acked.len(), Duration::from_secs(600)).await;
    let sequential = server.counts();
    assert_eq!(
        sequential, first,
        "one transaction at a time per partition makes other resources than many at once"
    );
    p.egress.process = None;
    p.set_destinations(&destination(&server.base()));
    p.start_egress();

    // Patient order: three patients' updates interleaved; each one's last name is the one it keeps.
    let mut order = Vec::new();
    for i in 0..8 {
        for patient in ["ORD1", "ORD2", "ORD3"] {
            order.push(a08(
                &format!("{patient}-{i}"),
                patient,
                &format!("FAMILY{i}"),
            ));
        }
    }
    let before = delivered(&server);
    let acked_order = send_all(&p, &order).await;
    assert_eq!(acked_order.len(), order.len());
    wait_delivered(&p, &server, before + order.len(), Duration::from_secs(120)).await;
    for patient in ["ORD1", "ORD2", "ORD3"] {
        let (status, bundle) = server.call(
            "GET",
            &format!("/fhir/Patient?identifier=urn:hl7gw:id:TESTFAC%7C{patient}"),
        );
        assert_eq!(status, 200, "{bundle}");
        let entries = bundle["entry"].as_array().cloned().unwrap_or_default();
        assert_eq!(entries.len(), 1, "one Patient {patient}: {bundle}");
        assert_eq!(
            entries[0]["resource"]["name"][0]["family"], "FAMILY7",
            "{patient}'s last update"
        );
    }
    let (_, metrics) = support::http_get(p.egress.admin.unwrap(), "/metrics");
    assert!(
        metrics.contains("hl7gw_egress_http_responses_total{destination=\"fhir\",class=\"2xx\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_decide_like_acks_down_429_400_and_replay() {
    let port = support::free_port();
    let p = fhir_pipeline(&destination(&format!("http://127.0.0.1:{port}/fhir")));
    let admin = p.egress.admin.unwrap();
    let metric = |name: &str| -> f64 {
        let (_, body) = support::http_get(admin, "/metrics");
        body.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };

    // The server is down: the message waits (no dead letter) and goes once it is up.
    assert_eq!(
        send_all(&p, &[support::adt("DOWN-1", "P-DOWN")])
            .await
            .len(),
        1
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric("hl7gw_egress_retries_total{destination=\"fhir\",reason=\"connect_failed\"}") < 2.0
    {
        assert!(Instant::now() < deadline, "no retries counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let server = FhirServer::start(port, &[]);
    wait_delivered(&p, &server, 1, Duration::from_secs(60)).await;
    let mut egress = p.egress_client().await;
    assert!(dead_letters(&mut egress, "fhir", false).await.is_empty());

    // 429 with Retry-After: 2 → the next attempt comes no sooner than that.
    server.fail_next(429, 1, Some("2"));
    send_all(&p, &[support::adt("BUSY-1", "P-BUSY")]).await;
    wait_delivered(&p, &server, 2, Duration::from_secs(60)).await;
    let posts: Vec<serde_json::Value> = server
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "POST")
        .collect();
    let n = posts.len();
    assert!(n >= 3, "{posts:?}");
    assert_eq!(
        (
            posts[n - 2]["status"].as_u64(),
            posts[n - 1]["status"].as_u64()
        ),
        (Some(429), Some(200))
    );
    let waited = posts[n - 1]["at"].as_i64().unwrap() - posts[n - 2]["at"].as_i64().unwrap();
    assert!(
        waited >= 1900,
        "retried after {waited} ms, Retry-After said 2 s"
    );
    assert!(metric("hl7gw_egress_retries_total{destination=\"fhir\",reason=\"http_429\"}") >= 1.0);

    // 400 with an OperationOutcome: a dead letter at once, with the status and the outcome.
    server.fail_next(400, 1, None);
    send_all(&p, &[support::adt("BAD-1", "P-BAD")]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let letter = loop {
        let dead = dead_letters(&mut egress, "fhir", true).await;
        if let Some(d) = dead.into_iter().find(|d| d.control_id == "BAD-1") {
            break d;
        }
        assert!(Instant::now() < deadline, "no dead letter for BAD-1");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!((letter.reason.as_str(), letter.attempts), ("rejected", 1));
    let rejection = letter.envelope.and_then(|e| e.rejection).unwrap();
    assert_eq!(rejection.http_status, 400);
    assert!(
        rejection
            .detail
            .starts_with("receiver answered HTTP 400 (OperationOutcome, 1 issue: "),
        "{}",
        rejection.detail
    );
    let outcome: serde_json::Value = serde_json::from_slice(&rejection.ack).unwrap();
    assert_eq!(outcome["resourceType"], "OperationOutcome");
    assert_eq!(server.counts()["Patient"], 2, "BAD-1 was not applied");

    // Its replay is delivered.
    let replayed = egress
        .replay(hl7gw_runtime::proto::v1::ReplayRequest {
            destination: "fhir".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed.replayed, 1);
    wait_delivered(&p, &server, 3, Duration::from_secs(60)).await;
    assert_eq!(server.counts()["Patient"], 3);
    assert!(metric("hl7gw_egress_http_responses_total{destination=\"fhir\",class=\"4xx\"}") >= 2.0);

    // The ledger has each outcome with its HTTP status.
    let events = hl7gw_testkit::pipeline::read_events(&p.topic("events"), Duration::from_secs(30));
    let of = |kind: &str, control_id: &str| {
        events
            .iter()
            .filter(|(_, _, e)| e.kind == kind && e.control_id == control_id && e.stage == "egress")
            .map(|(_, _, e)| e.http_status)
            .collect::<Vec<u32>>()
    };
    assert_eq!(of("delivered", "DOWN-1"), [200]);
    assert_eq!(of("delivered", "BUSY-1"), [200]);
    assert_eq!(of("dead_lettered", "BAD-1"), [400]);
    assert_eq!(of("delivered", "BAD-1"), [200], "the replay");
}

/// A server over HTTPS (the test PKI's server certificate) that gives SMART backend services tokens to
/// `hl7gw-egress` (its key `smart-client`), and wants a client certificate of the test CA when `mutual`.
fn smart_server(pki: &support::Pki, mutual: bool) -> FhirServer {
    let (cert, key, ca) = (
        pki.file("server.pem"),
        pki.file("server.key"),
        pki.file("ca.pem"),
    );
    let client = format!("hl7gw-egress={}", pki.file("smart-client.pub"));
    let mut args = vec!["--tls-cert", &cert, "--tls-key", &key];
    if mutual {
        args.extend(["--client-ca", &ca]);
    }
    args.extend(["--smart-client", &client]);
    FhirServer::start(0, &args)
}

/// HTTPS with mutual TLS and SMART backend services (ES384 assertion, token endpoint discovered from the
/// server's smart-configuration): delivered over HTTP/2; a revoked token costs one 401, a new token and no
/// dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_over_mutual_tls_with_smart_backend_services() {
    let pki = support::pki::pki();
    let server = smart_server(&pki, true);
    let p = fhir_pipeline(&format!(
        "  fhir:\n    url: https://127.0.0.1:{}/fhir\n    response_timeout: 30s\n    retry: {{initial_backoff: 100ms, max_backoff: 1s}}\n\
         \x20   tls: {{ca: {}, cert: {}, key: {}}}\n\
         \x20   http: {{oauth2: {{client_id: hl7gw-egress, private_key: {}, key_id: k1}}}}\n",
        server.port,
        pki.file("ca.pem"),
        pki.file("client.pem"),
        pki.file("client.key"),
        pki.file("smart-client.key"),
    ));
    send_all(&p, &[support::adt("TLS-1", "P-TLS")]).await;
    let auth = wait_authorized(&p, &server, &pki, 1, "not delivered").await;
    assert_eq!(auth["tokensIssued"], 1, "{auth}");
    assert_eq!(auth["lastClientCertificateCn"], "hl7-client", "{auth}");
    let log = &auth["tokenLog"][0];
    assert_eq!(log["alg"], "ES384", "{log}");
    assert_eq!(log["kid"], "k1", "{log}");

    // Every token issued so far is revoked: the next delivery gets a 401, fetches a new one, and goes.
    server.call_tls("POST", "/admin/revoke", &pki).await;
    send_all(&p, &[support::adt("TLS-2", "P-TLS")]).await;
    let auth = wait_authorized(&p, &server, &pki, 2, "not delivered after revocation").await;
    assert_eq!(auth["tokensIssued"], 2, "{auth}");
    assert_eq!(auth["fhirUnauthorizedBy"]["revoked"], 1, "{auth}");
    let requests = server.call_tls("GET", "/admin/requests", &pki).await;
    let posts: Vec<&serde_json::Value> = requests["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["method"] == "POST")
        .collect();
    assert!(
        posts.iter().all(|r| r["protocol"] == "HTTP/2.0"),
        "HTTP/2 by ALPN: {posts:?}"
    );
    let mut egress = p.egress_client().await;
    assert!(dead_letters(&mut egress, "fhir", false).await.is_empty());
}

/// A bearer token from a file: a wrong one is retried (credentials, not the message: no dead letter), and the
/// file's new content is used after the 401 (a rotated secret needs no restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_bearer_token_file_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let expected = dir.path().join("server-token");
    std::fs::write(&expected, "right-token-0123456789\n").unwrap();
    let ours = dir.path().join("egress-token");
    std::fs::write(&ours, "stale-token\n").unwrap();
    let server = FhirServer::start(0, &["--bearer-token-file", expected.to_str().unwrap()]);
    let p = fhir_pipeline(&format!(
        "{}    http: {{bearer_token_file: {}}}\n",
        destination(&server.base()),
        ours.display()
    ));
    send_all(&p, &[support::adt("TOKEN-1", "P-TOKEN")]).await;
    let admin = p.egress.admin.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, m) = support::http_get(admin, "/metrics");
        if m.contains("hl7gw_egress_retries_total{destination=\"fhir\",reason=\"unauthorized\"} ") {
            break;
        }
        assert!(Instant::now() < deadline, "no 401 retry counted\n{m}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(&ours, "right-token-0123456789\n").unwrap();
    wait_delivered(&p, &server, 1, Duration::from_secs(30)).await;
    let mut egress = p.egress_client().await;
    assert!(dead_letters(&mut egress, "fhir", false).await.is_empty());
}

/// Not only FHIR: a route's HL7 output POSTed to a web service (here `hl7gw receive --http`) as
/// `application/hl7-v2`, byte for byte what the route made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hl7_route_posts_the_message_to_a_web_service() {
    let mut p = Pipeline::new();
    let out = p.dir.path().join("posted");
    let mut cmd = std::process::Command::new(support::bin("hl7gw"));
    cmd.args([
        "receive",
        "--http",
        "--no-sync",
        "--listen",
        "127.0.0.1:0",
        "--out",
    ])
    .arg(&out)
    .stderr(std::process::Stdio::null());
    let (_receiver, line) = support::spawn_listening(&mut cmd);
    let addr = line.trim().rsplit(' ').next().unwrap().to_owned();
    p.set_destinations(&format!(
        "  lab:\n    url: http://{addr}/hl7\n    http: {{headers: {{X-Feed: adt}}}}\n    retry: {{initial_backoff: 100ms, max_backoff: 1s}}\n"
    ));
    p.start_services();
    p.wait_ready(Duration::from_secs(60));
    assert_eq!(
        send_all(&p, &[support::adt("HOOK-1", "P-HOOK")])
            .await
            .len(),
        1
    );
    let file = out.join("000001-http.hl7");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "nothing posted\n{}",
            p.metrics_summary()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let posted = std::fs::read(&file).unwrap();
    // The default test route (adt-to-lab) sets MSH-5 and masks PID-5.
    assert_eq!(support::field(&posted, "MSH-10").as_deref(), Some("HOOK-1"));
    assert_eq!(support::field(&posted, "MSH-5").as_deref(), Some("LAB"));
    assert_ne!(support::field(&posted, "PID-5-1").as_deref(), Some("DOE"));
}

/// The server's `/admin/auth` once it authorized `n` FHIR requests; panics after 60 s saying `what`.
async fn wait_authorized(
    p: &Pipeline,
    server: &FhirServer,
    pki: &support::Pki,
    n: u64,
    what: &str,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut auth = server.call_tls("GET", "/admin/auth", pki).await;
    while auth["fhirAuthorized"].as_u64() < Some(n) {
        assert!(
            Instant::now() < deadline,
            "{what}: {auth}\n{}",
            p.metrics_summary()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        auth = server.call_tls("GET", "/admin/auth", pki).await;
    }
    auth
}

/// Waits for the dead letter of `control_id` at `destination` (with its envelope); panics after `limit`.
async fn wait_dead_letter(
    p: &Pipeline,
    control_id: &str,
    limit: Duration,
) -> hl7gw_runtime::proto::v1::DeadLetter {
    let mut egress = p.egress_client().await;
    let deadline = Instant::now() + limit;
    loop {
        let dead = dead_letters(&mut egress, "fhir", true).await;
        if let Some(d) = dead.into_iter().find(|d| d.control_id == control_id) {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "no dead letter for {control_id}\n{}",
            p.metrics_summary()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Replays the dead letters of `ids` (forced when `force`); the count replayed.
async fn replay_ids(p: &Pipeline, ids: &[String], force: bool) -> u32 {
    let mut egress = p.egress_client().await;
    egress
        .replay(hl7gw_runtime::proto::v1::ReplayRequest {
            ids: ids.to_vec(),
            force,
            ..Default::default()
        })
        .await
        .expect("Replay")
        .into_inner()
        .replayed
}

/// The ledger's events of `kind` (by the egress) for `control_id`: their reasons and HTTP statuses.
fn egress_events(p: &Pipeline, kind: &str, control_id: &str) -> Vec<(String, u32)> {
    hl7gw_testkit::pipeline::read_events(&p.topic("events"), Duration::from_secs(30))
        .into_iter()
        .filter(|(_, _, e)| e.kind == kind && e.control_id == control_id && e.stage == "egress")
        .map(|(_, _, e)| (e.reason, e.http_status))
        .collect()
}

/// Issue 36, item 4: a 403 (a scope the server refuses) was retried for ever and never counted toward a bound:
/// the partition was wedged behind it with no dead letter. Now 401/403 count toward
/// `ack_policy.max_auth_retries` (10 by default), then the output is a dead letter `unauthorized` with the
/// status, and its replay (once the credentials are fixed) is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_bounded_then_a_replayable_dead_letter() {
    let server = FhirServer::start(0, &[]);
    let p = fhir_pipeline(&destination(&server.base()));

    server.fail_next(403, 1000, None);
    assert_eq!(
        send_all(&p, &[support::adt("SCOPE-1", "P-SCOPE")])
            .await
            .len(),
        1
    );
    let letter = wait_dead_letter(&p, "SCOPE-1", Duration::from_secs(60)).await;
    assert_eq!(letter.reason, "unauthorized");
    assert_eq!(letter.http_status, 403);
    assert_eq!(letter.attempts, 11, "1 + max_auth_retries (10)");
    let posts = server
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST")
        .count();
    assert_eq!(posts, 11);

    // The scope is granted: the replay is delivered.
    server.fail_next(403, 0, None);
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), false).await,
        1
    );
    wait_delivered(&p, &server, 1, Duration::from_secs(60)).await;
    assert_eq!(
        egress_events(&p, "dead_lettered", "SCOPE-1"),
        [("unauthorized".to_owned(), 403)]
    );
}

/// A stand-in for a pod's sidecar (an admin port on loopback): counts the connections it gets.
async fn sidecar() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the sidecar");
    let port = listener.local_addr().expect("its address").port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hits.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(s);
        }
    });
    (port, hits)
}

/// Issue 36, item 4, the token endpoint: SMART discovery naming a plain-http endpoint on the pod's loopback (a
/// request forgery to its sidecars) is refused, never connected to, and counted like a refusal (a dead letter
/// `unauthorized`, replayed once the server is fixed); a token answer with an `expires_in` of 2^64-1 seconds
/// is clamped (it panicked the worker: `Instant + keep` overflowed, and the egress stopped); a token endpoint
/// that refuses the client counts toward the same bound (it was retried for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_token_endpoints_are_refused_bounded_and_clamped() {
    let pki = support::pki::pki();
    let server = smart_server(&pki, false);
    let (sidecar_port, sidecar_hits) = sidecar().await;
    let hostile = format!("/admin/smart?tokenEndpoint=http://127.0.0.1:{sidecar_port}/token");
    server.call_tls("POST", &hostile, &pki).await;
    let p = fhir_pipeline(&format!(
        "  fhir:\n    url: https://127.0.0.1:{}/fhir\n    response_timeout: 30s\n    retry: {{initial_backoff: 100ms, max_backoff: 500ms}}\n\
         \x20   ack_policy: {{max_retries: 3}}\n\
         \x20   tls: {{ca: {}}}\n\
         \x20   http: {{oauth2: {{client_id: hl7gw-egress, private_key: {}, key_id: k1}}}}\n",
        server.port,
        pki.file("ca.pem"),
        pki.file("smart-client.key"),
    ));

    // The discovered endpoint is on loopback over plain http: refused, never reached.
    send_all(&p, &[support::adt("SSRF-1", "P-SMART")]).await;
    let letter = wait_dead_letter(&p, "SSRF-1", Duration::from_secs(60)).await;
    assert_eq!(letter.reason, "unauthorized");
    assert_eq!(
        sidecar_hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the egress connected to the discovered loopback endpoint"
    );
    let detail = letter
        .envelope
        .as_ref()
        .and_then(|e| e.rejection.as_ref())
        .map(|r| r.detail.clone())
        .unwrap_or_default();
    assert!(detail.contains("token endpoint"), "{detail}");

    // The server is fixed, and answers tokens that (it says) never expire: the replay is delivered.
    server
        .call_tls(
            "POST",
            "/admin/smart?tokenEndpoint=&expiresIn=18446744073709551615",
            &pki,
        )
        .await;
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), false).await,
        1
    );
    wait_authorized(&p, &server, &pki, 1, "not delivered after the fix").await;
    // The egress is still up (the clamp), and delivers the next one with the token it has.
    send_all(&p, &[support::adt("SMART-2", "P-SMART")]).await;
    let auth = wait_authorized(&p, &server, &pki, 2, "the egress stopped delivering").await;
    assert_eq!(auth["tokensIssued"], 1, "{auth}");

    // The token endpoint refuses the client (every token revoked, every new one refused): bounded, then a
    // dead letter with the token endpoint's status.
    server.call_tls("POST", "/admin/revoke", &pki).await;
    server
        .call_tls("POST", "/admin/token-fail?status=400&count=1000", &pki)
        .await;
    send_all(&p, &[support::adt("REFUSED-1", "P-SMART")]).await;
    let letter = wait_dead_letter(&p, "REFUSED-1", Duration::from_secs(60)).await;
    assert_eq!(letter.reason, "unauthorized");
    assert_eq!(letter.http_status, 400);
    assert_eq!(letter.attempts, 11, "1 + max_auth_retries (10)");
    server
        .call_tls("POST", "/admin/token-fail?status=400&count=0", &pki)
        .await;
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), false).await,
        1
    );
    wait_authorized(&p, &server, &pki, 3, "the replay was not delivered").await;
}

/// The POSTs to the server's base so far: (status, body bytes).
fn posts(server: &FhirServer) -> Vec<(u64, i64)> {
    server
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/fhir")
        .map(|r| {
            (
                r["status"].as_u64().unwrap_or(0),
                r["bytes"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

/// Stops the egress with SIGTERM (it commits what it settled: no redelivery after its restart).
fn restart_gently(p: &mut Pipeline) {
    if let Some(child) = p.egress.process.as_mut() {
        let code = support::sigterm_and_wait(&mut child.0, "egress", Duration::from_secs(25));
        assert!(code.success(), "egress exited with {code}");
    }
}

/// Issue 36, item 5: replay is whole or refused, and never silent. A dead letter shrunk to fit the record limit
/// (the message dropped) was replayed as an empty body, which a lenient server takes and the ledger called
/// delivered; now the replay re-reads the message from where the egress read it (the destination topic's
/// record the dead letter names), or, when that topic no longer holds it, refuses it saying why and where the
/// original was. A forced replay inside the duplicate window was dropped with a log line only; now it is sent
/// (a replay is a new delivery, its Kafka redeliveries still suppressed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_whole_or_refused_and_a_forced_one_is_sent() {
    let server = FhirServer::start(0, &[]);
    let mut p = fhir_pipeline(&destination(&server.base()));
    // An address of 4 KB makes a Bundle a 2 KB dead letter cannot hold.
    let long = |control_id: &str| {
        String::from_utf8(support::adt(control_id, "P-WHOLE"))
            .unwrap()
            .replace(
                "|F\r",
                &format!("|F|||{} MAIN STREET^^BOSTON^MA^02115\r", "9".repeat(4000)),
            )
            .into_bytes()
    };
    send_all(&p, &[long("WHOLE-0")]).await;
    wait_delivered(&p, &server, 1, Duration::from_secs(60)).await;
    let bundle_bytes = posts(&server)[0].1;
    assert!(bundle_bytes > 4000, "a Bundle of {bundle_bytes} bytes");

    // The egress again, its records limited to 2 KB: a dead letter of a Bundle does not fit whole.
    restart_gently(&mut p);
    p.egress.process = None;
    p.egress
        .env
        .push(("HL7GW_KAFKA__MAX_MESSAGE_BYTES", "2000".into()));
    p.start_egress();
    p.wait_ready(Duration::from_secs(60));
    server.fail_next(400, 2, None);
    send_all(&p, &[long("WHOLE-1"), long("WHOLE-2")]).await;
    let letter = wait_dead_letter(&p, "WHOLE-1", Duration::from_secs(60)).await;
    let second = wait_dead_letter(&p, "WHOLE-2", Duration::from_secs(60)).await;
    let env = letter.envelope.clone().unwrap_or_default();
    let rej = env.rejection.clone().unwrap_or_default();
    assert!(env.raw.is_empty(), "the message was dropped to fit");
    assert!(rej.detail.contains("is not stored"), "{}", rej.detail);

    // The limit is raised again (the replay's own records must fit); the replay sends the whole Bundle, read
    // from the destination topic.
    restart_gently(&mut p);
    p.egress.process = None;
    p.egress
        .env
        .retain(|(k, _)| *k != "HL7GW_KAFKA__MAX_MESSAGE_BYTES");
    p.start_egress();
    p.wait_ready(Duration::from_secs(60));
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), false).await,
        1
    );
    wait_delivered(&p, &server, 2, Duration::from_secs(60)).await;
    let sent = posts(&server);
    assert_eq!(
        sent.last().copied(),
        Some((200, bundle_bytes)),
        "the replay's POST: {sent:?}"
    );

    // Forced again within the duplicate window: sent again (and on the ledger as delivered twice).
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), true).await,
        1
    );
    wait_delivered(&p, &server, 3, Duration::from_secs(30)).await;
    assert_eq!(
        egress_events(&p, "delivered", "WHOLE-1"),
        [(String::new(), 200), (String::new(), 200)]
    );

    // The destination topic no longer holds the second one's message (retention, here deleted): its replay
    // is refused, saying why and where the original was; nothing is sent.
    let rej = second
        .envelope
        .and_then(|e| e.rejection)
        .unwrap_or_default();
    let origin = format!(
        "{}/{}/{}",
        rej.origin_topic, rej.origin_partition, rej.origin_offset
    );
    assert_eq!(rej.origin_topic, p.topic("out.fhir"));
    delete_records(
        &rej.origin_topic,
        rej.origin_partition,
        rej.origin_offset + 1,
    )
    .await;
    let before = posts(&server).len();
    let mut egress = p.egress_client().await;
    let r = egress
        .replay(hl7gw_runtime::proto::v1::ReplayRequest {
            ids: vec![second.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.replayed, 0, "{r:?}");
    let [refused] = &r.refused[..] else {
        panic!("one refusal: {r:?}")
    };
    assert_eq!(
        (refused.id.as_str(), refused.origin.as_str()),
        (second.id.as_str(), origin.as_str())
    );
    assert!(
        refused.why.contains("no longer holds it"),
        "{}",
        refused.why
    );
    // The CLI says so, names the place, and exits 1.
    let token = p.dir.path().join("ops.token");
    std::fs::write(&token, hl7gw_testkit::pipeline::OPS_TOKEN).expect("the token file");
    let out = std::process::Command::new(support::bin("hl7gw"))
        .args(["replay", "--to", &p.egress_addr(), "--id", &second.id])
        .arg("--token-file")
        .arg(&token)
        .output()
        .expect("hl7gw replay");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("not replayed {}", second.id))
            && err.contains("no longer holds it")
            && err.contains(&format!("the original was read at {origin}")),
        "{err}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(posts(&server).len(), before, "nothing was sent");
}

/// Deletes the records of `topic`'s `partition` before `offset` (as retention would).
async fn delete_records(topic: &str, partition: i32, offset: i64) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", support::broker())
        .create()
        .expect("an admin client");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .expect("a partition");
    let done = admin
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .expect("records deleted");
    for e in done.elements() {
        assert!(e.error().is_ok(), "delete records: {:?}", e.error());
    }
}

/// Stops the transformer with SIGTERM (its transaction committed: no batch read again after its restart).
fn stop_transformer(p: &mut Pipeline) {
    if let Some(child) = p.transformer.process.as_mut() {
        let code = support::sigterm_and_wait(&mut child.0, "transformer", Duration::from_secs(25));
        assert!(code.success(), "transformer exited with {code}");
    }
    p.transformer.process = None;
}

/// Issue 36, item 5: a `toFhir` output over the record limit was dead-lettered without its content and was
/// not replayable. Its dead letter now names its input (inbound topic, partition, offset), and `replay`
/// re-reads that input and routes it again (once the limit is raised), while the inbound topic holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_large_output_is_replayed_from_its_input() {
    let server = FhirServer::start(0, &[]);
    let mut p = fhir_pipeline(&destination(&server.base()));
    send_all(&p, &[support::adt("BIG-0", "P-BIG")]).await;
    wait_delivered(&p, &server, 1, Duration::from_secs(60)).await;

    // The transformer's records limited to 2 KB: a Bundle with a 4 KB address is over it.
    stop_transformer(&mut p);
    p.transformer
        .env
        .push(("HL7GW_KAFKA__MAX_MESSAGE_BYTES", "2000".into()));
    p.start_transformer();
    p.wait_ready(Duration::from_secs(60));
    let big = String::from_utf8(support::adt("BIG-1", "P-BIG"))
        .unwrap()
        .replace(
            "|F\r",
            &format!("|F|||{} MAIN STREET^^BOSTON^MA^02115\r", "9".repeat(4000)),
        )
        .into_bytes();
    send_all(&p, &[big]).await;
    let mut egress = p.egress_client().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let letter = loop {
        let page = egress
            .list_dead_letters(hl7gw_runtime::proto::v1::ListDeadLettersRequest {
                stage: "transformer".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if let Some(d) = page
            .dead_letters
            .into_iter()
            .find(|d| d.control_id == "BIG-1")
        {
            break d;
        }
        assert!(
            Instant::now() < deadline,
            "no transformer dead letter for BIG-1"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(letter.reason, "too_large");

    // The limit raised again: the replay re-reads the input and the route delivers it.
    stop_transformer(&mut p);
    p.transformer
        .env
        .retain(|(k, _)| *k != "HL7GW_KAFKA__MAX_MESSAGE_BYTES");
    p.start_transformer();
    p.wait_ready(Duration::from_secs(60));
    let replayed = egress
        .replay(hl7gw_runtime::proto::v1::ReplayRequest {
            ids: vec![letter.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed.replayed, 1, "{replayed:?}");
    wait_delivered(&p, &server, 2, Duration::from_secs(60)).await;
    let (status, bundle) = server.call(
        "GET",
        "/fhir/Patient?identifier=urn:hl7gw:id:TESTFAC%7CP-BIG",
    );
    assert_eq!(status, 200, "{bundle}");
    let line = bundle["entry"][0]["resource"]["address"][0]["line"][0]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        line.len() > 4000,
        "the replayed message's address: {bundle}"
    );
}
