//! Every ACKed message delivered: 10,000 through every part in patient order, a receiver outage with
//! rejections and replay, SIGKILLs of the transformer and the egress, two senders and two routes to one destination.

use super::*;
use hl7gw_runtime::proto::v1::ReplayRequest;
use hl7gw_testkit::pipeline::{Pipeline, check_delivery, received, wait_delivered};
use hl7gw_testkit::{KillOnDrop, bin, recorded};
use std::process::{Command, Stdio};

#[test]
fn ten_thousand_messages_arrive_transformed_and_in_patient_order() {
    let _serial = common::one_at_a_time();
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
        ("transformer", p.transformer.process.as_mut()),
        ("egress", p.egress.process.as_mut()),
    ] {
        let code = support::sigterm_and_wait(&mut child.unwrap().0, name, Duration::from_secs(25));
        assert!(code.success(), "{name} exited with {code}");
    }
}

#[test]
fn receiver_outage_rejections_dead_letters_and_replay() {
    common::run_alone(outage_rejections_replay);
}

async fn outage_rejections_replay(mut p: Pipeline) {
    // `hl7gw receive --reject-every` answers AR with ERR 207, which the default policy retries (table 0008);
    // this test is about dead letters and their replay, so this destination dead-letters every refusal.
    p.dead_letter_refusals();
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
    let (dead, r) = p.wait_settled(&ids, Duration::from_secs(60)).await;
    let mut egress = p.egress_client().await;
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
    let status = common::egress_status(&mut egress).await;
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
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.start_all(None);
    let record = p.dir.path().join("acked.txt");
    let mut load = p.load_through_sigkills(&record);
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

/// Two routes that both lead to `lab`, as an integration engineer writes when one feed needs two shapes.
fn two_routes() -> String {
    format!(
        "{}---\n{}",
        common::ROUTES,
        "\
apiVersion: hl7gw.io/v1alpha1
kind: HL7Route
metadata: {name: adt-copy-to-lab}
spec:
  match: {messageTypes: ['ADT^A*']}
  transforms:
    - set: {path: MSH-5, value: LAB}
    - set: {path: MSH-6, value: COPY}
    - mask: {path: PID-5}
  destinations: [lab]
"
    )
}

/// Issue 9, item 3: the egress's duplicate window knows one output by its envelope id and route, not by the
/// untransformed (MSH-4, MSH-10): two sending applications of one facility that use the same control id, and
/// two routes to one destination, are four different messages and all four reach the receiver.
#[test]
fn two_senders_of_one_facility_and_two_routes_to_one_destination_all_arrive() {
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    std::fs::write(p.dir.path().join("routes.yaml"), two_routes()).unwrap();
    p.start_all(None);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = p.mllp_client().await;
        for app in ["ADMIT", "REGISTER"] {
            let ack = c.call(&adt_from(app, "SAME-1", "MRN42")).await.unwrap();
            assert_eq!(support::ack_code(&ack), "AA");
        }
    });
    let dir = p.received_dir();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = received(&dir).copies.get("SAME-1").copied().unwrap_or(0);
        if n >= 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} of 4 outputs (2 senders x 2 routes) reached the receiver"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(received(&dir).copies.get("SAME-1").copied(), Some(4));
}
