//! The whole pipeline against a real broker: `hl7gw-load` → ingress → transformer → egress → `hl7gw receive`,
//! all real processes. Every ACKed message must reach the receiver, transformed as its route says, each
//! patient's messages in order — also across a receiver outage, receiver rejections (DLQ, then replay) and
//! SIGKILLs of the transformer and the egress.
//!
//! One test binary, one module per topic (`delivery`, `acks`, `backlog`, `dlq`, `kafka`); here the helpers they
//! share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline as common;

use common::Egress;
use std::time::{Duration, Instant};

mod acks;
mod backlog;
mod delivery;
mod dlq;
mod kafka;

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

/// An ADT^A01 from `app` at facility `FAC`.
fn adt_from(app: &str, control_id: &str, patient: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|{app}|FAC|HL7GW|HL7GW|20261123120000||ADT^A01^ADT_A01|{control_id}|P|2.5.1\r\
         EVN|A01|20261123120000\r\
         PID|1||{patient}^^^FAC^MR||DOE^JANE||19700101|F\r"
    )
    .into_bytes()
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

/// Sum of a counter's series whose labels contain `labels`, read from an admin address.
fn counter_sum(admin: std::net::SocketAddr, name: &str, labels: &str) -> f64 {
    let (_, body) = support::http_get(admin, "/metrics");
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
