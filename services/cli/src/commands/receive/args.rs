//! The flags of `hl7gw receive`, for both receivers.

use hl7v2::mllp::DEFAULT_MAX_FRAME;
use std::path::PathBuf;

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

/// A size of at least 1.
fn positive_size(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
