//! `hl7gw receive --http`: an HTTP receiver standing in for a FHIR server or a web service (`make run`, tests):
//! each POST/PUT body is stored as a file (temp name, fsync, rename), then answered 200 with an
//! OperationOutcome naming the file. Logs carry sizes, content types and file names: never content.

use super::args::ReceiveArgs;
use super::shared::{Refusal, stop_signal, store};
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;

struct Shared {
    out: PathBuf,
    sync: bool,
    reject_every: Option<u64>,
    refusal: Option<Refusal>,
    delay: std::time::Duration,
    count: Option<u64>,
    next_seq: AtomicU64,
    received: AtomicU64,
    stored: AtomicU64,
    done: CancellationToken,
}

/// Serves until SIGINT/SIGTERM (or `--count` bodies stored).
pub async fn serve(args: &ReceiveArgs, first_seq: u64) -> anyhow::Result<()> {
    let shared = Arc::new(Shared {
        out: args.out.clone(),
        sync: !args.no_sync,
        reject_every: args.reject_every,
        refusal: Refusal::from_args(args),
        delay: std::time::Duration::from_millis(args.delay),
        count: args.count,
        next_seq: AtomicU64::new(first_seq),
        received: AtomicU64::new(0),
        stored: AtomicU64::new(0),
        done: CancellationToken::new(),
    });
    let app = axum::Router::new()
        .fallback(receive)
        .layer(DefaultBodyLimit::max(args.max_frame))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let local = listener.local_addr().context("reading the bound address")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {local}")?;
        out.flush()?;
    }
    log!(
        "listening on http://{local}, storing in {}",
        shared.out.display()
    );
    let done = shared.done.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                () = stop_signal() => log!("stopping on signal"),
                () = done.cancelled() => {}
            }
        })
        .await
        .context("serving HTTP")?;
    log!("stopped: {} stored", shared.stored.load(Ordering::Relaxed));
    Ok(())
}

/// One request: POST/PUT bodies are stored and answered 200; anything else is 405.
async fn receive(
    State(s): State<Arc<Shared>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method != Method::POST && method != Method::PUT {
        return (StatusCode::METHOD_NOT_ALLOWED, "POST or PUT\n").into_response();
    }
    let n = s.received.fetch_add(1, Ordering::Relaxed) + 1;
    if !s.delay.is_zero() {
        tokio::time::sleep(s.delay).await;
    }
    if s.refusal.as_ref().is_some_and(|r| r.refuses(&body)) {
        log!("request {n}: answered 503 (--refuse-containing)");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            outcome("error", "transient", "refused by --refuse-containing"),
        )
            .into_response();
    }
    if s.reject_every.is_some_and(|every| n % every == 0) {
        log!("request {n}: answered 503 (--reject-every)");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            outcome("error", "transient", "refused by --reject-every"),
        )
            .into_response();
    }
    if s.count
        .is_some_and(|c| s.stored.load(Ordering::Relaxed) >= c)
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "done\n").into_response();
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ext = match content_type {
        c if c.contains("json") => "json",
        c if c.contains("hl7") => "hl7",
        _ => "bin",
    };
    let seq = s.next_seq.fetch_add(1, Ordering::Relaxed);
    let name = format!("{seq:06}-http.{ext}");
    if let Err(e) = store(&s.out, &name, &body, s.sync).await {
        log!("{name}: not stored: {}", e.kind());
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            outcome("error", "exception", "not stored"),
        )
            .into_response();
    }
    log!(
        "{name}: {} bytes of {} stored",
        body.len(),
        crate::sanitise::sanitise(content_type.as_bytes())
    );
    let stored = s.stored.fetch_add(1, Ordering::Relaxed) + 1;
    if s.count.is_some_and(|c| stored >= c) {
        s.done.cancel();
    }
    (
        StatusCode::OK,
        outcome("information", "informational", &format!("stored as {name}")),
    )
        .into_response()
}

/// A one-issue OperationOutcome (FHIR JSON).
fn outcome(severity: &str, code: &str, text: &str) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/fhir+json")],
        serde_json::json!({
            "resourceType": "OperationOutcome",
            "issue": [{"severity": severity, "code": code, "diagnostics": text}]
        })
        .to_string(),
    )
}
