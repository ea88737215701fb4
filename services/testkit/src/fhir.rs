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
