//! `hl7gw receive --http`: a POSTed body is stored as a file and answered 200 with an OperationOutcome;
//! `--reject-every` answers 503 with Retry-After; `--count` stops the receiver.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_hl7gw");

/// One HTTP/1.0 POST: (status line and headers, body).
fn post(port: u16, body: &str, content_type: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /fhir HTTP/1.0\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_owned(), body.to_owned())
}

#[test]
fn stores_posted_bodies_and_answers_like_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["receive", "--http", "--listen", "127.0.0.1:0", "--no-sync"])
        .args(["--reject-every", "2", "--count", "2", "--out"])
        .arg(dir.path());
    let (mut child, line) = hl7gw_testkit::spawn_listening(&mut cmd);
    let port: u16 = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("listening line {line:?}"));

    let bundle = r#"{"resourceType":"Bundle","type":"transaction","entry":[]}"#;
    let (head, body) = post(port, bundle, "application/fhir+json");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert!(body.contains("stored as 000001-http.json"), "{body}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("000001-http.json")).unwrap(),
        bundle
    );

    let (head, _) = post(port, bundle, "application/fhir+json");
    assert!(head.starts_with("HTTP/1.0 503"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );

    let (head, _) = post(port, "MSH|^~\\&|A", "application/hl7-v2");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert!(dir.path().join("000002-http.hl7").is_file());

    // --count 2 reached: the receiver exits by itself.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(status.success());
            break;
        }
        assert!(Instant::now() < deadline, "still running after --count");
        std::thread::sleep(Duration::from_millis(100));
    }
}
