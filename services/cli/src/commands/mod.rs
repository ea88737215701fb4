//! One module per command of `hl7gw`, named as the command is (`dry_run` is `hl7gw dry-run`); each has its
//! arguments (a clap `Args` struct) and a `run` that main calls.

pub mod ack;
pub mod completions;
pub mod deadletters;
pub mod dry_run;
pub mod fhir;
pub mod flat;
pub mod man;
pub mod receive;
pub mod replay;
pub mod send;
pub mod senders;
pub mod status;
pub mod tail;
pub mod trace;
