//! Scale events under load: two instances each of the ingress, the transformer and the egress, while instances
//! are added and removed (SIGTERM and SIGKILL). Consumer-group rebalances lose nothing and keep each patient's
//! order at the receiver; the duplicates an egress crash causes are counted and printed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline as common;

use common::{Pipeline, check_delivery, wait_delivered};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{KillOnDrop, recorded};

/// Paced load on one ingress: `clients` × 40 msg/s for `secs`, ACKed ids recorded in `record`.
fn load(port: u16, clients: u32, secs: u32, record: &Path) -> Child {
    support::load_command(port, clients, secs, record)
        .args(["--rate", "40", "--timeout", "15"])
        .stdout(Stdio::null())
        .spawn()
        .expect("starting hl7gw-load")
}

fn sigterm(child: &mut KillOnDrop, name: &str) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(status.success(), "{name} drained and exited 0: {status}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not exit within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn sigkill(child: &mut KillOnDrop) {
    let _ = child.0.kill();
    let _ = child.0.wait();
}

fn assert_running(child: &mut KillOnDrop, name: &str) {
    assert!(child.0.try_wait().unwrap().is_none(), "{name} exited");
}

#[test]
fn instances_added_and_removed_under_load_lose_nothing_and_keep_patient_order() {
    let mut p = Pipeline::new();
    p.start_all(None);
    let (mut ingress2, port2) = p.extra_ingress();
    let mut transformer2 = p.extra_transformer(1);
    let mut egress2 = p.extra_egress();
    let (rec_a, rec_b) = (p.dir.path().join("a.txt"), p.dir.path().join("b.txt"));
    let load_a = load(p.mllp, 3, 50, &rec_a);
    let load_b = load(port2, 3, 50, &rec_b);
    let t0 = Instant::now();
    let at = |s: u64| {
        let until = Duration::from_secs(s).saturating_sub(t0.elapsed());
        std::thread::sleep(until);
    };

    at(8);
    let mut transformer3 = p.extra_transformer(2);
    at(14);
    sigterm(p.transformer.process.as_mut().unwrap(), "transformer 1");
    at(20);
    let mut egress3 = p.extra_egress();
    at(26);
    sigkill(p.egress.process.as_mut().unwrap());
    at(32);
    sigkill(&mut transformer2);
    at(38);
    sigterm(&mut ingress2, "ingress 2");

    let _ = load_a.wait_with_output();
    let _ = load_b.wait_with_output();
    let mut ids = recorded(&rec_a);
    let from_a = ids.len();
    ids.extend(recorded(&rec_b));
    assert!(
        from_a > 1000 && ids.len() > from_a + 500,
        "both loads ran: {from_a} + {}",
        ids.len() - from_a
    );
    let started = Instant::now();
    let r = wait_delivered(&p.received_dir(), &ids, Duration::from_secs(240));
    let duplicates = check_delivery(&r, &[]);
    eprintln!(
        "scale: {} ACKed ({from_a} via ingress 1, {} via ingress 2, stopped at 38 s), all delivered {:.1} s after \
         the load ended, in patient order; {duplicates} duplicates at the receiver (an egress SIGKILLed at 26 s \
         leaves its deliveries since its last commit to the next owner, which skips those the ledger has: what \
         was in the air at the kill may come twice)",
        ids.len(),
        ids.len() - from_a,
        started.elapsed().as_secs_f64()
    );
    assert_running(p.ingress.process.as_mut().unwrap(), "ingress 1");
    assert_running(&mut transformer3, "transformer 3");
    assert_running(&mut egress2, "egress 2");
    assert_running(&mut egress3, "egress 3");
}
