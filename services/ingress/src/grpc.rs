//! gRPC `hl7gw.v1.Ingest` (same rules as MLLP) and `grpc.health.v1.Health`.

use crate::budget::Held;
use crate::config::Config;
use crate::metrics::{ProtocolLabels, ReasonLabels};
use crate::pipeline::{Action, Origin, Pending, Pipeline, Reply};
use hl7gw_runtime::proto::v1::ingest_server::{Ingest, IngestServer};
use hl7gw_runtime::proto::v1::{SendRequest, SendResponse, SendersRequest, SendersResponse};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

/// The Ingest service.
#[derive(Debug)]
pub struct IngestService {
    pipe: Arc<Pipeline>,
    cfg: Arc<Config>,
    streams: AtomicU64,
    auth: hl7gw_runtime::grpc::Auth,
}

impl IngestService {
    /// Where a call comes from, once its caller may send (`grpc.allow.Ingest`).
    async fn origin<T>(&self, req: &Request<T>) -> Result<Origin, Status> {
        self.auth.authorize(req, "Ingest").await.inspect_err(|s| {
            let reason = if s.code() == tonic::Code::Unauthenticated {
                "grpc_unauthenticated"
            } else {
                "grpc_permission_denied"
            };
            self.pipe
                .metrics
                .connections_refused
                .get_or_create(&ReasonLabels { reason })
                .inc();
        })?;
        let id = self.streams.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Origin {
            listener: Arc::from("grpc"),
            protocol: "grpc",
            peer: hl7gw_runtime::grpc::peer(req)
                .map(|p| p.to_string())
                .unwrap_or_default()
                .into(),
            connection_id: format!("grpc-{id}"),
            tls_client: hl7gw_runtime::grpc::client_subject(req).unwrap_or_default(),
        })
    }

    fn submit(&self, message: bytes::Bytes, origin: &Origin, seq: u64) -> Pending {
        submit(&self.pipe, self.cfg.max_frame_bytes, message, origin, seq)
    }

    fn respond(pipe: &Pipeline, reply: Reply) -> Result<SendResponse, Status> {
        if matches!(reply.action, Action::Close) {
            return Err(Status::unavailable(
                "Kafka did not confirm the write in time; resend",
            ));
        }
        let mut ack = Vec::with_capacity(256);
        let code = pipe.render(&reply, &mut ack);
        let control_id = hl7v2::Header::salvage(&reply.frame).control_id;
        Ok(SendResponse {
            ack: ack.into(),
            ack_code: code.map(|c| c.as_str().to_owned()).unwrap_or_default(),
            control_id: String::from_utf8_lossy(control_id).into_owned(),
            envelope_id: if matches!(reply.action, Action::Accept) {
                reply.envelope_id.clone()
            } else {
                String::new()
            },
            reason: reply.reason().to_owned(),
            duplicate: matches!(reply.action, Action::Replay(_)),
        })
    }
}

#[tonic::async_trait]
impl Ingest for IngestService {
    async fn send(&self, req: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        let origin = self.origin(&req).await?;
        let message = req.into_inner().message;
        // Held until the answer is ready, drawn from the process's budget like a stream's messages: many
        // concurrent unary calls wait for bytes instead of holding any amount.
        let _bytes = self
            .pipe
            .budget
            .connection(self.cfg.max_in_flight_bytes_per_connection)
            .acquire(crate::budget::cost(&message))
            .await
            .ok_or_else(|| Status::unavailable("the ingress is shutting down"))?;
        let p = self.submit(message, &origin, 1);
        let reply = self.pipe.resolve(p).await;
        self.pipe
            .answered(&self.pipe.senders.unlisted(&origin), &reply);
        Self::respond(&self.pipe, reply).map(Response::new)
    }

    type SendStreamStream = Answers;

    async fn send_stream(
        &self,
        req: Request<Streaming<SendRequest>>,
    ) -> Result<Response<Self::SendStreamStream>, Status> {
        let origin = self.origin(&req).await?;
        self.pipe
            .metrics
            .connections
            .get_or_create(&ProtocolLabels { protocol: "grpc" })
            .inc();
        let mut inbound = req.into_inner();
        let (pending_tx, mut pending_rx) =
            mpsc::channel::<(Pending, Held)>(self.cfg.max_in_flight_per_connection);
        let (out_tx, out_rx) = mpsc::channel(self.cfg.max_in_flight_per_connection);
        let pipe = self.pipe.clone();
        // The stream's waiting messages stay within the same byte bound as an MLLP connection's, drawn from
        // the same process-wide budget.
        let budget = self
            .pipe
            .budget
            .connection(self.cfg.max_in_flight_bytes_per_connection);
        // Answers in request order. A client that takes none for `write_timeout` (its HTTP/2 window and the
        // queue are full) has its stream ended, as MLLP closes such a connection: the messages waiting here
        // and their bytes are let go (the sender resends what it got no answer for).
        let (write_timeout, ended) = (self.cfg.write_timeout, Arc::new(Ended::default()));
        let answers = Answers {
            rx: out_rx,
            ended: ended.clone(),
        };
        // Listed in the sender view until the stream's answers end.
        let listed = pipe.senders.connect(&origin);
        tokio::spawn(async move {
            while let Some((p, _bytes)) = pending_rx.recv().await {
                let reply = pipe.resolve(p).await;
                pipe.answered(&listed, &reply);
                let close = matches!(reply.action, Action::Close);
                let answer = Self::respond(&pipe, reply);
                match tokio::time::timeout(write_timeout, out_tx.send(answer)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break,
                    Err(_) => {
                        pipe.metrics.write_timeouts.inc();
                        hl7gw_runtime::limited_info!(
                            "write_timeout",
                            "gRPC stream did not read its answers within write_timeout: ended"
                        );
                        ended.end(Status::resource_exhausted(format!(
                            "answers not read within write_timeout ({write_timeout:?}): stream \
                             ended, resend the messages without an answer"
                        )));
                        break;
                    }
                }
                if close {
                    break;
                }
            }
        });
        let (pipe, max) = (self.pipe.clone(), self.cfg.max_frame_bytes);
        // A stream is paced like an MLLP connection (`rate_limit_per_connection`).
        let mut limiter = crate::connection::RateLimiter::new(self.cfg.rate_limit_per_connection);
        tokio::spawn(async move {
            let mut seq = 0u64;
            while let Ok(Some(req)) = inbound.message().await {
                limiter.wait().await;
                seq += 1;
                let Some(bytes) = budget.acquire(crate::budget::cost(&req.message)).await else {
                    break;
                };
                // An ended stream (answers not read) takes nothing more.
                if pending_tx.is_closed() {
                    break;
                }
                let p = submit(&pipe, max, req.message, &origin, seq);
                if pending_tx.send((p, bytes)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(answers))
    }

    /// Admin: the sender view (nobody unless `grpc.allow.Senders` says; audited).
    async fn senders(
        &self,
        req: Request<SendersRequest>,
    ) -> Result<Response<SendersResponse>, Status> {
        let what = format!(
            "sending_application={:?}",
            hl7gw_runtime::grpc::clip(&req.get_ref().sending_application)
        );
        let caller = self.auth.admin(&req, "Senders", &what).await?;
        let peer = hl7gw_runtime::grpc::peer(&req);
        let view = self
            .pipe
            .senders
            .snapshot(&req.into_inner().sending_application);
        let result: Result<Response<SendersResponse>, Status> = Ok(Response::new(view));
        hl7gw_runtime::grpc::audit_result(&caller, peer, "Senders", &what, &result, |r| {
            format!(
                "{} senders, {} connections",
                r.senders.len(),
                r.connections.len()
            )
        });
        result
    }
}

/// Why a `SendStream` was ended early, once it was.
#[derive(Debug, Default)]
pub struct Ended(std::sync::Mutex<Option<Status>>);

impl Ended {
    fn end(&self, status: Status) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
    }

    fn take(&self) -> Option<Status> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// A `SendStream`'s answers; once the stream is [`Ended`], its status comes next (the answers still queued
/// are dropped) and the stream ends.
#[derive(Debug)]
pub struct Answers {
    rx: mpsc::Receiver<Result<SendResponse, Status>>,
    ended: Arc<Ended>,
}

impl tokio_stream::Stream for Answers {
    type Item = Result<SendResponse, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if let Some(status) = self.ended.take() {
            self.rx.close();
            while self.rx.try_recv().is_ok() {}
            return std::task::Poll::Ready(Some(Err(status)));
        }
        self.rx.poll_recv(cx)
    }
}

/// Frames over the size limit get the same NAK as on MLLP; the rest goes through the pipeline.
fn submit(
    pipe: &Pipeline,
    max: usize,
    message: bytes::Bytes,
    origin: &Origin,
    seq: u64,
) -> Pending {
    if message.len() > max {
        pipe.metrics.framing_error("frame_too_large", &origin.peer);
        return Pending::Ready(
            pipe.framing_reply(format!("message larger than the {max}-byte limit")),
        );
    }
    pipe.submit(message, origin, seq)
}

/// Who may call Ingest when `grpc.allow.Ingest` does not say: anyone, or only authenticated callers when the
/// MLLP listener requires client certificates (no open side door beside it).
pub fn default_ingest_policy(cfg: &Config) -> &'static [&'static str] {
    if cfg.tls.as_ref().is_some_and(|t| t.client_ca.is_some()) {
        &["authenticated"]
    } else {
        &["anonymous"]
    }
}

/// The Ingest service over `pipe`, accepting messages up to `max_frame_bytes` (plus room for the request's
/// other fields), gzip and zstd both ways.
pub fn service(pipe: Arc<Pipeline>, cfg: Arc<Config>) -> IngestServer<IngestService> {
    let max = cfg.max_frame_bytes + 4096;
    let auth =
        hl7gw_runtime::grpc::Auth::new(&cfg.grpc, &[("Ingest", default_ingest_policy(&cfg))]);
    let svc = IngestServer::new(IngestService {
        pipe,
        cfg,
        streams: AtomicU64::new(0),
        auth,
    })
    .max_decoding_message_size(max);
    hl7gw_runtime::compressed!(svc)
}
