//! Issue 26: the delivery ledger (`hl7.events`) and the operator's tools on it, driven as an operator would:
//! real processes, a real broker, the `hl7gw` CLI over TLS with a token. The ledger misses no output and says
//! nothing that did not happen, across SIGKILLs of the transformer and the egress; `hl7gw trace` finds a
//! message delivered, one dead-lettered and one replayed; a replay run again does not send anything twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_runtime::ledger::kind;
use hl7gw_testkit::pipeline::{self as common, Pipeline, read_events, received};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::{pki, recorded, runtime};

#[test]
fn the_ledger_accounts_for_every_output_across_sigkills() {
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.dead_letter_refusals();
    p.start_all(Some(10));
    let record = p.dir.path().join("acked.txt");
    let mut load = p.load_through_sigkills(&record);
    let deadline = Instant::now() + Duration::from_secs(120);
    while load.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the load run did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    let ids = recorded(&record);
    assert!(ids.len() > 300, "the run sent messages: {}", ids.len());
    let (dead, r) = runtime().block_on(p.wait_settled(&ids, Duration::from_secs(240)));
    // Settled at the receiver and in the DLQ; the ledger's last events may still be in flight.
    std::thread::sleep(Duration::from_secs(2));
    let events = read_events(&p.topic("events"), Duration::from_secs(60));

    // By control id (each load message has its own): the events of each kind, and their envelope ids.
    let mut by: HashMap<(&str, &str), usize> = HashMap::new();
    let mut routed_ids: HashMap<&str, &str> = HashMap::new();
    for (_, _, e) in &events {
        *by.entry((e.control_id.as_str(), e.kind.as_str()))
            .or_default() += 1;
        if e.kind == kind::ROUTED {
            routed_ids.insert(e.envelope_id.as_str(), e.control_id.as_str());
        }
    }
    let n = |cid: &str, k: &str| by.get(&(cid, k)).copied().unwrap_or(0);
    let dlq = support::read_topic(
        support::broker(),
        &p.topic("dlq"),
        dead.len(),
        Duration::from_secs(30),
    );
    let dlq_by_cid = |cid: &str| {
        dlq.iter()
            .filter(|d| {
                d.envelope
                    .header
                    .as_ref()
                    .is_some_and(|h| h.control_id == cid)
            })
            .count()
    };
    let mut twice = 0;
    for cid in &ids {
        // The transformer's events are in its transactions: exactly one `routed` per output, kills or not.
        assert_eq!(n(cid, kind::ROUTED), 1, "{cid}: routed events");
        let delivered = n(cid, kind::DELIVERED);
        let dead_lettered = n(cid, kind::DEAD_LETTERED);
        // Misses nothing: every output has its outcome.
        assert!(
            delivered + dead_lettered >= 1,
            "{cid}: no outcome in the ledger"
        );
        // Says nothing that did not happen: no more deliveries than the receiver stored, no more dead
        // letters than the DLQ holds.
        let copies = r.copies.get(cid).copied().unwrap_or(0);
        assert!(
            delivered <= copies,
            "{cid}: {delivered} delivered events, {copies} at the receiver"
        );
        assert!(
            dead_lettered <= dlq_by_cid(cid),
            "{cid}: {dead_lettered} dead-lettered events"
        );
        if delivered + dead_lettered > 1 {
            twice += 1;
        }
    }
    // Every outcome is of an output the transformer made (no event out of nowhere).
    for (_, _, e) in &events {
        if e.kind == kind::DELIVERED || e.kind == kind::DEAD_LETTERED {
            assert!(routed_ids.contains_key(e.envelope_id.as_str()), "{e:?}");
            assert_eq!(e.stage, "egress");
            assert_eq!(e.destination, "lab");
        }
        // Ids, types, times and codes: never the message.
        assert!(e.envelope_id.len() == 36 && e.pod.len() < 100, "{e:?}");
    }
    let duplicates: usize = r.copies.values().map(|c| c - 1).sum();
    eprintln!(
        "ledger across SIGKILLs: {} ACKed, {} events, {} dead letters, {twice} outputs with two outcomes \
         (delivered again after the kill: {duplicates} duplicates at the receiver)",
        ids.len(),
        events.len(),
        dead.len()
    );
}

/// Rewrites the pipeline's egress.yaml so its gRPC listener is TLS (the CLI sends tokens only over TLS).
fn tls_admin(p: &Pipeline, pki: &support::pki::Pki) {
    let cfg = p.dir.path().join("egress.yaml");
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    let yaml = yaml.replacen(
        "grpc:\n",
        &format!(
            "grpc:\n  tls: {{cert: {}, key: {}}}\n",
            pki.file("server.pem"),
            pki.file("server.key")
        ),
        1,
    );
    std::fs::write(&cfg, yaml).unwrap();
}

/// Runs the operator's CLI against the pipeline's egress: (success, stdout, stderr).
fn hl7gw(p: &Pipeline, pki: &support::pki::Pki, args: &[&str]) -> (bool, String, String) {
    let token = p.dir.path().join("ops.token");
    std::fs::write(&token, format!("{}\n", common::OPS_TOKEN)).unwrap();
    let to = format!("https://127.0.0.1:{}", p.egress_grpc);
    let ca = pki.file("ca.pem");
    support::output_text(&mut support::admin_cli(
        args,
        &to,
        Some(&ca),
        Some(token.as_path()),
    ))
}

fn json_lines(s: &str) -> Vec<serde_json::Value> {
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn kinds(traced: &serde_json::Value) -> Vec<String> {
    traced["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn trace_finds_delivered_dead_lettered_and_replayed_and_replay_runs_once() {
    let _serial = common::one_at_a_time();
    let mut p = Pipeline::new();
    p.dead_letter_refusals();
    let pki = pki();
    tls_admin(&p, &pki);
    // Every 3rd message the receiver gets is refused: a dead letter.
    p.start_all(Some(3));
    // An empty DLQ lists nothing: `--since` once failed on it (librdkafka refuses an empty offsets lookup).
    let (ok, _, err) = hl7gw(&p, &pki, &["deadletters", "--since", "1h"]);
    assert!(ok, "deadletters --since on an empty DLQ: {err}");
    let ids = p.load(1, 12);
    assert_eq!(ids.len(), 12);
    let deadline = Instant::now() + Duration::from_secs(120);
    let dead = loop {
        let (ok, out, err) = hl7gw(
            &p,
            &pki,
            &["deadletters", "--destination", "lab", "--since", "1h"],
        );
        assert!(ok || Instant::now() < deadline, "{err}");
        if !ok {
            eprintln!("{err}");
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        let dead = json_lines(&out);
        let delivered = received(&p.received_dir()).first.len();
        if dead.len() + delivered >= ids.len() {
            break dead;
        }
        assert!(
            Instant::now() < deadline,
            "not settled: {} dead, {delivered} delivered",
            dead.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(dead.len(), 4, "{dead:?}");
    // Input the ingress refuses (an unsupported version) is NAKed and listed as an ingress dead letter.
    let bad = String::from_utf8(support::adt("BADVER-1", "P9"))
        .unwrap()
        .replace("|P|2.5.1\r", "|P|9.9\r");
    let nak = runtime().block_on(async {
        let mut c = p.mllp_client().await;
        c.call(bad.as_bytes()).await.unwrap()
    });
    assert_ne!(support::ack_code(&nak), "AA");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, err) = hl7gw(
            &p,
            &pki,
            &["deadletters", "--stage", "ingress", "--since", "1h"],
        );
        assert!(ok, "{err}");
        if let Some(d) = json_lines(&out).first() {
            assert_eq!(d["control_id"], "BADVER-1");
            assert_eq!(d["stage"], "ingress");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ingress dead letter was not listed"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let (ok, _, err) = hl7gw(&p, &pki, &["replay", "--stage", "ingress"]);
    assert!(
        ok && err.contains("0 replayed"),
        "ingress dead letters are not replayed: {err}"
    );
    let dead_cid = dead[0]["control_id"].as_str().unwrap().to_owned();
    let delivered_cid = ids
        .iter()
        .find(|c| **c != dead_cid && !dead.iter().any(|d| d["control_id"] == **c))
        .unwrap()
        .clone();

    // Found by control id: received, routed, delivered (the table, then JSON lines).
    let (ok, table, err) = hl7gw(
        &p,
        &pki,
        &["trace", "--control-id", &delivered_cid, "--since", "2h"],
    );
    assert!(ok, "{err}");
    assert!(
        table.contains("delivered") && table.contains("routed") && table.contains("received"),
        "{table}"
    );
    let (ok, out, err) = hl7gw(
        &p,
        &pki,
        &["trace", "--control-id", &delivered_cid, "--json"],
    );
    assert!(ok, "{err}");
    let traced = json_lines(&out);
    assert_eq!(traced.len(), 1, "{out}");
    assert!(
        traced[0]["inbound"]
            .as_str()
            .unwrap()
            .starts_with(&p.topic("inbound"))
    );
    assert_eq!(kinds(&traced[0]), ["routed", "delivered"], "{out}");
    let delivered = &traced[0]["events"][1];
    assert!(
        delivered["ack_code"] == "AA" || delivered["ack_code"] == "CA",
        "{out}"
    );
    assert_eq!(delivered["destination"], "lab");

    // Dead-lettered, then found again by its envelope id.
    let dead_id = dead[0]["id"].as_str().unwrap().to_owned();
    let (ok, out, err) = hl7gw(&p, &pki, &["trace", "--id", &dead_id, "--json"]);
    assert!(ok, "{err}");
    let traced = json_lines(&out);
    assert_eq!(kinds(&traced[0]), ["routed", "dead_lettered"], "{out}");
    assert_eq!(traced[0]["events"][1]["reason"], "rejected");

    // The receiver accepts everything now. A dry run lists the 4 and replays none.
    p.receiver = None;
    p.start_receiver(None);
    let (ok, out, err) = hl7gw(
        &p,
        &pki,
        &["replay", "--stage", "egress", "--since", "12h", "--dry-run"],
    );
    assert!(ok && err.contains("4 would be replayed"), "{err}");
    assert_eq!(json_lines(&out).len(), 4);
    // One letter first (as a replay cut short after it would have), then the whole selection again.
    let (ok, out, err) = hl7gw(&p, &pki, &["replay", "--id", &dead_id]);
    assert!(ok && err.contains("1 replayed"), "{err}");
    assert_eq!(out.trim(), dead_id);
    // As the runbook says it; then, as after a cut, the same command again.
    let again = [
        "replay", "--stage", "egress", "--since", "12h", "--reason", "rejected",
    ];
    let (ok, _, err) = hl7gw(&p, &pki, &again);
    assert!(
        ok && err.contains("3 replayed") && err.contains("1 skipped"),
        "{err}"
    );
    // Run again: nothing is sent twice.
    let (ok, _, err) = hl7gw(&p, &pki, &again);
    assert!(
        ok && err.contains("0 replayed") && err.contains("4 skipped"),
        "{err}"
    );
    let r = common::wait_delivered(&p.received_dir(), &ids, Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(3));
    let r2 = received(&p.received_dir());
    for d in &dead {
        let cid = d["control_id"].as_str().unwrap();
        assert_eq!(
            r2.copies.get(cid),
            Some(&1),
            "{cid} delivered once after the replays"
        );
    }
    assert_eq!(r.first.len(), ids.len());
    // The listing says who replayed each letter.
    let (ok, out, _) = hl7gw(&p, &pki, &["deadletters", "--destination", "lab"]);
    assert!(ok);
    assert!(
        json_lines(&out)
            .iter()
            .all(|d| d["replayed_by"] == "token:ops"),
        "{out}"
    );

    // The replayed message's trace: routed, dead-lettered, replayed (by whom), delivered.
    let (ok, out, err) = hl7gw(&p, &pki, &["trace", "--id", &dead_id, "--json"]);
    assert!(ok, "{err}");
    let traced = json_lines(&out);
    assert_eq!(
        kinds(&traced[0]),
        ["routed", "dead_lettered", "replayed", "delivered"],
        "{out}"
    );
    assert_eq!(traced[0]["events"][2]["replayed_by"], "token:ops");
    // --force sends a replayed letter again.
    let (ok, _, err) = hl7gw(&p, &pki, &["replay", "--id", &dead_id, "--force"]);
    assert!(ok && err.contains("1 replayed"), "{err}");

    // Status: the destination, its backlog and the age of its oldest undelivered message (none now).
    let (ok, out, err) = hl7gw(&p, &pki, &["status", "--json"]);
    assert!(ok, "{err}");
    let s = &json_lines(&out)[0];
    assert_eq!(s["destination"], "lab");
    assert_eq!(s["dead_lettered_by_reason"]["rejected"], 4);
    assert!(
        s["oldest_undelivered_age_seconds"].as_f64().unwrap() < 5.0,
        "{s}"
    );
    let (ok, table, _) = hl7gw(&p, &pki, &["status"]);
    assert!(
        ok && table.contains("OLDEST AGE") && table.contains("lab"),
        "{table}"
    );
}

#[test]
fn ledger_events_kafka_refuses_make_the_egress_unready_until_they_are_written() {
    common::run_alone(|mut p| async move {
        // The egress's events go to a topic that refuses records over 100 bytes (an event is a few hundred).
        let small = p.topic("events-small");
        support::create_topic(&small, 1, &[("max.message.bytes", "100")]).await;
        for (k, v) in &mut p.egress.env {
            if *k == "HL7GW_LEDGER__TOPIC" {
                v.clone_from(&small);
            }
        }
        p.start_all(None);
        p.wait_ready(Duration::from_secs(60));
        let http = p.egress.admin.unwrap();
        let mut c = p.mllp_client().await;
        assert_eq!(
            support::ack_code(&c.call(&support::adt("LEDGER-1", "P1")).await.unwrap()),
            "AA"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        support::wait_unready_async("egress", http, "ledger events cannot be written", deadline)
            .await;
        support::alter_topic(&small, "max.message.bytes", "1000000").await;
        let events =
            tokio::task::spawn_blocking(move || read_events(&small, Duration::from_secs(30)))
                .await
                .unwrap();
        assert!(
            events
                .iter()
                .any(|(_, _, e)| e.kind == kind::DELIVERED && e.control_id == "LEDGER-1"),
            "{events:?}"
        );
        support::wait_ready_async("egress", http, Instant::now() + Duration::from_secs(30)).await;
    });
}
