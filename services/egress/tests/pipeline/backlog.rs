//! Backlogs: a stuck partition does not stop the others, a backlog is read without pausing, large results stay
//! under the pods' memory limit.

use super::*;
use hl7gw_testkit::pipeline::{Pipeline, check_delivery, wait_delivered};
use hl7gw_testkit::{KillOnDrop, bin, recorded};
use std::process::Command;

/// Issue 9, item 11: one partition whose receiver never answers (its patient's messages pile up) must not stop
/// the destination's other partitions: the full partition is held back and paused, the others go on.
#[test]
fn a_stuck_partition_does_not_stop_the_others() {
    common::run_alone(|mut p| async move {
        let cfg = p.dir.path().join("egress.yaml");
        let yaml = std::fs::read_to_string(&cfg).unwrap();
        // 4 KiB: a few of the stuck patient's messages held back are enough to pause its partition.
        std::fs::write(
            &cfg,
            format!("queue_per_partition: 2\nqueue_bytes_per_partition: 4096\n{yaml}"),
        )
        .unwrap();
        // The receiver never answers MRN-STUCK's messages and takes every other one.
        let delivered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = delivered.clone();
        scripted_receiver(p.receiver_port, move |m| {
            let cid = control_id(m);
            if m.get("PID-3-1") == Some(&b"MRN-STUCK"[..]) {
                log.lock().unwrap().push(format!("stuck:{cid}"));
                return vec![];
            }
            log.lock().unwrap().push(cid.clone());
            vec![format!("AA|{cid}")]
        })
        .await;
        p.start_services();
        let mut c = p.mllp_client().await;
        for i in 0..40 {
            let ack = c
                .call(&adt_from("ADMIT", &format!("STUCK-{i}"), "MRN-STUCK"))
                .await
                .unwrap();
            assert_eq!(support::ack_code(&ack), "AA");
        }
        // Wait until the egress is stuck on the first of them, its queue full behind it.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !delivered
            .lock()
            .unwrap()
            .iter()
            .any(|d| d.starts_with("stuck:"))
        {
            assert!(
                Instant::now() < deadline,
                "the stuck patient never reached the receiver"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let others: Vec<String> = (0..12).map(|i| format!("OTHER-{i}")).collect();
        for (i, id) in others.iter().enumerate() {
            let ack = c
                .call(&adt_from("ADMIT", id, &format!("MRN-OTHER-{i}")))
                .await
                .unwrap();
            assert_eq!(support::ack_code(&ack), "AA");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let n = delivered
                .lock()
                .unwrap()
                .iter()
                .filter(|d| d.starts_with("OTHER-"))
                .count();
            if n > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no other patient's message was delivered while one partition was stuck"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let pauses = counter_sum(
            p.egress.admin.unwrap(),
            "hl7gw_egress_partition_pauses_total",
            "lab",
        );
        assert!(pauses >= 1.0, "the stuck partition was paused ({pauses})");
    });
}

/// A backlog on one partition, smaller than `queue_bytes_per_partition`, is read without pausing the
/// partition. Each pause dropped what librdkafka had fetched ahead, and a resumed partition with nothing else
/// to fetch waited up to a second for its next fetch: pausing whenever the 64-record queue was full capped a
/// replacement pod's catch-up at about 64 messages a second.
#[test]
fn a_backlog_on_one_partition_is_read_without_pausing() {
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.set_env("HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS", "1");
    p.start_receiver(None);
    p.start_transformer();
    p.start_ingress();
    // The first test of this binary: on a broker just started, a few writes can miss ack_timeout (NAKed).
    let ids = p.load_acked(4, 500);
    assert!(ids.len() > 1_900, "{} of 2,000 ACKed", ids.len());
    // A port picked just before it is bound: the one Pipeline::new chose may have gone to a client socket since.
    p.egress_grpc = support::free_port();
    p.start_egress();
    let r = wait_delivered(&p.received_dir(), &ids, Duration::from_secs(120));
    assert_eq!(check_delivery(&r, &[]), 0, "duplicates");
    let pauses = counter_sum(
        p.egress.admin.unwrap(),
        "hl7gw_egress_partition_pauses_total",
        "lab",
    );
    assert_eq!(pauses, 0.0, "2,000 small messages paused the partition");
}

/// Peak resident memory of a running process (`VmHWM`), in bytes.
fn peak_rss(child: &KillOnDrop) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[test]
fn a_backlog_of_500_kb_results_stays_well_under_the_pods_memory_limit() {
    // The chart's limit is 512 MiB for the transformer and the egress. A backlog of large results (a PDF in
    // an OBX) must be worked through in batches and queues bounded in bytes, not in records: 500 records or
    // 64 per partition of 500 KB are a quarter of a gigabyte or more.
    const N: u32 = 400;
    const LIMIT: u64 = 256 << 20;
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.set_env("HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS", "6");
    std::fs::write(
        p.dir.path().join("routes.yaml"),
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {name: results}\n\
         spec:\n  match: {messageTypes: ['ORU^R01']}\n  destinations: [lab]\n",
    )
    .unwrap();
    let report = "A".repeat(500 * 1024);
    let oru = format!(
        "MSH|^~\\&|LAB|HOSP|EHR|HOSP|20260101120000||ORU^R01|X|P|2.5\rPID|1||MRN1^^^HOSP^MR||DOE^JOHN\r\
         OBR|1|||PDF^Report\rOBX|1|ED|PDF^Report||^application^pdf^Base64^{report}||||||F\r"
    );
    let file = p.dir.path().join("oru.hl7");
    std::fs::write(&file, oru).unwrap();

    // The backlog: every result stored in the inbound topic before the transformer starts.
    p.start_ingress();
    let record = p.dir.path().join("acked.txt");
    support::run_ok(
        Command::new(bin("hl7gw-load"))
            .args(["--to", &format!("127.0.0.1:{}", p.mllp)])
            .args(["--clients", "2", "--messages", &(N / 2).to_string()])
            .args(["--warmup", "0", "--timeout", "30", "--record-acked"])
            .arg(&record)
            .arg("--files")
            .arg(&file),
    );
    let ids = recorded(&record);
    assert_eq!(ids.len(), N as usize);

    // The transformer works through it into the destination topic while no egress runs.
    p.start_transformer();
    let admin = p.transformer.admin.unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    while counter_sum(
        admin,
        "hl7gw_transformer_messages_total{",
        "outcome=\"routed\"",
    ) < f64::from(N)
    {
        assert!(
            Instant::now() < deadline,
            "the transformer did not route the backlog"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let transformer_peak = peak_rss(p.transformer.process.as_ref().unwrap());

    // The egress works through the destination's backlog into a receiver that fsyncs every file.
    p.start_receiver(None);
    p.start_egress();
    let r = wait_delivered(&p.received_dir(), &ids, Duration::from_secs(300));
    assert!(r.first.values().all(|(_, b)| b.len() > 500 * 1024));
    let egress_peak = peak_rss(p.egress.process.as_ref().unwrap());
    eprintln!(
        "backlog of {N} x 500 KB: transformer peak RSS {} MiB, egress peak RSS {} MiB",
        transformer_peak >> 20,
        egress_peak >> 20
    );
    assert!(
        transformer_peak < LIMIT,
        "transformer peak RSS {} MiB",
        transformer_peak >> 20
    );
    assert!(
        egress_peak < LIMIT,
        "egress peak RSS {} MiB",
        egress_peak >> 20
    );
}
