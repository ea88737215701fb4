//! What the MLLP and the HTTP receiver share: the folder they store into (file names, sequence numbers, the
//! temporary-file-then-rename write), `--refuse-containing`, and the stop signal.

use super::args::ReceiveArgs;
use crate::sanitise::sanitise;
use anyhow::Context;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::AsyncWriteExt;

/// The folder under `--out` for payloads that did not parse.
pub const REJECTED_DIR: &str = "rejected";

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

/// `<sequence>-<sanitised control id>.hl7`.
pub(crate) fn file_name(seq: u64, control_id: &[u8]) -> String {
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
pub(crate) fn first_sequence(out: &Path) -> anyhow::Result<u64> {
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
