//! One client: a persistent connection, one message in flight (or `--in-flight` N, pipelined), latency of each
//! round trip.
//!
//! The loop reuses its write buffer (the framed message), its read buffer and its MLLP decoder; a message is
//! built before its timer starts. On a connection error or an ACK timeout the message counts as an error, the
//! connection is dropped and re-made after a short backoff, and the loop goes on with the next message (a
//! failed message is not resent: a load run counts, it does not deliver).

use crate::ack::{self, AckCheck};
use crate::grpc::GrpcTarget;
use crate::messages::{MessageId, MessageSet};
use crate::record::RecordHandle;
use crate::stats::{ClientStats, ErrorKind};
use bytes::BytesMut;
use hl7v2::MllpCodec;
use rustls_pki_types::ServerName;
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use tokio::time::Sleep;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::codec::Decoder;
use tokio_util::either::Either;

/// A connection: plain TCP or TLS, or the pipe to a gRPC stream's bridge (`--grpc`).
pub type Conn = Either<Either<TcpStream, TlsStream<TcpStream>>, tokio::io::DuplexStream>;

/// First wait before reconnecting; doubled per failure up to [`MAX_BACKOFF`], reset by an ACK.
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A `--rate` message whose turn came this far after its schedule (its predecessor's ACK was late) is late.
const LATE: Duration = Duration::from_millis(1);

/// Where and how to connect.
#[derive(Clone)]
pub struct Target {
    /// `HOST:PORT`, resolved at each connect (a restarted pod may have a new address).
    pub addr: String,
    pub tls: Option<(TlsConnector, ServerName<'static>)>,
    /// Over the gRPC `Ingest/SendStream` instead of MLLP (its own TLS settings).
    pub grpc: Option<Arc<GrpcTarget>>,
    /// Bound on TCP connect plus TLS handshake.
    pub connect_timeout: Duration,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("tls", &self.tls.as_ref().map(|(_, name)| name))
            .field("grpc", &self.grpc.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl Target {
    /// Connects (TCP_NODELAY, then the TLS handshake when configured; or a gRPC channel and stream).
    pub async fn connect(&self) -> io::Result<Conn> {
        let attempt = async {
            if let Some(grpc) = &self.grpc {
                return Ok(Either::Right(grpc.connect().await?));
            }
            let tcp = TcpStream::connect(&self.addr).await?;
            tcp.set_nodelay(true)?;
            match &self.tls {
                None => Ok(Either::Left(Either::Left(tcp))),
                Some((connector, name)) => Ok(Either::Left(Either::Right(
                    connector.connect(name.clone(), tcp).await?,
                ))),
            }
        };
        match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no connection within {:?}", self.connect_timeout),
            )),
        }
    }
}

/// When a client stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// After this many measured messages (or at the run's time limit).
    Count(u64),
    /// After this long (the last message's ACK is still awaited, up to the ACK timeout).
    Duration(Duration),
}

/// What the clients of one run share.
#[derive(Debug)]
pub struct Plan {
    pub target: Target,
    pub messages: Arc<MessageSet>,
    pub run_id: Vec<u8>,
    /// Warm-up messages per client.
    pub warmup: u64,
    pub mode: Mode,
    /// Longest wait for one ACK.
    pub timeout: Duration,
    /// Each client's send schedule (`None`: as fast as the ACKs come).
    pub rate: Option<Pace>,
    /// Messages sent ahead of their ACKs per connection (1: send, wait, send).
    pub in_flight: usize,
    /// Bounds the warm-up, and in count mode the whole run (`--max-seconds`).
    pub hard_deadline: Instant,
    /// Lets every client finish its warm-up before any starts measuring.
    pub barrier: Barrier,
}

struct Client<'p> {
    id: u32,
    plan: &'p Plan,
    conn: Option<Conn>,
    /// The ACK timer, reset for each message. Pushing a registered timer's deadline later is a lock-free
    /// store in tokio, where a fresh timer per message takes the timer wheel's lock twice and can wake a
    /// parked worker thread.
    ack_timer: Pin<Box<Sleep>>,
    wbuf: Vec<u8>,
    rbuf: BytesMut,
    codec: MllpCodec,
    backoff: Duration,
    stats: ClientStats,
}

/// Why [`Client::send_one`] sent nothing: no connection could be made before the deadline.
struct NotSent;

/// Runs one client to the end of the plan, starting on `conn`.
pub async fn run_client(
    id: u32,
    plan: Arc<Plan>,
    conn: Conn,
    record: Option<RecordHandle>,
) -> ClientStats {
    let plan = &*plan;
    let mut c = Client {
        id,
        plan,
        conn: Some(conn),
        ack_timer: Box::pin(tokio::time::sleep(plan.timeout)),
        wbuf: Vec::with_capacity(2048),
        rbuf: BytesMut::with_capacity(8192),
        codec: MllpCodec::default(),
        backoff: INITIAL_BACKOFF,
        stats: ClientStats::default(),
    };

    for seq in 0..plan.warmup {
        match c
            .send_one(
                seq,
                true,
                plan.hard_deadline,
                Some(plan.hard_deadline),
                None,
            )
            .await
        {
            Err(NotSent) => break,
            Ok(Ok(_)) => c.stats.warmup_messages += 1,
            Ok(Err(_)) => {
                c.stats.warmup_messages += 1;
                c.stats.warmup_errors += 1;
            }
        }
    }
    // Bounded: a client that died would otherwise hold the others here.
    let _ = tokio::time::timeout_at(plan.hard_deadline.into(), plan.barrier.wait()).await;

    let start = Instant::now();
    let (send_until, ack_until, counted) = match plan.mode {
        Mode::Count(n) => (plan.hard_deadline, Some(plan.hard_deadline), Some(n)),
        Mode::Duration(d) => (start + d, None, None),
    };
    if plan.in_flight > 1 {
        c.pipelined(start, send_until, ack_until, counted, record.as_ref())
            .await;
        c.stats.start = Some(start);
        c.stats.end = Some(Instant::now());
        return c.stats;
    }
    let mut seq = 0u64;
    loop {
        if counted.is_some_and(|n| seq >= n) {
            break;
        }
        // With a rate, each message has a scheduled time; its latency counts from then, so a gateway that
        // stalls shows up in the percentiles, not only as a lower rate (no coordinated omission).
        let mut scheduled = None;
        if let Some(rate) = plan.rate {
            let Some(at) = schedule(start, seq, rate, send_until) else {
                c.stats.stopped_early = counted.is_some();
                break;
            };
            // Late: the previous ACK came after this message's time (timer wake-up jitter is not lateness).
            if Instant::now().saturating_duration_since(at) > LATE {
                c.stats.late_sends += 1;
            }
            tokio::time::sleep_until(at.into()).await;
            scheduled = Some(at);
        }
        if Instant::now() >= send_until {
            c.stats.stopped_early = counted.is_some();
            break;
        }
        match c
            .send_one(seq, false, send_until, ack_until, scheduled)
            .await
        {
            Err(NotSent) => {
                c.stats.stopped_early = counted.is_some();
                break;
            }
            Ok(Ok((check, latency))) => {
                c.stats.messages += 1;
                c.stats.ack(check.class, check.id_matches, latency);
                if check.accepted()
                    && let Some(r) = &record
                {
                    r.acked(id, seq);
                }
            }
            Ok(Err(kind)) => {
                c.stats.messages += 1;
                c.stats.errors.add(kind);
            }
        }
        seq += 1;
    }
    c.stats.start = Some(start);
    c.stats.end = Some(Instant::now());
    c.stats
}

impl Client<'_> {
    /// Sends message `seq` and reads its ACK. Reconnects first when needed (until `connect_until`); the ACK
    /// wait ends at the ACK timeout or `ack_until`, whichever comes first. The latency counts from `scheduled`
    /// when given (a `--rate` schedule), else from the write.
    async fn send_one(
        &mut self,
        seq: u64,
        warmup: bool,
        connect_until: Instant,
        ack_until: Option<Instant>,
        scheduled: Option<Instant>,
    ) -> Result<Result<(AckCheck, Duration), ErrorKind>, NotSent> {
        if self.conn.is_none() {
            self.reconnect(connect_until, warmup).await?;
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err(NotSent);
        };
        let built = Instant::now();
        self.wbuf.clear();
        let id = MessageId {
            run: &self.plan.run_id,
            client: self.id,
            seq,
            warmup,
        };
        let cid = self.plan.messages.pick(seq).write_frame(&mut self.wbuf, id);
        let t0 = Instant::now();
        if !warmup {
            self.stats.build += t0 - built;
        }
        let by_timeout = t0 + self.plan.timeout;
        let limit = ack_until.map_or(by_timeout, |d| d.min(by_timeout));
        self.ack_timer.as_mut().reset(limit.into());
        let r = tokio::select! {
            biased;
            r = exchange(conn, &self.wbuf, &mut self.rbuf, &mut self.codec) => Some(r),
            () = &mut self.ack_timer => None,
        };
        let latency = scheduled.map_or(t0, |at| at.min(t0)).elapsed();
        let outcome = match r {
            Some(Ok(frame)) => {
                self.backoff = INITIAL_BACKOFF;
                Ok((ack::check(&frame, &self.wbuf[cid]), latency))
            }
            Some(Err(kind)) => Err(kind),
            None if limit < by_timeout => Err(ErrorKind::Deadline),
            None => Err(ErrorKind::Timeout),
        };
        if outcome.is_err() {
            self.disconnect();
        }
        Ok(outcome)
    }

    /// The measured phase with up to `plan.in_flight` messages written ahead of their ACKs, which must come
    /// back in order. An error or a timeout (counted from the oldest unanswered message) fails every message in
    /// flight and re-makes the connection, as one failed exchange does without pipelining.
    async fn pipelined(
        &mut self,
        start: Instant,
        send_until: Instant,
        ack_until: Option<Instant>,
        counted: Option<u64>,
        record: Option<&RecordHandle>,
    ) {
        let plan = self.plan;
        let mut waiting: VecDeque<Sent> = VecDeque::with_capacity(plan.in_flight);
        let mut seq = 0u64;
        let mut sending = true;
        loop {
            // Fill the window with every message that is due.
            let mut next_due = None;
            while sending && waiting.len() < plan.in_flight {
                if counted.is_some_and(|n| seq >= n) {
                    sending = false;
                    break;
                }
                let mut scheduled = None;
                if let Some(rate) = plan.rate {
                    let Some(at) = schedule(start, seq, rate, send_until) else {
                        self.stats.stopped_early = counted.is_some();
                        sending = false;
                        break;
                    };
                    let now = Instant::now();
                    if at > now {
                        if waiting.is_empty() {
                            tokio::time::sleep_until(at.into()).await;
                        } else {
                            next_due = Some(at);
                            break;
                        }
                    } else if now - at > LATE {
                        self.stats.late_sends += 1;
                    }
                    scheduled = Some(at);
                }
                if Instant::now() >= send_until {
                    self.stats.stopped_early = counted.is_some();
                    sending = false;
                    break;
                }
                if self.conn.is_none() && self.reconnect(send_until, false).await.is_err() {
                    self.stats.stopped_early = counted.is_some();
                    sending = false;
                    break;
                }
                let Some(conn) = self.conn.as_mut() else {
                    sending = false;
                    break;
                };
                let built = Instant::now();
                self.wbuf.clear();
                let id = MessageId {
                    run: &plan.run_id,
                    client: self.id,
                    seq,
                    warmup: false,
                };
                let cid = plan.messages.pick(seq).write_frame(&mut self.wbuf, id);
                let t0 = Instant::now();
                self.stats.build += t0 - built;
                let sent = Sent {
                    seq,
                    control_id: self.wbuf[cid].to_vec(),
                    origin: scheduled.map_or(t0, |at| at.min(t0)),
                    written: t0,
                };
                seq += 1;
                let write = async {
                    conn.write_all(&self.wbuf).await?;
                    conn.flush().await
                };
                match tokio::time::timeout(plan.timeout, write).await {
                    Ok(Ok(())) => waiting.push_back(sent),
                    Ok(Err(_)) | Err(_) => {
                        waiting.push_back(sent);
                        self.fail_all(&mut waiting, ErrorKind::Io);
                    }
                }
            }
            let Some(oldest) = waiting.front() else {
                if sending {
                    continue;
                }
                return;
            };
            let by_timeout = oldest.written + plan.timeout;
            let limit = ack_until.map_or(by_timeout, |d| d.min(by_timeout));
            let Some(conn) = self.conn.as_mut() else {
                self.fail_all(&mut waiting, ErrorKind::Closed);
                continue;
            };
            self.ack_timer.as_mut().reset(limit.into());
            // Reading is cancel-safe (bytes stay in `rbuf`), so a due message may interrupt the wait.
            let due = async {
                match next_due {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let r = tokio::select! {
                biased;
                r = read_frame(conn, &mut self.rbuf, &mut self.codec) => Some(r),
                () = &mut self.ack_timer => None,
                () = due => continue,
            };
            match r {
                Some(Ok(frame)) => {
                    self.backoff = INITIAL_BACKOFF;
                    let Some(sent) = waiting.pop_front() else {
                        continue;
                    };
                    let check = ack::check(&frame, &sent.control_id);
                    self.stats.messages += 1;
                    self.stats
                        .ack(check.class, check.id_matches, sent.origin.elapsed());
                    if check.accepted()
                        && let Some(r) = record
                    {
                        r.acked(self.id, sent.seq);
                    }
                }
                Some(Err(kind)) => self.fail_all(&mut waiting, kind),
                None if limit < by_timeout => self.fail_all(&mut waiting, ErrorKind::Deadline),
                None => self.fail_all(&mut waiting, ErrorKind::Timeout),
            }
        }
    }

    /// Counts every message in flight as failed with `kind` and drops the connection.
    fn fail_all(&mut self, waiting: &mut VecDeque<Sent>, kind: ErrorKind) {
        for _ in waiting.drain(..) {
            self.stats.messages += 1;
            self.stats.errors.add(kind);
        }
        self.disconnect();
    }

    fn disconnect(&mut self) {
        self.conn = None;
        self.rbuf.clear();
        self.codec = MllpCodec::default();
    }

    /// Re-connects after the backoff; each failed attempt is a `connect` error.
    async fn reconnect(&mut self, until: Instant, warmup: bool) -> Result<(), NotSent> {
        loop {
            let wake = Instant::now() + self.backoff;
            if wake >= until {
                return Err(NotSent);
            }
            tokio::time::sleep_until(wake.into()).await;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.plan.target.connect()).await {
                Ok(Ok(conn)) => {
                    self.conn = Some(conn);
                    self.stats.reconnects += 1;
                    return Ok(());
                }
                Ok(Err(_)) | Err(_) => {
                    if warmup {
                        self.stats.warmup_errors += 1;
                    } else {
                        self.stats.errors.add(ErrorKind::Connect);
                    }
                }
            }
        }
    }
}

/// When message `seq` is due at `rate` messages per second from `start`; `None` past `send_until`.
fn schedule(start: Instant, seq: u64, pace: Pace, send_until: Instant) -> Option<Instant> {
    pace.due(seq)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .and_then(|d| start.checked_add(d))
        .filter(|at| *at < send_until)
}

/// A client's send schedule (`--rate`, `--rate-to`): messages per second, constant or changing linearly from
/// `from` to `to` over `over` (a ramp, for a latency curve in one run).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    pub from: f64,
    pub to: f64,
    pub over: Duration,
}

impl Pace {
    /// `rate` messages per second throughout.
    pub fn constant(rate: f64) -> Self {
        Self {
            from: rate,
            to: rate,
            over: Duration::ZERO,
        }
    }

    /// Seconds after the start at which message `seq` (from 0) is due: the time `t` at which the rate's
    /// integral, `from·t + a·t²/2` with `a = (to - from) / over`, reaches `seq`.
    fn due(&self, seq: u64) -> Option<f64> {
        let n = seq as f64;
        let span = self.over.as_secs_f64();
        if self.to == self.from || span <= 0.0 {
            return Some(n / self.from);
        }
        let a = (self.to - self.from) / span;
        let disc = self.from * self.from + 2.0 * a * n;
        (disc >= 0.0).then(|| (disc.sqrt() - self.from) / a)
    }
}

/// A pipelined message waiting for its ACK.
struct Sent {
    seq: u64,
    control_id: Vec<u8>,
    /// Where its latency counts from: the scheduled time with `--rate`, else the write.
    origin: Instant,
    /// When it was written: its ACK timeout counts from here.
    written: Instant,
}

/// Writes one framed message and reads one frame back.
async fn exchange(
    conn: &mut Conn,
    frame: &[u8],
    rbuf: &mut BytesMut,
    codec: &mut MllpCodec,
) -> Result<BytesMut, ErrorKind> {
    conn.write_all(frame).await.map_err(|_| ErrorKind::Io)?;
    conn.flush().await.map_err(|_| ErrorKind::Io)?;
    read_frame(conn, rbuf, codec).await
}

/// Reads the next frame. Cancel-safe: bytes read stay in `rbuf` for the next call.
async fn read_frame(
    conn: &mut Conn,
    rbuf: &mut BytesMut,
    codec: &mut MllpCodec,
) -> Result<BytesMut, ErrorKind> {
    loop {
        match codec.decode(rbuf) {
            Ok(Some(ack)) => return Ok(ack),
            Ok(None) => {}
            Err(_) => return Err(ErrorKind::Framing),
        }
        if rbuf.capacity() - rbuf.len() < 1024 {
            rbuf.reserve(8192);
        }
        match conn.read_buf(rbuf).await {
            Ok(0) => return Err(ErrorKind::Closed),
            Ok(_) => {}
            Err(_) => return Err(ErrorKind::Io),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constant_pace_spaces_messages_evenly() {
        let p = Pace::constant(100.0);
        assert_eq!(p.due(0), Some(0.0));
        assert_eq!(p.due(250), Some(2.5));
    }

    /// From 100 to 300 msg/s over 10 s: 2,000 messages in all, the first 1,000 by t = (sqrt(5)-1)·100/20 s
    /// (100t + 10t² = 1000 → t ≈ 6.18 s), and the messages come closer together as the rate rises.
    #[test]
    fn a_ramp_sends_the_rate_integral_and_speeds_up() {
        let p = Pace {
            from: 100.0,
            to: 300.0,
            over: Duration::from_secs(10),
        };
        let at = |n| p.due(n).expect("due");
        assert!((at(2000) - 10.0).abs() < 1e-9, "{}", at(2000));
        assert!((at(1000) - 6.180_339_887).abs() < 1e-6, "{}", at(1000));
        assert!(at(11) - at(10) > at(1991) - at(1990));
        let down = Pace {
            from: 300.0,
            to: 100.0,
            over: Duration::from_secs(10),
        };
        assert!((down.due(2000).expect("due") - 10.0).abs() < 1e-9);
        // Past the ramp's end a falling rate would reach 0: such messages are never due.
        assert_eq!(down.due(5000), None);
    }
}
