//! `hl7gw receive`: an MLLP receiver that stores each message as a file and then ACKs it.
//!
//! Every connection runs in its own task and handles its messages in order: parse, store (temp file, fsync,
//! rename, so a file that is there is complete), then ACK. A payload that does not parse gets an AR/CR with an
//! ERR segment (the parser's table 0357 code, a text without message content) and is kept under `rejected/`.
//! A framing violation (oversized frame, start block inside a frame, end block without CR) gets an AR with
//! ERR 207 and the connection is closed. Logs go to stderr and carry peer addresses, sequence numbers,
//! control ids (sanitised), sizes and error kinds: never message content.
//!
//! `--http` runs an HTTP receiver instead (http.rs): the stand-in for a FHIR server or a web service.

mod args;
mod http;
mod mllp;
mod shared;

pub use args::ReceiveArgs;

use anyhow::Context;
use std::process::ExitCode;
use tokio_rustls::TlsAcceptor;

/// `hl7gw receive`.
pub fn run(args: ReceiveArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating the output directory {}", args.out.display()))?;
    let acceptor = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsAcceptor::from(hl7gw_tls::server_config(
            cert,
            key,
            args.client_ca.as_deref(),
        )?)),
        _ => None,
    };
    let first = shared::first_sequence(&args.out)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    if args.http {
        runtime.block_on(http::serve(&args, first))?;
    } else {
        runtime.block_on(mllp::serve(&args, first, acceptor))?;
    }
    Ok(ExitCode::SUCCESS)
}
