//! Stop the broker in the middle of a load run: no AA for a message Kafka did not confirm; start it again:
//! the same ingress recovers without a restart. Runs its own broker (port 29192), which it stops and starts.
#![allow(clippy::unwrap_used)] // test helpers: a failed step fails the test

use hl7gw_testkit as support;

use std::time::Duration;
use support::*;

const PORT: u16 = 29192;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_gets_no_false_ack_and_the_ingress_recovers() {
    let brokers = broker_on(PORT);
    let inbound = unique_topic("test.outage");
    let env = vec![
        ("HL7GW_KAFKA__BROKERS", brokers.clone()),
        ("HL7GW_INBOUND_TOPIC", inbound.clone()),
        ("HL7GW_DLQ_TOPIC", unique_topic("test.outage.dlq")),
        ("HL7GW_ACK_TIMEOUT", "2s".to_owned()),
    ];
    let port = free_port();
    let ingress = ingress_on(port, &env);
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("acked.txt");
    // 40 s: in a full `make test` (28 s then) the ingress had no time left to show its recovery after the restart.
    let load = start_load(port, 2, 40, &record);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = recorded(&record).len();
    stop_broker(PORT);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = recorded(&record).len();
    broker_on(PORT);
    let out = tokio::task::spawn_blocking(move || load.wait_with_output().unwrap())
        .await
        .unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = recorded(&record);
    assert!(before > 100, "load ran before the outage ({before})");
    let naks =
        summary["acks"]["AR"].as_u64().unwrap_or(0) + summary["acks"]["CR"].as_u64().unwrap_or(0);
    assert!(naks > 0, "the outage answered AR/CR 207: {summary}");
    assert!(
        ids.len() > during + 100,
        "after the broker came back the same ingress accepted again ({} > {during})",
        ids.len()
    );
    let (acked, stored, dups) = check_all_acked_are_stored(&brokers, &inbound, &ids);
    eprintln!(
        "outage: {acked} ACKed ({before} before, {during} by the end of the outage), {stored} records, \
         {dups} duplicates, acks {}",
        summary["acks"]
    );
    drop(ingress);
    stop_broker(PORT);
}
