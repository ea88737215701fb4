//! The whole pipeline against a real broker: `hl7gw-load` → ingress → transformer → egress → `hl7gw receive`,
//! all real processes. Every ACKed message must reach the receiver, transformed as its route says, each
//! patient's messages in order — also across a receiver outage, receiver rejections (DLQ, then replay) and
//! SIGKILLs of the transformer and the egress.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ingress/tests/support/mod.rs"]
mod support;

mod common;

use common::{Pipeline, check_delivery, received, wait_delivered};
use hl7gw_runtime::proto::v1::egress_client::EgressClient;
use hl7gw_runtime::proto::v1::{ListDeadLettersRequest, ReplayRequest, StatusRequest};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::{KillOnDrop, bin, recorded};

/// One pipeline at a time: each is a handful of processes on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn ten_thousand_messages_arrive_transformed_and_in_patient_order() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut p = Pipeline::new();
    p.start_all(None);
    let started = Instant::now();
    let ids = p.load(4, 2_500);
    assert_eq!(ids.len(), 10_000);
    let r = wait_delivered(&p.received_dir(), &ids, Duration::from_secs(300));
    let duplicates = check_delivery(&r, &[]);
    eprintln!(
        "pipeline: 10,000 messages sent and delivered in {:.1} s, {duplicates} duplicates",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(duplicates, 0, "no crash, no duplicate");

    // SIGTERM: both workers drain (finish, commit, leave the group) and exit 0 well within the grace period.
    for (name, child) in [
        ("transformer", p.transformer.as_mut()),
        ("egress", p.egress.as_mut()),
    ] {
        let child = &mut child.unwrap().0;
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(25);
        let code = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(code.success(), "{name} exited with {code}");
    }
}

#[test]
fn receiver_outage_rejections_dead_letters_and_replay() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(outage_rejections_replay());
}

async fn outage_rejections_replay() {
    let mut p = Pipeline::new();
    p.start_all(Some(10));
    let dir = p.received_dir();

    // Load in the background; take the receiver away for 10 s once it has some messages.
    let mllp = p.mllp;
    let record = p.dir.path().join("acked.txt");
    let mut load = KillOnDrop(
        Command::new(bin("hl7gw-load"))
            .args(["--to", &format!("127.0.0.1:{mllp}")])
            .args([
                "--clients",
                "2",
                "--messages",
                "300",
                "--warmup",
                "0",
                "--timeout",
                "20",
                "--record-acked",
            ])
            .arg(&record)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while received(&dir).first.len() < 100 {
        assert!(Instant::now() < deadline, "receiver got nothing");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.receiver = None;
    tokio::time::sleep(Duration::from_secs(10)).await;
    p.start_receiver(Some(10));
    assert!(
        load.0.wait().unwrap().success(),
        "every message ACKed by the ingress"
    );
    let ids = recorded(&record);
    assert_eq!(ids.len(), 600);

    // Every message ends at the receiver or in the DLQ as rejected.
    let mut egress = EgressClient::connect(p.egress_addr()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (dead, r) = loop {
        let dead = egress
            .list_dead_letters(ListDeadLettersRequest {
                destination: "lab".into(),
                ..ListDeadLettersRequest::default()
            })
            .await
            .unwrap()
            .into_inner()
            .dead_letters;
        let r = received(&dir);
        let settled = ids
            .iter()
            .filter(|id| r.first.contains_key(*id) || dead.iter().any(|d| &d.control_id == *id))
            .count();
        if settled == ids.len() {
            break (dead, r);
        }
        if Instant::now() > deadline {
            let status = egress
                .status(StatusRequest::default())
                .await
                .unwrap()
                .into_inner();
            panic!(
                "{settled} of 600 settled ({} received, {} dead letters); egress: {status:?}",
                r.first.len(),
                dead.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        dead.len() >= 50,
        "every 10th answered AR/CR: {} dead letters",
        dead.len()
    );
    for d in &dead {
        assert_eq!(d.reason, "rejected");
        assert!(d.ack_code == "AR" || d.ack_code == "CR", "{d:?}");
        assert!(
            !r.first.contains_key(&d.control_id),
            "a rejected message was not stored"
        );
    }
    let status = egress
        .status(StatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.destinations.len(), 1);
    assert!(status.destinations[0].dead_lettered >= dead.len() as u64);

    // The receiver accepts everything now: replay delivers the dead letters.
    p.receiver = None;
    p.start_receiver(None);
    let replayed = egress
        .replay(ReplayRequest {
            destination: "lab".into(),
            ..ReplayRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed.replayed as usize, dead.len());
    let r = wait_delivered(&dir, &ids, Duration::from_secs(120));
    let replayed_ids: Vec<String> = dead.iter().map(|d| d.control_id.clone()).collect();
    let duplicates = check_delivery(&r, &replayed_ids);
    eprintln!(
        "outage + rejections: 600 ACKed, {} dead-lettered and replayed, {duplicates} duplicates at the receiver",
        dead.len()
    );
}

#[test]
fn sigkill_of_the_transformer_and_the_egress_loses_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut p = Pipeline::new();
    p.start_all(None);
    let record = p.dir.path().join("acked.txt");
    let mut load = support::start_load(p.mllp, 2, 20, &record);
    std::thread::sleep(Duration::from_secs(5));
    p.transformer = None; // SIGKILL
    p.start_transformer();
    std::thread::sleep(Duration::from_secs(5));
    p.egress = None; // SIGKILL
    p.start_egress();
    let out = load.wait_with_output_or_kill();
    assert!(out, "the load run finished");
    let ids = recorded(&record);
    assert!(ids.len() > 500, "the run sent messages: {}", ids.len());
    let r = wait_delivered(&p.received_dir(), &ids, Duration::from_secs(240));
    let duplicates = check_delivery(&r, &[]);
    eprintln!(
        "SIGKILL transformer + egress: {} ACKed, all delivered, {duplicates} duplicates at the receiver",
        ids.len()
    );
    assert!(
        duplicates <= ids.len() / 4,
        "duplicates bounded by the commit interval and in-flight work: {duplicates}"
    );
}

/// Waits for a child to exit (at most 120 s); true when it exited successfully.
trait WaitOrKill {
    fn wait_with_output_or_kill(&mut self) -> bool;
}

impl WaitOrKill for std::process::Child {
    fn wait_with_output_or_kill(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(s)) = self.try_wait() {
                return s.success();
            }
            if Instant::now() > deadline {
                let _ = self.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
