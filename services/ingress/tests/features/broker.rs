//! An unreachable broker (`on_timeout`: close or NAK, never AA; not ready) and a fatal producer error
//! recovered in-process.

use super::*;

fn assert_not_ready(ingress: &Ingress) {
    let (status, _) = http_get(ingress.admin, "/readyz");
    assert_eq!(status, 503, "/readyz while Kafka is unreachable");
    let (status, _) = http_get(ingress.admin, "/healthz");
    assert_eq!(status, 200, "/healthz: the process is alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_broker_with_on_timeout_close_closes_without_an_answer() {
    let ingress = Ingress::start_with(&unreachable_env(Some("close")), &[], false);
    assert_not_ready(&ingress);
    for n in 0..3 {
        let mut c = Mllp::connect(ingress.mllp).await;
        let id = format!("CLOSE{n}");
        c.send(&adt(&id, "P1")).await;
        let t = Instant::now();
        let got = next_frame(&mut c.0, Duration::from_secs(8)).await;
        let took = t.elapsed();
        match got {
            Next::Closed => {}
            Next::Frame(f) => panic!(
                "{id}: on_timeout=close answered {:?} after {took:?}",
                String::from_utf8_lossy(&f)
            ),
            Next::Silent => panic!("{id}: the connection was not closed within 8 s"),
        }
        assert!(took < Duration::from_secs(3), "{id}: closed after {took:?}");
    }
    assert_not_ready(&ingress);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_broker_with_on_timeout_nak_answers_ar_207() {
    let ingress = Ingress::start_with(&unreachable_env(None), &[], false);
    assert_not_ready(&ingress);
    let mut c = Mllp::connect(ingress.mllp).await;
    for n in 0..3 {
        let id = format!("NAK{n}");
        c.send(&adt(&id, "P1")).await;
        let t = Instant::now();
        let got = next_frame(&mut c.0, Duration::from_secs(8)).await;
        let took = t.elapsed();
        let Next::Frame(ack) = got else {
            panic!("{id}: no NAK ({got:?})");
        };
        assert_eq!(msa(&ack), ("AR".to_owned(), id.clone()));
        assert_eq!(err3(&ack).as_deref(), Some("207"), "{id}");
        assert!(took < Duration::from_secs(3), "{id}: NAK after {took:?}");
    }
    // No AA was ever sent.
    assert_eq!(ingress.metric("hl7gw_ingress_acks_total{code=\"AA\"}"), 0.0);
    assert_eq!(ingress.metric("hl7gw_ingress_acks_total{code=\"AR\"}"), 3.0);
    assert_not_ready(&ingress);
}

/// Issue 10: a fatal error of the idempotent producer (raised by the test failpoint on the 5th record, as a
/// lost sequence would) is recovered in-process: the producer is recreated, the message in flight gets AR 207
/// (never AA), later messages are accepted again, and the process stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_producer_error_is_recovered_in_process() {
    let (mut ingress, t) = start([("FAILPOINT_KAFKA_FATAL_AFTER", "5".into())]);
    let mut c = Mllp::connect(ingress.mllp).await;
    let mut codes = Vec::new();
    for i in 1..=12 {
        let ack = c.call(&adt(&format!("FATAL-{i}"), "P1")).await.unwrap();
        codes.push(msa(&ack).0);
    }
    let refused: Vec<usize> = (0..codes.len()).filter(|&i| codes[i] != "AA").collect();
    assert!(!refused.is_empty() && refused.len() <= 2, "{codes:?}");
    assert!(refused.iter().all(|&i| codes[i] == "AR"), "{codes:?}");
    assert_eq!(codes.last().map(String::as_str), Some("AA"), "{codes:?}");
    assert_eq!(
        ingress.metric("hl7gw_ingress_producer_recoveries_total"),
        1.0
    );
    assert!(ingress.is_running());
    let accepted: Vec<String> = (0..codes.len())
        .filter(|&i| codes[i] == "AA")
        .map(|i| format!("FATAL-{}", i + 1))
        .collect();
    check_all_acked_are_stored(t.brokers, &t.inbound, &accepted);
    ingress.wait_ready(Duration::from_secs(15));
}
