//! One MLLP connection: a reader that frames, submits and queues messages in arrival order, and a writer that
//! answers them in the same order as Kafka confirms them. At most `max_in_flight_per_connection` wait at once.

use crate::budget::{self, Held};
use crate::config::{ApplicationAck, Config};
use crate::pipeline::{Action, Origin, Pending, Pipeline};
use bytes::BytesMut;
use hl7gw_runtime::slots::Progress;
use hl7v2::mllp::{CR, EB, MllpCodec, MllpError, SB};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::{Decoder, Encoder};
use tokio_util::sync::CancellationToken;

/// MLLP release 2 commit acknowledgement bytes.
const COMMIT_ACK: u8 = 0x06;
const COMMIT_NAK: u8 = 0x15;

/// Serves one connection until the peer closes, a deadline passes, or `stop` (drain) is cancelled between
/// frames. Messages already read are always answered before the connection closes. The deadlines are for
/// whole frames (`frame_timeout` from a frame's start) and since the last complete frame (`idle_timeout`),
/// so a byte now and then cannot hold a connection slot.
pub async fn serve<S>(
    stream: S,
    origin: Origin,
    pipe: Arc<Pipeline>,
    cfg: Arc<Config>,
    stop: CancellationToken,
    progress: Arc<Progress>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, wr) = tokio::io::split(stream);
    let (tx, rx) = mpsc::channel::<InFlight>(cfg.max_in_flight_per_connection);
    let budget = pipe
        .budget
        .connection(cfg.max_in_flight_bytes_per_connection);
    let closing = CancellationToken::new();
    // Listed in the sender view while the writer runs (it answers the connection's last message).
    let listed = pipe.senders.connect(&origin);
    let writer = tokio::spawn(write_loop(
        wr,
        rx,
        pipe.clone(),
        cfg.clone(),
        closing.clone(),
        progress.clone(),
        listed,
    ));
    let m = &pipe.metrics;
    let mut codec = MllpCodec::new(cfg.max_frame_bytes);
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut sequence = 0u64;
    let mut skipped = 0u64;
    let mut limiter = RateLimiter::new(cfg.rate_limit_per_connection);
    let mut idle_deadline = Instant::now() + cfg.idle_timeout;
    let mut frame_deadline: Option<Instant> = None;
    // The process budget reserved for the read buffer of a frame not yet complete.
    let mut reading: Vec<Held> = Vec::new();
    'conn: loop {
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => {
                    m.frames.inc();
                    progress.frame();
                    frame_deadline = None;
                    // The frame is charged on its own now (below); the buffer's reservation goes.
                    reading.clear();
                    idle_deadline = Instant::now() + cfg.idle_timeout;
                    // Held until the answer is written: the connection's and the process's waiting messages
                    // stay within bytes.
                    let bytes = tokio::select! {
                        p = budget.acquire(budget::cost(&frame)) => match p {
                            Some(p) => p,
                            None => break 'conn,
                        },
                        _ = closing.cancelled() => break 'conn,
                    };
                    limiter.wait().await;
                    sequence += 1;
                    let p = pipe.submit(frame.freeze(), &origin, sequence);
                    progress.read();
                    if tx.send((p, Some(bytes))).await.is_err() {
                        break 'conn;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    m.framing_error(e.kind(), &origin.peer);
                    let text = match e {
                        MllpError::FrameTooLarge { limit } => {
                            format!("message larger than the {limit}-byte limit")
                        }
                        MllpError::MissingCarriageReturn => {
                            "MLLP end block not followed by CR".to_owned()
                        }
                        // The sender restarted a frame: the partial one was never complete, nothing to answer.
                        MllpError::StartBlockInFrame { .. } => continue,
                        MllpError::Truncated { .. } | MllpError::Io(_) => break 'conn,
                        _ => break 'conn,
                    };
                    let (reply, bytes) = match codec.take_rejected() {
                        Some(payload) => {
                            // Held until its answer is written, like any frame's bytes.
                            let bytes = tokio::select! {
                                p = budget.acquire(budget::cost(&payload)) => match p {
                                    Some(p) => p,
                                    None => break 'conn,
                                },
                                _ = closing.cancelled() => break 'conn,
                            };
                            sequence += 1;
                            let r = pipe.framing_reject(payload.freeze(), text, &origin, sequence);
                            (r, Some(bytes))
                        }
                        None => (Pending::Ready(pipe.framing_reply(text)), None),
                    };
                    progress.read();
                    if tx.send((reply, bytes)).await.is_err() {
                        break 'conn;
                    }
                }
            }
        }
        let now_skipped = codec.skipped_bytes();
        if now_skipped > skipped {
            m.bytes_skipped.inc_by(now_skipped - skipped);
            skipped = now_skipped;
        }
        let between_frames = codec.is_idle() && buf.is_empty();
        // Neither deadline moves with the bytes that arrive: only a complete frame resets them (a restarted
        // frame keeps the first start's deadline).
        let deadline = if between_frames {
            idle_deadline
        } else {
            *frame_deadline.get_or_insert_with(|| Instant::now() + cfg.frame_timeout)
        };
        tokio::select! {
            biased;
            _ = closing.cancelled() => break,
            _ = stop.cancelled(), if between_frames => break,
            _ = progress.evicted.cancelled() => {
                m.connections_evicted.inc();
                hl7gw_runtime::limited_debug!("evicted", peer = %origin.peer, "connection closed to make room at a connection bound");
                break;
            }
            r = tokio::time::timeout_at(deadline, read_more(&mut rd, &mut buf, &budget, &mut reading)) => match r {
                Ok(Ok(0)) => {
                    if !between_frames {
                        m.framing_error("truncated", &origin.peer);
                    }
                    break;
                }
                Ok(Ok(n)) => {
                    m.bytes_received.inc_by(n as u64);
                }
                Ok(Err(_)) => break,
                Err(_) => {
                    if between_frames {
                        m.idle_closes.inc();
                        tracing::debug!(peer = %origin.peer, "idle connection closed");
                    } else {
                        m.framing_error("frame_timeout", &origin.peer);
                    }
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Reads what the peer sent into `buf`, first reserving from the process's budget whatever of the buffer's
/// capacity is past [`budget::FREE_READ_BYTES`] and not reserved yet (the buffer is grown here, so the read
/// cannot grow it past what was reserved). Waits while the budget is spent; the frame's deadline still runs.
async fn read_more<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    budget: &budget::ConnectionBudget,
    reading: &mut Vec<Held>,
) -> std::io::Result<usize> {
    buf.reserve(8 * 1024);
    let reserved: usize = reading.iter().map(Held::bytes).sum();
    let needed = buf
        .capacity()
        .saturating_sub(budget::FREE_READ_BYTES + reserved);
    if needed > 0 {
        match budget
            .reserve_reading(needed.next_multiple_of(64 * 1024))
            .await
        {
            Some(h) => reading.push(h),
            None => return Err(std::io::ErrorKind::BrokenPipe.into()),
        }
    }
    rd.read_buf(buf).await
}

/// A message read from the connection, with its share of the byte budget.
type InFlight = (Pending, Option<Held>);

async fn write_loop<W>(
    mut wr: W,
    mut rx: mpsc::Receiver<InFlight>,
    pipe: Arc<Pipeline>,
    cfg: Arc<Config>,
    closing: CancellationToken,
    progress: Arc<Progress>,
    listed: crate::senders::SenderConn,
) where
    W: AsyncWrite + Unpin,
{
    let mllp2 = cfg.mllp2_commit_acks;
    let (accept, on_store) = (
        cfg.accept_ack,
        cfg.application_ack == ApplicationAck::OnStore && !mllp2,
    );
    let mut ack = Vec::with_capacity(512);
    let mut out = BytesMut::with_capacity(4 * 1024);
    let mut codec = MllpCodec::default();
    while let Some((p, bytes)) = rx.recv().await {
        let reply = pipe.resolve(p).await;
        pipe.answered(&listed, &reply);
        // Answered as far as eviction and the byte budget go: the answer is about to be written, or the
        // connection closes. Released before the write, so a sender that waits for each answer finds its
        // connection holding nothing when it sends the next message (and gets the budget's floor).
        progress.answered();
        drop(bytes);
        if matches!(reply.action, Action::Close) {
            closing.cancel();
            break;
        }
        let code = pipe.render_accept(&reply, &mut ack, accept);
        if mllp2 {
            let accepted = match &reply.action {
                Action::Accept | Action::Replay(_) => true,
                Action::Batch(b) => b.all_accepted(),
                _ => false,
            };
            let b = if accepted { COMMIT_ACK } else { COMMIT_NAK };
            out.extend_from_slice(&[SB, b, EB, CR]);
        } else if code.is_some() {
            // Encoding into a BytesMut cannot fail.
            let _ = codec.encode(&ack[..], &mut out);
        }
        // The application ACK (application_ack: on_store) follows the accept ACK in the same bounded buffer:
        // written by the same flush, under the same write_timeout.
        if on_store && pipe.render_application(&reply, &mut ack).is_some() {
            let _ = codec.encode(&ack[..], &mut out);
        }
        if (rx.is_empty() || out.len() > 64 * 1024) && !out.is_empty() {
            progress.writing();
            let written = tokio::time::timeout(cfg.write_timeout, async {
                wr.write_all(&out).await?;
                wr.flush().await
            })
            .await;
            progress.written();
            match written {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    closing.cancel();
                    break;
                }
                Err(_) => {
                    pipe.metrics.write_timeouts.inc();
                    hl7gw_runtime::limited_info!(
                        "write_timeout",
                        "sender did not read its ACKs within write_timeout: closed"
                    );
                    closing.cancel();
                    break;
                }
            }
            out.clear();
        }
    }
    if !out.is_empty() {
        let _ = tokio::time::timeout(cfg.write_timeout, wr.write_all(&out)).await;
    }
    let _ = tokio::time::timeout(cfg.write_timeout, wr.shutdown()).await;
    // Messages left unanswered (close on timeout, or the peer went away) are dropped with `rx`: the sender
    // resends them.
}

/// Spaces messages of one connection to at most `rate` per second (0: no limit).
#[derive(Debug)]
pub(crate) struct RateLimiter {
    interval: Option<Duration>,
    next: tokio::time::Instant,
}

impl RateLimiter {
    pub(crate) fn new(rate: f64) -> Self {
        Self {
            interval: (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate)),
            next: tokio::time::Instant::now(),
        }
    }

    pub(crate) async fn wait(&mut self) {
        let Some(iv) = self.interval else { return };
        let now = tokio::time::Instant::now();
        if self.next > now {
            tokio::time::sleep_until(self.next).await;
        }
        self.next = self.next.max(now) + iv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::test_pipeline;
    use hl7gw_runtime::slots::{SlotLimits, Slots, Taken};

    /// Issue 24, item 3: frames still being read are charged to the process's budget past the first 64 KiB,
    /// so eight connections each half way through a 300 KB frame hold no more than a 512 KiB budget (they wait,
    /// counted), where before each buffered its bytes uncounted.
    #[tokio::test]
    async fn partial_frames_draw_on_the_process_budget() {
        let cfg = Config {
            max_in_flight_bytes_per_connection: 64 * 1024,
            max_in_flight_bytes: 512 * 1024,
            ..Config::default()
        };
        let pipe = Arc::new(test_pipeline(cfg.clone()));
        let cfg = Arc::new(cfg);
        let slots = Slots::new(SlotLimits {
            max: 16,
            per_address: 0,
            evict_after: Duration::ZERO,
            wait_when_full: false,
        });
        let mut clients = Vec::new();
        for id in 0..8 {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let Taken::Free(slot) = slots.take(id, None) else {
                panic!("a free slot")
            };
            let origin = Origin {
                listener: "mllp".into(),
                protocol: "mllp",
                peer: format!("127.0.0.1:{id}").into(),
                connection_id: format!("c{id}"),
                tls_client: String::new(),
            };
            let (pipe, cfg) = (pipe.clone(), cfg.clone());
            tokio::spawn(async move {
                let _slot = &slot;
                serve(
                    server,
                    origin,
                    pipe,
                    cfg,
                    CancellationToken::new(),
                    slot.progress.clone(),
                )
                .await;
            });
            clients.push(tokio::spawn(async move {
                let mut client = client;
                let mut partial = vec![SB];
                partial.extend(std::iter::repeat_n(b'X', 300 * 1024));
                // Blocks once the server stops reading: the budget is spent.
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), client.write_all(&partial)).await;
                client
            }));
        }
        let mut open = Vec::new();
        for c in clients {
            open.push(c.await.expect("client"));
        }
        let held = pipe.metrics.in_flight_bytes.get();
        assert!(held <= 512 * 1024, "{held} bytes held");
        assert!(held >= 256 * 1024, "the partial frames are charged: {held}");
        assert!(pipe.metrics.budget_waits.get() >= 1, "connections waited");
        drop(open);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limiter_spaces_messages() {
        let mut l = RateLimiter::new(10.0);
        let t0 = tokio::time::Instant::now();
        for _ in 0..5 {
            l.wait().await;
        }
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_millis(500),
            "{took:?}"
        );
        let mut off = RateLimiter::new(0.0);
        let t1 = tokio::time::Instant::now();
        off.wait().await;
        assert_eq!(t1.elapsed(), Duration::ZERO);
    }
}
