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
        if r.is_empty() {
            "starting".into()
        } else {
            r.clone()
        }
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
