//! `hl7gw receive`: an MLLP receiver that stores each message as a file and then ACKs it.
//!
//! Every connection runs in its own task and handles its messages in order: parse, store (temp file, fsync,
//! rename, so a file that is there is complete), then ACK. A payload that does not parse gets an AR/CR with an
//! ERR segment (the parser's table 0357 code, a text without message content) and is kept under `rejected/`.
//! A framing violation (oversized frame, start block inside a frame, end block without CR) gets an AR with
//! ERR 207 and the connection is closed. Logs go to stderr and carry peer addresses, sequence numbers,
//! control ids (sanitised), sizes and error kinds: never message content.

use crate::sanitise::sanitise;
use crate::tls;
use anyhow::Context;
use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use hl7v2::ack::{AckError, AckIds, Outcome, ack_code, hl7_timestamp, write_ack};
use hl7v2::mllp::DEFAULT_MAX_FRAME;
use hl7v2::{ErrorCode, Header, Message, MllpCodec, MllpError};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
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

/// The folder under `--out` for payloads that did not parse.
pub const REJECTED_DIR: &str = "rejected";

/// How long a closing connection keeps reading (and discarding) what the peer still sends, so that the
/// close does not reset the connection before the peer has read our last answer.
const LINGER: Duration = Duration::from_secs(2);

/// How long in-flight connections get to finish after the receiver was told to stop.
const DRAIN: Duration = Duration::from_secs(10);

/// Arguments of `hl7gw receive`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each message that parses is written to DIR as <sequence>-<control id>.hl7 (the control id
reduced to [A-Za-z0-9_.-]), under a temporary name first, synced and renamed, so a file that
is there is complete; then it is answered with AA, or CA when the sender asked for enhanced
mode (MSH-15/MSH-16 valued).
A payload that does not parse is answered with AR (or CR) and an ERR segment carrying the
parse error, and kept in DIR/rejected/ for inspection. Messages refused by --reject-every or
--refuse-containing are answered AR (or CR) with ERR 207 and not stored (over HTTP: 503).
--delay makes each answer wait, as a slow receiver's would. An oversized frame or another MLLP framing
violation is answered with AR and ERR 207, and the connection is closed.

Sequence numbers continue after the highest one already in DIR: run one receiver per DIR.
stdout carries the one line `listening on ADDR`; logs go to stderr and never carry message
content. SIGINT/SIGTERM stop accepting, let connections finish the message in hand, exit 0.")]
pub struct ReceiveArgs {
    /// Address to listen on; port 0 picks a free port (printed as `listening on ADDR`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:2575")]
    pub listen: String,
    /// Directory to store the messages in (created when missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Largest accepted MLLP payload, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_FRAME, value_parser = positive_size)]
    pub max_frame: usize,
    /// Close a connection that delivers no complete frame for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: u64,
    /// Serve TLS with this PEM certificate (chain); needs --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require a client certificate issued by a CA of this PEM file (mutual TLS).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// Answer every Nth parsed message with AR/CR (ERR 207) instead of storing it (for retry tests).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub reject_every: Option<u64>,
    /// Exit (status 0) once N messages are stored and ACKed; later messages are not answered.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Receive over HTTP instead of MLLP: each POST/PUT body (a FHIR Bundle, JSON, an HL7 message) is stored
    /// as <sequence>-http.<json|hl7|bin> and answered 200 (an HTTP destination's stand-in; plain HTTP only).
    #[arg(long, conflicts_with_all = ["tls_cert", "client_ca"])]
    pub http: bool,
    /// Do not fsync each file before the ACK (load tests that measure the sender, not this disk); a crash
    /// can then lose messages that were ACKed.
    #[arg(long)]
    pub no_sync: bool,
    /// Answer each message this many milliseconds after it arrived (a slow receiver: each MLLP connection and
    /// each HTTP request waits on its own, so a sender with several in the air gets them answered together).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub delay: u64,
    /// Refuse the first --refuse-times messages whose bytes contain TEXT (MLLP: AR with ERR 207; HTTP: 503),
    /// then take them: a receiver that refuses one patient for a while, for retry tests.
    #[arg(long, value_name = "TEXT")]
    pub refuse_containing: Option<String>,
    /// How many messages --refuse-containing refuses.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 3,
        requires = "refuse_containing"
    )]
    pub refuse_times: u64,
}

/// `--refuse-containing`: the first `left` payloads that contain `needle` are refused.
#[derive(Debug)]
pub(crate) struct Refusal {
    needle: Vec<u8>,
    left: AtomicU64,
}

impl Refusal {
    pub(crate) fn from_args(args: &ReceiveArgs) -> Option<Self> {
        let needle = args.refuse_containing.as_ref()?;
        Some(Self {
            needle: needle.as_bytes().to_vec(),
            left: AtomicU64::new(args.refuse_times),
        })
    }

    /// Whether `payload` is refused (counted against `--refuse-times`).
    pub(crate) fn refuses(&self, payload: &[u8]) -> bool {
        !self.needle.is_empty()
            && payload
                .windows(self.needle.len())
                .any(|w| w == self.needle.as_slice())
            && self
                .left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
    }
}

/// A size of at least 1.
fn positive_size(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

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

/// `hl7gw receive`.
pub fn run(args: ReceiveArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating the output directory {}", args.out.display()))?;
    let acceptor = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsAcceptor::from(tls::server_config(
            cert,
            key,
            args.client_ca.as_deref(),
        )?)),
        _ => None,
    };
    let first = first_sequence(&args.out)?;
    if args.http {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?;
        runtime.block_on(crate::receive_http::serve(&args, first))?;
        return Ok(ExitCode::SUCCESS);
    }
    let shared = Arc::new(Shared {
        out: args.out.clone(),
        max_frame: args.max_frame,
        idle: Duration::from_secs(args.idle_timeout),
        reject_every: args.reject_every,
        refusal: Refusal::from_args(&args),
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(serve(&args.listen, acceptor, shared))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve(
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

/// Resolves on SIGINT or SIGTERM (pending forever when the handlers cannot be installed).
pub(crate) async fn stop_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
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

/// `<sequence>-<sanitised control id>.hl7`.
fn file_name(seq: u64, control_id: &[u8]) -> String {
    format!("{seq:06}-{}.hl7", sanitise(control_id))
}

/// The sequence number a stored file name starts with.
fn sequence_of(name: &str) -> Option<u64> {
    let (digits, _) = name.split_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One past the highest sequence already used in `out` or its rejected folder (1 for an empty directory).
fn first_sequence(out: &Path) -> anyhow::Result<u64> {
    let mut max = 0;
    for dir in [out.to_path_buf(), out.join(REJECTED_DIR)] {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        for entry in entries.flatten() {
            if let Some(n) = entry.file_name().to_str().and_then(sequence_of) {
                max = max.max(n);
            }
        }
    }
    Ok(max.saturating_add(1))
}

/// Writes `bytes` to `dir/name` through a hidden temporary file: create, write, sync (unless `sync` is
/// false), rename.
pub(crate) async fn store(dir: &Path, name: &str, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = async {
        let mut f = tokio::fs::File::create(&tmp).await?;
        f.write_all(bytes).await?;
        if sync {
            f.sync_all().await?;
        }
        drop(f);
        tokio::fs::rename(&tmp, dir.join(name)).await
    }
    .await;
    if written.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_safe_and_ordered() {
        assert_eq!(file_name(1, b"DEMO0001"), "000001-DEMO0001.hl7");
        assert_eq!(file_name(42, b"../../x"), "000042-.._.._x.hl7");
        assert_eq!(file_name(1_234_567, b""), "1234567-none.hl7");
        assert!(!file_name(7, b"a/b\\c").contains(['/', '\\']));
    }

    #[test]
    fn sequences_are_read_back() {
        assert_eq!(sequence_of("000042-X.hl7"), Some(42));
        assert_eq!(sequence_of("7-none.hl7"), Some(7));
        assert_eq!(sequence_of(".000042-X.hl7.tmp"), None);
        assert_eq!(sequence_of("rejected"), None);
        assert_eq!(sequence_of("-x.hl7"), None);
        assert_eq!(sequence_of("12a-x.hl7"), None);
    }

    #[test]
    fn first_sequence_continues_after_existing_files() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(first_sequence(dir.path()).unwrap(), 1);
        std::fs::write(dir.path().join("000003-A.hl7"), b"x").unwrap();
        std::fs::create_dir(dir.path().join(REJECTED_DIR)).unwrap();
        std::fs::write(dir.path().join(REJECTED_DIR).join("000009-none.hl7"), b"x").unwrap();
        assert_eq!(first_sequence(dir.path()).unwrap(), 10);
    }

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

    #[tokio::test]
    async fn store_leaves_only_the_complete_file() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), "000001-A.hl7", b"MSH|x", true)
            .await
            .unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["000001-A.hl7"]);
        assert_eq!(
            std::fs::read(dir.path().join("000001-A.hl7")).unwrap(),
            b"MSH|x"
        );
    }
}
