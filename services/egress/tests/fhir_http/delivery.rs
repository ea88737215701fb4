//! What reaches the server: the corpus once, in order and validated; an HL7 route's message POSTed to a web
//! service.

use super::*;
use std::collections::BTreeMap;

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
