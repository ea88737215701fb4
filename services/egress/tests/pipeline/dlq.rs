//! Dead letters: a transformer's replayed through fixed routes, one over the record limit shrunk, one Kafka refuses
//! even shrunk, a message without a control id.

use super::*;
use hl7gw_runtime::proto::v1::{ListDeadLettersRequest, ReplayRequest};
use hl7gw_testkit::pipeline::{Pipeline, wait_delivered};
use hl7gw_testkit::runtime;
use std::sync::Mutex;

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
