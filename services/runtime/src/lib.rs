//! hl7gw-runtime: what every hl7gw service shares — config loading, telemetry, metrics, Kafka client setup,
//! the envelope contract, shutdown, and the admin HTTP server.

pub mod proto {
    //! Generated from `proto/hl7gw/v1`.
    #![allow(
        missing_docs,
        missing_debug_implementations,
        clippy::all,
        clippy::pedantic
    )]
    pub mod v1 {
        tonic::include_proto!("hl7gw.v1");
    }
    /// The encoded `FileDescriptorSet` of proto/hl7gw/v1 (served by gRPC reflection).
    pub const DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/hl7gw_descriptor.bin"));
}

pub mod admin;
pub mod config;
pub mod dedup;
pub mod delivery;
pub mod envelope;
pub mod failpoint;
pub mod grpc;
pub mod kafka;
pub mod memory;
pub mod metrics;
pub mod producer;
pub mod service;
pub mod shutdown;
pub mod telemetry;

/// This process's pod name: `POD_NAME` (set by the chart from the downward API), else `HOSTNAME`.
pub fn pod_name() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "local".to_owned())
}

/// A binary's end: `Ok` exits 0; an error prints one line, `error: ` and its causes joined by `: ` (no
/// backtrace, whatever `RUST_BACKTRACE` says), and exits 1.
pub fn exit<E: std::fmt::Display>(result: Result<(), E>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let line = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {line}");
            std::process::ExitCode::FAILURE
        }
    }
}
