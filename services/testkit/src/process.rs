//! The workspace's binaries and tools as child processes: started, waited for, killed on drop; the load harness.

#![allow(clippy::unwrap_used)]

use crate::repo_root;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL) when the test ends, whether it passed or panicked.
pub struct KillOnDrop(pub std::process::Child);

/// Starts `cmd` with its stdout piped and reads the listening line every service prints first (`... grpc=<addr>
/// admin=<addr>`, or the receiver's `listening on <addr>`); the process, killed on drop, and the line.
pub fn spawn_listening(cmd: &mut Command) -> (KillOnDrop, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", cmd.get_program().to_string_lossy()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("reading the listening line");
    (KillOnDrop(child), line)
}

/// The value of `key=` in a listening line.
pub fn listening_field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// Sends SIGTERM to `child` and waits up to `limit` for it to exit; its exit status. Panics, naming the
/// process `name`, when it is still running then.
pub fn sigterm_and_wait(
    child: &mut Child,
    name: &str,
    limit: Duration,
) -> std::process::ExitStatus {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -TERM {name}");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end; its stdout, or a panic naming the program with its stderr when it failed.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{:?} did not start: {e}", cmd.get_program()));
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        cmd.get_program(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tool `scripts/tools.sh` installs (`helm`, `grpcurl`, `kubeconform`), installed first when missing
/// (instant once cached in .cache/tools).
pub fn tool(name: &str) -> PathBuf {
    let script = repo_root().join("scripts/tools.sh");
    run_ok(Command::new("bash").arg(&script));
    run_ok(Command::new("bash").arg(&script).arg("path"))
        .trim()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} is not among scripts/tools.sh's tools"))
}

/// A workspace binary (`hl7gw-ingress`, `hl7gw-load`, `hl7gw`, ...) next to the test's own directory:
/// `cargo test --workspace --all-targets` builds every binary before any test runs.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test step");
    let dir = exe.parent().and_then(Path::parent).expect("test step");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} missing: run the tests with `cargo test --workspace --all-targets` (make test)",
        bin.display()
    );
    bin
}

/// `hl7gw-load`.
pub fn load_binary() -> PathBuf {
    bin("hl7gw-load")
}

/// Runs `hl7gw-load` for `secs` seconds with `clients` connections, recording every ACKed id in `record`;
/// stdout (the JSON summary) is piped.
pub fn start_load(port: u16, clients: u32, secs: u32, record: &Path) -> Child {
    load_command(port, clients, secs, record)
        .args(["--timeout", "10"])
        .spawn()
        .expect("starting hl7gw-load")
}

/// `hl7gw-load` to the MLLP port for `secs` seconds with `clients` connections, no warmup, every ACKed id
/// recorded in `record`, the JSON summary on a piped stdout, stderr discarded; add options and spawn it.
pub fn load_command(port: u16, clients: u32, secs: u32, record: &Path) -> Command {
    let mut cmd = Command::new(load_binary());
    cmd.args(["--to", &format!("127.0.0.1:{port}")])
        .args(["--clients", &clients.to_string()])
        .args(["--duration", &secs.to_string(), "--warmup", "0", "--json"])
        .arg("--record-acked")
        .arg(record)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("test step")
        .local_addr()
        .expect("test step")
        .port()
}

/// Waits until the service `name` whose admin server is at `admin` answers `/readyz` with 200; panics at
/// `deadline`.
pub fn wait_ready(name: &str, admin: SocketAddr, deadline: Instant) {
    while http_get(admin, "/readyz").0 != 200 {
        assert!(Instant::now() < deadline, "{name} not ready");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// [`wait_ready`] from async code, on a blocking thread.
pub async fn wait_ready_async(name: &'static str, admin: SocketAddr, deadline: Instant) {
    tokio::task::spawn_blocking(move || wait_ready(name, admin, deadline))
        .await
        .expect("the readiness wait");
}

/// Waits until the service `name` whose admin server is at `admin` answers `/readyz` with 503 and a body that
/// says `reason`; panics at `deadline`.
pub fn wait_unready(name: &str, admin: SocketAddr, reason: &str, deadline: Instant) {
    loop {
        let (code, body) = http_get(admin, "/readyz");
        if code == 503 && body.contains(reason) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}'s readiness does not say {reason:?}: {code} {body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// [`wait_unready`] from async code, on a blocking thread.
pub async fn wait_unready_async(
    name: &'static str,
    admin: SocketAddr,
    reason: &'static str,
    deadline: Instant,
) {
    tokio::task::spawn_blocking(move || wait_unready(name, admin, reason, deadline))
        .await
        .expect("the readiness wait");
}

/// The operator's CLI, `hl7gw args`, against the admin API at `to` (`https://…` checked with the CA file
/// `ca`, or `http://…`), with the token in `token_file` when there is one. More arguments may follow.
pub fn admin_cli(args: &[&str], to: &str, ca: Option<&str>, token_file: Option<&Path>) -> Command {
    let mut cmd = Command::new(bin("hl7gw"));
    cmd.args(args).args(["--to", to]);
    if let Some(ca) = ca {
        cmd.args(["--ca", ca]);
    }
    if let Some(file) = token_file {
        cmd.arg("--token-file").arg(file);
    }
    cmd
}

/// Runs `cmd` to its end: (success, stdout, stderr), the output as text.
pub fn output_text(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{:?} did not start: {e}", cmd.get_program()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The audit lines (`admin call`) of a service's log.
pub fn admin_calls(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("admin call")).collect()
}

/// Whether one audit line of `log` has every one of `words` (who, which method, what came of it).
pub fn audited(log: &str, words: &[&str]) -> bool {
    admin_calls(log)
        .iter()
        .any(|l| words.iter().all(|w| l.contains(w)))
}

/// A minimal blocking HTTP GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}
