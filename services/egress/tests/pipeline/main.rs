//! The whole pipeline against a real broker: `hl7gw-load` → ingress → transformer → egress → `hl7gw receive`,
//! all real processes. Every ACKed message must reach the receiver, transformed as its route says, each
//! patient's messages in order — also across a receiver outage, receiver rejections (DLQ, then replay) and
//! SIGKILLs of the transformer and the egress.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline as common;

use common::{Pipeline, check_delivery, received, wait_delivered};
use hl7gw_runtime::proto::v1::{ListDeadLettersRequest, ReplayRequest};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::{KillOnDrop, bin, recorded, runtime};

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

use common::Egress;

/// Waits until the `lab` destination delivered or dead-lettered `n` messages; `context` explains a timeout.
async fn wait_settled(egress: &mut Egress, n: u64, context: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = common::egress_status(egress).await;
        let d = &s.destinations[0];
        if d.delivered + d.dead_lettered >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not settled: {d:?}; {}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// (control id, MSA-1 of the receiver's answer) of every `lab` dead letter.
async fn dead_letters(egress: &mut Egress) -> Vec<(String, String)> {
    common::lab_dead_letters(egress)
        .await
        .into_iter()
        .map(|d| (d.control_id, d.ack_code))
        .collect()
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

/// An ADT^A01 from `app` at facility `FAC`.
fn adt_from(app: &str, control_id: &str, patient: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|{app}|FAC|HL7GW|HL7GW|20261123120000||ADT^A01^ADT_A01|{control_id}|P|2.5.1\r\
         EVN|A01|20261123120000\r\
         PID|1||{patient}^^^FAC^MR||DOE^JANE||19700101|F\r"
    )
    .into_bytes()
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

/// A receiver that answers every message twice, as enhanced-mode receivers do: first the accept ACK (CA, or CE,
/// a content error, for control ids ending in `-3`), then later an application ACK (AA). Returns the task.
/// A receiver on `port` that answers as the test scripts it: `answer` gets each message and returns the MSA
/// fields of the ACKs to send back, in order (`AA|<control id>`, ...); none leaves the message unanswered.
async fn scripted_receiver(
    port: u16,
    answer: impl Fn(&hl7v2::Message<'_>) -> Vec<String> + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    use futures_util::{SinkExt, StreamExt};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut f = tokio_util::codec::Framed::new(s, hl7v2::MllpCodec::default());
                let mut n = 0u32;
                while let Some(Ok(frame)) = f.next().await {
                    let acks = answer(&hl7v2::Message::parse(&frame).unwrap());
                    for msa in acks {
                        n += 1;
                        let ack = format!(
                            "MSH|^~\\&|RCV|RCV|HL7GW|HL7GW|20261123120000||ACK^A01^ACK|R{n}|P|2.5.1\rMSA|{msa}\r"
                        );
                        if f.send(ack.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    })
}

/// MSH-10 of `m`.
fn control_id(m: &hl7v2::Message<'_>) -> String {
    String::from_utf8_lossy(m.get("MSH-10").unwrap_or_default()).into_owned()
}

/// Answers every message twice, an accept ACK (CE for control ids ending in `-3`, else CA) then an application
/// ACK (AA).
async fn two_ack_receiver(port: u16) -> tokio::task::JoinHandle<()> {
    scripted_receiver(port, |m| {
        let cid = control_id(m);
        let accept = if cid.ends_with("-3") { "CE" } else { "CA" };
        vec![format!("{accept}|{cid}"), format!("AA|{cid}")]
    })
    .await
}

/// Issue 9, item 4: the egress matches MSA-2 to the control id it sent. A receiver that sends an accept ACK
/// and then an application ACK must not shift every answer by one: the message the receiver refused (CE) is
/// dead-lettered, and no other is.
#[test]
fn answers_are_matched_by_msa2_not_by_arrival() {
    common::run_alone(|mut p| async move {
        let _receiver = two_ack_receiver(p.receiver_port).await;
        p.start_services();
        let mut c = p.mllp_client().await;
        let ids: Vec<String> = (1..=6).map(|i| format!("TWOACK-{i}")).collect();
        for id in &ids {
            // One patient: one partition, one connection, in order.
            let ack = c.call(&adt_from("ADMIT", id, "MRN7")).await.unwrap();
            assert_eq!(support::ack_code(&ack), "AA");
        }
        let mut egress = p.egress_client().await;
        wait_settled(&mut egress, 6, String::new).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let dead: Vec<String> = dead_letters(&mut egress)
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            dead,
            ["TWOACK-3"],
            "only the refused message is a dead letter"
        );
        let s = common::egress_status(&mut egress).await;
        assert_eq!(s.destinations[0].delivered, 5);
    });
}

/// A receiver that answers by control id, as real receivers do: `POL-1` has a content error (AE 102), `POL-2`
/// is refused twice with AR 207 ("resend later") before it is taken, a message whose MSH-15 is `NE` gets no
/// answer at all (a compliant enhanced-mode receiver), and the rest get AA. Every message that reaches it is
/// recorded in arrival order as (control id, MSH-15).
async fn policy_receiver(port: u16) -> std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    scripted_receiver(port, move |m| {
        let get = |p: &str| String::from_utf8_lossy(m.get(p).unwrap_or_default()).into_owned();
        let (cid, msh15) = (get("MSH-10"), get("MSH-15"));
        let tries = {
            let mut l = log.lock().unwrap();
            l.push((cid.clone(), msh15.clone()));
            l.iter().filter(|(c, _)| *c == cid).count()
        };
        let msa = match (cid.as_str(), msh15.as_str()) {
            (_, "NE") => return vec![],
            ("POL-1", _) => "AE|POL-1\rERR|||102^Data type error^HL70357|E".to_owned(),
            ("POL-2", _) if tries <= 2 => {
                "AR|POL-2\rERR|||207^Application internal error^HL70357|E".to_owned()
            }
            _ => format!("AA|{cid}"),
        };
        vec![msa]
    })
    .await;
    seen
}

/// Issue 9, item 10: the egress follows HL7 table 0008. A content error (AE) goes to the DLQ at once instead
/// of blocking the partition forever; a rejection with ERR 207 ("resend later") is retried, so the patient's
/// later messages do not overtake it; and a message whose MSH-15 asks for no accept ACK is sent with MSH-15
/// `AL`, so a compliant receiver answers instead of the egress resending it forever.
#[test]
fn the_ack_policy_follows_hl7_table_0008_and_msh15_asks_for_an_answer() {
    common::run_alone(|mut p| async move {
        let seen = policy_receiver(p.receiver_port).await;
        p.start_services();
        let mut c = p.mllp_client().await;
        for (cid, msh15) in [("POL-1", ""), ("POL-2", ""), ("POL-3", "NE"), ("POL-4", "")] {
            let m = format!(
                "MSH|^~\\&|ADMIT|FAC|HL7GW|HL7GW|20261123120000||ADT^A01^ADT_A01|{cid}|P|2.5.1|||{msh15}|\r\
                 EVN|A01|20261123120000\rPID|1||MRN9^^^FAC^MR||DOE^JANE||19700101|F\r"
            );
            if msh15 == "NE" {
                // The ingress, too, sends no accept ACK for NE.
                c.send(m.as_bytes()).await;
            } else {
                let ack = c.call(m.as_bytes()).await.unwrap();
                assert_eq!(support::ack_code(&ack), "AA");
            }
        }
        let mut egress = p.egress_client().await;
        wait_settled(&mut egress, 4, || {
            format!("the receiver saw {:?}", seen.lock().unwrap())
        })
        .await;
        let dead = dead_letters(&mut egress).await;
        assert_eq!(dead, [("POL-1".to_owned(), "AE".to_owned())]);
        let seen = seen.lock().unwrap().clone();
        let order: Vec<&str> = seen.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(
            order,
            ["POL-1", "POL-2", "POL-2", "POL-2", "POL-3", "POL-4"],
            "AE once, AR 207 retried in place, then the rest in order"
        );
        assert_eq!(seen[4].1, "AL", "MSH-15 NE went out as AL");
    });
}

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

/// Sum of a counter's series whose labels contain `labels`, read from an admin address.
fn counter_sum(admin: std::net::SocketAddr, name: &str, labels: &str) -> f64 {
    let (_, body) = support::http_get(admin, "/metrics");
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
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

/// Issue 9 (smaller items): the transformer's dead letters have a replay path. An ORU^R01 arrives while no
/// route takes results: the transformer dead-letters it (`unmatched`). Once the route is added, `Replay` with
/// stage `transformer` sends it back to the inbound topic, the transformer routes it and it arrives.
#[test]
fn a_transformer_dead_letter_is_replayed_through_the_routes_once_they_are_fixed() {
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.start_all(None);
    let oru = "MSH|^~\\&|LAB|FAC|EHR|FAC|20261123120000||ORU^R01|RESULT-1|P|2.5.1\r\
               PID|1||MRN7^^^FAC^MR||DOE^JANE\rOBX|1|NM|GLU||5.5|mmol/L|||||F\r";
    runtime().block_on(async {
        let mut c = p.mllp_client().await;
        let ack = c.call(oru.as_bytes()).await.unwrap();
        assert_eq!(support::ack_code(&ack), "AA");

        let mut egress = p.egress_client().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        let letter = loop {
            let page = egress
                .list_dead_letters(ListDeadLettersRequest {
                    stage: "transformer".into(),
                    ..ListDeadLettersRequest::default()
                })
                .await
                .unwrap()
                .into_inner();
            if let Some(d) = page.dead_letters.into_iter().next() {
                break d;
            }
            assert!(
                Instant::now() < deadline,
                "the unmatched result was not dead-lettered"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        assert_eq!(
            (
                letter.control_id.as_str(),
                letter.reason.as_str(),
                letter.stage.as_str()
            ),
            ("RESULT-1", "unmatched", "transformer")
        );
        // Not listed among the destination's own dead letters.
        assert!(dead_letters(&mut egress).await.is_empty());

        // The route for results is added (the transformer reloads its file), then the replay.
        let routes = format!(
            "{}---\napiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: results}}\n\
             spec:\n  match: {{messageTypes: ['ORU^R01']}}\n  destinations: [lab]\n",
            common::ROUTES
        );
        std::fs::write(p.dir.path().join("routes.yaml"), routes).unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let r = egress
            .replay(ReplayRequest {
                stage: "transformer".into(),
                ..ReplayRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.ids, vec![letter.id]);
    });
    let r = wait_delivered(
        &p.received_dir(),
        &["RESULT-1".to_owned()],
        Duration::from_secs(60),
    );
    assert_eq!(r.copies.get("RESULT-1"), Some(&1));
}

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

/// Produces `messages` (control id, HL7 message) to `topic` as the transformer's outputs for `lab`, all keyed
/// by one patient (one partition, in order). Records up to 4 MB.
async fn produce_outputs(topic: &str, messages: &[(&str, Vec<u8>)]) {
    let producer = support::EnvelopeProducer::with_max_bytes(support::broker(), Some(4_000_000));
    for (id, raw) in messages {
        let m = hl7v2::Message::parse(raw).unwrap();
        let env = hl7gw_runtime::proto::v1::Envelope {
            id: format!("{id}-{}", uuid::Uuid::now_v7().simple()),
            raw: raw.clone().into(),
            header: Some(hl7gw_runtime::envelope::header(
                m.header(),
                hl7v2::Charset::Utf8,
            )),
            key: "FAC|MRN-BIG".into(),
            destination: "lab".into(),
            route: "adt-to-lab".into(),
            ..Default::default()
        };
        producer.send(topic, &env.key, &env).await;
    }
}

/// Starts the pipeline's egress and waits (30 s at most) until its `/readyz` says ready.
async fn start_ready_egress(p: &mut Pipeline) {
    p.start_egress();
    let admin = p.egress.admin.expect("the egress's admin address");
    support::wait_ready_async("egress", admin, Instant::now() + Duration::from_secs(30)).await;
}

/// A receiver taking frames up to 4 MiB that answers AE with a `ack_bytes`-byte ACK (its MSA-3 text) to control
/// ids starting with `BIG`, AA to the others; returns the control ids it got, in order.
async fn big_ack_receiver(port: u16, ack_bytes: usize) -> std::sync::Arc<Mutex<Vec<String>>> {
    use futures_util::{SinkExt, StreamExt};
    let got = std::sync::Arc::new(Mutex::new(Vec::new()));
    let log = got.clone();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut f = tokio_util::codec::Framed::new(s, hl7v2::MllpCodec::new(4 << 20));
                while let Some(Ok(frame)) = f.next().await {
                    let cid = control_id(&hl7v2::Message::parse(&frame).unwrap());
                    log.lock().unwrap().push(cid.clone());
                    let msa = if cid.starts_with("BIG") {
                        format!("AE|{cid}|{}", "E".repeat(ack_bytes))
                    } else {
                        format!("AA|{cid}")
                    };
                    let ack = format!(
                        "MSH|^~\\&|RCV|RCV|HL7GW|HL7GW|20261123120000||ACK^A01^ACK|R1|P|2.5.1\rMSA|{msa}\r"
                    );
                    if f.send(ack.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    got
}

/// The pipeline's egress, ready, delivering to a [`big_ack_receiver`] answering with `ack_bytes`-byte AEs: the
/// control ids the receiver got.
async fn egress_to_big_ack_receiver(
    p: &mut Pipeline,
    ack_bytes: usize,
) -> std::sync::Arc<Mutex<Vec<String>>> {
    let got = big_ack_receiver(p.receiver_port, ack_bytes).await;
    start_ready_egress(p).await;
    got
}

/// Waits (20 s at most) until the receiver `got` the control id `cid`; panics saying `what` was not.
async fn wait_received(got: &Mutex<Vec<String>>, cid: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = got.lock().unwrap().clone();
        if seen.iter().any(|c| c == cid) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the receiver got {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The records of the pipeline's DLQ topic, read (on a blocking thread) until one came and none followed, or
/// `limit` passed.
async fn dlq_records(p: &Pipeline, limit: Duration) -> Vec<support::Record> {
    let dlq = p.topic("dlq");
    tokio::task::spawn_blocking(move || support::read_topic(support::broker(), &dlq, 1, limit))
        .await
        .unwrap()
}

/// Issue 24, item 6: a 1.9 MiB output the receiver refuses with a 200 KB AE. Its dead letter (the message, the
/// receiver's answer and the rejection) is over the 2 MiB record limit: Kafka refused it, and the egress tried
/// again forever while the patient's later messages waited behind it. The dead letter is now shrunk until it
/// fits (the receiver's answer dropped first) and the later messages are delivered.
#[test]
fn a_dead_letter_over_the_record_limit_is_shrunk_and_later_messages_delivered() {
    common::run_alone(|mut p| async move {
        let got = egress_to_big_ack_receiver(&mut p, 200_000).await;
        let mut big = adt_from("ADMIT", "BIG-1", "MRN-BIG");
        big.extend_from_slice(b"NTE|1||");
        big.resize(1_900 * 1024, b'X');
        big.push(b'\r');
        let mut messages = vec![("BIG-1", big.clone())];
        for id in ["AFTER-1", "AFTER-2"] {
            messages.push((id, adt_from("ADMIT", id, "MRN-BIG")));
        }
        produce_outputs(&p.topic("out.lab"), &messages).await;

        wait_received(
            &got,
            "AFTER-2",
            "the messages after the refused one were not delivered",
        )
        .await;
        let dead = dlq_records(&p, Duration::from_secs(10)).await;
        let (d, rej) = support::only_dead_letter(&dead);
        assert_eq!(
            (rej.stage.as_str(), rej.reason.as_str()),
            ("egress", "rejected")
        );
        assert!(rej.ack.is_empty(), "the receiver's answer was dropped");
        assert!(rej.detail.contains("answer"), "{}", rej.detail);
        assert_eq!(
            d.envelope.raw.len(),
            big.len(),
            "the message itself fits and is kept"
        );
        assert_eq!(
            d.envelope.header.clone().unwrap_or_default().control_id,
            "BIG-1"
        );
    });
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

/// Issue 24, item 7: a DLQ topic that refuses even a shrunk dead letter (its `max.message.bytes` far below
/// the egress's) left the egress retrying forever with readiness green. The dead letter is shrunk (answer,
/// then message), readiness says dead letters cannot be written, and once the topic takes it, it lands.
#[test]
fn dead_letters_kafka_refuses_even_shrunk_make_the_egress_unready_with_the_reason() {
    common::run_alone(|mut p| async move {
        let dlq = p.topic("dlq");
        support::create_topic(&dlq, 1, &[("max.message.bytes", "200")]).await;
        let _got = egress_to_big_ack_receiver(&mut p, 1_000).await;
        let http = p.egress.admin.unwrap();
        produce_outputs(
            &p.topic("out.lab"),
            &[("BIG-2", adt_from("ADMIT", "BIG-2", "MRN-BIG"))],
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(20);
        support::wait_unready_async("egress", http, "dead letters cannot be written", deadline)
            .await;
        support::alter_topic(&dlq, "max.message.bytes", "1000000").await;
        let dead = dlq_records(&p, Duration::from_secs(20)).await;
        let (d, rej) = support::only_dead_letter(&dead);
        assert_eq!(rej.reason, "rejected");
        assert!(rej.ack.is_empty() && d.envelope.raw.is_empty(), "{rej:?}");
        assert!(rej.detail.contains("sha256"), "{}", rej.detail);
        support::wait_ready_async("egress", http, Instant::now() + Duration::from_secs(30)).await;
    });
}

/// Issue 24, item 14's corollary: only an answer naming the message's MSH-10 counts, so a message sent without
/// one (a route cleared it) could never be answered and would be sent again forever. It is a dead letter,
/// `no_control_id`, and the messages after it are delivered.
#[test]
fn a_message_without_a_control_id_is_a_dead_letter_not_resent_forever() {
    common::run_alone(|mut p| async move {
        let got = egress_to_big_ack_receiver(&mut p, 0).await;
        let messages = [
            ("NOID", adt_from("ADMIT", "", "MRN-BIG")),
            ("AFTER-3", adt_from("ADMIT", "AFTER-3", "MRN-BIG")),
        ];
        produce_outputs(&p.topic("out.lab"), &messages).await;
        wait_received(&got, "AFTER-3", "the message after it was not delivered").await;
        let dead = dlq_records(&p, Duration::from_secs(10)).await;
        let reasons: Vec<String> = dead
            .iter()
            .map(|d| d.envelope.rejection.clone().unwrap_or_default().reason)
            .collect();
        assert_eq!(reasons, ["no_control_id"]);
        assert!(
            !got.lock().unwrap().iter().any(String::is_empty),
            "it was not sent"
        );
    });
}
