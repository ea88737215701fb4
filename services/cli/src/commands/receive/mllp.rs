//! The MLLP receiver: every connection in its own task, its messages in order: parse, store, then ACK; a
//! payload that does not parse gets an AR/CR with an ERR segment and is kept under `rejected/`; a framing
//! violation gets an AR with ERR 207 and the connection is closed.

use super::args::ReceiveArgs;
use super::shared::{REJECTED_DIR, Refusal, file_name, stop_signal, store};
use crate::sanitise::sanitise;
use anyhow::Context;
use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use hl7v2::ack::{AckError, AckIds, Outcome, ack_code, hl7_timestamp, write_ack};
use hl7v2::{ErrorCode, Header, Message, MllpCodec, MllpError};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

/// How long a closing connection keeps reading (and discarding) what the peer still sends, so that the
/// close does not reset the connection before the peer has read our last answer.
const LINGER: Duration = Duration::from_secs(2);

/// How long in-flight connections get to finish after the receiver was told to stop.
const DRAIN: Duration = Duration::from_secs(10);

/// What every connection task shares.
#[derive(Debug)]
struct Shared {
    out: PathBuf,
    max_frame: usize,
    idle: Duration,
    reject_every: Option<u64>,
    refusal: Option<Refusal>,
    delay: Duration,
    count: Option<u64>,
    sync: bool,
    /// Sequence number of the next received payload (file names).
    next_seq: AtomicU64,
    /// Messages that parsed (for --reject-every).
    parsed: AtomicU64,
    /// Store slots handed out (for --count).
    reserved: AtomicU64,
    /// Messages stored and answered.
    stored: AtomicU64,
    /// Payloads and frames refused.
    rejected: AtomicU64,
    shutdown: CancellationToken,
}

/// Serves MLLP on `--listen` until SIGINT/SIGTERM (or `--count` messages stored), numbering files from `first`.
pub async fn serve(
    args: &ReceiveArgs,
    first: u64,
    acceptor: Option<TlsAcceptor>,
) -> anyhow::Result<()> {
    let shared = Arc::new(Shared {
        out: args.out.clone(),
        max_frame: args.max_frame,
        idle: Duration::from_secs(args.idle_timeout),
        reject_every: args.reject_every,
        refusal: Refusal::from_args(args),
        delay: Duration::from_millis(args.delay),
        count: args.count,
        sync: !args.no_sync,
        next_seq: AtomicU64::new(first),
        parsed: AtomicU64::new(0),
        reserved: AtomicU64::new(0),
        stored: AtomicU64::new(0),
        rejected: AtomicU64::new(0),
        shutdown: CancellationToken::new(),
    });
    listen(&args.listen, acceptor, shared).await
}

async fn listen(
    listen: &str,
    acceptor: Option<TlsAcceptor>,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let local = listener.local_addr().context("reading the bound address")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {local}")?;
        out.flush()?;
    }
    log!(
        "listening on {local}{}, storing in {}",
        if acceptor.is_some() { " (TLS)" } else { "" },
        shared.out.display()
    );
    let mut tasks = JoinSet::new();
    let stop = stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = shared.shutdown.cancelled() => break,
            () = &mut stop => {
                log!("stopping on signal");
                break;
            }
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    tasks.spawn(connection(tcp, peer, acceptor.clone(), shared.clone()));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    log!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(e) = joined {
                    log!("connection task failed: {e}");
                }
            }
        }
    }
    drop(listener);
    shared.shutdown.cancel();
    let drained = timeout(DRAIN, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        log!(
            "{} connection(s) still open after {}s, closing them",
            tasks.len(),
            DRAIN.as_secs()
        );
        tasks.shutdown().await;
    }
    log!(
        "stopped: {} stored, {} rejected",
        shared.stored.load(Ordering::Relaxed),
        shared.rejected.load(Ordering::Relaxed)
    );
    Ok(())
}

/// One accepted connection: the TLS handshake when configured, then the message loop.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: Option<TlsAcceptor>,
    shared: Arc<Shared>,
) {
    let _ = tcp.set_nodelay(true);
    log!("{peer}: connected");
    let handled = match acceptor {
        Some(acceptor) => match timeout(shared.idle, acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => messages(stream, peer, &shared).await,
            Ok(Err(e)) => {
                log!("{peer}: TLS handshake failed: {e}");
                return;
            }
            Err(_) => {
                log!("{peer}: TLS handshake timed out");
                return;
            }
        },
        None => messages(tcp, peer, &shared).await,
    };
    log!("{peer}: closed after {handled} message(s)");
}

/// What the message loop does with one payload.
enum Answer {
    /// Write this ACK or NAK (in the connection's ACK buffer) and go on.
    Reply { accepted_slot: bool },
    /// Close without an answer (the receiver is stopping; the sender will resend).
    Close,
}

/// The message loop of one connection; returns the number of frames answered.
async fn messages<S>(io: S, peer: SocketAddr, shared: &Shared) -> u64
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut framed = Framed::new(io, MllpCodec::new(shared.max_frame));
    let mut ack = Vec::with_capacity(512);
    let mut answered = 0;
    loop {
        let next = tokio::select! {
            biased;
            () = shared.shutdown.cancelled() => break,
            next = timeout(shared.idle, framed.next()) => next,
        };
        let payload = match next {
            Err(_) => {
                log!("{peer}: idle for {}s, closing", shared.idle.as_secs());
                break;
            }
            Ok(None) => return answered,
            Ok(Some(Err(e))) => {
                shared.rejected.fetch_add(1, Ordering::Relaxed);
                log!("{peer}: MLLP error {}: {e}", e.kind());
                if framing_nak(&e, &mut ack) {
                    let _ = timeout(shared.idle, framed.send(&ack[..])).await;
                    answered += 1;
                }
                break;
            }
            Ok(Some(Ok(payload))) => payload,
        };
        match answer(&payload, peer, shared, &mut ack).await {
            Answer::Reply { accepted_slot } => {
                match timeout(shared.idle, framed.send(&ack[..])).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => log!("{peer}: writing the ACK failed: {e}"),
                    Err(_) => log!("{peer}: writing the ACK timed out"),
                }
                answered += 1;
                if accepted_slot {
                    let stored = shared.stored.fetch_add(1, Ordering::AcqRel) + 1;
                    if shared.count.is_some_and(|n| stored >= n) {
                        log!("{stored} message(s) stored, as --count asked: stopping");
                        shared.shutdown.cancel();
                    }
                }
            }
            Answer::Close => break,
        }
    }
    close_gently(framed).await;
    answered
}

/// Handles one payload: decides, stores, and writes the answer into `ack`.
async fn answer(
    payload: &BytesMut,
    peer: SocketAddr,
    shared: &Shared,
    ack: &mut Vec<u8>,
) -> Answer {
    let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
    let now = hl7_timestamp(SystemTime::now());
    let ack_id = ack_control_id(&now, seq);
    let ids = AckIds {
        control_id: ack_id.as_bytes(),
        timestamp: &now,
    };
    let size = payload.len();
    let message = match Message::parse(payload) {
        Ok(m) => m,
        Err(e) => {
            let h = Header::salvage(payload);
            let control_id = sanitise(h.control_id);
            let name = file_name(seq, h.control_id);
            let kept =
                match store(&shared.out.join(REJECTED_DIR), &name, payload, shared.sync).await {
                    Ok(()) => format!("kept as {REJECTED_DIR}/{name}"),
                    Err(err) => format!("could not keep it: {err}"),
                };
            log!(
                "{peer}: #{seq} rejected ({size} bytes, control id {control_id}): {} ({}); {kept}",
                e.kind(),
                e.code()
            );
            let text = e.to_string();
            return reject(shared, ack, &h, &ids, AckError::error(e.code(), &text));
        }
    };
    if !shared.delay.is_zero() {
        tokio::time::sleep(shared.delay).await;
    }
    let h = message.header();
    let control_id = sanitise(h.control_id);
    if shared.refusal.as_ref().is_some_and(|r| r.refuses(payload)) {
        log!(
            "{peer}: #{seq} refused on request ({size} bytes, control id {control_id}, --refuse-containing)"
        );
        let err = AckError::error(
            ErrorCode::ApplicationInternalError,
            "refused on request (--refuse-containing); resend later",
        );
        return reject(shared, ack, h, &ids, err);
    }
    let nth = shared.parsed.fetch_add(1, Ordering::Relaxed) + 1;
    if shared
        .reject_every
        .is_some_and(|every| nth.is_multiple_of(every))
    {
        log!(
            "{peer}: #{seq} rejected on request ({size} bytes, control id {control_id}, --reject-every)"
        );
        let err = AckError::error(
            ErrorCode::ApplicationInternalError,
            "rejected on request (--reject-every); resend later",
        );
        return reject(shared, ack, h, &ids, err);
    }
    if let Some(limit) = shared.count
        && shared.reserved.fetch_add(1, Ordering::AcqRel) >= limit
    {
        log!(
            "{peer}: #{seq} not taken (control id {control_id}): --count reached, closing unanswered"
        );
        return Answer::Close;
    }
    let name = file_name(seq, h.control_id);
    match store(&shared.out, &name, payload, shared.sync).await {
        Ok(()) => {
            log!("{peer}: #{seq} stored as {name} ({size} bytes, control id {control_id})");
            write_ack(ack, h, ack_code(h, Outcome::Accept), None, &ids);
            Answer::Reply {
                accepted_slot: true,
            }
        }
        Err(e) => {
            if shared.count.is_some() {
                shared.reserved.fetch_sub(1, Ordering::AcqRel);
            }
            log!("{peer}: #{seq} not stored (control id {control_id}): {e}");
            let err = AckError::error(
                ErrorCode::ApplicationInternalError,
                "could not store the message; resend later",
            );
            reject(shared, ack, h, &ids, err)
        }
    }
}

/// Counts a rejection and writes its AR/CR, carrying `err`, into `ack`.
fn reject(
    shared: &Shared,
    ack: &mut Vec<u8>,
    h: &Header<'_>,
    ids: &AckIds<'_>,
    err: AckError<'_>,
) -> Answer {
    shared.rejected.fetch_add(1, Ordering::Relaxed);
    write_ack(ack, h, ack_code(h, Outcome::Reject), Some(&err), ids);
    Answer::Reply {
        accepted_slot: false,
    }
}

/// The NAK for a framing violation (written into `out`), or `false` when the connection just ends.
fn framing_nak(e: &MllpError, out: &mut Vec<u8>) -> bool {
    let text = match e {
        MllpError::FrameTooLarge { .. }
        | MllpError::StartBlockInFrame { .. }
        | MllpError::MissingCarriageReturn => e.to_string(),
        _ => return false,
    };
    let now = hl7_timestamp(SystemTime::now());
    let id = ack_control_id(&now, 0);
    let ids = AckIds {
        control_id: id.as_bytes(),
        timestamp: &now,
    };
    let h = Header::default();
    let err = AckError::error(ErrorCode::ApplicationInternalError, &text);
    write_ack(out, &h, ack_code(&h, Outcome::Reject), Some(&err), &ids);
    true
}

/// Shuts down our side, then reads and discards what the peer still sends for a bounded time, so that the
/// kernel does not answer unread data with a reset that could destroy our last answer in flight.
async fn close_gently<S>(framed: Framed<S, MllpCodec>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut io = framed.into_inner();
    let _ = timeout(LINGER, io.shutdown()).await;
    let mut buf = vec![0u8; 8192];
    let _ = timeout(LINGER, async {
        while let Ok(n) = io.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// MSH-10 of our ACKs: the 14-digit time and the sequence, 20 characters (the v2.5 length of MSH-10).
fn ack_control_id(now: &[u8; 19], seq: u64) -> String {
    format!(
        "{}{:06}",
        String::from_utf8_lossy(&now[..14]),
        seq % 1_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_control_ids_fit_msh10() {
        let now = *b"20260101120000+0000";
        assert_eq!(ack_control_id(&now, 5), "20260101120000000005");
        assert_eq!(ack_control_id(&now, 1_000_005).len(), 20);
    }

    #[test]
    fn framing_violations_get_a_parseable_nak() {
        let mut out = Vec::new();
        assert!(framing_nak(
            &MllpError::FrameTooLarge { limit: 10 },
            &mut out
        ));
        let m = Message::parse(&out).unwrap();
        assert_eq!(m.get("MSA-1"), Some(&b"AR"[..]));
        assert_eq!(m.get("ERR-3-1"), Some(&b"207"[..]));
        assert!(!framing_nak(
            &MllpError::Truncated { buffered: 3 },
            &mut out
        ));
    }
}
