//! The admin endpoints and metrics: health, readiness, no patient data in `/metrics`, librdkafka's statistics.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_answer_and_metrics_carry_no_patient_data() {
    let (ingress, _) = start([]);
    let (status, _) = http_get(ingress.admin, "/healthz");
    assert_eq!(status, 200);
    let (status, _) = http_get(ingress.admin, "/readyz");
    assert_eq!(status, 200);

    // Patient data that must never reach a metric: in accepted, duplicate and rejected messages.
    let (pid, family, given, dob) = ("PHI7734519", "QUIXOTEZ", "MARGARETHA", "19450317");
    let msg = |control_id: &str, version: &str| {
        format!(
            "MSH|^~\\&|TESTAPP|TESTFAC|HL7GW|HL7GW|20261122120000||ADT^A01^ADT_A01|{control_id}|P|{version}\r\
             PID|1||{pid}^^^TESTFAC^MR||{family}^{given}||{dob}|F\r"
        )
        .into_bytes()
    };
    let mut c = Mllp::connect(ingress.mllp).await;
    let ack = c.call(&msg("ADM1", "2.5.1")).await.unwrap();
    assert_eq!(msa(&ack).0, "AA");
    let ack = c.call(&msg("ADM1", "2.5.1")).await.unwrap();
    assert_eq!(msa(&ack).0, "AA", "duplicate");
    let ack = c.call(&msg("ADM2", "9.9")).await.unwrap();
    assert_eq!(msa(&ack).0, "AR");
    let ack = c
        .call(format!("PID|1||{pid}||{family}^{given}").as_bytes())
        .await
        .unwrap();
    assert_eq!(msa(&ack).0, "AE");

    let (status, metrics) = http_get(ingress.admin, "/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("hl7gw_ingress_frames_total"), "{metrics}");
    assert_eq!(ingress.metric("hl7gw_ingress_frames_total"), 4.0);
    for phi in [pid, family, given, dob] {
        assert!(
            !metrics.to_uppercase().contains(phi),
            "/metrics contains patient data {phi:?}"
        );
    }
}

/// Issue 12: librdkafka's statistics reach `/metrics`: the Produce requests behind the messages, per broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_requests_per_broker_and_api_are_metrics() {
    let (ingress, _) = start([("HL7GW_KAFKA__STATISTICS_INTERVAL", "500ms".to_owned())]);
    let mut c = Mllp::connect(ingress.mllp).await;
    for id in ["STATS1", "STATS2", "STATS3"] {
        assert_eq!(ack_code(&c.call(&adt(id, "P1")).await.unwrap()), "AA");
    }
    let series = "hl7gw_kafka_requests_total{client=\"hl7gw-ingress\",type=\"producer\",broker=\"1\",api=\"Produce\"}";
    let deadline = Instant::now() + Duration::from_secs(15);
    while ingress.metric(series) < 3.0 {
        assert!(
            Instant::now() < deadline,
            "no {series} >= 3 in /metrics: {}",
            http_get(ingress.admin, "/metrics").1
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
