//! Issue 11: the egress's admin API (dead letters with patient data, replay) over TLS and mutual TLS, refused to
//! anonymous callers by default, allowed per method to named tokens and client certificates, every call audited
//! without message content.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_testkit::pipeline as common;

use common::Pipeline;
use hl7gw_runtime::proto::v1::egress_client::EgressClient;
use hl7gw_runtime::proto::v1::{ListDeadLettersRequest, ReplayRequest, StatusRequest};
use std::process::Command;
use std::time::Duration;
use support::{KillOnDrop, bin, pki};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const OPS: &str = "ops-token-0123456789abcdef";
const VIEWER: &str = "viewer-token-0123456789abcdef";

/// Starts an egress whose gRPC listener uses `grpc_yaml`; returns it, its gRPC address and its log file.
fn egress(p: &Pipeline, grpc_yaml: &str) -> (KillOnDrop, String, std::path::PathBuf) {
    let (child, grpc, _, log) = egress_with_admin(p, grpc_yaml);
    (child, grpc, log)
}

/// [`egress`], with the admin (`/metrics`) address too.
fn egress_with_admin(
    p: &Pipeline,
    grpc_yaml: &str,
) -> (KillOnDrop, String, std::net::SocketAddr, std::path::PathBuf) {
    let cfg = p.dir.path().join("secure-egress.yaml");
    let base = std::fs::read_to_string(p.dir.path().join("egress.yaml")).unwrap();
    // The pipeline's egress.yaml starts with its own grpc: section; this test brings another.
    let destinations = &base[base.find("destinations:").unwrap()..];
    std::fs::write(&cfg, format!("{grpc_yaml}{destinations}")).unwrap();
    let log = p.dir.path().join("egress.log");
    let mut cmd = Command::new(bin("hl7gw-egress"));
    cmd.args(["--config", cfg.to_str().unwrap()])
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in p.env.iter().chain(&p.egress.env) {
        cmd.env(k, v);
    }
    cmd.env("RUST_LOG", "warn,hl7gw::audit=info");
    let (child, line) = support::spawn_listening(&mut cmd);
    let grpc = support::listening_field(&line, "grpc").to_owned();
    let admin = support::listening_field(&line, "admin").parse().unwrap();
    (child, grpc, admin, log)
}

async fn channel(
    addr: &str,
    tls: Option<ClientTlsConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut e = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30));
    if let Some(t) = tls {
        e = e.tls_config(t).unwrap();
    }
    e.connect().await
}

fn with_token<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    r.map(|_| Code::Ok).unwrap_or_else(|s| {
        eprintln!("call refused: {s:?}");
        s.code()
    })
}

/// The code of each admin call made with `token` on `ch`.
async fn codes(ch: Channel, token: Option<&str>) -> [Code; 3] {
    // zstd both ways: every service accepts gzip and zstd.
    use tonic::codec::CompressionEncoding::Zstd;
    let mut c = EgressClient::new(ch)
        .send_compressed(Zstd)
        .accept_compressed(Zstd);
    [
        code(c.status(with_token(StatusRequest::default(), token)).await),
        code(
            c.list_dead_letters(with_token(
                ListDeadLettersRequest {
                    destination: "lab".into(),
                    ..ListDeadLettersRequest::default()
                },
                token,
            ))
            .await,
        ),
        code(
            c.replay(with_token(
                ReplayRequest {
                    ids: vec!["no-such-id".into()],
                    ..ReplayRequest::default()
                },
                token,
            ))
            .await,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_need_tls_and_an_allowed_caller_and_are_audited() {
    let p = Pipeline::new();
    let pki = pki();
    std::fs::write(
        p.dir.path().join("tokens"),
        format!("# operators\nops {OPS}\nviewer {VIEWER}\n"),
    )
    .unwrap();
    let grpc = format!(
        "grpc:\n  tls: {{cert: {}, key: {}, client_ca: {}}}\n  tokens_file: {}\n  allow:\n    \
         Status: [authenticated]\n    ListDeadLetters: [token:ops, cert:hl7-client]\n    Replay: [token:ops]\n",
        pki.file("server.pem"),
        pki.file("server.key"),
        pki.file("ca.pem"),
        p.dir.path().join("tokens").display()
    );
    let (_egress, addr, log) = egress(&p, &grpc);
    let ca = Certificate::from_pem(std::fs::read(pki.path("ca.pem")).unwrap());
    let tls = || {
        ClientTlsConfig::new()
            .ca_certificate(ca.clone())
            .domain_name("localhost")
    };
    let identity = |name: &str| {
        Identity::from_pem(
            std::fs::read(pki.path(&format!("{name}.pem"))).unwrap(),
            std::fs::read(pki.path(&format!("{name}.key"))).unwrap(),
        )
    };

    // Plaintext to a TLS listener: no answer at all.
    let plain = channel(&addr, None).await;
    if let Ok(ch) = plain {
        let got = codes(ch, Some(OPS)).await;
        assert!(got.iter().all(|c| *c != Code::Ok), "plaintext got {got:?}");
    }
    // TLS without credentials: refused everywhere (deny by default for admin methods).
    let anonymous = codes(channel(&addr, Some(tls())).await.unwrap(), None).await;
    assert_eq!(anonymous, [Code::Unauthenticated; 3]);
    // A token nobody issued.
    let bogus = codes(
        channel(&addr, Some(tls())).await.unwrap(),
        Some("made-up-token-0123456789"),
    )
    .await;
    assert_eq!(bogus, [Code::Unauthenticated; 3]);
    // viewer: Status only.
    let viewer = codes(channel(&addr, Some(tls())).await.unwrap(), Some(VIEWER)).await;
    assert_eq!(
        viewer,
        [Code::Ok, Code::PermissionDenied, Code::PermissionDenied]
    );
    // ops: everything (the replay finds nothing to replay: OK with 0).
    let ops = codes(channel(&addr, Some(tls())).await.unwrap(), Some(OPS)).await;
    assert_eq!(ops, [Code::Ok, Code::Ok, Code::Ok]);
    // A client certificate (CN=hl7-client): Status and ListDeadLetters, not Replay.
    let cert = codes(
        channel(&addr, Some(tls().identity(identity("client"))))
            .await
            .unwrap(),
        None,
    )
    .await;
    assert_eq!(cert, [Code::Ok, Code::Ok, Code::PermissionDenied]);
    // A certificate from another CA never gets a connection.
    if let Ok(ch) = channel(&addr, Some(tls().identity(identity("intruder")))).await {
        let got = codes(ch, None).await;
        assert!(got.iter().all(|c| *c != Code::Ok), "intruder got {got:?}");
    }

    // The operator's CLI: the same calls over TLS with a token file.
    let token_file = p.dir.path().join("ops.token");
    std::fs::write(&token_file, format!("{OPS}\n")).unwrap();
    let (to, ca) = (format!("https://{addr}"), pki.file("ca.pem"));
    let cli = |args: &[&str], token: bool| {
        let token = token.then_some(token_file.as_path());
        support::output_text(&mut support::admin_cli(args, &to, Some(&ca), token))
    };
    let (ok, _, err) = cli(&["deadletters", "--destination", "lab"], true);
    assert!(ok && err.contains("0 dead letter(s)"), "{err}");
    let (ok, _, err) = cli(&["deadletters", "--destination", "lab"], false);
    assert!(!ok && err.contains("Unauthenticated"), "{err}");
    let (ok, _, err) = cli(&["replay", "--id", "no-such-id"], true);
    assert!(ok && err.contains("0 replayed"), "{err}");

    // grpcurl as the README shows it, through reflection (no protos needed), with the token.
    let grpcurl = support::tool("grpcurl");
    let out = Command::new(&grpcurl)
        .args(["-cacert", &pki.file("ca.pem")])
        .args(["-H", &format!("authorization: Bearer {OPS}")])
        .args([
            "-d",
            r#"{"destination":"lab"}"#,
            &addr,
            "hl7gw.v1.Egress/ListDeadLetters",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "grpcurl ListDeadLetters: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&grpcurl)
        .args(["-cacert", &pki.file("ca.pem"), &addr, "list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("hl7gw.v1.Egress") && listed.contains("grpc.health.v1.Health"),
        "{listed}"
    );

    // Every admin call is audited: who, what, result; no token in the log.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        support::audited(
            &text,
            &["token:ops", "ListDeadLetters", "ok: 0 dead letters"]
        ),
        "{text}"
    );
    assert!(
        support::audited(&text, &["cert:hl7-client", "Replay", "refused"]),
        "{text}"
    );
    assert!(
        support::admin_calls(&text)
            .iter()
            .filter(|l| l.contains("refused"))
            .count()
            >= 9,
        "refusals audited: {text}"
    );
    assert!(
        !text.contains(OPS) && !text.contains(VIEWER),
        "a token leaked into the log"
    );
}

#[test]
fn a_plaintext_egress_refuses_anonymous_admin_calls_by_default() {
    let p = Pipeline::new();
    let (_egress, addr, _log) = egress(&p, "");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let got = codes(channel(&addr, None).await.unwrap(), None).await;
        assert_eq!(got, [Code::Unauthenticated; 3]);
    });
}

/// The gRPC section of an egress with the tokens `ops` and `viewer` (written to the pipeline's folder): both may
/// list dead letters, and `also` (one more `Method: [callers]` line) allows another method.
fn ops_and_viewer(p: &Pipeline, also: &str) -> String {
    let tokens = p.dir.path().join("tokens");
    std::fs::write(&tokens, format!("ops {OPS}\nviewer {VIEWER}\n")).unwrap();
    format!(
        "grpc:\n  tokens_file: {}\n  allow:\n    ListDeadLetters: [token:ops, token:viewer]\n    {also}\n",
        tokens.display()
    )
}

/// A dead letter of destination `lab` whose message names the test patient, written to the DLQ as the egress
/// would write it.
async fn dead_letter(p: &Pipeline, control_id: &str) {
    use hl7gw_runtime::proto::v1::{Envelope, Header, Rejection};
    let env = Envelope {
        id: hl7gw_runtime::envelope::new_id(),
        destination: "lab".into(),
        raw: support::adt(control_id, "MRN-4711").into(),
        header: Some(Header {
            message_type: "ADT".into(),
            control_id: control_id.into(),
            ..Header::default()
        }),
        rejection: Some(Rejection {
            stage: "egress".into(),
            reason: "rejected".into(),
            ..Rejection::default()
        }),
        ..Envelope::default()
    };
    support::produce_envelope(support::broker(), &p.topic("dlq"), &env.id, &env).await;
}

/// Issue 36, item 1: message bodies are their own permission (`ReadMessages`; RBAC `messages get`). A viewer
/// allowed to list dead letters gets ids and codes, never the message; an operator allowed `ReadMessages` gets
/// it; both are audited. Item 7: the CLI sends its token over plaintext to a loopback address (what
/// `kubectl port-forward` gives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_lists_dead_letters_but_never_reads_a_message() {
    let p = Pipeline::new();
    dead_letter(&p, "BODY1").await;
    let grpc = ops_and_viewer(&p, "ReadMessages: [token:ops]");
    let (_egress, addr, log) = egress(&p, &grpc);
    let mut c = EgressClient::new(channel(&addr, None).await.unwrap());
    let list = |with: bool| ListDeadLettersRequest {
        destination: "lab".into(),
        include_envelope: with,
        ..ListDeadLettersRequest::default()
    };
    // The letter is listed for the viewer, without the message (read back from the DLQ: wait for it).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let letters = loop {
        let r = c
            .list_dead_letters(with_token(list(false), Some(VIEWER)))
            .await
            .unwrap()
            .into_inner();
        if !r.dead_letters.is_empty() || std::time::Instant::now() > deadline {
            break r.dead_letters;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].control_id, "BODY1");
    assert!(letters[0].envelope.is_none());
    // With the message: refused to the viewer, whatever else it may do.
    let viewer = c
        .list_dead_letters(with_token(list(true), Some(VIEWER)))
        .await;
    match viewer {
        Err(s) => {
            assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
            assert!(s.message().contains("ReadMessages"), "{s:?}");
        }
        Ok(r) => panic!(
            "the viewer read the message: {:?}",
            r.into_inner().dead_letters[0]
                .envelope
                .as_ref()
                .map(|e| String::from_utf8_lossy(&e.raw).into_owned())
        ),
    }
    // The operator may.
    let ops = c
        .list_dead_letters(with_token(list(true), Some(OPS)))
        .await
        .unwrap()
        .into_inner();
    let raw = &ops.dead_letters[0].envelope.as_ref().unwrap().raw;
    assert!(String::from_utf8_lossy(raw).contains("MRN-4711"));

    // The CLI over plaintext to 127.0.0.1 with a token (a port-forward): the listing works for the viewer,
    // `--with-message` is refused with the permission named.
    let cli = |token: &str, with_message: bool| {
        let file = p.dir.path().join("cli.token");
        std::fs::write(&file, format!("{token}\n")).unwrap();
        let list = ["deadletters", "--destination", "lab"];
        let mut cmd =
            support::admin_cli(&list, &format!("http://{addr}"), None, Some(file.as_path()));
        if with_message {
            cmd.arg("--with-message");
        }
        support::output_text(&mut cmd)
    };
    let (ok, out, err) = cli(VIEWER, false);
    assert!(
        ok && out.contains("BODY1") && !out.contains("MRN-4711"),
        "{out}{err}"
    );
    let (ok, out, err) = cli(VIEWER, true);
    assert!(
        !ok && err.contains("PermissionDenied") && !out.contains("MRN-4711"),
        "{out}{err}"
    );
    let (ok, out, err) = cli(OPS, true);
    assert!(ok && out.contains("MRN-4711"), "{out}{err}");

    // Audited: the viewer's refusal names the permission; the operator's answer says it held messages.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        support::audited(&text, &["ReadMessages", "refused", "viewer"]),
        "{text}"
    );
    assert!(
        support::audited(&text, &["token:ops", "with their messages"]),
        "{text}"
    );
    assert!(
        !text.contains("MRN-4711"),
        "patient data in the log: {text}"
    );
}

/// Issue 36, item 6: dead-letter listings and traces read Kafka on demand, so at most a few run at once per
/// caller (and per process); more are refused with RESOURCE_EXHAUSTED and counted, and a call whose caller
/// went away stops reading (its place is free again within one Kafka request's timeout, not when its 30 s
/// budget ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_are_bounded_per_caller_and_stop_when_the_caller_goes() {
    let mut p = Pipeline::new();
    // A "broker" that takes connections and never answers: a listing waits for it, retrying, until its budget
    // (30 s) runs out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    p.egress.env.push((
        "HL7GW_KAFKA__BROKERS",
        silent.local_addr().unwrap().to_string(),
    ));
    let grpc = ops_and_viewer(&p, "Trace: [token:ops, token:viewer]");
    let (_egress, addr, admin, _log) = egress_with_admin(&p, &grpc);
    let ch = channel(&addr, None).await.unwrap();
    let list = || ListDeadLettersRequest {
        destination: "lab".into(),
        ..ListDeadLettersRequest::default()
    };
    let trace = || hl7gw_runtime::proto::v1::TraceRequest {
        control_id: "NOPE".into(),
        ..hl7gw_runtime::proto::v1::TraceRequest::default()
    };
    // Two slow listings of the operator's.
    let mut slow: Vec<_> = (0..2)
        .map(|_| {
            let mut c = EgressClient::new(ch.clone());
            tokio::spawn(async move { c.list_dead_letters(with_token(list(), Some(OPS))).await })
        })
        .collect();
    // Both reading (the egress serves its gRPC once it started, which a silent Kafka makes slow).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !support::http_get(admin, "/metrics")
        .1
        .contains("hl7gw_egress_admin_scans_in_flight 2")
    {
        if let Some(i) = slow.iter().position(|h| h.is_finished()) {
            let r = slow.swap_remove(i).await.unwrap();
            panic!("a listing did not wait: {:?}", r.map(|r| r.into_inner()));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the listings did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A third from the same caller, listing or trace: refused at once.
    let mut c = EgressClient::new(ch.clone());
    let started = std::time::Instant::now();
    let third = c.list_dead_letters(with_token(list(), Some(OPS))).await;
    assert_eq!(code(third), Code::ResourceExhausted);
    assert_eq!(
        code(c.trace(with_token(trace(), Some(OPS))).await),
        Code::ResourceExhausted
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Another caller is not held up by the operator's calls (its trace fails for want of Kafka, later).
    assert_ne!(
        code(c.trace(with_token(trace(), Some(VIEWER))).await),
        Code::ResourceExhausted
    );
    let metrics = support::http_get(admin, "/metrics").1;
    for series in [
        "hl7gw_egress_admin_scans_refused_total{method=\"ListDeadLetters\",limit=\"caller\"} 1",
        "hl7gw_egress_admin_scans_refused_total{method=\"Trace\",limit=\"caller\"} 1",
        "hl7gw_egress_admin_scans_in_flight 2",
    ] {
        assert!(metrics.contains(series), "no {series}: {metrics}");
    }
    // The operator gives up (the calls are cancelled): their Kafka reading stops and the places are free
    // again, long before the listings' budget would have ended.
    let cancelled = std::time::Instant::now();
    for h in slow {
        h.abort();
    }
    loop {
        let m = support::http_get(admin, "/metrics").1;
        if m.contains("hl7gw_egress_admin_scans_in_flight 0") {
            eprintln!(
                "the cancelled listings stopped after {:?}",
                cancelled.elapsed()
            );
            break;
        }
        assert!(
            cancelled.elapsed() < Duration::from_secs(8),
            "the cancelled listings are still reading: {m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(
        code(c.trace(with_token(trace(), Some(OPS))).await),
        Code::ResourceExhausted
    );
}
