//! Reading the files a command is given.

use anyhow::Context;
use std::path::PathBuf;

/// Reads a file, naming it in the error.
pub(crate) fn read(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}
