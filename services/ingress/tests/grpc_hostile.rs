//! Hostile and careless gRPC clients (issue 24) against the real ingress binary and a real broker: idle TCP
//! connections beyond `grpc_max_connections`, connections that idle or grow old, and streams whose answers
//! are never read. Each test bounds every wait and uses small timeouts from the `grpc:` settings.
#![allow(clippy::unwrap_used)] // test helpers: a failed step fails the test

use hl7gw_testkit as support;

use hl7gw_runtime::proto::v1::SendRequest;
use hl7gw_runtime::proto::v1::ingest_client::IngestClient;
use std::time::{Duration, Instant};
use support::*;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// An ingress on fresh topics, with `extra` settings.
fn start(extra: impl IntoIterator<Item = (&'static str, String)>) -> (Ingress, Topics) {
    Ingress::on_fresh_topics("test.grpc_hostile", extra)
}

fn endpoint(ingress: &Ingress) -> Endpoint {
    Endpoint::from_shared(format!("http://{}", ingress.grpc))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
}

/// One `Send` of `id` on `client`: its ACK code.
async fn send(client: &mut IngestClient<Channel>, id: &str) -> Result<String, tonic::Status> {
    client
        .send(SendRequest {
            message: adt(id, "P1").into(),
        })
        .await
        .map(|r| r.into_inner().ack_code)
}

/// Issue 24, item 2: TCP connections that never send the HTTP/2 preface are closed after
/// `grpc.first_stream_timeout`, so more of them than `grpc_max_connections` cannot keep health checks and
/// Ingest out (they waited in the backlog for ever before, with readiness 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tcp_connections_beyond_the_grpc_limit_do_not_keep_health_checks_and_ingest_out() {
    let (ingress, _t) = start([
        ("HL7GW_GRPC_MAX_CONNECTIONS", "8".to_owned()),
        ("HL7GW_GRPC__FIRST_STREAM_TIMEOUT", "1s".to_owned()),
    ]);
    // 20 connections that send nothing: 8 take every slot, the others close the oldest of them (none opened a
    // call) or wait for a slot; every one is closed by its first-stream deadline.
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(tokio::net::TcpStream::connect(ingress.grpc).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let served = tokio::time::timeout(Duration::from_secs(10), async {
        let mut health = HealthClient::new(endpoint(&ingress).connect().await.unwrap());
        let status = health
            .check(HealthCheckRequest::default())
            .await
            .unwrap()
            .into_inner()
            .status;
        let mut ingest = IngestClient::new(endpoint(&ingress).connect().await.unwrap());
        (status, send(&mut ingest, "IDLE1").await.unwrap())
    })
    .await;
    let Ok((status, code)) = served else {
        panic!(
            "with 20 idle connections and grpc_max_connections 8, no health check or Send was served within 10 s"
        );
    };
    assert_eq!(status, 1, "SERVING");
    assert_eq!(code, "AA");
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "served after {:?}",
        t.elapsed()
    );
    // Every idle connection is closed: evicted for a newcomer (none ever opened a call) or at its first-stream
    // deadline, whichever comes first (which one depends on the machine's timing, so the sum is what counts).
    let closed = |reason: &str| {
        ingress.metric(&format!(
            "hl7gw_grpc_connections_closed_total{{reason=\"{reason}\"}}"
        ))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut timed_out, mut evicted) = (0.0, 0.0);
    while Instant::now() < deadline {
        (timed_out, evicted) = (closed("first_stream_timeout"), closed("evicted"));
        if timed_out + evicted >= 20.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        timed_out + evicted >= 20.0,
        "of 20 idle connections {timed_out} closed at their first-stream deadline and {evicted} evicted"
    );
    assert!(timed_out >= 1.0, "no first_stream_timeout close");
    drop(idle);
}

/// Issue 24, item 2: a connection without calls for `grpc.idle_timeout` gets a GOAWAY (the client reconnects
/// for its next call); one older than `grpc.max_connection_age` gets one too, and a call still running
/// `max_connection_age_grace` later is cut. Each is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_connections_are_sent_away_when_idle_or_old() {
    let (ingress, _t) = start([
        ("HL7GW_GRPC__IDLE_TIMEOUT", "1s".to_owned()),
        ("HL7GW_GRPC__MAX_CONNECTION_AGE", "3s".to_owned()),
        ("HL7GW_GRPC__MAX_CONNECTION_AGE_GRACE", "1s".to_owned()),
    ]);
    let metric = |reason: &str| {
        ingress.metric(&format!(
            "hl7gw_grpc_connections_closed_total{{reason=\"{reason}\"}}"
        ))
    };
    // Idle: sent away after 1 s without a call; the next call is served on a new connection.
    let mut client = IngestClient::new(endpoint(&ingress).connect().await.unwrap());
    assert_eq!(send(&mut client, "AGE1").await.unwrap(), "AA");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(metric("idle_timeout") >= 1.0, "no idle_timeout close");
    assert_eq!(send(&mut client, "AGE2").await.unwrap(), "AA");

    // Old: a stream kept open is not idle, but the connection is sent away at 3 s and cut at 4 s.
    let mut client = IngestClient::new(endpoint(&ingress).connect().await.unwrap());
    let opened = Instant::now();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(SendRequest {
        message: adt("AGE3", "P1").into(),
    })
    .await
    .unwrap();
    let mut answers = client
        .send_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = answers.message().await.unwrap().unwrap();
    assert_eq!(first.ack_code, "AA");
    let end = tokio::time::timeout(Duration::from_secs(10), answers.message()).await;
    assert!(
        end.is_ok(),
        "a stream on a connection past max_connection_age + grace was not ended within 10 s"
    );
    let took = opened.elapsed();
    assert!(
        took >= Duration::from_millis(3500),
        "the stream ended after {took:?}, before age + grace"
    );
    assert!(metric("max_age") >= 1.0, "no max_age GOAWAY");
    assert!(metric("grace_expired") >= 1.0, "no grace_expired close");
    drop(tx);
}

/// Issue 24, item 3: a `SendStream` whose answers the client does not take within `write_timeout` is ended
/// (RESOURCE_EXHAUSTED after the answers already sent) and counted in `write_timeouts_total`, so it stops
/// holding in-flight bytes; a sender that reads its answers on the same ingress is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_stream_that_never_reads_its_answers_is_ended_after_write_timeout() {
    let (ingress, _t) = start([
        ("HL7GW_WRITE_TIMEOUT", "1s".to_owned()),
        ("HL7GW_ACK_MODE", "fast".to_owned()),
    ]);
    // The never-reading stream: far more answers than its HTTP/2 window (16 KiB here; hyper's clients take
    // 2 MiB by default, which only moves the point where the server starts to wait) and the stream's queue
    // hold.
    let mut rude = IngestClient::new(
        endpoint(&ingress)
            .initial_stream_window_size(16 * 1024)
            .connect()
            .await
            .unwrap(),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let sender = tokio::spawn(async move {
        let mut sent = 0u32;
        for i in 0..3000 {
            let req = SendRequest {
                message: adt(&format!("RUDE{i}"), "P1").into(),
            };
            // The ingress stops reading a stream it has ended: give up after 5 s without progress.
            match tokio::time::timeout(Duration::from_secs(5), tx.send(req)).await {
                Ok(Ok(())) => sent += 1,
                _ => break,
            }
        }
        sent
    });
    let mut answers = rude
        .send_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Meanwhile a well-behaved stream on its own connection is answered.
    let mut polite = IngestClient::new(endpoint(&ingress).connect().await.unwrap());
    let (ptx, prx) = tokio::sync::mpsc::channel(4);
    let mut pan = polite
        .send_stream(tokio_stream::wrappers::ReceiverStream::new(prx))
        .await
        .unwrap()
        .into_inner();
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut i = 0;
    while Instant::now() < deadline {
        ptx.send(SendRequest {
            message: adt(&format!("POLITE{i}"), "P2").into(),
        })
        .await
        .unwrap();
        let a = tokio::time::timeout(Duration::from_secs(5), pan.message())
            .await
            .expect("the polite stream got no answer within 5 s")
            .unwrap()
            .unwrap();
        assert_eq!(a.ack_code, "AA", "POLITE{i}");
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let timeouts = ingress.metric("hl7gw_ingress_write_timeouts_total");
    assert!(
        timeouts >= 1.0,
        "a stream that read none of its answers for 6 s was not ended (write_timeout 1s)"
    );
    // Reading now: the answers that were on their way, then the end.
    let mut read = 0u32;
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), answers.message()).await {
            Ok(Ok(Some(_))) => read += 1,
            Ok(Ok(None)) => break None,
            Ok(Err(s)) => break Some(s),
            Err(_) => panic!("the ended stream neither answered nor ended within 10 s"),
        }
    };
    let sent = sender.await.unwrap();
    assert!(
        read < sent,
        "all {sent} answers arrived: the stream was not ended"
    );
    let status = end.expect("an ended stream ends with a status");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
}

/// Issue 24, item 2: a client that finished the HTTP/2 handshake and then stops answering (a dead peer, a
/// half-open tunnel) is disconnected when a keepalive PING goes unanswered, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_client_that_stops_answering_pings_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (ingress, _t) = start([
        ("HL7GW_GRPC__KEEPALIVE_INTERVAL", "1s".to_owned()),
        ("HL7GW_GRPC__KEEPALIVE_TIMEOUT", "1s".to_owned()),
        ("HL7GW_GRPC__FIRST_STREAM_TIMEOUT", "60s".to_owned()),
    ]);
    let mut c = tokio::net::TcpStream::connect(ingress.grpc).await.unwrap();
    // The client preface and an empty SETTINGS frame, then silence: no SETTINGS ACK, no PING answer.
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let opened = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(_)) | Ok(Err(_))),
        "the connection stayed open {:?} without answering a PING",
        opened.elapsed()
    );
    let closed =
        ingress.metric("hl7gw_grpc_connections_closed_total{reason=\"keepalive_timeout\"}");
    assert_eq!(closed, 1.0, "keepalive_timeout closes");
}

/// Issue 36, item 2: connections from one address (127.0.0.2) each holding an open `Health/Watch` stream take
/// at most `grpc_max_connections_per_address` slots, so health checks and Sends from another address are
/// answered; the extra connections are closed at once and counted. Before: they took the whole pool and the
/// others waited in the backlog (2 of 13 health checks failed in the run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_watch_streams_from_one_address_leave_room_for_the_others() {
    let (ingress, _t) = start([
        ("HL7GW_GRPC_MAX_CONNECTIONS", "12".to_owned()),
        ("HL7GW_GRPC_MAX_CONNECTIONS_PER_ADDRESS", "4".to_owned()),
    ]);
    let flooder = std::net::IpAddr::from([127, 0, 0, 2]);
    let mut watchers = Vec::new();
    for _ in 0..30 {
        let ep = endpoint(&ingress).local_address(Some(flooder));
        watchers.push(tokio::spawn(async move {
            let Ok(channel) = ep.connect().await else {
                return;
            };
            let mut health = HealthClient::new(channel);
            if let Ok(stream) = health.watch(HealthCheckRequest::default()).await {
                let mut stream = stream.into_inner();
                while let Ok(Some(_)) = stream.message().await {}
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..5 {
        let started = Instant::now();
        let served = tokio::time::timeout(Duration::from_secs(5), async {
            let mut health = HealthClient::new(endpoint(&ingress).connect().await.unwrap());
            health
                .check(HealthCheckRequest::default())
                .await
                .unwrap()
                .into_inner()
                .status
        })
        .await;
        assert_eq!(
            served.ok(),
            Some(1),
            "health check {i} from another address not served after {:?}",
            started.elapsed()
        );
    }
    let mut ingest = IngestClient::new(endpoint(&ingress).connect().await.unwrap());
    assert_eq!(send(&mut ingest, "WATCH1").await.unwrap(), "AA");
    let refused = ingress
        .metric("hl7gw_grpc_connections_closed_total{reason=\"max_connections_per_address\"}");
    assert!(refused >= 1.0, "per-address refusals counted: {refused}");
    for w in watchers {
        w.abort();
    }
}
