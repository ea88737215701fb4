//! The MLLP listener: bounded connections (at the limit the stalest idle or slow one makes room), TCP_NODELAY,
//! optional PROXY protocol header and TLS.

use crate::config::Config;
use crate::connection;
use crate::metrics::{ProtocolLabels, ReasonLabels};
use crate::pipeline::{Origin, Pipeline};
use hl7gw_runtime::slots::{Progress, Refusal, Slot, SlotLimits, Slots, Taken};
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
    let slots = Slots::new(SlotLimits {
        max: cfg.max_connections,
        per_address: cfg.max_connections_per_address,
        evict_after: cfg.evict_after,
        wait_when_full: false,
    });
    let ids = AtomicU64::new(0);
    let listener_name: Arc<str> = Arc::from(cfg.listener_name.as_str());
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    hl7gw_runtime::limited_warn!("accept_failed", error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let id = ids.fetch_add(1, Ordering::Relaxed) + 1;
        // The TCP peer is the client unless a PROXY protocol header names it (then the bound applies once the
        // header is read).
        let addr = (!cfg.proxy_protocol).then_some(peer.ip());
        // At the limit the stalest idle or slow connection is closed to make room; when every one is busy or
        // recent, the new connection is closed at once and counted, not left waiting unanswered in the
        // kernel's backlog: the sender sees the close and retries.
        let free = match slots.take(id, addr) {
            Taken::Free(slot) => Some(slot),
            Taken::Wait => None,
            Taken::Refused(why) => {
                refuse(&pipe, peer, why);
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
                None => match slots.wait(id, addr).await {
                    Some(s) => s,
                    None => {
                        refuse(&pipe, peer, Refusal::MaxConnections);
                        return;
                    }
                },
            };
            let m = pipe.metrics.clone();
            m.connections
                .get_or_create(&ProtocolLabels { protocol: "mllp" })
                .inc();
            m.connections_active.inc();
            handle(tcp, peer, id, tls, pipe, cfg, stop, name, &slot).await;
            m.connections_active.dec();
            drop(slot);
        });
    }
}

fn refuse(pipe: &Pipeline, peer: SocketAddr, why: Refusal) {
    let reason = why.reason();
    pipe.metrics
        .connections_refused
        .get_or_create(&ReasonLabels { reason })
        .inc();
    hl7gw_runtime::limited_debug!(reason, %peer, reason, "connection refused at its connection bound");
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
    slot: &Slot,
) {
    let progress: Arc<Progress> = slot.progress.clone();
    let refused = |reason: &'static str| {
        pipe.metrics
            .connections_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    };
    // Handshakes (PROXY header, TLS) are as evictable as a connection that never sent a frame: a flood of
    // slow handshakes cannot pin the slots until their timeouts.
    let evicted = || {
        pipe.metrics.connections_evicted.inc();
        hl7gw_runtime::limited_debug!("evicted_in_handshake", %peer, "connection closed in its handshake to make room");
    };
    let mut peer = peer.to_string();
    if cfg.proxy_protocol {
        let header = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(5), read_proxy_header(&mut tcp)) => r,
            _ = progress.evicted.cancelled() => return evicted(),
        };
        match header {
            Ok(Ok(Some(addr))) => {
                if let Err(why) = slot.bind_address(addr.ip()) {
                    refuse(&pipe, addr, why);
                    return;
                }
                peer = addr.to_string();
            }
            Ok(Ok(None)) => {}
            _ => {
                refused("proxy_header");
                hl7gw_runtime::limited_info!(
                    "proxy_header",
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
            let accepted = tokio::select! {
                r = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)) => r,
                _ = progress.evicted.cancelled() => return evicted(),
            };
            match accepted {
                Ok(Ok(stream)) => {
                    if let Some(cert) = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                    {
                        origin.tls_client = hl7gw_tls::subject(cert);
                    }
                    connection::serve(stream, origin, pipe, cfg, stop, progress).await;
                }
                Ok(Err(e)) => {
                    refused("tls_handshake");
                    hl7gw_runtime::limited_info!("tls_handshake", peer = %origin.peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    refused("tls_handshake");
                    hl7gw_runtime::limited_info!("tls_handshake", peer = %origin.peer, "TLS handshake timed out");
                }
            }
        }
        None => connection::serve(tcp, origin, pipe, cfg, stop, progress).await,
    }
}

/// Reads a PROXY protocol v1 or v2 header (and nothing after it). `Ok(None)`: a LOCAL/UNKNOWN header that
/// names no client; `Err`: no valid header.
async fn read_proxy_header(tcp: &mut TcpStream) -> std::io::Result<Option<SocketAddr>> {
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
                        Some(SocketAddr::from((a.source_address, a.source_port)))
                    }
                    ppp::v1::Addresses::Tcp6(a) => {
                        Some(SocketAddr::from((a.source_address, a.source_port)))
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
                        Some(SocketAddr::from((a.source_address, a.source_port)))
                    }
                    ppp::v2::Addresses::IPv6(a) => {
                        Some(SocketAddr::from((a.source_address, a.source_port)))
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
