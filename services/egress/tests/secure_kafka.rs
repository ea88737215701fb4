//! Issue 11: the whole pipeline (ingress → transformer → egress → receiver) through a secured Kafka, once over
//! SASL_SSL (SCRAM-SHA-512) and once over mutual TLS: every service publishes and consumes there, the
//! transformer's transactions and the egress's dead letters and their listing included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline as common;

use common::{Pipeline, check_delivery};
use std::time::Duration;
use support::SecureBroker;

/// One pipeline at a time: each is a handful of processes on a 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(mode: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let b = SecureBroker::get();
    let mut p = Pipeline::new();
    let security = match mode {
        "sasl" => b.sasl_env(&b.file("password")),
        _ => b.mtls_env("client", "ca.crt"),
    };
    p.env.retain(|(k, _)| *k != "HL7GW_KAFKA__BROKERS");
    p.env.extend(security);
    p.env.push(("HL7GW_KAFKA__COMPRESSION", "zstd".into()));
    // Every 10th message is refused by the receiver and dead-lettered at once.
    let cfg = p.dir.path().join("egress.yaml");
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{yaml}    ack_policy: {{retry: []}}\n")).unwrap();
    p.start_all(Some(10));
    // Ready first: a partition's first records sent while its leader is still being elected can be NAKed
    // (runtime kafka/delivery.rs, `confirmed`), and this test counts on all 100 being accepted.
    p.wait_ready(Duration::from_secs(60));
    let ids = p.load(4, 25);
    assert_eq!(ids.len(), 100, "{mode}: every message accepted");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (dead, r) = rt.block_on(p.wait_settled(&ids, Duration::from_secs(90)));
    assert!(!dead.is_empty(), "{mode}: the refused ones are listed");
    let delivered: Vec<String> = r.first.keys().cloned().collect();
    assert_eq!(delivered.len() + dead.len(), 100, "{mode}");
    check_delivery(&r, &[]);
}

#[test]
fn the_pipeline_runs_over_sasl_ssl() {
    run("sasl");
}

#[test]
fn the_pipeline_runs_over_mutual_tls() {
    run("mtls");
}
