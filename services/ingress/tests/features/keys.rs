//! The Kafka key and partition: a salted hash of the patient id, the partition a Java producer would choose.

use super::*;
use std::collections::HashSet;

/// Issue 11: with `key_salt_file`, the Kafka key (shown by every Kafka tool without reading the payload) is the
/// salted SHA-256 of MSH-4|PID-3.1, not the medical record number; one patient still has one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_key_can_be_a_salted_hash_of_the_patient_id() {
    use sha2::Digest;
    let (inbound, _, mut env) = topics_env(broker());
    let (_dir, salt) = support::temp_file("salt", "a-salt-from-a-secret-0123456789\n");
    env.push(("HL7GW_KEY_SALT_FILE", salt.display().to_string()));
    let ingress = Ingress::start(&env);
    let mut c = Mllp::connect(ingress.mllp).await;
    for id in ["SALT1", "SALT2"] {
        let ack = c.call(&adt(id, "MRN-4711")).await.unwrap();
        assert_eq!(ack_code(&ack), "AA");
    }
    let records = read_topic(broker(), &inbound, 2, Duration::from_secs(20));
    let mut h = sha2::Sha256::new();
    h.update(b"a-salt-from-a-secret-0123456789");
    h.update(b"TESTFAC|MRN-4711");
    let want: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    for r in &records {
        let key = String::from_utf8(r.key.clone().unwrap()).unwrap();
        assert_eq!(key, want);
        assert!(!key.contains("4711"));
    }
    // A salt too short to hide anything is refused at start.
    std::fs::write(&salt, "short").unwrap();
    let out = std::process::Command::new(bin("hl7gw-ingress"))
        .arg("--check-config")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 16 bytes"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line, no backtrace: {err}");
}

/// The number of partitions of `topic`.
fn partitions_of(brokers: &str, topic: &str) -> usize {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    md.topics()[0].partitions().len()
}

/// Issue 13: keys land in the partition a Java producer would choose (`murmur2_random`), so Java and hl7gw
/// producers of one topic keep one patient in one partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_land_in_the_partition_a_java_producer_would_choose() {
    let (ingress, t) = start([("HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS", "6".to_owned())]);
    let mut c = Mllp::connect(ingress.mllp).await;
    for i in 0..24 {
        let ack = c.call(&adt(&format!("PART{i}"), &format!("MRN{i}"))).await;
        assert_eq!(ack_code(&ack.unwrap()), "AA");
    }
    let records_topic = t.inbound.clone();
    let records = tokio::task::spawn_blocking(move || {
        read_topic(broker(), &t.inbound, 24, Duration::from_secs(30))
    })
    .await
    .unwrap();
    assert_eq!(records.len(), 24);
    // The ingress created the topic with kafka.create_topics_partitions (not the broker's default of 3).
    assert_eq!(partitions_of(broker(), &records_topic), 6);
    let mut used = HashSet::new();
    for r in &records {
        let key = r.key.as_deref().expect("a key");
        // The Java client's partition for the key (its murmur2 checked against the Java client's own values in
        // hl7gw-runtime's ledger tests).
        let java = hl7gw_runtime::ledger::partition_for(key, 6);
        assert_eq!(r.partition, java, "key {:?}", String::from_utf8_lossy(key));
        used.insert(r.partition);
    }
    assert!(used.len() > 1, "24 keys in one partition: {used:?}");
}
