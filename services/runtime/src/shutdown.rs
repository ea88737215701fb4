//! Shutdown: SIGTERM or SIGINT cancels one token; services stop accepting, drain, flush and exit in order.
//! [`block_on`] is the part of every service's `main` after its config is read ([`crate::service::main`]).

use std::io::Write;
use tokio_util::sync::CancellationToken;

/// Why running a service stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E: std::error::Error + 'static> {
    #[error("starting the tokio runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    #[error(transparent)]
    Service(E),
}

/// Runs a service: a multi-threaded tokio runtime, telemetry named `service`, and SIGTERM/SIGINT cancelling
/// the token handed to `run`, which returns once the service drained.
pub fn block_on<E, Fut>(
    service: &'static str,
    log_json: bool,
    run: impl FnOnce(CancellationToken) -> Fut,
) -> Result<(), RunError<E>>
where
    E: std::error::Error + 'static,
    Fut: Future<Output = Result<(), E>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    rt.block_on(async move {
        let _telemetry = crate::telemetry::init(service, log_json)?;
        let stop = CancellationToken::new();
        cancel_on_signal(stop.clone());
        run(stop).await.map_err(RunError::Service)
    })
}

/// Prints the one stdout line a service writes once its ports are bound (tests and scripts wait for it).
pub fn print_listening(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(line);
    let _ = writeln!(out);
    let _ = out.flush();
}

/// Cancels `token` on the first SIGTERM or SIGINT (Ctrl-C).
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received; draining");
        token.cancel();
    });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
