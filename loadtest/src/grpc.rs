//! `--grpc`: the load over the ingress's gRPC `Ingest/SendStream` instead of MLLP.
//!
//! Each client's connection is one HTTP/2 channel carrying one `SendStream` call. A bridge task turns the
//! client's MLLP frames into `SendRequest`s and each `SendResponse`'s ACK back into a frame, over an in-process
//! pipe, so the MLLP loops (sequential, pipelined with `--in-flight`, paced with `--rate`) run unchanged. The
//! bridge adds a copy and a task hand-off per message to the measured latency (a few µs on a loopback run).

use anyhow::Context as _;
use bytes::BytesMut;
use hl7v2::MllpCodec;
use std::io;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use tokio_util::codec::Decoder;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Generated from proto/hl7gw/v1 (`hl7gw-proto`); the harness uses ingest.proto's client.
pub use hl7gw_proto::v1 as proto;

use proto::ingest_client::IngestClient;
use proto::{SendRequest, SendResponse};

/// Requests queued between the bridge and the HTTP/2 stream (the client's `--in-flight` bounds the rest).
const QUEUED: usize = 1024;

/// Where and how to open a client's gRPC stream.
#[derive(Clone, Debug)]
pub struct GrpcTarget {
    endpoint: Endpoint,
    token: Option<MetadataValue<Ascii>>,
}

impl GrpcTarget {
    /// `to` is `HOST:PORT`; TLS from the MLLP TLS flags (`--tls --ca [--cert --key] [--server-name]`); the
    /// token (sent as `authorization: Bearer`) from a file, never from the command line.
    pub fn new(
        to: &str,
        tls: &hl7gw_tls::ClientFlags,
        token_file: Option<&Path>,
        connect_timeout: std::time::Duration,
    ) -> anyhow::Result<Self> {
        let scheme = if tls.enabled { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{to}"))
            .with_context(|| format!("--to {to:?}"))?
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true);
        if tls.enabled {
            let read =
                |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
            let ca = tls.ca.as_deref().context("--tls needs --ca")?;
            let mut config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(read(ca)?))
                .domain_name(
                    tls.server_name
                        .clone()
                        .unwrap_or_else(|| hl7gw_tls::host_of(to).to_owned()),
                );
            if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            endpoint = endpoint.tls_config(config).context("TLS settings")?;
        }
        let token = match token_file {
            None => None,
            Some(p) => {
                let t = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                Some(
                    format!("Bearer {}", t.trim())
                        .parse()
                        .context("the token is not a valid header value")?,
                )
            }
        };
        Ok(Self { endpoint, token })
    }

    /// Opens a channel and a `SendStream` call; returns the client's end of the bridge.
    pub async fn connect(&self) -> io::Result<DuplexStream> {
        let channel = self.endpoint.connect().await.map_err(io::Error::other)?;
        let (tx, rx) = mpsc::channel(QUEUED);
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        if let Some(t) = &self.token {
            request.metadata_mut().insert("authorization", t.clone());
        }
        let responses = IngestClient::new(channel)
            .send_stream(request)
            .await
            .map_err(io::Error::other)?
            .into_inner();
        let (mine, theirs) = tokio::io::duplex(64 * 1024);
        tokio::spawn(bridge(theirs, tx, responses));
        Ok(mine)
    }
}

/// Frames from the client become requests; responses become frames. Either side ending (a closed
/// connection, a gRPC error) drops the pipe, which the client sees as a closed connection and re-makes.
async fn bridge(
    side: DuplexStream,
    requests: mpsc::Sender<SendRequest>,
    mut responses: tonic::Streaming<SendResponse>,
) {
    let (mut rd, mut wr) = tokio::io::split(side);
    let up = async move {
        let mut codec = MllpCodec::default();
        let mut buf = BytesMut::with_capacity(8192);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => {
                    let req = SendRequest {
                        message: frame.freeze(),
                    };
                    if requests.send(req).await.is_err() {
                        return;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(_) => return,
            }
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(8192);
            }
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let down = async move {
        let mut frame = Vec::with_capacity(2048);
        while let Ok(Some(r)) = responses.message().await {
            frame.clear();
            frame.push(0x0b);
            frame.extend_from_slice(&r.ack);
            frame.extend_from_slice(&[0x1c, 0x0d]);
            if wr.write_all(&frame).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
