//! `hl7gw-load --grpc` against an in-test `hl7gw.v1.Ingest` server (tonic, on 127.0.0.1): every message goes
//! over `SendStream` with the token, pipelined and sequential, and each ACK is matched to its message.

use hl7gw_load::grpc::proto::ingest_server::{Ingest, IngestServer};
use hl7gw_load::grpc::proto::{SendRequest, SendResponse, SendersRequest, SendersResponse};
use serde_json::Value;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

const TOKEN: &str = "load-test-token-0123";

/// Answers CA to each message, in order, on streams that carry the token; counts the messages.
#[derive(Default)]
struct Gateway {
    received: Arc<AtomicU64>,
}

/// MSH-10 of an ER7 message.
fn control_id(msg: &[u8]) -> Vec<u8> {
    let msh = msg.split(|b| *b == b'\r').next().unwrap_or_default();
    msh.split(|b| *b == b'|')
        .nth(9)
        .unwrap_or_default()
        .to_vec()
}

fn ack(cid: &[u8]) -> SendResponse {
    let mut a = b"MSH|^~\\&|GW|H|LOAD|T|20260101000000||ACK^A01|A1|P|2.5\rMSA|CA|".to_vec();
    a.extend_from_slice(cid);
    a.push(b'\r');
    SendResponse {
        ack: a.into(),
        ack_code: "CA".into(),
        control_id: String::from_utf8_lossy(cid).into_owned(),
        ..SendResponse::default()
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<SendResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Ingest for Gateway {
    async fn send(&self, r: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        Ok(Response::new(ack(&control_id(&r.into_inner().message))))
    }

    type SendStreamStream = Answers;

    async fn send_stream(
        &self,
        r: Request<Streaming<SendRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let auth = r
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if auth != Some(&format!("Bearer {TOKEN}")) {
            return Err(Status::unauthenticated("no token"));
        }
        let received = self.received.clone();
        let answers = r.into_inner().map(move |m| {
            let m = m?;
            received.fetch_add(1, Ordering::Relaxed);
            Ok(ack(&control_id(&m.message)))
        });
        Ok(Response::new(Box::pin(answers)))
    }

    /// The load harness never asks for the sender view.
    async fn senders(
        &self,
        _: Request<SendersRequest>,
    ) -> Result<Response<SendersResponse>, Status> {
        Err(Status::unimplemented("not in this stand-in"))
    }
}

async fn serve() -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let gw = Gateway::default();
    let received = gw.received.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IngestServer::new(gw))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, received)
}

async fn load(args: &[&str]) -> (i32, Value, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_hl7gw-load"))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("hl7gw-load finished in time")
    .expect("running hl7gw-load");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.code().expect("exit code"),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_go_over_send_stream_with_the_token_pipelined_or_not() {
    let (addr, received) = serve().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token file");
    let token = token.to_str().expect("utf-8");
    for in_flight in ["1", "8"] {
        let before = received.load(Ordering::Relaxed);
        let (code, j, out) = load(&[
            "--to",
            &addr,
            "--grpc",
            "--token-file",
            token,
            "--clients",
            "3",
            "--messages",
            "200",
            "--warmup",
            "10",
            "--in-flight",
            in_flight,
            "--json",
        ])
        .await;
        assert_eq!(code, 0, "{out}");
        assert_eq!(j["acks"]["CA"], 600, "{out}");
        assert_eq!(j["errors"], 0, "{out}");
        assert_eq!(j["mismatches"], 0, "{out}");
        assert_eq!(received.load(Ordering::Relaxed) - before, 630, "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_refused_for_want_of_a_token_is_a_setup_error() {
    let (addr, _) = serve().await;
    let (code, _, out) = load(&["--to", &addr, "--grpc", "--messages", "5", "--json"]).await;
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no token"), "{out}");
}
