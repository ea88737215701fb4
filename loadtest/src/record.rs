//! `--record-acked FILE`: every control id that got AA/CA, one per line, appended as soon as it is read.
//!
//! Clients hand (client, seq) pairs to one writer thread over a channel (no allocation per message); the
//! thread formats the ids and appends whatever has queued up with one `write` to the file (no user-space
//! buffer), so a harness killed mid-run leaves every line written so far, each for an id whose AA/CA was read
//! from the socket. An id is sent only after its ACK was read and checked.

use crate::ids::push_control_id;
use anyhow::Context;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

/// Most ids written in one `write`.
const BATCH: usize = 4096;

/// The writer of one run.
#[derive(Debug)]
pub struct Recorder {
    tx: Sender<(u32, u64)>,
    thread: JoinHandle<std::io::Result<u64>>,
}

/// A client's end of the recorder.
#[derive(Debug, Clone)]
pub struct RecordHandle(Sender<(u32, u64)>);

impl RecordHandle {
    /// Records the measured message `seq` of `client` as acknowledged.
    pub fn acked(&self, client: u32, seq: u64) {
        // The writer only goes away after a write error, which `Recorder::finish` reports.
        let _ = self.0.send((client, seq));
    }
}

impl Recorder {
    /// Opens `path` for appending (created when missing) and starts the writer for ids of run `run_id`.
    pub fn open(path: &Path, run_id: &str) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {} for --record-acked", path.display()))?;
        let (tx, rx) = channel();
        let run = run_id.as_bytes().to_vec();
        let thread = std::thread::Builder::new()
            .name("record-acked".into())
            .spawn(move || write_ids(file, &run, &rx))
            .context("starting the --record-acked writer")?;
        Ok(Self { tx, thread })
    }

    pub fn handle(&self) -> RecordHandle {
        RecordHandle(self.tx.clone())
    }

    /// Waits until every id sent so far is written (all handles must be dropped); returns how many were.
    pub fn finish(self) -> anyhow::Result<u64> {
        drop(self.tx);
        match self.thread.join() {
            Ok(r) => r.context("writing the --record-acked file"),
            Err(_) => anyhow::bail!("the --record-acked writer panicked"),
        }
    }
}

fn write_ids(mut file: File, run: &[u8], rx: &Receiver<(u32, u64)>) -> std::io::Result<u64> {
    let mut buf = Vec::with_capacity(BATCH * 24);
    let mut written = 0u64;
    while let Ok(first) = rx.recv() {
        buf.clear();
        let mut next = Some(first);
        let mut n = 0;
        while let Some((client, seq)) = next {
            push_control_id(&mut buf, run, client, seq, false);
            buf.push(b'\n');
            n += 1;
            next = if n < BATCH { rx.try_recv().ok() } else { None };
        }
        file.write_all(&buf)?;
        written += n as u64;
    }
    // A pipe or a terminal (`--record-acked /dev/stdout`, as the node check's load Job does) cannot be synced:
    // EINVAL there means there is nothing to sync, not a lost id.
    match file.sync_data() {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
        r => r?,
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_one_id_per_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("acked.txt");
        std::fs::write(&path, "OLD-0-0\n").expect("seed");
        let r = Recorder::open(&path, "RUN").expect("open");
        let h = r.handle();
        let threads: Vec<_> = (0..4)
            .map(|c| {
                let h = h.clone();
                std::thread::spawn(move || (0..1_000).for_each(|s| h.acked(c, s)))
            })
            .collect();
        for t in threads {
            t.join().expect("join");
        }
        drop(h);
        assert_eq!(r.finish().expect("finish"), 4_000);
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4_001);
        assert_eq!(lines[0], "OLD-0-0");
        let unique: std::collections::HashSet<_> = lines.iter().collect();
        assert_eq!(unique.len(), 4_001);
        assert!(lines.contains(&"RUN-3-999"));
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn ids_are_on_disk_before_the_run_ends() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("acked.txt");
        let r = Recorder::open(&path, "RUN").expect("open");
        let h = r.handle();
        h.acked(1, 7);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(&path).expect("read") != "RUN-1-7\n" {
            assert!(std::time::Instant::now() < deadline, "id not written");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        drop(h);
        r.finish().expect("finish");
    }

    #[test]
    fn unwritable_path_is_an_error() {
        assert!(Recorder::open(Path::new("/nonexistent/dir/acked.txt"), "R").is_err());
    }
}
