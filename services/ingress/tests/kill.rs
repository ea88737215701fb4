//! "An ACK is a promise", proven by killing things mid-load: SIGKILL the ingress while `hl7gw-load` runs,
//! then check that every control id the harness recorded as ACKed is in the topic.
#![allow(clippy::unwrap_used)] // test helpers: a failed step fails the test

use hl7gw_testkit as support;

use std::time::Duration;
use support::*;

#[test]
fn sigkill_mid_load_loses_no_acked_message() {
    let brokers = broker();
    let inbound = unique_topic("test.kill");
    let env = vec![
        ("HL7GW_KAFKA__BROKERS", brokers.to_owned()),
        ("HL7GW_INBOUND_TOPIC", inbound.clone()),
        ("HL7GW_DLQ_TOPIC", unique_topic("test.kill.dlq")),
    ];
    let port = free_port();
    let mut first = ingress_on(port, &env);
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("acked.txt");
    let load = start_load(port, 4, 14, &record);

    std::thread::sleep(Duration::from_secs(4));
    let before_kill = recorded(&record).len();
    first.0.kill().unwrap(); // SIGKILL
    first.0.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let second = ingress_on(port, &env);

    let out = load.wait_with_output().unwrap();
    drop(second);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = recorded(&record);
    assert!(
        before_kill > 100,
        "load was running before the kill ({before_kill} ACKed)"
    );
    assert!(
        ids.len() > before_kill + 100,
        "load resumed on the restarted ingress ({} ACKed in all, {before_kill} before the kill)",
        ids.len()
    );
    let (acked, stored, dups) = check_all_acked_are_stored(brokers, &inbound, &ids);
    eprintln!(
        "sigkill: {acked} ACKed ({before_kill} before the kill), {stored} records, {dups} duplicates, \
         errors {}, reconnects {}",
        summary["errors"], summary["reconnects"]
    );
}
