//! The whole pipeline against a real broker: `hl7gw-load` → ingress → transformer → egress → `hl7gw receive`,
//! all real processes. Every ACKed message must reach the receiver, transformed as its route says, each
//! patient's messages in order — also across a receiver outage, receiver rejections (DLQ, then replay) and
//! SIGKILLs of the transformer and the egress.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ingress/tests/support/mod.rs"]
mod support;

use hl7gw_runtime::proto::v1::egress_client::EgressClient;
use hl7gw_runtime::proto::v1::{ListDeadLettersRequest, ReplayRequest, StatusRequest};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::{KillOnDrop, bin, broker, free_port, recorded};

/// One pipeline at a time: each is a handful of processes on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

const ROUTES: &str = "\
apiVersion: hl7gw.io/v1alpha1
kind: HL7Route
metadata: {name: adt-to-lab}
spec:
  match: {messageTypes: ['ADT^A*']}
  transforms:
    - set: {path: MSH-5, value: LAB}
    - mask: {path: PID-5}
  destinations: [lab]
";

/// Topics, groups and files of one test's pipeline.
struct Pipeline {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
    ingress_env: Vec<(&'static str, String)>,
    transformer_env: Vec<(&'static str, String)>,
    egress_env: Vec<(&'static str, String)>,
    mllp: u16,
    receiver_port: u16,
    egress_grpc: u16,
    ingress: Option<KillOnDrop>,
    transformer: Option<KillOnDrop>,
    egress: Option<KillOnDrop>,
    receiver: Option<KillOnDrop>,
}

impl Pipeline {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let id = uuid::Uuid::now_v7().simple().to_string();
        let t = |s: &str| format!("t{id}.{s}");
        let env = vec![
            ("HL7GW_KAFKA_BROKERS", broker().to_owned()),
            ("HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS", "3".into()),
            ("RUST_LOG", "warn".into()),
        ];
        let ingress_env = vec![
            ("HL7GW_INBOUND_TOPIC", t("inbound")),
            ("HL7GW_DLQ_TOPIC", t("dlq")),
        ];
        let transformer_env = vec![
            ("HL7GW_INBOUND_TOPIC", t("inbound")),
            ("HL7GW_DLQ_TOPIC", t("dlq")),
            ("HL7GW_OUT_TOPIC_PREFIX", t("out.")),
            ("HL7GW_GROUP_ID", t("transformer")),
            ("HL7GW_TRANSACTIONAL_ID", t("transformer-0")),
        ];
        let egress_env = vec![
            ("HL7GW_DLQ_TOPIC", t("dlq")),
            ("HL7GW_OUT_TOPIC_PREFIX", t("out.")),
            ("HL7GW_GROUP_PREFIX", t("egress")),
        ];
        std::fs::write(dir.path().join("routes.yaml"), ROUTES).unwrap();
        let receiver_port = free_port();
        std::fs::write(
            dir.path().join("egress.yaml"),
            format!(
                "destinations:\n  lab:\n    address: 127.0.0.1:{receiver_port}\n    response_timeout: 5s\n    retry: {{initial_backoff: 100ms, max_backoff: 1s}}\n"
            ),
        )
        .unwrap();
        Self {
            dir,
            env,
            ingress_env,
            transformer_env,
            egress_env,
            mllp: free_port(),
            receiver_port,
            egress_grpc: free_port(),
            ingress: None,
            transformer: None,
            egress: None,
            receiver: None,
        }
    }

    fn received_dir(&self) -> PathBuf {
        self.dir.path().join("received")
    }

    fn spawn(&self, name: &str, args: &[String], extra: &[(&str, String)]) -> KillOnDrop {
        let mut cmd = Command::new(bin(name));
        // The receiver logs a line per message: keep the test output readable.
        let stderr = if name == "hl7gw" {
            Stdio::null()
        } else {
            Stdio::inherit()
        };
        cmd.args(args).stdout(Stdio::piped()).stderr(stderr);
        for (k, v) in self
            .env
            .iter()
            .map(|(k, v)| (*k, v))
            .chain(extra.iter().map(|(k, v)| (*k, v)))
        {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        // Each service prints one line once its ports are bound.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(!line.is_empty(), "{name} exited before listening");
        KillOnDrop(child)
    }

    fn start_ingress(&mut self) {
        let args = [
            "--mllp-addr".into(),
            format!("127.0.0.1:{}", self.mllp),
            "--grpc-addr".into(),
            "127.0.0.1:0".into(),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        self.ingress = Some(self.spawn("hl7gw-ingress", &args, &self.ingress_env));
    }

    fn start_transformer(&mut self) {
        let args = [
            "--grpc-addr".into(),
            "127.0.0.1:0".into(),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        let routes = self.dir.path().join("routes.yaml").display().to_string();
        let mut env = self.transformer_env.clone();
        env.push(("HL7GW_ROUTES__FILE", routes));
        self.transformer = Some(self.spawn("hl7gw-transformer", &args, &env));
    }

    fn start_egress(&mut self) {
        let args = [
            "--config".into(),
            self.dir.path().join("egress.yaml").display().to_string(),
            "--grpc-addr".into(),
            format!("127.0.0.1:{}", self.egress_grpc),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        self.egress = Some(self.spawn("hl7gw-egress", &args, &self.egress_env));
    }

    fn start_receiver(&mut self, reject_every: Option<u32>) {
        let mut args = vec![
            "receive".to_owned(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.receiver_port),
            "--out".into(),
            self.received_dir().display().to_string(),
        ];
        if let Some(n) = reject_every {
            args.extend(["--reject-every".into(), n.to_string()]);
        }
        self.receiver = Some(self.spawn("hl7gw", &args, &[]));
    }

    fn start_all(&mut self, reject_every: Option<u32>) {
        self.start_receiver(reject_every);
        self.start_egress();
        self.start_transformer();
        self.start_ingress();
    }

    /// Runs `hl7gw-load` in count mode, recording ACKed control ids; returns them (all must be AA/CA).
    fn load(&self, clients: u32, per_client: u32) -> Vec<String> {
        let record = self
            .dir
            .path()
            .join(format!("acked-{}.txt", uuid::Uuid::now_v7().simple()));
        let out = Command::new(bin("hl7gw-load"))
            .args(["--to", &format!("127.0.0.1:{}", self.mllp)])
            .args([
                "--clients",
                &clients.to_string(),
                "--messages",
                &per_client.to_string(),
            ])
            .args(["--warmup", "0", "--timeout", "20", "--record-acked"])
            .arg(&record)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "hl7gw-load: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        recorded(&record)
    }

    fn egress_addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.egress_grpc)
    }
}

/// What the receiver stored: control id to (sequence, file content), and how many times each id arrived.
struct Received {
    first: HashMap<String, (u64, Vec<u8>)>,
    copies: HashMap<String, usize>,
}

fn received(dir: &Path) -> Received {
    let mut first = HashMap::new();
    let mut copies: HashMap<String, usize> = HashMap::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".hl7") else {
            continue;
        };
        let Some((seq, _)) = stem.split_once('-') else {
            continue;
        };
        let Ok(seq) = seq.parse::<u64>() else {
            continue;
        };
        let bytes = std::fs::read(e.path()).unwrap();
        let cid = hl7v2::Message::parse(&bytes)
            .ok()
            .and_then(|m| {
                m.get("MSH-10")
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            })
            .unwrap_or_default();
        *copies.entry(cid.clone()).or_default() += 1;
        first
            .entry(cid)
            .and_modify(|(s, b): &mut (u64, Vec<u8>)| {
                if seq < *s {
                    *s = seq;
                    b.clone_from(&bytes);
                }
            })
            .or_insert((seq, bytes));
    }
    Received { first, copies }
}

/// Waits until every id in `ids` is at the receiver.
fn wait_delivered(dir: &Path, ids: &[String], limit: Duration) -> Received {
    let deadline = Instant::now() + limit;
    loop {
        let r = received(dir);
        let missing = ids.iter().filter(|id| !r.first.contains_key(*id)).count();
        if missing == 0 {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} ACKed messages never reached the receiver",
            ids.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Checks transforms and per-patient order (except for `replayed` ids, which arrive when replayed); returns
/// the number of duplicate deliveries.
fn check_delivery(r: &Received, replayed: &[String]) -> usize {
    // Control ids are RUN-<client>-<seq>; the patient (PID-3.1) is per client, so a patient's messages must
    // reach the receiver in increasing <seq>.
    let mut by_patient: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for (cid, (rseq, bytes)) in &r.first {
        let m = hl7v2::Message::parse(bytes).unwrap();
        assert_eq!(
            m.get("MSH-5"),
            Some(&b"LAB"[..]),
            "route set MSH-5 on {cid}"
        );
        assert_eq!(
            m.get("PID-5"),
            Some(&b"***"[..]),
            "route masked PID-5 on {cid}"
        );
        if replayed.contains(cid) {
            continue;
        }
        let patient = String::from_utf8_lossy(m.get("PID-3-1").unwrap()).into_owned();
        let seq: u64 = cid.rsplit('-').next().unwrap().parse().unwrap();
        by_patient.entry(patient).or_default().push((*rseq, seq));
    }
    assert!(
        by_patient.len() > 10,
        "several patients: {}",
        by_patient.len()
    );
    for (patient, mut v) in by_patient {
        v.sort();
        assert!(
            v.windows(2).all(|w| w[0].1 < w[1].1),
            "patient {patient}: messages delivered out of order: {:?}",
            &v[..v.len().min(20)]
        );
    }
    r.copies.values().map(|n| n - 1).sum()
}

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
