//! The MLLP listener: bounded connections (at the limit the stalest idle or slow one makes room), TCP_NODELAY,
//! optional PROXY protocol header and TLS.

use crate::config::Config;
use crate::connection;
use crate::metrics::{ProtocolLabels, ReasonLabels};
use crate::pipeline::{Origin, Pipeline};
use crate::slots::{Progress, Slot, Slots, Taken};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Accepts connections until `stop`; each runs on `tracker` so the drain can wait for them.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    pipe: Arc<Pipeline>,
    cfg: Arc<Config>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Slots::new(cfg.max_connections, cfg.evict_after);
    let ids = AtomicU64::new(0);
    let listener_name: Arc<str> = Arc::from(cfg.listener_name.as_str());
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let id = ids.fetch_add(1, Ordering::Relaxed) + 1;
        // At the limit the stalest idle or slow connection is closed to make room; when every one is busy or
        // recent, the new connection is closed at once and counted, not left waiting unanswered in the
        // kernel's backlog: the sender sees the close and retries.
        let free = match slots.take(id) {
            Taken::Free(slot) => Some(slot),
            Taken::Evicting => None,
            Taken::Refused => {
                refuse_at_limit(&pipe, peer);
                drop(tcp);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (pipe, cfg, stop, tls, name, slots) = (
            pipe.clone(),
            cfg.clone(),
            stop.clone(),
            tls.clone(),
            listener_name.clone(),
            slots.clone(),
        );
        tracker.spawn(async move {
            let slot: Slot = match free {
                Some(s) => s,
                None => match slots.wait(id).await {
                    Some(s) => s,
                    None => {
                        refuse_at_limit(&pipe, peer);
                        return;
                    }
                },
            };
            let progress = slot.progress.clone();
            let m = pipe.metrics.clone();
            m.connections
                .get_or_create(&ProtocolLabels { protocol: "mllp" })
                .inc();
            m.connections_active.inc();
            handle(tcp, peer, id, tls, pipe, cfg, stop, name, progress).await;
            m.connections_active.dec();
            drop(slot);
        });
    }
}

fn refuse_at_limit(pipe: &Pipeline, peer: SocketAddr) {
    pipe.metrics
        .connections_refused
        .get_or_create(&ReasonLabels {
            reason: "max_connections",
        })
        .inc();
    tracing::debug!(%peer, "connection refused: max_connections reached");
}

#[allow(clippy::too_many_arguments)]
async fn handle(
    mut tcp: TcpStream,
    peer: SocketAddr,
    id: u64,
    tls: Option<TlsAcceptor>,
    pipe: Arc<Pipeline>,
    cfg: Arc<Config>,
    stop: CancellationToken,
    listener: Arc<str>,
    progress: Arc<Progress>,
) {
    let refused = |reason: &'static str| {
        pipe.metrics
            .connections_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    };
    let mut peer = peer.to_string();
    if cfg.proxy_protocol {
        match tokio::time::timeout(Duration::from_secs(5), read_proxy_header(&mut tcp)).await {
            Ok(Ok(Some(addr))) => peer = addr,
            Ok(Ok(None)) => {}
            _ => {
                refused("proxy_header");
                tracing::info!(
                    peer,
                    "connection without a valid PROXY protocol header closed"
                );
                return;
            }
        }
    }
    let mut origin = Origin {
        listener,
        protocol: "mllp",
        peer: peer.into(),
        connection_id: format!("mllp-{id}"),
        tls_client: String::new(),
    };
    tracing::debug!(peer = %origin.peer, connection = %origin.connection_id, "connection opened");
    match tls {
        Some(acceptor) => {
            match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    if let Some(cert) = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                    {
                        origin.tls_client = crate::tls::subject(cert);
                    }
                    connection::serve(stream, origin, pipe, cfg, stop, progress).await;
                }
                Ok(Err(e)) => {
                    refused("tls_handshake");
                    tracing::info!(peer = %origin.peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    refused("tls_handshake");
                    tracing::info!(peer = %origin.peer, "TLS handshake timed out");
                }
            }
        }
        None => connection::serve(tcp, origin, pipe, cfg, stop, progress).await,
    }
}

/// Reads a PROXY protocol v1 or v2 header (and nothing after it). `Ok(None)`: a LOCAL/UNKNOWN header that
/// names no client; `Err`: no valid header.
async fn read_proxy_header(tcp: &mut TcpStream) -> std::io::Result<Option<String>> {
    use ppp::PartialResult;
    use tokio::io::AsyncReadExt;
    let mut peek = [0u8; 536];
    loop {
        let n = tcp.peek(&mut peek).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        match ppp::HeaderResult::parse(&peek[..n]) {
            ppp::HeaderResult::V1(Ok(h)) => {
                let len = h.header.len();
                let addr = match h.addresses {
                    ppp::v1::Addresses::Tcp4(a) => {
                        Some(SocketAddr::from((a.source_address, a.source_port)).to_string())
                    }
                    ppp::v1::Addresses::Tcp6(a) => {
                        Some(SocketAddr::from((a.source_address, a.source_port)).to_string())
                    }
                    ppp::v1::Addresses::Unknown => None,
                };
                let mut skip = vec![0u8; len];
                tcp.read_exact(&mut skip).await?;
                return Ok(addr);
            }
            ppp::HeaderResult::V2(Ok(h)) => {
                let len = h.len();
                let addr = match h.addresses {
                    ppp::v2::Addresses::IPv4(a) => {
                        Some(SocketAddr::from((a.source_address, a.source_port)).to_string())
                    }
                    ppp::v2::Addresses::IPv6(a) => {
                        Some(SocketAddr::from((a.source_address, a.source_port)).to_string())
                    }
                    _ => None,
                };
                let mut skip = vec![0u8; len];
                tcp.read_exact(&mut skip).await?;
                return Ok(addr);
            }
            r if r.is_incomplete() && n < peek.len() => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            _ => return Err(std::io::ErrorKind::InvalidData.into()),
        }
    }
}
