//! hl7gw-load: the MLLP load harness, following RS7's methodology.
//!
//! N clients, each a tokio task with one persistent TCP or TLS connection and one message in flight: build
//! the next message (unique MSH-10), start the timer, send, read one MLLP frame, stop the timer, classify the
//! ACK by MSA-1 and check MSA-2. A warm-up (not counted) comes first; a run stops after a count or a duration.
//! Latencies go into an HDR histogram (µs, 3 significant digits). Connection errors and ACK timeouts are
//! counted and followed by a reconnect, so a run survives a gateway being killed and restarted; with
//! `--record-acked` every control id whose AA/CA was read is appended to a file as it arrives, for a later
//! check that each of them was stored.
//!
//! See `loadtest/README.md` for usage and the scenarios.

pub mod ack;
pub mod cli;
pub mod client;
pub mod grpc;
pub mod ids;
pub mod messages;
pub mod record;
pub mod run;
pub mod stats;
