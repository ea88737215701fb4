//! The server's answers decide like ACKs: down, 429, 400 with an OperationOutcome, and the replay.

use super::*;

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
