//! `hl7gw send`: sends files to an MLLP receiver over one connection, one message at a time, and prints each ACK.
//!
//! A FILE is a file, `-` (stdin) or a folder (each file in it, by name; hidden files and subfolders are left
//! out). A file holding one message is sent as it is, byte for byte; a file holding several (each starting
//! at an MSH segment) is cut before each MSH, and a batch file (FHS/BHS first) is split with
//! [`hl7v2::Batch`], each message sent on its own (the batch envelope is not sent). A progress bar goes to
//! stderr when stderr is a terminal; `--json` prints one JSON line per message instead of the ACKs. The exit
//! code says how it went: 0 when every ACK accepted (AA/CA), 1 when any did not (AE/AR/CE/CR), 2 when the
//! connection, a timeout, an unreadable ACK or the arguments failed.

use crate::sanitise::sanitise;
use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hl7v2::ack::Outcome;
use hl7v2::{Batch, Header, MllpCodec};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_util::codec::Framed;

/// Arguments of `hl7gw send`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
A FILE is a file, - (stdin), or a folder: every file in it, in name order (hidden files and
subfolders left out). A file with one message is sent unchanged; a file with several is cut
before each MSH segment; a batch file (starting with FHS or BHS) is split and each of its
messages is sent on its own. Messages go out in order over one connection, each after the
ACK of the one before. Each ACK is printed on stdout, one segment per line (with --json, one
JSON line per message: file, index, control_id, ack_code, latency_ms); stderr gets one line
per message with its control id and ACK code, and a progress bar when it is a terminal.

Examples:
  hl7gw send --to localhost:2575 adt.hl7
  hl7gw send --to localhost:2575 --json outbox/
  cat batch.hl7 | hl7gw send --to localhost:2575 -

Exit status: 0 when every ACK is AA or CA; 1 when any is AE, AR, CE or CR;
2 on a connection, TLS or timeout error, an unreadable ACK, or bad arguments.")]
pub struct SendArgs {
    /// Receiver address.
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,
    /// Message or batch files to send; - for stdin; a folder for every file in it.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// One JSON line per message on stdout (file, index, control_id, ack_code, latency_ms) instead of the ACKs.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the connection, the TLS handshake, each write and each ACK.
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Send the whole set of files this many times (on the same connection).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub repeat: u64,
    #[command(flatten)]
    pub tls: hl7gw_tls::ClientFlags,
}

/// One message to send and the name it goes by in the log.
#[derive(Debug, Clone)]
struct Outgoing {
    label: String,
    /// The file's name (`-` for stdin).
    file: String,
    /// Its place in the file, from 1.
    index: usize,
    payload: Bytes,
}

/// The files a FILE argument names with their names: stdin for `-`, each file of a folder (by name, hidden
/// files and subfolders left out), or the file.
fn inputs(path: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .context("reading stdin")?;
        return Ok(vec![("-".to_owned(), bytes)]);
    }
    let name = |p: &Path| {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    if path.is_dir() {
        let mut files = Vec::new();
        for e in std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))? {
            let e = e.with_context(|| format!("reading {}", path.display()))?;
            let p = e.path();
            if name(&p).starts_with('.') || !p.is_file() {
                continue;
            }
            files.push(p);
        }
        files.sort();
        if files.is_empty() {
            bail!("{}: no file in the folder", path.display());
        }
        return files
            .iter()
            .map(|p| Ok((name(p), crate::files::read(&p.to_path_buf())?)))
            .collect();
    }
    Ok(vec![(name(path), crate::files::read(&path.to_path_buf())?)])
}

/// `hl7gw send`.
pub fn run(args: SendArgs) -> anyhow::Result<ExitCode> {
    let (host, port) = split_host_port(&args.to)?;
    let mut messages = Vec::new();
    for path in &args.files {
        for (name, bytes) in inputs(path)? {
            let parts = split_file(&bytes).with_context(|| format!("splitting {name}"))?;
            let several = parts.len() > 1;
            for (i, payload) in parts.into_iter().enumerate() {
                let label = if several {
                    format!("{name}#{}", i + 1)
                } else {
                    name.clone()
                };
                messages.push(Outgoing {
                    label,
                    file: name.clone(),
                    index: i + 1,
                    payload,
                });
            }
        }
    }
    let out = Output {
        json: args.json,
        repeat: args.repeat,
        bar: std::io::stderr().is_terminal().then(|| {
            let total = (messages.len() as u64).saturating_mul(args.repeat);
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{bar:40} {pos}/{len} messages ({elapsed}, {eta} left)",
            ) {
                bar.set_style(style);
            }
            bar
        }),
    };
    let tls = args.tls.client(&args.to)?;
    let t = Duration::from_secs(args.timeout);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let tcp = timeout(t, TcpStream::connect((host, port)))
            .await
            .map_err(|_| {
                anyhow!(
                    "connecting to {}: no connection within {}s",
                    args.to,
                    args.timeout
                )
            })?
            .with_context(|| format!("connecting to {}", args.to))?;
        let _ = tcp.set_nodelay(true);
        match tls {
            Some((config, name)) => {
                let connector = tokio_rustls::TlsConnector::from(config);
                let stream = timeout(t, connector.connect(name, tcp))
                    .await
                    .map_err(|_| {
                        anyhow!(
                            "TLS handshake with {}: no answer within {}s",
                            args.to,
                            args.timeout
                        )
                    })?
                    .with_context(|| format!("TLS handshake with {}", args.to))?;
                exchange(stream, &messages, &out, t).await
            }
            None => exchange(tcp, &messages, &out, t).await,
        }
    })
}

/// Splits `HOST:PORT` (`[v6]:PORT` too) into the host and the port.
fn split_host_port(to: &str) -> anyhow::Result<(&str, u16)> {
    let (host, port) = to
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("--to {to:?}: expected HOST:PORT"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = port
        .parse()
        .map_err(|_| anyhow!("--to {to:?}: {port:?} is not a port number"))?;
    if host.is_empty() {
        bail!("--to {to:?}: the host is missing");
    }
    Ok((host, port))
}

/// How the results are shown.
#[derive(Debug)]
struct Output {
    json: bool,
    repeat: u64,
    /// On stderr when it is a terminal.
    bar: Option<ProgressBar>,
}

impl Output {
    /// Writes (to stderr or stdout) with the progress bar out of the way.
    fn note<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }
}

/// The messages of a file: each message of a batch; each message of a file of several (cut before each MSH);
/// or the whole file, unchanged, as one message.
fn split_file(bytes: &[u8]) -> anyhow::Result<Vec<Bytes>> {
    if hl7v2::batch::is_batch(bytes) {
        let batch = Batch::parse(bytes)?;
        let parts: Vec<Bytes> = batch
            .messages()
            .map(|m| Bytes::copy_from_slice(m.as_bytes()))
            .collect();
        if parts.is_empty() {
            bail!("the batch holds no message");
        }
        Ok(parts)
    } else {
        match hl7v2::batch::split(bytes) {
            Ok(split) if split.messages.len() > 1 => Ok(split
                .messages
                .iter()
                .map(|m| Bytes::copy_from_slice(m))
                .collect()),
            // One message, or not HL7 at all: sent as it is (the receiver answers what it makes of it).
            _ => Ok(vec![Bytes::copy_from_slice(bytes)]),
        }
    }
}

/// Sends every message `repeat` times over `io`, waiting for each ACK, and prints the ACKs.
async fn exchange<S>(
    io: S,
    messages: &[Outgoing],
    out: &Output,
    t: Duration,
) -> anyhow::Result<ExitCode>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut framed = Framed::new(io, MllpCodec::default());
    let mut all_accepted = true;
    let mut sent = 0u64;
    for round in 1..=out.repeat {
        for m in messages {
            let control_id = sanitise(Header::salvage(&m.payload).control_id);
            let started = Instant::now();
            timeout(t, framed.send(m.payload.clone()))
                .await
                .map_err(|_| anyhow!("{}: could not write within {}s", m.label, t.as_secs()))?
                .with_context(|| format!("{}: sending", m.label))?;
            let ack = timeout(t, framed.next())
                .await
                .map_err(|_| anyhow!("{}: no ACK within {}s", m.label, t.as_secs()))?
                .ok_or_else(|| anyhow!("{}: connection closed before the ACK", m.label))?
                .with_context(|| format!("{}: reading the ACK", m.label))?;
            let latency = started.elapsed();
            sent += 1;
            if !out.json {
                out.note(|| print_ack(&ack))?;
            }
            let Some((code, answered)) = hl7v2::ack::read_ack(&ack) else {
                bail!(
                    "{}: the answer has no readable MSA-1 acknowledgment code",
                    m.label
                );
            };
            let answered = sanitise(answered);
            if out.json {
                let mut line = json!({
                    "file": m.file,
                    "index": m.index,
                    "control_id": control_id,
                    "ack_code": code.as_str(),
                    "latency_ms": (latency.as_secs_f64() * 1e6).round() / 1e3,
                });
                if out.repeat > 1 {
                    line["round"] = json!(round);
                }
                out.note(|| {
                    let mut stdout = std::io::stdout().lock();
                    writeln!(stdout, "{line}")?;
                    stdout.flush()
                })?;
            }
            out.note(|| {
                if answered != control_id {
                    log!(
                        "{}: warning: ACK is for control id {answered}, sent {control_id}",
                        m.label
                    );
                }
                log!("{}: {} (control id {control_id})", m.label, code.as_str());
            });
            if let Some(bar) = &out.bar {
                bar.inc(1);
            }
            if code.outcome() != Outcome::Accept {
                all_accepted = false;
            }
        }
    }
    // Say goodbye politely (TLS close_notify); the ACKs are in, so a failure here changes nothing.
    let _ = timeout(t, SinkExt::<Bytes>::close(&mut framed)).await;
    if let Some(bar) = &out.bar {
        bar.finish_and_clear();
    }
    log!(
        "{sent} message(s) sent, {}",
        if all_accepted {
            "all accepted"
        } else {
            "some NOT accepted"
        }
    );
    Ok(if all_accepted {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Prints an ACK on stdout, one segment per line.
fn print_ack(ack: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for seg in ack
        .split(|&b| b == b'\r' || b == b'\n')
        .filter(|s| !s.is_empty())
    {
        out.write_all(seg)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port() {
        assert_eq!(
            split_host_port("localhost:2575").unwrap(),
            ("localhost", 2575)
        );
        assert_eq!(split_host_port("[::1]:1").unwrap(), ("::1", 1));
        assert!(split_host_port("localhost").is_err());
        assert!(split_host_port(":2575").is_err());
        assert!(split_host_port("h:99999").is_err());
    }

    #[test]
    fn batch_and_multi_message_files_are_split_and_single_files_are_not() {
        let batch = b"FHS|^~\\&|APP\rBHS|^~\\&|APP\r\
MSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\rPID|1\r\
MSH|^~\\&|A|B|C|D|2020||ADT^A08|2|P|2.5\rPID|2\r\
BTS|2\rFTS|1\r";
        let parts = split_file(batch).unwrap();
        assert_eq!(parts.len(), 2);
        assert!(parts[0].starts_with(b"MSH|") && parts[0].ends_with(b"PID|1\r"));
        assert!(parts[1].ends_with(b"PID|2\r"));
        let one = b"MSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\rPID|1\r\n";
        assert_eq!(split_file(one).unwrap(), [Bytes::from_static(one)]);
        let two =
            b"MSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\rMSH|^~\\&|A|B|C|D|2020||ADT^A08|2|P|2.5\r";
        assert_eq!(
            split_file(two).unwrap(),
            [
                Bytes::from_static(&two[..two.len() / 2]),
                Bytes::from_static(&two[two.len() / 2..])
            ]
        );
        assert_eq!(split_file(b"junk").unwrap(), [Bytes::from_static(b"junk")]);
        assert!(split_file(b"FHS|^~\\&\rFTS|0\r").is_err());
    }
}
