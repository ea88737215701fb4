//! The HTTP destination against a real FHIR server (HAPI FHIR's RestfulServer, validating every write; the
//! harness in tests/fhir), the whole pipeline in front of it: MLLP → ingress → transformer (`toFhir`,
//! transaction Bundles) → egress → POST to the server's base.
//!
//! - every corpus message of a type the converter maps is delivered, none refused by the validator, and a
//!   second delivery of the same messages leaves the server's resource counts as they were;
//! - each patient's messages arrive in the order they were sent (the last update wins);
//! - the answers decide like ACKs: a server that is down is waited for, a 429 waits its `Retry-After`, a 400
//!   with an OperationOutcome is a dead letter with the status and the outcome, and its replay is delivered;
//! - refused credentials (403, a token endpoint's refusal, a discovered token endpoint that may not be used) are
//!   bounded, then a replayable dead letter; a token's `expires_in` is clamped;
//! - a replay is whole (re-read from its topic when the dead letter lost the message) or refused, and a forced
//!   one is sent.
//!
//! One test binary, one module per topic (`delivery`, `answers`, `auth`, `replay`); here the helpers they share.

use hl7gw_testkit as support;
use hl7gw_testkit::fhir::FhirServer;
use hl7gw_testkit::pipeline::{Pipeline, dead_letters};
use std::time::{Duration, Instant};

mod answers;
mod auth;
mod delivery;
mod replay;

/// A route sending every message type the converter maps to `fhir` as a transaction Bundle (times without an
/// offset are taken as US Eastern: appointments need instants). Three corpus senders name no assigning
/// authority anywhere (no CX-4/CX-6, no MSH-4): the route names one for each, as a site would, instead of
/// letting their patients be refused as `unscoped_patient_identity`.
fn routes() -> String {
    let types: Vec<String> = hl7gw_fhir::SUPPORTED
        .iter()
        .map(|t| format!("'{t}'"))
        .collect();
    format!(
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: to-fhir}}\nspec:\n  match: {{messageTypes: [{}]}}\n  transforms:\n    - toFhir:\n        bundleType: transaction\n        timezone: America/New_York\n        senders: {{ADT-HIS: {{authority: ADT-HIS}}, RADIS1: {{authority: RADIS1}}, DMCOE: {{authority: DMCOE}}}}\n  destinations: [fhir]\n",
        types.join(", ")
    )
}

/// The pipeline in front of the server: the [`routes`], the egress's `destinations` (YAML, four spaces in),
/// every service started and ready.
fn fhir_pipeline(destinations: &str) -> Pipeline {
    let mut p = Pipeline::new();
    p.set_routes(&routes());
    p.set_destinations(destinations);
    p.start_services();
    p.wait_ready(Duration::from_secs(60));
    p
}

fn destination(url: &str) -> String {
    format!(
        "  fhir:\n    url: {url}\n    response_timeout: 30s\n    retry: {{initial_backoff: 100ms, max_backoff: 1s}}\n"
    )
}

/// Sends each message on one MLLP connection; the control ids the ingress accepted (AA/CA).
async fn send_all(p: &Pipeline, messages: &[Vec<u8>]) -> Vec<String> {
    let mut mllp = p.mllp_client().await;
    let mut acked = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let Some(ack) = mllp.call(m).await else {
            panic!(
                "no ACK for message {i}: {:?}",
                String::from_utf8_lossy(&m[..m.len().min(300)])
            );
        };
        if matches!(support::ack_code(&ack).as_str(), "AA" | "CA") {
            acked.push(support::field(m, "MSH-10").unwrap_or_default());
        }
    }
    acked
}

/// POSTs to the server's base that it answered with 2xx.
fn delivered(server: &FhirServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["status"].as_u64().is_some_and(|s| s / 100 == 2))
        .count()
}

/// Waits until the server took `n` transactions; panics after `limit` with the dead letters and metrics.
async fn wait_delivered(p: &Pipeline, server: &FhirServer, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let got = delivered(server);
        if got >= n {
            return;
        }
        if Instant::now() > deadline {
            let mut egress = p.egress_client().await;
            let dead = dead_letters(&mut egress, "fhir", true).await;
            let reasons: Vec<String> = dead
                .iter()
                .take(10)
                .map(|d| {
                    let r = d
                        .envelope
                        .as_ref()
                        .and_then(|e| e.rejection.clone())
                        .unwrap_or_default();
                    format!(
                        "{} {}: {} {}",
                        d.control_id,
                        d.reason,
                        r.detail,
                        String::from_utf8_lossy(&r.ack[..r.ack.len().min(600)])
                    )
                })
                .collect();
            panic!(
                "{got} of {n} delivered; {} dead letters:\n{}\n{}",
                dead.len(),
                reasons.join("\n"),
                p.metrics_summary()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits for the dead letter of `control_id` at `destination` (with its envelope); panics after `limit`.
async fn wait_dead_letter(
    p: &Pipeline,
    control_id: &str,
    limit: Duration,
) -> hl7gw_runtime::proto::v1::DeadLetter {
    let mut egress = p.egress_client().await;
    let deadline = Instant::now() + limit;
    loop {
        let dead = dead_letters(&mut egress, "fhir", true).await;
        if let Some(d) = dead.into_iter().find(|d| d.control_id == control_id) {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "no dead letter for {control_id}\n{}",
            p.metrics_summary()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Replays the dead letters of `ids` (forced when `force`); the count replayed.
async fn replay_ids(p: &Pipeline, ids: &[String], force: bool) -> u32 {
    let mut egress = p.egress_client().await;
    egress
        .replay(hl7gw_runtime::proto::v1::ReplayRequest {
            ids: ids.to_vec(),
            force,
            ..Default::default()
        })
        .await
        .expect("Replay")
        .into_inner()
        .replayed
}

/// The ledger's events of `kind` (by the egress) for `control_id`: their reasons and HTTP statuses.
fn egress_events(p: &Pipeline, kind: &str, control_id: &str) -> Vec<(String, u32)> {
    hl7gw_testkit::pipeline::read_events(&p.topic("events"), Duration::from_secs(30))
        .into_iter()
        .filter(|(_, _, e)| e.kind == kind && e.control_id == control_id && e.stage == "egress")
        .map(|(_, _, e)| (e.reason, e.http_status))
        .collect()
}

/// The POSTs to the server's base so far: (status, body bytes).
fn posts(server: &FhirServer) -> Vec<(u64, i64)> {
    server
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/fhir")
        .map(|r| {
            (
                r["status"].as_u64().unwrap_or(0),
                r["bytes"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}
