//! The ingress's optional features, each against the real binary and a real Kafka broker (scripts/kafka.sh):
//! TLS and mutual TLS, the PROXY protocol, MLLP release 2 commit acknowledgements, enhanced acknowledgement
//! mode, the per-connection rate limit, pipelining, fast ACK mode, `on_timeout` with an unreachable broker,
//! and the admin endpoints.
//!
//! Every test starts its own ingress on ephemeral 127.0.0.1 ports, uses its own topics, and bounds every wait.
//! One test binary, one module per topic (`tls`, `proxy`, `acks`, `broker`, `grpc`, `limits`, `keys`, `admin`);
//! here the helpers they share.
#![allow(clippy::unwrap_used)] // test helpers: a failed step fails the test

use hl7gw_testkit as support;

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use hl7v2::MllpCodec;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::codec::{Decoder, Framed};

mod acks;
mod admin;
mod broker;
mod grpc;
mod keys;
mod limits;
mod proxy;
mod tls;

/// The longest wait for one ACK.
const ACK_WAIT: Duration = Duration::from_secs(15);

fn topics_env(brokers: &str) -> (String, String, Vec<(&'static str, String)>) {
    support::topics_env(brokers, "test.features")
}

/// An ingress on fresh topics, with `extra` settings.
fn start(extra: impl IntoIterator<Item = (&'static str, String)>) -> (Ingress, Topics) {
    Ingress::on_fresh_topics("test.features", extra)
}

/// An ADT^A01 with MSH-12 `version` and MSH-15/16 (empty: original acknowledgement mode).
fn adt_enhanced(control_id: &str, version: &str, msh15: &str, msh16: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|TESTAPP|TESTFAC|HL7GW|HL7GW|20261122120000||ADT^A01^ADT_A01|{control_id}|P|{version}|||{msh15}|{msh16}\r\
         EVN|A01|20261122120000\r\
         PID|1||P1^^^TESTFAC^MR||DOE^JANE||19700101|F\r"
    )
    .into_bytes()
}

fn frame(payload: &[u8]) -> Vec<u8> {
    hl7v2::mllp::frame(payload).to_vec()
}

/// What the next read on a connection brought.
#[derive(Debug)]
enum Next {
    Frame(BytesMut),
    Closed,
    Silent,
}

/// The next MLLP frame, or whether the connection closed (EOF or error) or stayed silent for `limit`.
async fn next_frame<S>(f: &mut Framed<S, MllpCodec>, limit: Duration) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(limit, f.next()).await {
        Ok(Some(Ok(frame))) => Next::Frame(frame),
        Ok(Some(Err(_)) | None) => Next::Closed,
        Err(_) => Next::Silent,
    }
}

/// Sends one payload and returns the next frame (None: closed or nothing within `ACK_WAIT`).
async fn call_on<S>(f: &mut Framed<S, MllpCodec>, payload: &[u8]) -> Option<BytesMut>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if f.send(payload).await.is_err() {
        return None;
    }
    match next_frame(f, ACK_WAIT).await {
        Next::Frame(b) => Some(b),
        _ => None,
    }
}

/// (MSA-1, MSA-2) of an ACK.
fn msa(ack: &[u8]) -> (String, String) {
    let (code, id) = hl7v2::read_ack(ack).expect("an ACK");
    (
        code.as_str().to_owned(),
        String::from_utf8_lossy(id).into_owned(),
    )
}

fn err3(ack: &[u8]) -> Option<String> {
    support::field(ack, "ERR-3-1")
}

/// Writes `bytes` on a new plain TCP connection and reads until close or `wait`: (bytes read, closed).
async fn raw_exchange(addr: SocketAddr, bytes: &[u8], wait: Duration) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
}

/// The MLLP frames in `bytes`.
fn frames_in(bytes: &[u8]) -> Vec<BytesMut> {
    let mut codec = MllpCodec::default();
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Ok(Some(f)) = codec.decode(&mut buf) {
        out.push(f);
    }
    out
}

/// Polls a metric until it reaches `at_least` or `limit` passes; returns the last value.
async fn wait_metric(ingress: &Ingress, series: &str, at_least: f64, limit: Duration) -> f64 {
    let deadline = Instant::now() + limit;
    loop {
        let v = ingress.metric(series);
        if v >= at_least || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The record of `control_id` among `records`.
fn record_of<'r>(records: &'r [Record], control_id: &str) -> &'r Record {
    records
        .iter()
        .find(|r| r.envelope.header.as_ref().unwrap().control_id == control_id)
        .unwrap_or_else(|| panic!("{control_id} not in the topic"))
}

/// A client config (ring provider) trusting only the test CA, presenting `identity` (cert, key file names).
fn client_config(pki: &Pki, identity: Option<(&str, &str)>) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.path("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(pki.path(cert))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(pki.path(key)).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// Connects over TLS (server name 127.0.0.1, as the certificate says) and frames MLLP on top.
async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<Framed<TlsStream<TcpStream>, MllpCodec>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio::time::timeout(
        Duration::from_secs(10),
        TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    Ok(Framed::new(tls, MllpCodec::default()))
}

fn unreachable_env(on_timeout: Option<&str>) -> Vec<(&'static str, String)> {
    let (_, _, mut env) = topics_env("127.0.0.1:1");
    env.push(("HL7GW_ACK_TIMEOUT", "1s".to_owned()));
    // librdkafka logs every failed connection attempt; keep the ingress's own warnings.
    env.push(("RUST_LOG", "warn,rdkafka=off,librdkafka=off".to_owned()));
    if let Some(v) = on_timeout {
        env.push(("HL7GW_ON_TIMEOUT", v.to_owned()));
    }
    env
}
