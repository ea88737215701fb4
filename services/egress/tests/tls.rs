//! The egress's MLLP client over TLS and mutual TLS against a real receiver (`hl7gw receive` with a server
//! certificate and a client CA): it delivers with the client certificate, and a receiver requiring one refuses
//! a client without it or with a certificate from another CA.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_egress::config::{ClientTls, Destination, RetryPolicy};
use hl7gw_egress::mllp_client::{MllpClient, Tls};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use support::{bin, pki};

fn destination(address: &str, tls: ClientTls) -> Destination {
    Destination {
        address: address.to_owned(),
        url: None,
        http: Default::default(),
        tls: Some(tls),
        connect_timeout: Duration::from_secs(5),
        response_timeout: Duration::from_secs(5),
        retry: RetryPolicy::default(),
        ..Destination::default()
    }
}

#[tokio::test]
async fn delivers_over_mutual_tls_and_is_refused_without_the_right_certificate() {
    let pki = pki();
    let out = tempfile::tempdir().unwrap();
    let p = |n: &str| pki.path(n).display().to_string();
    let (_receiver, line) = support::spawn_listening(
        Command::new(bin("hl7gw"))
            .args(["receive", "--listen", "127.0.0.1:0", "--out"])
            .arg(out.path())
            .args([
                "--tls-cert",
                &p("server.pem"),
                "--tls-key",
                &p("server.key"),
            ])
            .args(["--client-ca", &p("ca.pem")])
            .stderr(Stdio::null()),
    );
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let msg = b"MSH|^~\\&|APP|FAC|LAB|X|20260101||ADT^A01|TLS-1|P|2.5\rPID|1||P1\r";

    let tls = |cert: Option<&str>| ClientTls {
        ca: pki.path("ca.pem"),
        cert: cert.map(|c| pki.path(&format!("{c}.pem"))),
        key: cert.map(|c| pki.path(&format!("{c}.key"))),
        server_name: Some("localhost".into()),
    };
    let client = |d: Destination| {
        let tls = Tls::from_config("lab", &d).unwrap();
        MllpClient::new(Arc::new(d), tls, Gauge::default(), Counter::default())
    };

    let connected = Gauge::default();
    let d = destination(&addr, tls(Some("client")));
    let mut ok = MllpClient::new(
        Arc::new(d.clone()),
        Tls::from_config("lab", &d).unwrap(),
        connected.clone(),
        Counter::default(),
    );
    // The client certificate's notAfter is in every registry, labelled by use and destination (issue 26).
    let scrape = hl7gw_runtime::metrics::render(&hl7gw_runtime::metrics::registry());
    let not_after = hl7gw_tls::file_not_after(&pki.path("client.pem")).unwrap();
    assert!(
        scrape.lines().any(|l| l
            == format!(r#"hl7gw_tls_certificate_not_after_timestamp_seconds{{use="mllp-client",destination="lab"}} {not_after}"#)),
        "{scrape}"
    );
    let ack = ok
        .send(msg, b"TLS-1")
        .await
        .expect("an ACK over mutual TLS");
    assert_eq!(hl7v2::read_ack(&ack).unwrap().0.as_str(), "AA");
    assert_eq!(connected.get(), 1, "one persistent connection");
    let ack = ok
        .send(msg, b"TLS-1")
        .await
        .expect("a second message on the same connection");
    assert_eq!(hl7v2::read_ack(&ack).unwrap().0.as_str(), "AA");
    assert_eq!(connected.get(), 1);

    for cert in [None, Some("intruder")] {
        let mut refused = client(destination(&addr, tls(cert)));
        assert!(
            refused.send(msg, b"TLS-1").await.is_err(),
            "a client with {cert:?} must not get an answer"
        );
    }
    let files = std::fs::read_dir(out.path()).unwrap().count();
    assert_eq!(files, 2, "only the mutual-TLS messages were stored");
}
