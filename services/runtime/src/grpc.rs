//! The services' gRPC listener, built one way for all three: TLS or mutual TLS (PEM files), TCP_NODELAY, a
//! connection limit, connection lifetimes (first-stream timeout, HTTP/2 keepalive, idle timeout, maximum
//! age), gzip/zstd, health; and who may call which method. Admin methods are refused to anyone not
//! allow-listed (deny by default); every call to them is audited (who, method, what, result; never content).

use crate::admin::Health;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::Status;

mod audit;
mod auth;
mod caller;
mod error;
mod settings;
mod tokens;

pub use audit::{MAX_LOGGED_VALUE, audit, audit_result, client_subject, clip, clip_to, peer};
pub use auth::{Auth, KUBERNETES_AUDIENCE, READ_MESSAGES, kubernetes_resource};
pub use caller::{Caller, ConnInfo};
pub use error::GrpcError;
pub use settings::{GrpcSettings, ServerTls};

/// Serves `routes` (plus reflection) on `listener` with the listener's TLS until `stop`: at most
/// `limits.max_connections` connections at once (and `max_connections_per_address` from one address: see
/// [`crate::slots`]), each closed when it opens no call in time, stops answering
/// PINGs, grows old or stays idle (the `grpc:` settings), each close counted in `metrics`. On `stop` every
/// connection gets a GOAWAY; calls in progress have `max_connection_age_grace` to finish.
pub async fn serve(
    routes: tonic::service::Routes,
    listener: TcpListener,
    settings: &GrpcSettings,
    limits: Limits,
    metrics: GrpcMetrics,
    stop: CancellationToken,
) -> Result<(), GrpcServeError> {
    let acceptor = settings.acceptor()?;
    // Reflection (the public schema of proto/, nothing else) for grpcurl and other generic clients.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| GrpcError::Rule(format!("reflection: {e}")))?;
    let routes = routes.add_service(reflection).prepare();
    let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
    let mut http2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    http2
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(nonzero(settings.keepalive_interval))
        .keep_alive_timeout(settings.keepalive_timeout);
    let lifetimes = Lifetimes {
        first_stream: settings.first_stream_timeout,
        max_age: nonzero(settings.max_connection_age),
        grace: settings.max_connection_age_grace,
        idle: nonzero(settings.idle_timeout),
    };
    let tasks = tokio_util::task::TaskTracker::new();
    let slots = crate::slots::Slots::new(crate::slots::SlotLimits {
        max: limits.max_connections,
        per_address: limits.max_connections_per_address,
        evict_after: EVICT_AFTER,
        wait_when_full: true,
    });
    accept_loop(
        listener,
        &slots,
        &metrics,
        stop.clone(),
        |stream, remote, accepted, slot| {
            let (routes, http2, acceptor, metrics, stop) = (
                routes.clone(),
                http2.clone(),
                acceptor.clone(),
                metrics.clone(),
                stop.clone(),
            );
            tasks.spawn(async move {
                let Some(slot) = slot.get().await else {
                    metrics.closed(crate::slots::Refusal::MaxConnections.reason());
                    return;
                };
                let progress = slot.progress.clone();
                let Some(conn) = handshake(
                    stream, remote, acceptor, accepted, lifetimes, &metrics, &progress,
                )
                .await
                else {
                    return;
                };
                metrics.connections.inc();
                serve_connection(conn, routes, http2, lifetimes, &metrics, stop, progress).await;
                metrics.connections.dec();
                drop(slot);
            });
        },
    )
    .await;
    tasks.close();
    tasks.wait().await;
    Ok(())
}

crate::label_sets! {
    /// `reason`: why the server closed a gRPC connection.
    pub struct CloseLabels { pub reason: &'static str }
}

crate::metric_set! {
    /// The gRPC listener's connections (every service has one).
    pub struct GrpcMetrics under "grpc" {
        /// Open gRPC connections, each holding a slot of the connection limit.
        pub connections: prometheus_client::metrics::gauge::Gauge =
            "gRPC connections open (each holds a slot of the listener's connection limit)";
        /// Connections the server closed or sent away, by reason.
        pub connections_closed: prometheus_client::metrics::family::Family<
            CloseLabels,
            prometheus_client::metrics::counter::Counter,
        > = "gRPC connections the server closed or sent a GOAWAY, by reason: handshake_failed, \
             first_stream_timeout (no TLS handshake or first call in time), keepalive_timeout (no PING \
             answer), idle_timeout, max_age, grace_expired (calls still running after a GOAWAY's grace), \
             evicted (idle, sent away for a new connection at a limit), max_connections (no slot freed \
             within 5 s), max_connections_per_address (its address held its bound, none idle)";
    }
}

impl GrpcMetrics {
    fn closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&CloseLabels { reason })
            .inc();
    }
}

/// How long a connection may live, resolved from [`GrpcSettings`] (`None`: no limit).
#[derive(Debug, Clone, Copy)]
struct Lifetimes {
    first_stream: Duration,
    max_age: Option<Duration>,
    grace: Duration,
    idle: Option<Duration>,
}

/// Accepts connections until `stop`, handing each (with the future of its slot) to `serve`: at the limits
/// (all, or its address's) the stalest idle connection is sent away for it, else it waits (bounded) for a
/// slot; one refused at its address's bound is closed at once. Nagle is turned off (tonic leaves it on for
/// incoming streams, and a unary call then waits ~40 ms for the delayed ACK).
async fn accept_loop(
    listener: TcpListener,
    slots: &Arc<crate::slots::Slots>,
    metrics: &GrpcMetrics,
    stop: CancellationToken,
    mut serve: impl FnMut(TcpStream, SocketAddr, Instant, PendingSlot),
) {
    let mut ids = 0u64;
    loop {
        let (stream, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    crate::limited_warn!("grpc_accept_failed", error = %e, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
        ids += 1;
        let addr = Some(remote.ip());
        let slot = match slots.take(ids, addr) {
            crate::slots::Taken::Free(s) => PendingSlot::Ready(s),
            crate::slots::Taken::Wait => PendingSlot::Wait(slots.clone(), ids, addr),
            crate::slots::Taken::Refused(why) => {
                metrics.closed(why.reason());
                crate::limited_debug!(why.reason(), %remote, reason = why.reason(), "gRPC connection refused at its connection bound");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        serve(stream, remote, Instant::now(), slot);
    }
}

/// A new connection's slot: taken, or to wait for.
enum PendingSlot {
    Ready(crate::slots::Slot),
    Wait(Arc<crate::slots::Slots>, u64, Option<std::net::IpAddr>),
}

impl PendingSlot {
    /// The slot, or `None` when none freed within the bounded wait.
    async fn get(self) -> Option<crate::slots::Slot> {
        match self {
            PendingSlot::Ready(s) => Some(s),
            PendingSlot::Wait(slots, id, addr) => slots.wait(id, addr).await,
        }
    }
}

/// The TLS handshake when the listener has TLS, finished within the first-stream timeout.
async fn handshake(
    stream: TcpStream,
    remote: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    accepted: Instant,
    lifetimes: Lifetimes,
    metrics: &GrpcMetrics,
    progress: &crate::slots::Progress,
) -> Option<Conn> {
    let Some(acceptor) = tls else {
        return Some(Conn {
            io: Io::Plain(stream),
            info: ConnInfo {
                remote: Some(remote),
                client_cn: None,
                client_subject: None,
            },
            accepted,
        });
    };
    let deadline = tokio::time::Instant::from_std(accepted + lifetimes.first_stream);
    // A handshake that has not finished is as evictable as a connection that opened no call.
    let handshake = tokio::select! {
        r = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => r,
        _ = progress.evicted.cancelled() => {
            metrics.closed("evicted");
            return None;
        }
    };
    match handshake {
        Ok(Ok(s)) => {
            let cert = s.get_ref().1.peer_certificates().and_then(|c| c.first());
            let info = ConnInfo {
                remote: Some(remote),
                client_cn: cert.and_then(hl7gw_tls::common_name),
                client_subject: cert.map(hl7gw_tls::subject),
            };
            Some(Conn {
                io: Io::Tls(Box::new(s)),
                info,
                accepted,
            })
        }
        Ok(Err(e)) => {
            tracing::debug!(%remote, error = %e, "gRPC TLS handshake failed");
            metrics.closed("handshake_failed");
            None
        }
        Err(_) => {
            tracing::debug!(%remote, "gRPC TLS handshake timed out");
            metrics.closed("first_stream_timeout");
            None
        }
    }
}

/// Calls in progress on one connection, and since when it has had none.
#[derive(Debug)]
struct Activity {
    state: std::sync::Mutex<(usize, Option<Instant>)>,
    changed: tokio::sync::Notify,
    /// The connection's slot's view of it (calls open make it busy for the eviction).
    progress: Arc<crate::slots::Progress>,
}

impl Activity {
    fn new(since: Instant, progress: Arc<crate::slots::Progress>) -> Self {
        Self {
            state: std::sync::Mutex::new((0, Some(since))),
            changed: tokio::sync::Notify::new(),
            progress,
        }
    }

    fn started(self: &Arc<Self>) -> CallGuard {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 += 1;
        s.1 = None;
        self.progress.call_started();
        CallGuard(self.clone())
    }

    /// Since when no call has been in progress (`None`: one is).
    fn idle_since(&self) -> Option<Instant> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

/// One call in progress, until its response has been sent (or the call was reset).
struct CallGuard(Arc<Activity>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = s.0.saturating_sub(1);
        self.0.progress.call_ended();
        if s.0 == 0 {
            s.1 = Some(Instant::now());
            drop(s);
            self.0.changed.notify_one();
        }
    }
}

/// A response body that holds its call's [`CallGuard`] until hyper has sent it or dropped it.
struct TrackedBody {
    inner: tonic::body::Body,
    _call: CallGuard,
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves one connection until it ends, enforcing its [`Lifetimes`]: no call within `first_stream` of the
/// accept closes it; `idle` without a call or `max_age` sends a GOAWAY, and calls still running `grace`
/// later are cut; so does `stop`.
async fn serve_connection(
    conn: Conn,
    routes: tonic::service::Routes,
    http2: hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
    lifetimes: Lifetimes,
    metrics: &GrpcMetrics,
    stop: CancellationToken,
    progress: Arc<crate::slots::Progress>,
) {
    let accepted = conn.accepted;
    let info = conn.info.clone();
    let activity = Arc::new(Activity::new(Instant::now(), progress.clone()));
    let opened = Arc::new(AtomicBool::new(false));
    let svc = {
        let (activity, opened) = (activity.clone(), opened.clone());
        hyper::service::service_fn(move |req: axum::http::Request<hyper::body::Incoming>| {
            use tonic::codegen::Service;
            let call = activity.started();
            opened.store(true, Ordering::Relaxed);
            let mut req = req.map(tonic::body::Body::new);
            // What handlers learn about the connection (`peer`, `client_subject`, the caller's certificate).
            req.extensions_mut().insert(info.clone());
            let mut routes = routes.clone();
            async move {
                std::future::poll_fn(|cx| {
                    Service::<axum::http::Request<tonic::body::Body>>::poll_ready(&mut routes, cx)
                })
                .await?;
                let resp = routes.call(req).await?;
                Ok::<_, std::convert::Infallible>(
                    resp.map(|inner| tonic::body::Body::new(TrackedBody { inner, _call: call })),
                )
            }
        })
    };
    let remote = conn.info.remote;
    let c = http2.serve_connection(hyper_util::rt::TokioIo::new(conn), svc);
    tokio::pin!(c);
    let first_stream_at = accepted + lifetimes.first_stream;
    let max_age_at = lifetimes.max_age.map(|a| accepted + a);
    // Once a GOAWAY went out: when the calls still running are cut.
    let mut cut_at: Option<Instant> = None;
    let far = || Instant::now() + Duration::from_secs(24 * 3600);
    loop {
        let deadline = match cut_at {
            Some(at) => at,
            None => {
                let mut d = max_age_at.unwrap_or_else(far);
                if !opened.load(Ordering::Relaxed) {
                    d = d.min(first_stream_at);
                }
                if let (Some(idle), Some(since)) = (lifetimes.idle, activity.idle_since()) {
                    d = d.min(since + idle);
                }
                d
            }
        };
        tokio::select! {
            r = c.as_mut() => {
                if let Err(e) = r {
                    if keepalive_timed_out(&e) {
                        metrics.closed("keepalive_timeout");
                    }
                    tracing::debug!(peer = ?remote, error = %e, "gRPC connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                let now = Instant::now();
                if cut_at.is_some() {
                    metrics.closed("grace_expired");
                    tracing::debug!(peer = ?remote, "gRPC connection closed: calls still running after the grace period");
                    return;
                }
                let idle = lifetimes.idle.zip(activity.idle_since());
                let (reason, grace) = if !opened.load(Ordering::Relaxed) && now >= first_stream_at {
                    // No call was ever opened: before the HTTP/2 preface this closes the connection at
                    // once, after it a GOAWAY goes out; either way there is nothing to wait for.
                    ("first_stream_timeout", lifetimes.grace.min(lifetimes.first_stream))
                } else if max_age_at.is_some_and(|at| now >= at) {
                    ("max_age", lifetimes.grace)
                } else if idle.is_some_and(|(i, since)| now >= since + i) {
                    ("idle_timeout", lifetimes.grace)
                } else {
                    continue;
                };
                metrics.closed(reason);
                tracing::debug!(peer = ?remote, reason, "gRPC connection sent away (GOAWAY)");
                c.as_mut().graceful_shutdown();
                cut_at = Some(now + grace);
            }
            _ = activity.changed.notified() => {}
            _ = progress.evicted.cancelled(), if cut_at.is_none() => {
                // Closed for a new connection at a limit: it had no call in progress (or never opened one).
                metrics.closed("evicted");
                crate::limited_debug!("grpc_evicted", peer = ?remote, "gRPC connection sent away to make room");
                if !opened.load(Ordering::Relaxed) {
                    // Nothing to wait for (hyper's graceful shutdown would wait for the preface).
                    return;
                }
                c.as_mut().graceful_shutdown();
                cut_at = Some(Instant::now() + lifetimes.grace.min(EVICT_GRACE));
            }
            _ = stop.cancelled(), if cut_at.is_none() => {
                c.as_mut().graceful_shutdown();
                cut_at = Some(Instant::now() + lifetimes.grace);
            }
        }
    }
}

/// Whether hyper ended a connection because a keepalive PING went unanswered.
fn keepalive_timed_out(e: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.to_string().contains("keep-alive timed out") {
            return true;
        }
        source = s.source();
    }
    false
}

/// How much one gRPC listener serves at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Streams per connection (none: tonic's default).
    pub max_concurrent_streams: Option<u32>,
    /// Connections served at once; at the limit the stalest idle connection is sent away for a new one, else
    /// the new one waits up to 5 s for a slot, then is closed.
    pub max_connections: usize,
    /// Connections served at once from one client address (open streams count; 0: no bound); at the bound a
    /// new one sends away an idle one of the same address or is closed at once.
    pub max_connections_per_address: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: None,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_address: MAX_CONNECTIONS_PER_ADDRESS,
        }
    }
}

/// A generated tonic server accepting and sending gzip and zstd (every hl7gw service does).
#[macro_export]
macro_rules! compressed {
    ($server:expr) => {{
        use tonic::codec::CompressionEncoding::{Gzip, Zstd};
        $server
            .accept_compressed(Gzip)
            .accept_compressed(Zstd)
            .send_compressed(Gzip)
            .send_compressed(Zstd)
    }};
}

/// Why a gRPC listener stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum GrpcServeError {
    #[error(transparent)]
    Settings(#[from] GrpcError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// `grpc.health.v1.Health` for a service: SERVING (for `service_name` and for "") while `health` is ready,
/// NOT_SERVING otherwise and once `stop` fires. Polls readiness every 500 ms.
pub fn health(
    health: Arc<Health>,
    service_name: &'static str,
    stop: CancellationToken,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    use tonic_health::ServingStatus;
    let (reporter, service) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let ready = health.is_ready();
            if last != Some(ready) {
                let status = if ready {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                reporter.set_service_status(service_name, status).await;
                reporter.set_service_status("", status).await;
                last = Some(ready);
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
                _ = stop.cancelled() => {
                    reporter.set_service_status(service_name, ServingStatus::NotServing).await;
                    reporter.set_service_status("", ServingStatus::NotServing).await;
                    break;
                }
            }
        }
    });
    service
}

/// Most connections one gRPC listener serves at once by default; more wait in the accept backlog (hyper
/// itself sets no limit, so a flood of idle connections could take a pod's memory and file descriptors).
pub const MAX_CONNECTIONS: usize = 1024;

/// Most connections one client address holds on a gRPC listener by default: a quarter of the pool, so one
/// address (a scanner, a misbehaving client, every stream of one sender) leaves three quarters to the rest.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = MAX_CONNECTIONS / 4;

/// How long a gRPC connection must have had no call before it is sent away for a new one at a limit (one
/// that never opened a call goes first, at any age).
const EVICT_AFTER: Duration = Duration::from_secs(5);

/// How long calls of an evicted connection may still run (it had none when chosen; one may have started).
const EVICT_GRACE: Duration = Duration::from_secs(10);

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// One accepted gRPC connection (its slot in the connection limit is held by its task).
pub struct Conn {
    io: Io,
    info: ConnInfo,
    /// When the TCP connection was accepted (the first-stream timeout counts from here).
    accepted: Instant,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match &mut $self.io {
            Io::Plain($s) => {
                let $s = std::pin::Pin::new($s);
                $e
            }
            Io::Tls($s) => {
                let $s = std::pin::Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused_without_showing_tokens() {
        let s = GrpcSettings {
            allow: [("Replay".to_owned(), vec!["ops".to_owned()])].into(),
            ..GrpcSettings::default()
        };
        assert!(s.validate(&["Replay"]).is_err());
        assert!(s.validate(&["Status"]).is_err(), "unknown method");
        let lifetimes = |first: u64, ka: u64, kat: u64| GrpcSettings {
            first_stream_timeout: Duration::from_secs(first),
            keepalive_interval: Duration::from_secs(ka),
            keepalive_timeout: Duration::from_secs(kat),
            ..GrpcSettings::default()
        };
        assert!(GrpcSettings::default().validate(&[]).is_ok());
        assert!(
            lifetimes(0, 60, 20).validate(&[]).is_err(),
            "no first-stream timeout"
        );
        assert!(
            lifetimes(10, 60, 0).validate(&[]).is_err(),
            "keepalive without timeout"
        );
        assert!(lifetimes(10, 0, 0).validate(&[]).is_ok(), "keepalive off");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tokens");
        std::fs::write(&file, "short-secret-token\n").expect("write");
        let e = tokens::Tokens::read(&file)
            .expect_err("no name")
            .to_string();
        assert!(!e.contains("short-secret-token"), "{e}");
    }
}
