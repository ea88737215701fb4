//! A real 3-broker KRaft cluster (scripts/kafka.sh, RF 3, `min.insync.replicas=2`) under the whole pipeline:
//! `hl7gw-load` → ingress → transformer → egress → `hl7gw receive`, while brokers are SIGKILLed, restarted one by
//! one (a rolling restart) and the active controller is killed. In every scenario no service exits, every
//! message answered AA reaches the receiver, and the destination topic (read_committed) holds no control id twice.
//! The failure matrix it prints is the table in docs/BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline as common;

use common::{Pipeline, received, wait_delivered};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::{Cluster, read_topic, recorded};

/// Client port of node 1 (nodes 2 and 3: +10, +20), below the ephemeral port range.
const PORT: u16 = 29500;
/// Messages per second per client: steady load that leaves the 2-core machine room for three brokers.
const RATE: &str = "40";
const CLIENTS: u32 = 4;

/// One row of the failure matrix.
struct Row {
    scenario: &'static str,
    acked: usize,
    naks: u64,
    delivered: usize,
    duplicates: usize,
    longest_gap: Duration,
    catch_up: Duration,
}

fn start_load(p: &Pipeline, secs: u32, record: &Path) -> Child {
    support::load_command(p.mllp, CLIENTS, secs, record)
        .args(["--rate", RATE, "--timeout", "15"])
        .spawn()
        .expect("starting hl7gw-load")
}

/// Watches the record file: the longest time without a new AA until `until` (when the load stops sending; the
/// load's wait for its last answers after that is not a gap the senders would see), or until `running` clears.
fn watch_acks(
    record: &Path,
    until: Instant,
    running: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Duration> {
    let record = record.to_owned();
    std::thread::spawn(move || {
        let mut last = (0usize, Instant::now());
        let mut longest = Duration::ZERO;
        while running.load(Ordering::Acquire) && Instant::now() < until {
            let n = std::fs::metadata(&record).map_or(0, |m| m.len() as usize);
            let now = Instant::now();
            if n != last.0 {
                if last.0 > 0 {
                    longest = longest.max(now - last.1);
                }
                last = (n, now);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // A gap still open when the load ended (no AA since) counts too.
        if last.0 > 0 {
            longest = longest.max(Instant::now().min(until) - last.1);
        }
        longest
    })
}

/// Prints what each service's metrics say (on a failure).
fn diagnose(p: &Pipeline) {
    for part in p.parts() {
        let (name, Some(admin)) = (part.name, part.admin) else {
            continue;
        };
        let (_, body) = support::http_get(admin, "/metrics");
        let interesting: Vec<&str> = body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.contains("_bucket") && !l.ends_with(" 0"))
            .collect();
        eprintln!("--- {name} metrics:\n{}", interesting.join("\n"));
        eprintln!(
            "--- {name} /readyz: {:?}",
            support::http_get(admin, "/readyz")
        );
    }
    // Where each thread of the transformer is (a stuck librdkafka call shows here).
    if let Some(t) = p.transformer.process.as_ref() {
        let out = Command::new("gdb")
            .args([
                "-p",
                &t.0.id().to_string(),
                "-batch",
                "-ex",
                "thread apply all bt 25",
            ])
            .output();
        if let Ok(out) = out {
            eprintln!(
                "--- transformer threads:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}

fn assert_all_running(p: &mut Pipeline, scenario: &str) {
    for part in p.parts_mut() {
        let name = part.name;
        let status = part.process.as_mut().unwrap().0.try_wait().unwrap();
        assert!(
            status.is_none(),
            "{scenario}: the {name} exited ({status:?})"
        );
    }
}

/// Runs the load for `secs` while `event` happens, then checks that every ACKed message arrived.
fn scenario(
    p: &mut Pipeline,
    name: &'static str,
    secs: u32,
    event: impl FnOnce(),
    all: &mut Vec<String>,
) -> Row {
    let record = p.dir.path().join(format!("acked-{}.txt", all.len()));
    let running = Arc::new(AtomicBool::new(true));
    let load = start_load(p, secs, &record);
    let watcher = watch_acks(
        &record,
        Instant::now() + Duration::from_secs(u64::from(secs)),
        running.clone(),
    );
    std::thread::sleep(Duration::from_secs(6));
    event();
    let out = load.wait_with_output().unwrap();
    running.store(false, Ordering::Release);
    let longest_gap = watcher.join().unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let naks = ["AR", "CR", "AE", "CE"]
        .iter()
        .map(|c| summary["acks"][c].as_u64().unwrap_or(0))
        .sum();
    let ids = recorded(&record);
    assert!(
        ids.len() > 100,
        "{name}: the load ran ({} ACKed): {summary}",
        ids.len()
    );
    assert_all_running(p, name);
    let ended = Instant::now();
    let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_delivered(&p.received_dir(), &ids, Duration::from_secs(180))
    })) {
        Ok(r) => r,
        Err(e) => {
            diagnose(p);
            std::panic::resume_unwind(e);
        }
    };
    let catch_up = ended.elapsed();
    let duplicates = ids
        .iter()
        .map(|id| r.copies.get(id).copied().unwrap_or(0).saturating_sub(1))
        .sum();
    assert_all_running(p, name);
    all.extend(ids.iter().cloned());
    let row = Row {
        scenario: name,
        acked: ids.len(),
        naks,
        delivered: ids.iter().filter(|id| r.first.contains_key(*id)).count(),
        duplicates,
        longest_gap,
        catch_up,
    };
    eprintln!(
        "cluster: {name}: {} ACKed, {} NAKs, {} delivered, {} duplicates at the receiver, longest ACK gap {:.1} s, \
         all delivered {:.1} s after the load ended",
        row.acked,
        row.naks,
        row.delivered,
        row.duplicates,
        row.longest_gap.as_secs_f64(),
        row.catch_up.as_secs_f64()
    );
    row
}

#[test]
#[ignore = "3 brokers, ~5 min: scripts/test.sh (make test) runs it beside the doc tests and chart checks; by hand: cargo test -p hl7gw-egress --test cluster -- --ignored"]
fn broker_failures_and_rolling_restarts_lose_nothing_and_stop_no_service() {
    let cluster = Cluster::up(PORT);
    let brokers = cluster.brokers();
    let mut p = Pipeline::new();
    p.env.retain(|(k, _)| *k != "HL7GW_KAFKA__BROKERS");
    p.env.push(("HL7GW_KAFKA__BROKERS", brokers.clone()));
    p.env.push(("HL7GW_KAFKA__REPLICATION_FACTOR", "3".into()));
    p.env.push(("HL7GW_KAFKA__MIN_INSYNC_REPLICAS", "2".into()));
    // The services' own lifecycle lines (rebalances, recoveries), without librdkafka's connection noise.
    p.env.retain(|(k, _)| *k != "RUST_LOG");
    p.env
        .push(("RUST_LOG", "info,librdkafka=off,rdkafka=off".into()));
    p.start_all(None);
    let mut all = Vec::new();
    let mut rows = Vec::new();

    // Each broker in turn, so the one coordinating the transformer's transactions and the consumer groups is
    // among them whatever the hash of their ids chose.
    for (n, name) in [
        (1, "broker 1 SIGKILLed, restarted 8 s later"),
        (2, "broker 2 SIGKILLed, restarted 8 s later"),
        (3, "broker 3 SIGKILLed, restarted 8 s later"),
    ] {
        rows.push(scenario(
            &mut p,
            name,
            25,
            || {
                cluster.kill(n);
                std::thread::sleep(Duration::from_secs(8));
                cluster.start(n);
            },
            &mut all,
        ));
    }
    rows.push(scenario(
        &mut p,
        "rolling restart: each broker stopped (SIGTERM) and started, one after the other",
        75,
        || {
            for n in 1..=3 {
                cluster.stop(n);
                cluster.start(n);
            }
        },
        &mut all,
    ));
    rows.push(scenario(
        &mut p,
        "the active controller SIGKILLed, restarted 10 s later",
        30,
        || {
            let n = cluster.controller();
            cluster.kill(n);
            std::thread::sleep(Duration::from_secs(10));
            cluster.start(n);
        },
        &mut all,
    ));

    rows.push(scenario(
        &mut p,
        "two brokers SIGKILLed (below min.insync.replicas), restarted 10 s later",
        30,
        || {
            cluster.kill(2);
            cluster.kill(3);
            std::thread::sleep(Duration::from_secs(10));
            cluster.start(2);
            cluster.start(3);
        },
        &mut all,
    ));
    let below_min_isr = rows.last().unwrap();
    // With one broker of three no write reaches min.insync.replicas=2: the ingress answers 207 (AR) and no AA
    // until the brokers are back; every AA it gave is delivered (checked above).
    assert!(
        below_min_isr.naks > 0,
        "NAKs while below min.insync.replicas"
    );
    assert!(
        below_min_isr.longest_gap >= Duration::from_secs(8),
        "no AA while below min.insync.replicas (longest gap {:?})",
        below_min_isr.longest_gap
    );

    // Exactly once into the destination topic: no control id twice for read_committed readers.
    let out_topic = p.topic("out.lab");
    let records = read_topic(&brokers, &out_topic, all.len(), Duration::from_secs(120));
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut outputs: HashMap<String, usize> = HashMap::new();
    for r in &records {
        *seen
            .entry(r.envelope.header.clone().unwrap_or_default().control_id)
            .or_default() += 1;
        *outputs.entry(r.envelope.id.clone()).or_default() += 1;
    }
    // The transformer adds no copy: an inbound record (its envelope id) is in the output at most as often as
    // it is in the input. The input itself can hold a record twice (seen once: one envelope at two
    // consecutive offsets of hl7.inbound, written by the ingress's idempotent producer while a broker was
    // SIGKILLed; most likely a timed-out request sent again under a bumped producer epoch, which the broker
    // cannot recognise as a retry). The egress's duplicate window keeps such a copy from the receiver.
    let inbound_topic = p.topic("inbound");
    let mut inputs: HashMap<String, usize> = HashMap::new();
    for r in read_topic(
        &brokers,
        &inbound_topic,
        all.len(),
        Duration::from_secs(120),
    ) {
        *inputs.entry(r.envelope.id.clone()).or_default() += 1;
    }
    let added: Vec<_> = outputs
        .iter()
        .filter(|(id, n)| **n > inputs.get(*id).copied().unwrap_or(0))
        .collect();
    assert!(
        added.is_empty(),
        "envelopes more often in {out_topic} than in {inbound_topic}: {added:?}"
    );
    let twice_in: Vec<_> = inputs.iter().filter(|(_, n)| **n > 1).collect();
    if !twice_in.is_empty() {
        eprintln!(
            "cluster: {} inbound record(s) written twice by the ingress's producer: {twice_in:?}",
            twice_in.len()
        );
    }
    let twice: Vec<_> = seen
        .iter()
        .filter(|(id, n)| {
            **n > 1
                && !records.iter().any(|r| {
                    r.envelope
                        .header
                        .as_ref()
                        .is_some_and(|h| &h.control_id == *id)
                        && inputs.get(&r.envelope.id).copied().unwrap_or(0) > 1
                })
        })
        .collect();
    assert!(
        twice.is_empty(),
        "control ids twice in {out_topic} (not from a twice-written input): {twice:?}"
    );
    assert!(
        all.iter().all(|id| seen.contains_key(id)),
        "every ACKed id is in {out_topic}"
    );
    let receiver = received(&p.received_dir());

    eprintln!(
        "\n| scenario | ACKed | delivered | lost | duplicates at the receiver | NAKs | longest ACK gap | all delivered after the load |"
    );
    eprintln!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        eprintln!(
            "| {} | {} | {} | {} | {} | {} | {:.1} s | {:.1} s |",
            r.scenario,
            r.acked,
            r.delivered,
            r.acked - r.delivered,
            r.duplicates,
            r.naks,
            r.longest_gap.as_secs_f64(),
            r.catch_up.as_secs_f64()
        );
    }
    eprintln!(
        "({} control ids in {out_topic}, none twice; {} distinct at the receiver)",
        seen.len(),
        receiver.first.len()
    );
    drop(p);
}
