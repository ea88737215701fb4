//! A service built and run in this process on port 0, as its binary would run it.

#![allow(clippy::unwrap_used)]

use crate::process::http_get;
use std::time::{Duration, Instant};

/// A service run in-process on port 0, as mini-redis's `start_server` does: its task, the token that stops
/// it and the addresses it bound.
pub struct InProcess<E> {
    pub bound: hl7gw_runtime::service::Bound,
    pub(crate) stop: tokio_util::sync::CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<Result<(), E>>,
}

impl<E: Send + 'static> InProcess<E> {
    /// Validates `cfg`, then builds and runs the service `S` on a task, as its binary would, and waits until
    /// it has bound its ports.
    pub async fn service<S>(cfg: S::Config) -> Self
    where
        S: hl7gw_runtime::service::Service<Error = E>,
    {
        use hl7gw_runtime::service::ServiceConfig;
        cfg.validate().expect("a valid config");
        let stop = tokio_util::sync::CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let app = S::build(std::sync::Arc::new(cfg)).await?;
            let _ = tx.send(app.bound());
            app.run(token).await
        });
        let bound = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("the service bound its ports within 30 s")
            .expect("the service started (it returned before binding)");
        Self { bound, stop, task }
    }

    /// Waits until `/readyz` answers 200 (within `limit`); the last answer otherwise.
    pub async fn ready(&self, limit: Duration) -> Result<(), String> {
        let admin = self.bound.admin;
        let deadline = Instant::now() + limit;
        loop {
            let (status, body) = tokio::task::spawn_blocking(move || http_get(admin, "/readyz"))
                .await
                .unwrap();
            if status == 200 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{status} {body}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Checks the service is alive (`/healthz` 200) and waits up to 60 s until it is ready; its `/metrics`.
    pub async fn serving(&self) -> String {
        assert_eq!(self.admin_get("/healthz").await.0, 200);
        self.ready(Duration::from_secs(60)).await.expect("ready");
        self.admin_get("/metrics").await.1
    }

    /// `GET path` on the admin server.
    pub async fn admin_get(&self, path: &'static str) -> (u16, String) {
        let admin = self.bound.admin;
        tokio::task::spawn_blocking(move || http_get(admin, path))
            .await
            .unwrap()
    }

    /// Cancels the stop token and waits for the service to drain and return.
    pub async fn stop(self, limit: Duration) -> Result<(), E> {
        self.stop.cancel();
        tokio::time::timeout(limit, self.task)
            .await
            .expect("the service drained in time")
            .expect("the service task did not panic")
    }
}

/// Starts the worker `S` (no MLLP listener) in-process, waits until it serves, checks that its `/metrics`
/// holds `series`, and stops it: each worker's in-process test.
pub async fn worker_serves<S>(cfg: S::Config, series: &str)
where
    S: hl7gw_runtime::service::Service,
    S::Error: std::fmt::Debug + Send + 'static,
{
    let worker = InProcess::service::<S>(cfg).await;
    assert!(worker.bound.mllp.is_none());
    let metrics = worker.serving().await;
    assert!(metrics.contains(series), "{series} in {metrics}");
    worker.stop(Duration::from_secs(30)).await.unwrap();
}

/// A service config listening on loopback port 0 (gRPC and admin) against `brokers`, with `yaml`'s keys
/// (which must not hold a `service:` or `kafka:` section of their own).
pub fn config_on_port_0<T>(brokers: &str, yaml: &str) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize + Default,
{
    config(&format!(
        "service: {{grpc_addr: 127.0.0.1:0, admin_addr: 127.0.0.1:0}}\nkafka: {{brokers: '{brokers}'}}\n{yaml}"
    ))
}

/// A service config from YAML, as the service would load it from its file (defaults under it, no `HL7GW_`
/// variables over it).
pub fn config<T>(yaml: &str) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize + Default,
{
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, yaml).unwrap();
    let no_flags = std::collections::BTreeMap::<String, String>::new();
    let no_env = figment::providers::Env::prefixed("HL7GW_TESTKIT_NOTHING_");
    hl7gw_runtime::config::load_with_env(Some(&file), &no_flags, no_env)
        .unwrap_or_else(|e| panic!("config {yaml}: {e}"))
}
