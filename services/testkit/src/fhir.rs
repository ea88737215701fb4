//! Maven-built test programs, and the FHIR test harness (`services/egress/tests/fhir`, HAPI FHIR 8.8.1): its validator, run on files, and
//! (for the HTTP destination's tests) its in-memory server. Built by `scripts/test.sh` with Maven; built here
//! when missing or older than its sources.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The JVM flags that halve the harness's start-up on 2 cores.
pub const JVM_FLAGS: &[&str] = &["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx1g"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The harness's jar, built with Maven when it is missing or older than its sources.
pub fn harness_jar() -> &'static Path {
    static JAR: OnceLock<PathBuf> = OnceLock::new();
    JAR.get_or_init(|| {
        maven_package(
            &repo_root().join("services/egress/tests/fhir"),
            &repo_root().join("target/tmp/fhir-harness"),
            "fhir-harness-1.jar",
            "harness.out",
        )
    })
}

/// A test's Maven project at `src` packaged into `out` (`-D<out_property>=<out>`), unless `out/<jar>` and
/// `out/libs` are newer than its pom.xml and every file under its `src/`; returns the jar's path. Its jars come
/// from Maven Central once and stay in ~/.m2.
pub fn maven_package(src: &Path, out: &Path, jar: &str, out_property: &str) -> PathBuf {
    let jar = out.join(jar);
    let newest_source = walk_newest(&src.join("src")).max(mtime(&src.join("pom.xml")));
    if mtime(&jar) <= newest_source || !out.join("libs").is_dir() {
        let status = Command::new("mvn")
            .args([
                "-q",
                "-B",
                "-Dstyle.color=never",
                "--no-transfer-progress",
                "-f",
            ])
            .arg(src.join("pom.xml"))
            .arg(format!("-D{out_property}={}", out.display()))
            .arg("package")
            .status()
            .expect("running mvn (Maven and Java 17 are needed for this test)");
        assert!(
            status.success(),
            "building {} with Maven failed",
            src.display()
        );
    }
    jar
}

fn mtime(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
}

/// The newest modification time of the files under `dir`.
fn walk_newest(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            newest = newest.max(if p.is_dir() {
                walk_newest(&p)
            } else {
                mtime(&p)
            });
        }
    }
    newest
}

/// One file's validation: counts by severity and the messages (severity, location, text).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Validation {
    pub file: String,
    pub errors: usize,
    pub warnings: usize,
    pub information: usize,
    #[serde(default)]
    pub messages: Vec<ValidationMessage>,
}

/// One validator message.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ValidationMessage {
    pub severity: String,
    #[serde(default)]
    pub location: String,
    pub message: String,
}

/// Validates every `*.json` under `dir` in one JVM with HAPI's R4 validator, offline.
pub fn validate_dir(dir: &Path) -> Vec<Validation> {
    let out = Command::new("java")
        .args(JVM_FLAGS)
        .arg("-jar")
        .arg(harness_jar())
        .arg("validate")
        .arg(dir)
        .output()
        .expect("running java (Java 17 is needed for the FHIR tests)");
    assert!(
        out.status.success(),
        "the validator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The harness's FHIR server (`serve`), killed when dropped: in memory, validating every write, with the
/// tests' controls at `/admin`.
pub struct FhirServer {
    pub process: crate::KillOnDrop,
    pub port: u16,
}

impl FhirServer {
    /// Starts the server on `port` (0: any free one) with `extra` arguments (TLS, tokens) and waits until it
    /// answers (HAPI's start takes 5-15 s here).
    pub fn start(port: u16, extra: &[&str]) -> Self {
        let mut cmd = Command::new("java");
        cmd.args(JVM_FLAGS)
            .arg("-jar")
            .arg(harness_jar())
            .args(["serve", "--port", &port.to_string()])
            .args(extra);
        let (process, line) = crate::spawn_listening(&mut cmd);
        let port = crate::listening_field(&line, "port")
            .parse()
            .unwrap_or_else(|_| panic!("the FHIR server's listening line: {line:?}"));
        Self { process, port }
    }

    /// The FHIR base URL (plain HTTP).
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}/fhir", self.port)
    }

    /// A request to the server (HTTP/1.0, so the answer is never chunked): (status, body as JSON, or null).
    pub fn call(&self, method: &str, path: &str) -> (u16, serde_json::Value) {
        self.send(method, path, b"")
    }

    /// A request with a FHIR JSON body (a transaction Bundle POSTed to `/fhir`): (status, body as JSON, or
    /// null).
    pub fn send(&self, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
        use std::io::{Read, Write};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let Ok(mut s) =
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))
        else {
            return (0, serde_json::Value::Null);
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(30)));
        let content_type = if body.is_empty() {
            ""
        } else {
            "Content-Type: application/fhir+json\r\n"
        };
        let _ = write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n{content_type}Content-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(body);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .and_then(|(_, b)| serde_json::from_str(b).ok())
            .unwrap_or(serde_json::Value::Null);
        (status, body)
    }

    /// A request to a server started with `--tls-cert` and `--client-ca` (the test PKI's CA and client
    /// certificate): the body as JSON (null when it is not).
    pub async fn call_tls(&self, method: &str, path: &str, pki: &crate::Pki) -> serde_json::Value {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let config = hl7gw_tls::client_config(
            &pki.path("ca.pem"),
            Some((&pki.path("client.pem"), &pki.path("client.key"))),
        )
        .expect("the test PKI");
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .expect("connect to the FHIR server");
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("a server name");
        let mut s = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .expect("TLS handshake with the FHIR server");
        s.write_all(
            format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("write");
        let mut out = Vec::new();
        // Jetty may close without close_notify: what was read is the answer.
        let _ = s.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out);
        text.split_once("\r\n\r\n")
            .and_then(|(_, b)| serde_json::from_str(b).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    /// Resources held, by type (`GET /admin/counts`).
    pub fn counts(&self) -> std::collections::BTreeMap<String, u64> {
        let (_, v) = self.call("GET", "/admin/counts");
        v.as_object()
            .into_iter()
            .flatten()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
            .collect()
    }

    /// The requests to /fhir so far, oldest first (`GET /admin/requests`).
    pub fn requests(&self) -> Vec<serde_json::Value> {
        let (_, v) = self.call("GET", "/admin/requests");
        v["requests"].as_array().cloned().unwrap_or_default()
    }

    /// The next `count` requests to /fhir get `status` (with `Retry-After: retry_after` when given).
    pub fn fail_next(&self, status: u16, count: u32, retry_after: Option<&str>) {
        let mut q = format!("/admin/fail?status={status}&count={count}");
        if let Some(r) = retry_after {
            q.push_str(&format!("&retryAfter={r}"));
        }
        let (code, body) = self.call("POST", &q);
        assert_eq!(code, 200, "POST {q}: {body}");
    }
}
