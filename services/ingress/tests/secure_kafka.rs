//! Issue 11: the ingress against a secured Kafka (the real broker of scripts/kafka.sh `KAFKA_SECURE=1`):
//! SASL_SSL with SCRAM-SHA-512 and mutual TLS work end to end; a wrong password, an unknown CA or a client
//! certificate the broker does not trust never yield an accept ACK, keep the process up and not ready with the
//! reason, and the service recovers by itself once the credentials are right.

use hl7gw_testkit as support;

use std::time::{Duration, Instant};
use support::*;

fn env_with(base: Vec<(&'static str, String)>, topic: &str) -> Vec<(&'static str, String)> {
    let mut env = base;
    env.extend([
        ("HL7GW_INBOUND_TOPIC", topic.to_owned()),
        ("HL7GW_DLQ_TOPIC", format!("{topic}.dlq")),
        ("HL7GW_ACK_TIMEOUT", "3s".into()),
        ("HL7GW_KAFKA__COMPRESSION", "zstd".into()),
    ]);
    env
}

async fn send_one(ingress: &Ingress, control_id: &str) -> String {
    let mut c = Mllp::connect(ingress.mllp).await;
    let ack = c.call(&adt(control_id, "SEC-1")).await.expect("an ACK");
    ack_code(&ack)
}

/// Waits until `/readyz` answers 503 with a body containing `want`; returns the body.
fn wait_not_ready_because(ingress: &Ingress, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_get(ingress.admin, "/readyz");
        if status == 503 && body.contains(want) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never said {want:?}: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_stored_over_sasl_ssl_and_over_mutual_tls() {
    let b = SecureBroker::get();
    let password = b.file("password");
    for (name, env) in [
        ("sasl", b.sasl_env(&password)),
        ("mtls", b.mtls_env("client", "ca.crt")),
    ] {
        let topic = unique_topic(&format!("secure-{name}"));
        let ingress = Ingress::start(&env_with(env, &topic));
        let id = format!("SEC-{name}");
        assert_eq!(send_one(&ingress, &id).await, "AA", "{name}");
        let records = read_topic(&b.plaintext, &topic, 1, Duration::from_secs(20));
        assert_eq!(records.len(), 1, "{name}: the AA'd message is in Kafka");
        assert!(
            String::from_utf8_lossy(&records[0].envelope.raw).contains(&id),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_never_yield_an_accept_and_the_service_stays_up() {
    let b = SecureBroker::get();
    let (_dir, wrong) = support::temp_file("wrong-password", "not-the-password\n");
    let cases = [
        (
            "wrong password",
            b.sasl_env(&wrong.display().to_string()),
            "authentication",
        ),
        (
            "unknown CA",
            b.mtls_env("client", "other-ca.crt"),
            "certificate verify failed",
        ),
        (
            "client certificate of an unknown CA",
            b.mtls_env("other-client", "ca.crt"),
            "kafka",
        ),
    ];
    for (name, env, reason) in cases {
        let topic = unique_topic("secure-bad");
        let mut ingress = Ingress::start_with(&env_with(env, &topic), &[], false);
        let body = wait_not_ready_because(&ingress, reason);
        assert!(!body.contains("not-the-password"), "{name}: {body}");
        let code = send_one(&ingress, "SEC-BAD").await;
        assert!(code == "AR", "{name}: got {code}, never an accept");
        assert!(ingress.is_running(), "{name}: the ingress stays up");
        let (status, _) = http_get(ingress.admin, "/readyz");
        assert_eq!(status, 503, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingress_recovers_by_itself_once_the_credentials_are_accepted() {
    let b = SecureBroker::get();
    let (_dir, password) = support::temp_file("password", "rotated-password");
    let user = format!("rotate-{}", uuid::Uuid::now_v7().simple());
    let topic = unique_topic("secure-rotate");
    let mut env = env_with(b.sasl_env(&password.display().to_string()), &topic);
    for (k, v) in env.iter_mut() {
        if *k == "HL7GW_KAFKA__SECURITY__USERNAME" {
            *v = user.clone();
        }
    }
    // The user does not exist yet: authentication fails.
    let ingress = Ingress::start_with(&env, &[], false);
    wait_not_ready_because(&ingress, "authentication");
    assert_eq!(send_one(&ingress, "SEC-ROT-1").await, "AR");
    // The broker's side is fixed (the user is created with that password): no restart needed.
    b.scram_user(&user, "rotated-password");
    ingress.wait_ready(Duration::from_secs(60));
    assert_eq!(send_one(&ingress, "SEC-ROT-2").await, "AA");
    let records = read_topic(&b.plaintext, &topic, 1, Duration::from_secs(20));
    assert_eq!(records.len(), 1, "only the accepted message is stored");
}
