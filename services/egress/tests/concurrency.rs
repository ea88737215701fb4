//! Issue 38: delivery at the receiver's speed. Interleaved messages of many patients through a receiver that
//! answers slowly (`hl7gw receive --delay`): many deliveries in the air at once, each patient's messages in their
//! ACK order, a patient the receiver refuses for a while holding only its own messages, and (MLLP) a SIGKILLed
//! egress losing nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline::{Pipeline, check_delivery, wait_delivered};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{KillOnDrop, bin, broker, http_get, read_topic};

/// The patient the receiver refuses a few times: client 0's fourth patient (`LOAD0-3`, PID-3.1).
const REFUSED: &str = "LOAD0-3^";

/// A receiver on `port` answering after `delay_ms`, refusing `REFUSED` `refuse_times` times.
fn receiver(p: &Pipeline, http: bool, port: u16, delay_ms: u32, refuse_times: u32) -> KillOnDrop {
    let mut cmd = Command::new(bin("hl7gw"));
    cmd.args(["receive", "--listen", &format!("127.0.0.1:{port}"), "--out"])
        .arg(p.received_dir())
        .args(["--no-sync", "--delay", &delay_ms.to_string()])
        .args(["--refuse-containing", REFUSED])
        .args(["--refuse-times", &refuse_times.to_string()])
        .stderr(std::process::Stdio::null());
    if http {
        cmd.arg("--http");
    }
    let (child, line) = support::spawn_listening(&mut cmd);
    assert!(line.starts_with("listening on"), "receiver: {line:?}");
    child
}

/// Samples the egress's `hl7gw_egress_in_flight` every 50 ms until dropped: the most seen.
struct InFlightProbe {
    stop: Arc<AtomicBool>,
    max: std::thread::JoinHandle<f64>,
}

impl InFlightProbe {
    fn start(admin: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let max = std::thread::spawn(move || {
            let mut max = 0f64;
            while !s.load(Ordering::Relaxed) {
                let (_, body) = http_get(admin, "/metrics");
                let v = body
                    .lines()
                    .find_map(|l| l.strip_prefix("hl7gw_egress_in_flight{destination=\"lab\"} "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0.0);
                max = max.max(v);
                std::thread::sleep(Duration::from_millis(50));
            }
            max
        });
        Self { stop, max }
    }

    fn finish(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.max.join().unwrap()
    }
}

/// Of the records on the destination topic that came after the refused patient's first message on its
/// partition, how many the receiver got before that message: with one message in flight per partition, none.
fn overtaking(p: &Pipeline, r: &hl7gw_testkit::pipeline::Received, total: usize) -> (usize, usize) {
    let records = read_topic(
        broker(),
        &p.topic("out.lab"),
        total,
        Duration::from_secs(60),
    );
    let mut at: HashMap<String, (i32, i64)> = HashMap::new();
    for rec in &records {
        let cid = rec.envelope.header.as_ref().unwrap().control_id.clone();
        at.entry(cid).or_insert((rec.partition, rec.offset));
    }
    let refused = |cid: &str| {
        r.first
            .get(cid)
            .is_some_and(|(_, b)| String::from_utf8_lossy(b).contains(REFUSED))
    };
    let (first_cid, &(partition, offset)) = at
        .iter()
        .filter(|(cid, _)| refused(cid))
        .min_by_key(|(_, po)| po.1)
        .expect("the refused patient's messages are on the topic");
    let its_rseq = r.first[first_cid].0;
    let later: Vec<&String> = at
        .iter()
        .filter(|(cid, (pa, off))| *pa == partition && *off > offset && !refused(cid))
        .map(|(cid, _)| cid)
        .collect();
    let before = later
        .iter()
        .filter(|cid| r.first[**cid].0 < its_rseq)
        .count();
    (before, later.len())
}

/// HTTP: a receiver answering in 50 ms gets many requests at once through the pooled client; each patient's
/// messages arrive in their ACK order; the patient it refuses 4 times (503, retried with backoff) holds only
/// its own messages: later messages of other patients on its partition are delivered meanwhile.
#[test]
fn an_http_receiver_gets_many_patients_at_once_and_one_refused_patient_holds_only_itself() {
    let mut p = Pipeline::new();
    let port = support::free_port();
    p.set_destinations(&format!(
        "    lab:\n      url: http://127.0.0.1:{port}/\n      response_timeout: 5s\n      max_in_flight: 16\n      retry: {{initial_backoff: 200ms, max_backoff: 1s}}\n"
    ));
    p.receiver = Some(receiver(&p, true, port, 50, 4));
    p.start_services();
    let probe = InFlightProbe::start(p.egress.admin.unwrap());
    let acked = p.load(4, 150);
    assert_eq!(acked.len(), 600);
    let r = wait_delivered(&p.received_dir(), &acked, Duration::from_secs(120));
    let max_in_flight = probe.finish();
    let duplicates = check_delivery(&r, &[]);
    assert_eq!(duplicates, 0, "no crash, no duplicate");
    assert!(
        max_in_flight >= 4.0,
        "deliveries in the air at once (most seen): {max_in_flight}"
    );
    let (before, later) = overtaking(&p, &r, acked.len());
    println!(
        "in flight at most {max_in_flight}; {before} of {later} later messages on the refused patient's partition delivered before it"
    );
    assert!(
        before > 0,
        "the refused patient held its whole partition: none of {later} later messages overtook it"
    );
}

/// MLLP with `connections: 4`: keys spread over a partition's connections, each patient in order, and an egress
/// SIGKILLed mid-run and started again loses nothing (the duplicates it causes are counted).
#[test]
fn an_mllp_receiver_on_four_connections_per_partition_keeps_order_through_a_sigkill() {
    let mut p = Pipeline::new();
    let port = support::free_port();
    p.set_destinations(&format!(
        "    lab:\n      address: 127.0.0.1:{port}\n      response_timeout: 5s\n      connections: 4\n      retry: {{initial_backoff: 200ms, max_backoff: 1s}}\n"
    ));
    p.receiver = Some(receiver(&p, false, port, 50, 3));
    p.start_services();
    let probe = InFlightProbe::start(p.egress.admin.unwrap());
    let load = {
        let record = p.dir.path().join("acked.txt");
        let child = support::load_command(p.mllp, 4, 8, &record)
            .args(["--rate", "40", "--timeout", "15"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        (child, record)
    };
    std::thread::sleep(Duration::from_secs(4));
    let max_in_flight = probe.finish();
    let egress = p.egress.process.as_mut().unwrap();
    let _ = egress.0.kill();
    let _ = egress.0.wait();
    p.start_egress();
    let (mut child, record) = load;
    assert!(child.wait().unwrap().success(), "hl7gw-load");
    let acked = support::recorded(&record);
    assert!(acked.len() > 1000, "acked {}", acked.len());
    let r = wait_delivered(&p.received_dir(), &acked, Duration::from_secs(120));
    let duplicates = check_delivery(&r, &[]);
    let (_, metrics) = http_get(p.egress.admin.unwrap(), "/metrics");
    let suppressed = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("hl7gw_egress_duplicates_suppressed_total{destination=\"lab\"} ")
        })
        .unwrap_or("0")
        .to_owned();
    println!(
        "{} delivered, {duplicates} duplicates after the SIGKILL, {suppressed} not sent again (the ledger had them); \
         in flight at most {max_in_flight} before it",
        acked.len()
    );
    assert!(
        max_in_flight > 3.0,
        "more than one connection per partition in use (most in the air: {max_in_flight})"
    );
    // What the receiver can get twice is what was in the air at the kill (at most 12 here) and the deliveries
    // whose ledger event had not reached Kafka; without the ledger's look-up, everything delivered since the last
    // commit (500 ms, ~80 messages at this rate) came again.
    assert!(
        duplicates <= 60,
        "{duplicates} duplicates: more than what was in the air at the kill"
    );
}
