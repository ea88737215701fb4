//! `hl7gw send`: sends files to an MLLP receiver over one connection, one message at a time, and prints each ACK.
//!
//! A file is sent as it is, byte for byte, as one message; a batch file (FHS/BHS first) is split with
//! [`hl7v2::Batch`] and each of its messages sent on its own (the batch envelope is not sent). The exit code
//! says how it went: 0 when every ACK accepted (AA/CA), 1 when any did not (AE/AR/CE/CR), 2 when the
//! connection, a timeout, an unreadable ACK or the arguments failed.

use crate::sanitise::sanitise;
use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hl7v2::ack::Outcome;
use hl7v2::{Batch, Header, MllpCodec};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_util::codec::Framed;

/// Arguments of `hl7gw send`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each FILE is sent unchanged as one message; a batch file (starting with FHS or BHS) is split
and each of its messages is sent on its own. Messages go out in order over one connection,
each after the ACK of the one before. Each ACK is printed on stdout, one segment per line;
stderr gets one line per message with its control id and ACK code.

Exit status: 0 when every ACK is AA or CA; 1 when any is AE, AR, CE or CR;
2 on a connection, TLS or timeout error, an unreadable ACK, or bad arguments.")]
pub struct SendArgs {
    /// Receiver address.
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,
    /// Message or batch files to send.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
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
    payload: Bytes,
}

/// `hl7gw send`.
pub fn run(args: SendArgs) -> anyhow::Result<ExitCode> {
    let (host, port) = split_host_port(&args.to)?;
    let mut messages = Vec::new();
    for path in &args.files {
        let bytes = crate::read(path)?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let parts = split_file(&bytes).with_context(|| format!("splitting batch file {name}"))?;
        let several = parts.len() > 1;
        for (i, payload) in parts.into_iter().enumerate() {
            let label = if several {
                format!("{name}#{}", i + 1)
            } else {
                name.clone()
            };
            messages.push(Outgoing { label, payload });
        }
    }
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
                exchange(stream, &messages, args.repeat, t).await
            }
            None => exchange(tcp, &messages, args.repeat, t).await,
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

/// The messages of a file: each message of a batch, or the whole file as one message.
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
        Ok(vec![Bytes::copy_from_slice(bytes)])
    }
}

/// Sends every message `repeat` times over `io`, waiting for each ACK, and prints the ACKs.
async fn exchange<S>(
    io: S,
    messages: &[Outgoing],
    repeat: u64,
    t: Duration,
) -> anyhow::Result<ExitCode>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut framed = Framed::new(io, MllpCodec::default());
    let mut all_accepted = true;
    let mut sent = 0u64;
    for _ in 0..repeat {
        for m in messages {
            let control_id = sanitise(Header::salvage(&m.payload).control_id);
            timeout(t, framed.send(m.payload.clone()))
                .await
                .map_err(|_| anyhow!("{}: could not write within {}s", m.label, t.as_secs()))?
                .with_context(|| format!("{}: sending", m.label))?;
            let ack = timeout(t, framed.next())
                .await
                .map_err(|_| anyhow!("{}: no ACK within {}s", m.label, t.as_secs()))?
                .ok_or_else(|| anyhow!("{}: connection closed before the ACK", m.label))?
                .with_context(|| format!("{}: reading the ACK", m.label))?;
            sent += 1;
            print_ack(&ack)?;
            let Some((code, answered)) = hl7v2::ack::read_ack(&ack) else {
                bail!(
                    "{}: the answer has no readable MSA-1 acknowledgment code",
                    m.label
                );
            };
            let answered = sanitise(answered);
            if answered != control_id {
                log!(
                    "{}: warning: ACK is for control id {answered}, sent {control_id}",
                    m.label
                );
            }
            log!("{}: {} (control id {control_id})", m.label, code.as_str());
            if code.outcome() != Outcome::Accept {
                all_accepted = false;
            }
        }
    }
    // Say goodbye politely (TLS close_notify); the ACKs are in, so a failure here changes nothing.
    let _ = timeout(t, SinkExt::<Bytes>::close(&mut framed)).await;
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
    fn batch_files_are_split_and_single_files_are_not() {
        let batch = b"FHS|^~\\&|APP\rBHS|^~\\&|APP\r\
MSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\rPID|1\r\
MSH|^~\\&|A|B|C|D|2020||ADT^A08|2|P|2.5\rPID|2\r\
BTS|2\rFTS|1\r";
        let parts = split_file(batch).unwrap();
        assert_eq!(parts.len(), 2);
        assert!(parts[0].starts_with(b"MSH|") && parts[0].ends_with(b"PID|1\r"));
        assert!(parts[1].ends_with(b"PID|2\r"));
        let two =
            b"MSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\rMSH|^~\\&|A|B|C|D|2020||ADT^A08|2|P|2.5\r";
        assert_eq!(split_file(two).unwrap(), [Bytes::from_static(two)]);
        assert_eq!(split_file(b"junk").unwrap(), [Bytes::from_static(b"junk")]);
        assert!(split_file(b"FHS|^~\\&\rFTS|0\r").is_err());
    }
}
