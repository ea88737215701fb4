//! The egress and its Kafka: a fatal producer error recovered in-process, the readiness probe's metadata requests,
//! a destination topic it cannot read.

use super::*;
use hl7gw_testkit::pipeline::Pipeline;
use hl7gw_testkit::runtime;

/// Issue 10: a fatal error of the egress's producer (raised by the test failpoint after its 2nd DLQ write) is
/// recovered in-process: the producer is recreated, the DLQ write is retried on the new one, every message
/// settles (delivered or dead-lettered) and the egress stays up.
#[test]
fn a_fatal_producer_error_in_the_egress_is_recovered_in_process() {
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.dead_letter_refusals();
    p.egress
        .env
        .push(("FAILPOINT_KAFKA_FATAL_AFTER", "2".into()));
    p.start_all(Some(2));
    let ids = p.load(1, 20);
    runtime().block_on(async {
        let mut egress = p.egress_client().await;
        wait_settled(&mut egress, ids.len() as u64, String::new).await;
        let dead = dead_letters(&mut egress).await;
        assert_eq!(dead.len(), 10, "every second message refused: {dead:?}");
    });
    let admin = p.egress.admin.unwrap();
    assert_eq!(
        counter_sum(admin, "hl7gw_egress_producer_recoveries_total", ""),
        1.0
    );
    assert!(
        p.egress
            .process
            .as_mut()
            .unwrap()
            .0
            .try_wait()
            .unwrap()
            .is_none(),
        "the egress is up"
    );
}

/// Issue 24, item 13: once its topics exist, the readiness probe (every 2 s) asks Kafka for the DLQ topic's
/// metadata only (the topic its producer writes), not for every topic of the cluster.
#[test]
fn the_readiness_probe_asks_for_the_dlq_topic_only() {
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.set_env(
        "RUST_LOG",
        "warn,hl7gw_runtime::service=info,librdkafka=debug",
    );
    p.egress
        .env
        .push(("HL7GW_KAFKA__PROPERTIES__DEBUG", "metadata".into()));
    p.log_dir = Some(p.dir.path().to_owned());
    p.start_egress();
    support::wait_ready(
        "egress",
        p.egress.admin.unwrap(),
        Instant::now() + Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_secs(5));
    let text = std::fs::read_to_string(p.dir.path().join("hl7gw-egress.log")).unwrap();
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| l.contains("hl7gw_runtime::service") && l.trim_end().ends_with("ready"))
        .expect("the egress logged ready");
    let asked: Vec<&str> = lines
        .filter(|l| l.contains("Request metadata for") && l.contains("application requested"))
        .collect();
    let all = asked.iter().filter(|l| l.contains("all topics")).count();
    assert_eq!(all, 0, "metadata requests for every topic: {asked:#?}");
    assert!(
        asked.len() >= 2,
        "the probe asked for {} named topics",
        asked.len()
    );
}

/// Issue 24, item 7: a destination topic the egress cannot read (here missing, on a cluster where the egress
/// does not create topics; an ACL refusing it is the same) left the egress polling forever with readiness
/// green. Readiness now says which destination and why, and comes back once the topic exists.
#[test]
fn a_destination_topic_that_cannot_be_read_makes_the_egress_unready_with_the_reason() {
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.set_env("HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS", "0");
    p.start_egress();
    let admin = p.egress.admin.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    support::wait_unready(
        "egress",
        admin,
        "destination lab: cannot read the topic",
        deadline,
    );
    runtime().block_on(support::create_topic(&p.topic("out.lab"), 1, &[]));
    support::wait_ready("egress", admin, Instant::now() + Duration::from_secs(60));
}
