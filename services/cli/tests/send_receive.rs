//! `hl7gw send` against `hl7gw receive`: the real binary, on 127.0.0.1, plain TCP, TLS and mutual TLS.
//!
//! Every child process is killed when its guard drops, and every wait is bounded, so a broken build fails
//! these tests instead of hanging them.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hl7gw_testkit::pki;

const BIN: &str = env!("CARGO_BIN_EXE_hl7gw");
/// The longest any one child process may run.
const DEADLINE: Duration = Duration::from_secs(30);

fn samples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("reading samples/")
        .map(|e| e.expect("reading samples/").path())
        .filter(|p| p.extension().is_some_and(|x| x == "hl7"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "samples missing in {}", dir.display());
    files
}

/// A child process that is killed when dropped; its stderr is collected and shown when a test fails.
struct Guard {
    child: Child,
    what: &'static str,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<thread::JoinHandle<()>>,
}

fn collect(pipe: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut pipe = pipe;
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock().expect("lock").extend_from_slice(&buf[..n]);
        }
    })
}

impl Guard {
    /// Spawns `hl7gw args` (stdin closed, stderr collected); its stdout is the caller's to read.
    fn spawn(what: &'static str, args: &[&OsStr]) -> (Self, ChildStdout) {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {what}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![collect(
            child.stderr.take().expect("piped stderr"),
            stderr.clone(),
        )];
        let guard = Self {
            child,
            what,
            stdout: Arc::default(),
            stderr,
            readers,
        };
        (guard, stdout)
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("lock")).into_owned()
    }

    /// Waits for the process to exit by itself, at most `DEADLINE`.
    fn wait(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("polling the child") {
                for r in self.readers.drain(..) {
                    r.join().expect("reader thread");
                }
                return status;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{} did not exit within {DEADLINE:?}; stderr:\n{}",
                self.what,
                self.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!("--- {} stderr ---\n{}", self.what, self.stderr());
        }
    }
}

/// A running `hl7gw receive` on 127.0.0.1 with an ephemeral port.
struct Receiver {
    guard: Guard,
    addr: String,
    out: PathBuf,
}

impl Receiver {
    fn start(out: &Path, extra: &[&str]) -> Self {
        let mut args = ["receive", "--listen", "127.0.0.1:0", "--out"]
            .map(OsStr::new)
            .to_vec();
        args.push(out.as_os_str());
        args.extend(extra.iter().map(OsStr::new));
        let (mut guard, stdout) = Guard::spawn("hl7gw receive", &args);
        let (tx, rx) = mpsc::channel();
        let rest = guard.stdout.clone();
        guard.readers.push(thread::spawn(move || {
            let mut lines = BufReader::new(stdout);
            let mut first = String::new();
            let _ = lines.read_line(&mut first);
            let _ = tx.send(first);
            let mut tail = Vec::new();
            let _ = lines.read_to_end(&mut tail);
            rest.lock().expect("lock").extend_from_slice(&tail);
        }));
        let line = rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("receiver did not start; stderr:\n{}", guard.stderr()));
        let addr = line
            .trim_end()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "unexpected first line {line:?}; stderr:\n{}",
                    guard.stderr()
                )
            })
            .to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "{addr}");
        Self {
            guard,
            addr,
            out: out.to_path_buf(),
        }
    }

    fn port(&self) -> &str {
        self.addr.rsplit_once(':').expect("address has a port").1
    }

    /// The stored message files (not the rejected/ folder, not temporary files), by name.
    fn stored(&self) -> Vec<(String, Vec<u8>)> {
        files_in(&self.out)
    }
}

fn files_in(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, Vec<u8>)> = entries
        .map(|e| e.expect("reading the output directory"))
        .filter(|e| e.file_type().expect("file type").is_file())
        .map(|e| {
            (
                e.file_name().into_string().expect("UTF-8 file name"),
                std::fs::read(e.path()).expect("reading a stored file"),
            )
        })
        .collect();
    files.sort();
    files
}

/// What a finished `hl7gw send` left.
struct Sent {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Sent {
    fn code(&self) -> i32 {
        self.status.code().expect("exited by signal")
    }
}

/// Runs `hl7gw <args>` to completion (bounded by `DEADLINE`).
fn hl7gw(args: &[&str], files: &[PathBuf]) -> Sent {
    let mut all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    all.extend(files.iter().map(|f| f.as_os_str()));
    let (mut guard, stdout) = Guard::spawn("hl7gw send", &all);
    guard.readers.push(collect(stdout, guard.stdout.clone()));
    let status = guard.wait();
    let text =
        |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().expect("lock")).into_owned();
    Sent {
        status,
        stdout: text(&guard.stdout),
        stderr: text(&guard.stderr),
    }
}

fn send(to: &str, extra: &[&str], files: &[PathBuf]) -> Sent {
    let mut args = vec!["send", "--to", to, "--timeout", "10"];
    args.extend_from_slice(extra);
    hl7gw(&args, files)
}

/// `out` holds `want` (the whole output in the failure message).
fn assert_contains(out: &str, want: &str) {
    assert!(out.contains(want), "{want:?} not in:\n{out}");
}

#[test]
fn samples_round_trip_byte_identical_and_receiver_stops_at_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start(&dir.path().join("out"), &["--count", "2"]);
    let files = samples();
    let sent = send(&rx.addr, &[], &files);
    assert_eq!(
        sent.code(),
        0,
        "stdout:\n{}\nstderr:\n{}",
        sent.stdout,
        sent.stderr
    );
    // One ACK per message, segments on their own lines: enhanced mode for the ADT (MSH-15/16 valued).
    assert_contains(&sent.stdout, "\nMSA|CA|DEMO0001\n");
    assert_contains(&sent.stdout, "\nMSA|AA|DEMO0002\n");
    assert_eq!(
        sent.stdout
            .lines()
            .filter(|l| l.starts_with("MSH|"))
            .count(),
        2
    );
    assert!(!sent.stdout.contains('\r'));
    // The receiver exits by itself after --count messages.
    assert!(rx.guard.wait().success(), "{}", rx.guard.stderr());
    let stored = rx.stored();
    assert_eq!(stored.len(), files.len());
    for ((name, bytes), file) in stored.iter().zip(&files) {
        assert_eq!(
            bytes,
            &std::fs::read(file).unwrap(),
            "{name} differs from {}",
            file.display()
        );
    }
    assert_eq!(stored[0].0, "000001-DEMO0001.hl7");
    assert_eq!(stored[1].0, "000002-DEMO0002.hl7");
    // The log names control ids but carries no message content (the samples' patient name).
    let log = rx.guard.stderr();
    assert!(log.contains("DEMO0001"), "{log}");
    assert!(!log.contains("PATIENT") && !sent.stderr.contains("PATIENT"));
}

#[test]
fn repeat_sends_the_set_again_under_unique_names() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), &[]);
    let sent = send(&rx.addr, &["--repeat", "3"], &samples());
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    let stored = rx.stored();
    assert_eq!(stored.len(), 6);
    let names: Vec<&str> = stored.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "000001-DEMO0001.hl7");
    assert_eq!(names[5], "000006-DEMO0002.hl7");
    // A second receiver on the same directory goes on after the highest sequence.
    drop(rx);
    let rx = Receiver::start(dir.path(), &[]);
    assert_eq!(send(&rx.addr, &[], &samples()[..1]).code(), 0);
    assert_eq!(rx.stored().last().unwrap().0, "000007-DEMO0001.hl7");
}

#[test]
fn reject_every_one_makes_send_exit_1_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), &["--reject-every", "1"]);
    let sent = send(&rx.addr, &[], &samples());
    assert_eq!(sent.code(), 1, "{}\n{}", sent.stdout, sent.stderr);
    assert_contains(&sent.stdout, "\nMSA|CR|DEMO0001\n");
    // v2.3: the text goes into MSA-3 and the ERR-1 layout is used.
    assert_contains(&sent.stdout, "\nMSA|AR|DEMO0002|");
    assert_eq!(
        sent.stdout
            .lines()
            .filter(|l| l.starts_with("ERR|"))
            .count(),
        2
    );
    assert!(rx.stored().is_empty());
}

#[test]
fn reject_every_second_message() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), &["--reject-every", "2"]);
    let sent = send(&rx.addr, &[], &samples());
    assert_eq!(sent.code(), 1, "{}", sent.stderr);
    assert_contains(&sent.stdout, "\nMSA|CA|DEMO0001\n");
    assert_contains(&sent.stdout, "\nMSA|AR|DEMO0002|");
    let stored = rx.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].0, "000001-DEMO0001.hl7");
}

#[test]
fn garbage_gets_an_ar_nak_and_the_connection_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.hl7");
    std::fs::write(&garbage, b"this is not HL7 at all\r").unwrap();
    let out = dir.path().join("out");
    let rx = Receiver::start(&out, &[]);
    let files = [garbage, samples()[0].clone()];
    let sent = send(&rx.addr, &[], &files);
    assert_eq!(sent.code(), 1, "{}", sent.stderr);
    let mut lines = sent.stdout.lines();
    assert!(lines.next().unwrap().starts_with("MSH|^~\\&|"));
    assert_eq!(lines.next().unwrap(), "MSA|AR|");
    let err = lines.next().unwrap();
    assert!(
        err.starts_with("ERR|||100^Segment sequence error^HL70357|E|"),
        "{err}"
    );
    assert!(
        !err.contains("not HL7"),
        "the NAK must not echo content: {err}"
    );
    // The next message on the same connection is taken.
    assert_contains(&sent.stdout, "\nMSA|CA|DEMO0001\n");
    let stored = rx.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].0, "000002-DEMO0001.hl7");
    // The rejected payload is kept apart, byte for byte.
    let rejected = files_in(&out.join("rejected"));
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].0, "000001-none.hl7");
    assert_eq!(rejected[0].1, b"this is not HL7 at all\r");
}

#[test]
fn batch_file_messages_are_sent_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let files = samples();
    let mut batch = b"FHS|^~\\&|DEMO\rBHS|^~\\&|DEMO\r".to_vec();
    for f in &files {
        batch.extend_from_slice(&std::fs::read(f).unwrap());
    }
    batch.extend_from_slice(format!("BTS|{}\rFTS|1\r", files.len()).as_bytes());
    let path = dir.path().join("batch.hl7");
    std::fs::write(&path, &batch).unwrap();
    let rx = Receiver::start(&dir.path().join("out"), &[]);
    let sent = send(&rx.addr, &[], &[path]);
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert!(sent.stderr.contains("batch.hl7#2"), "{}", sent.stderr);
    let stored = rx.stored();
    assert_eq!(stored.len(), files.len());
    for ((_, bytes), file) in stored.iter().zip(&files) {
        assert_eq!(bytes, &std::fs::read(file).unwrap());
    }
}

#[test]
fn concurrent_senders_are_all_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start(dir.path(), &["--count", "12"]);
    let senders: Vec<_> = (0..3)
        .map(|_| {
            let addr = rx.addr.clone();
            thread::spawn(move || send(&addr, &["--repeat", "2"], &samples()))
        })
        .collect();
    for s in senders {
        let sent = s.join().unwrap();
        assert_eq!(sent.code(), 0, "{}", sent.stderr);
    }
    assert!(rx.guard.wait().success());
    assert_eq!(rx.stored().len(), 12);
}

#[test]
fn oversized_frame_gets_a_nak_then_the_connection_closes() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), &["--max-frame", "100"]);
    let mut s = TcpStream::connect(&rx.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut frame = vec![0x0b];
    frame.extend_from_slice(b"MSH|^~\\&|A|B|C|D|2020||ADT^A01|BIG|P|2.5\rNTE|1||");
    frame.extend(std::iter::repeat_n(b'x', 5000));
    frame.extend_from_slice(b"\x1c\x0d");
    s.write_all(&frame).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    assert!(answer.starts_with(b"\x0bMSH|"), "{answer:?}");
    assert!(answer.ends_with(b"\x1c\x0d"), "{answer:?}");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("\rMSA|AR|\r"), "{text}");
    assert!(text.contains("|207^"), "{text}");
    assert!(rx.stored().is_empty());
}

#[test]
fn idle_connections_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), &["--idle-timeout", "1"]);
    let mut s = TcpStream::connect(&rx.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let start = Instant::now();
    // Half a frame, then silence.
    s.write_all(b"\x0bMSH|^~\\&|").unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert!(start.elapsed() < Duration::from_secs(8));
    let _ = s.shutdown(Shutdown::Both);
}

#[test]
fn connection_refused_and_no_ack_exit_2() {
    // Nobody listening.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let sent = send(&addr, &[], &samples());
    assert_eq!(sent.code(), 2, "{}", sent.stderr);
    assert!(sent.stdout.is_empty());
    // A peer that takes the message and never answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let holder = thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
    });
    let start = Instant::now();
    let sent = hl7gw(&["send", "--to", &addr, "--timeout", "1"], &samples());
    assert_eq!(sent.code(), 2, "{}", sent.stderr);
    assert!(sent.stderr.contains("no ACK within 1s"), "{}", sent.stderr);
    assert!(start.elapsed() < Duration::from_secs(10));
    holder.join().unwrap();
}

#[test]
fn usage_errors_exit_2() {
    let files = samples();
    assert_eq!(
        hl7gw(&["send", "--to", "127.0.0.1:1", "--tls"], &files).code(),
        2
    );
    assert_eq!(hl7gw(&["send", "--to", "127.0.0.1:1"], &[]).code(), 2);
    assert_eq!(hl7gw(&["send", "--to", "nowhere"], &files).code(), 2);
    let missing = [PathBuf::from("/nonexistent/x.hl7")];
    assert_eq!(hl7gw(&["send", "--to", "127.0.0.1:1"], &missing).code(), 2);
    assert_eq!(
        hl7gw(&["receive", "--listen", "127.0.0.1:0"], &[]).code(),
        2
    );
}

#[test]
fn tls_round_trip() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (pki.file("server.pem"), pki.file("server.key"));
    let rx = Receiver::start(dir.path(), &["--tls-cert", &cert, "--tls-key", &key]);
    let ca = pki.file("ca.pem");
    let files = samples();
    // By IP address (the certificate names 127.0.0.1) ...
    let sent = send(&rx.addr, &["--tls", "--ca", &ca], &files);
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_contains(&sent.stdout, "\nMSA|CA|DEMO0001\n");
    // ... and by name, with --server-name.
    let sent = send(
        &rx.addr,
        &["--tls", "--ca", &ca, "--server-name", "localhost"],
        &files,
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    let stored = rx.stored();
    assert_eq!(stored.len(), 2 * files.len());
    assert_eq!(stored[0].1, std::fs::read(&files[0]).unwrap());
    // A CA that did not issue the server's certificate, or a name it does not carry: no connection.
    let other = pki.file("other-ca.pem");
    assert_eq!(send(&rx.addr, &["--tls", "--ca", &other], &files).code(), 2);
    let wrong = ["--tls", "--ca", &ca, "--server-name", "example.org"];
    assert_eq!(send(&rx.addr, &wrong, &files).code(), 2);
    // Plain MLLP to a TLS receiver gets no ACK.
    assert_eq!(send(&rx.addr, &[], &files).code(), 2);
    assert_eq!(rx.stored().len(), 2 * files.len());
}

#[test]
fn mutual_tls_round_trip() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca) = (
        pki.file("server.pem"),
        pki.file("server.key"),
        pki.file("ca.pem"),
    );
    let rx = Receiver::start(
        dir.path(),
        &["--tls-cert", &cert, "--tls-key", &key, "--client-ca", &ca],
    );
    let to = format!("localhost:{}", rx.port());
    let files = samples();
    let (ccert, ckey) = (pki.file("client.pem"), pki.file("client.key"));
    let sent = send(
        &to,
        &["--tls", "--ca", &ca, "--cert", &ccert, "--key", &ckey],
        &files,
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_contains(&sent.stdout, "\nMSA|AA|DEMO0002\n");
    let stored = rx.stored();
    assert_eq!(stored.len(), files.len());
    for ((_, bytes), file) in stored.iter().zip(&files) {
        assert_eq!(bytes, &std::fs::read(file).unwrap());
    }
    // Without a client certificate, or with one from another CA: refused, nothing stored.
    assert_eq!(send(&to, &["--tls", "--ca", &ca], &files).code(), 2);
    let (icert, ikey) = (pki.file("intruder.pem"), pki.file("intruder.key"));
    let intruder = ["--tls", "--ca", &ca, "--cert", &icert, "--key", &ikey];
    assert_eq!(send(&to, &intruder, &files).code(), 2);
    assert_eq!(rx.stored().len(), files.len());
    assert!(rx.guard.stderr().contains("TLS"), "{}", rx.guard.stderr());
}
