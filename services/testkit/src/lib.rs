//! hl7gw-testkit: what the integration tests of every crate share: a real Kafka broker (or a 3-broker
//! cluster, or a secured one) started by the project's script, the PKI, the workspace's binaries started and
//! killed on drop, an MLLP client, and a Kafka reader to check what a topic holds.
// A test kit: a step that fails is a failed test, so unwrap and expect are its way of saying so.
#![allow(clippy::unwrap_used, missing_debug_implementations)]
//!
//! The files: `broker`, `process` (binaries and tools), `mllp`, `topic` (reading, writing and making topics),
//! `ingress` (an ingress on its own topics), `in_process` (a service run in this process), `pki`, `examples`,
//! `fhir`, `pipeline` (the four processes end to end).

mod broker;
pub mod examples;
pub mod fhir;
mod in_process;
mod ingress;
mod mllp;
pub mod pipeline;
pub mod pki;
mod process;
mod topic;

pub use broker::*;
pub use in_process::*;
pub use ingress::*;
pub use mllp::*;
pub use pki::{Pki, pki};
pub use process::*;
pub use topic::*;

use std::path::{Path, PathBuf};

/// The runtime of a test that drives real processes: multi-threaded, 2 workers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shared corpus of real HL7 v2 messages: `TESTDATA_HL7`, else `../shared/testdata/hl7` beside the
/// checkout (read from there, never copied into the repository).
pub fn corpus_dir() -> PathBuf {
    std::env::var_os("TESTDATA_HL7")
        .map_or_else(|| repo_root().join("../shared/testdata/hl7"), PathBuf::from)
}

/// The `.hl7` files of `dir` in name order, as (`prefix` + file stem, bytes); none when `dir` is missing.
pub fn hl7_files(dir: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        println!("no messages at {}", dir.display());
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "hl7"))
        .filter_map(|p| {
            let bytes = std::fs::read(&p).ok()?;
            let stem = p.file_stem()?.to_str()?.to_owned();
            Some((format!("{prefix}{stem}"), bytes))
        })
        .collect()
}

/// A file `name` holding `contents` in a fresh temporary folder (removed when the `TempDir` drops).
pub fn temp_file(name: &str, contents: impl AsRef<[u8]>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(name);
    std::fs::write(&file, contents).expect("writing a temporary file");
    (dir, file)
}
