//! The admin HTTP server: `/healthz` (alive), `/readyz` (ready for traffic), `/metrics` (Prometheus text).

use crate::metrics::{Registry, render};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What readiness is made of: the dependency (Kafka) answers and the service is not draining.
#[derive(Debug, Default)]
pub struct Health {
    dependency_ok: AtomicBool,
    draining: AtomicBool,
    /// Why the last probe failed, for `/readyz` (no secrets, no patient data: client error texts only).
    reason: std::sync::Mutex<String>,
}

impl Health {
    /// Records the last probe's outcome, with the reason when it failed.
    pub fn set_dependency(&self, status: Result<(), String>) {
        let ok = status.is_ok();
        if let Err(reason) = status {
            *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = reason;
        }
        self.dependency_ok.store(ok, Ordering::Relaxed);
    }

    /// Why the service is not ready (meaningful while [`Health::is_ready`] is false).
    pub fn reason(&self) -> String {
        if self.is_draining() {
            return "draining".into();
        }
        let r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_empty() { "starting".into() } else { r.clone() }
    }

    /// Marks the service as draining: never ready again.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// True while the service should get traffic.
    pub fn is_ready(&self) -> bool {
        self.dependency_ok.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }

    /// True once draining started.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    registry: Arc<Registry>,
}

/// A listener that could not be bound (every service refuses to start then, before serving anything).
#[derive(Debug, thiserror::Error)]
#[error("binding {what} on {addr}: {source}")]
pub struct BindError {
    pub what: &'static str,
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds a TCP listener, naming what it is for in the error.
pub async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { what, addr, source })
}

/// Binds the admin server; it serves until `stop` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    registry: Arc<Registry>,
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), BindError> {
    let listener = bind("admin HTTP", addr).await?;
    let local = listener.local_addr().unwrap_or(addr);
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AdminState { health, registry });
    let handle = tokio::spawn(async move {
        let res = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "admin server stopped");
        }
    });
    Ok((local, handle))
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.health.is_ready() {
        (StatusCode::OK, "ready\n".to_owned())
    } else if s.health.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", s.health.reason()),
        )
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render(&s.registry),
    )
}

/// `grpc.health.v1.Health` for a service: SERVING (for `service_name` and for "") while `health` is ready,
/// NOT_SERVING otherwise and once `stop` fires. Polls readiness every 500 ms.
pub fn grpc_health(
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
pub const GRPC_MAX_CONNECTIONS: usize = 1024;

/// The accepted connections of a gRPC listener (at most [`GRPC_MAX_CONNECTIONS`] at once), with Nagle's
/// algorithm off: tonic leaves it on for incoming streams, and a unary call then waits ~40 ms for the delayed
/// ACK (measured with k6 before this).
pub fn grpc_incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<GrpcConn>> {
    grpc_incoming_limited(listener, GRPC_MAX_CONNECTIONS)
}

/// [`grpc_incoming`] with at most `max` connections open at once: the next one is accepted only when one
/// closes.
pub fn grpc_incoming_limited(
    listener: TcpListener,
    max: usize,
) -> impl tokio_stream::Stream<Item = std::io::Result<GrpcConn>> {
    let permits = Arc::new(tokio::sync::Semaphore::new(max.max(1)));
    Box::pin(futures_util::stream::unfold(
        (listener, permits),
        |(listener, permits)| async move {
            let permit = permits.clone().acquire_owned().await.ok()?;
            let conn = match listener.accept().await {
                Ok((s, _)) => s.set_nodelay(true).map(|()| GrpcConn {
                    inner: s,
                    _permit: permit,
                }),
                Err(e) => Err(e),
            };
            Some((conn, (listener, permits)))
        },
    ))
}

/// One accepted gRPC connection; it holds its place in the listener's connection limit until dropped.
#[derive(Debug)]
pub struct GrpcConn {
    inner: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for GrpcConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl tokio::io::AsyncRead for GrpcConn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for GrpcConn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
