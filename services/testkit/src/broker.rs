//! Kafka for the tests, started by scripts/kafka.sh: one broker per port, a 3-broker cluster, a secured one.

#![allow(clippy::unwrap_used)]

use crate::repo_root;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Starts (once per port) a single-node KRaft broker on 127.0.0.1 with the project's script.
pub fn broker_on(port: u16) -> String {
    let root = repo_root();
    let status = Command::new("bash")
        .arg(root.join("scripts/kafka.sh"))
        .arg("up")
        .env("KAFKA_PORT", port.to_string())
        .env(
            "KAFKA_DATA_DIR",
            root.join(format!("target/kafka-test/{port}")),
        )
        .env("KAFKA_PARTITIONS", "3")
        .env("KAFKA_NODES", "1")
        .status()
        .expect("running scripts/kafka.sh");
    assert!(
        status.success(),
        "scripts/kafka.sh up failed for port {port}"
    );
    format!("127.0.0.1:{port}")
}

pub fn stop_broker(port: u16) {
    let root = repo_root();
    let _ = Command::new("bash")
        .arg(root.join("scripts/kafka.sh"))
        .arg("down")
        .env("KAFKA_PORT", port.to_string())
        .env("KAFKA_NODES", "1")
        .env(
            "KAFKA_DATA_DIR",
            root.join(format!("target/kafka-test/{port}")),
        )
        .status();
}

/// The shared test broker (port 29092 unless TEST_KAFKA_PORT says otherwise; not an `HL7GW_` name, since the
/// services the tests start inherit the environment and refuse unknown `HL7GW_` keys).
pub fn broker() -> &'static str {
    static B: OnceLock<String> = OnceLock::new();
    B.get_or_init(|| {
        let port = std::env::var("TEST_KAFKA_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(29092);
        broker_on(port)
    })
}

/// [`broker`] from async code (starting it blocks).
pub async fn broker_async() -> &'static str {
    tokio::task::spawn_blocking(broker).await.unwrap()
}

/// A topic name no other test uses.
pub fn unique_topic(prefix: &str) -> String {
    format!("{prefix}.{}", uuid::Uuid::now_v7().simple())
}

/// A 3-node KRaft cluster (scripts/kafka.sh, `KAFKA_NODES=3`) on `port`, `port`+10, `port`+20, for failover
/// tests: RF 3 and `min.insync.replicas=2` by default.
pub struct Cluster {
    pub port: u16,
}

impl Cluster {
    /// Starts the cluster (once per port) and waits until its three brokers are registered.
    pub fn up(port: u16) -> Self {
        let c = Self { port };
        assert!(
            c.run(&["up"]).0,
            "scripts/kafka.sh up failed for the cluster on {port}"
        );
        c
    }

    /// Runs `scripts/kafka.sh <args>` for this cluster: (success, stdout).
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let root = repo_root();
        let out = Command::new("bash")
            .arg(root.join("scripts/kafka.sh"))
            .args(args)
            .env("KAFKA_NODES", "3")
            .env("KAFKA_PORT", self.port.to_string())
            .env(
                "KAFKA_DATA_DIR",
                root.join(format!("target/kafka-test/cluster-{}", self.port)),
            )
            .stderr(Stdio::inherit())
            .output()
            .expect("running scripts/kafka.sh");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    }

    pub fn brokers(&self) -> String {
        self.run(&["brokers"]).1
    }

    /// SIGKILLs node `n` (1-3).
    pub fn kill(&self, n: u32) {
        assert!(self.run(&["kill", &n.to_string()]).0, "kill {n}");
    }

    /// Stops node `n` cleanly (SIGTERM, as in a rolling restart).
    pub fn stop(&self, n: u32) {
        assert!(self.run(&["stop", &n.to_string()]).0, "stop {n}");
    }

    /// Starts node `n` again and waits until it is back in the cluster.
    pub fn start(&self, n: u32) {
        assert!(self.run(&["start", &n.to_string()]).0, "start {n}");
    }

    /// The node id of the active KRaft controller.
    pub fn controller(&self) -> u32 {
        let (ok, out) = self.run(&["controller"]);
        assert!(ok, "controller: {out}");
        out.parse()
            .unwrap_or_else(|_| panic!("controller id: {out:?}"))
    }

    pub fn down(&self) {
        let _ = self.run(&["down"]);
    }
}

/// Stopped when the test ends, passed or failed (its data stays in target/kafka-test for a look).
impl Drop for Cluster {
    fn drop(&mut self) {
        self.down();
    }
}

/// The broker with TLS and SASL listeners (scripts/kafka.sh `KAFKA_SECURE=1`, port 29392): SASL_SSL with
/// SCRAM-SHA-512 on 29394, mTLS on 29395, plaintext on 29392 for the test's own readers; the test PKI in `pki`.
#[derive(Debug, Clone)]
pub struct SecureBroker {
    pub plaintext: String,
    pub sasl_ssl: String,
    pub mtls: String,
    pub pki: PathBuf,
}

pub const SECURE_PORT: u16 = 29392;

impl SecureBroker {
    /// Starts it once (stopped by scripts/test.sh at the end).
    pub fn get() -> &'static SecureBroker {
        static B: OnceLock<SecureBroker> = OnceLock::new();
        B.get_or_init(|| {
            let out = Self::script(&["up"]);
            assert!(
                out.status.success(),
                "scripts/kafka.sh up (KAFKA_SECURE=1) failed"
            );
            SecureBroker {
                plaintext: format!("127.0.0.1:{SECURE_PORT}"),
                sasl_ssl: format!("127.0.0.1:{}", SECURE_PORT + 2),
                mtls: format!("127.0.0.1:{}", SECURE_PORT + 3),
                pki: Self::data_dir().join("pki"),
            }
        })
    }

    pub(crate) fn data_dir() -> PathBuf {
        repo_root().join(format!("target/kafka-test/{SECURE_PORT}"))
    }

    pub(crate) fn script(args: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(repo_root().join("scripts/kafka.sh"))
            .args(args)
            .env("KAFKA_PORT", SECURE_PORT.to_string())
            .env("KAFKA_DATA_DIR", Self::data_dir())
            .env("KAFKA_PARTITIONS", "3")
            .env("KAFKA_NODES", "1")
            .env("KAFKA_SECURE", "1")
            .stderr(Stdio::inherit())
            .output()
            .expect("running scripts/kafka.sh")
    }

    /// Creates a SCRAM-SHA-512 user, or sets its password.
    pub fn scram_user(&self, name: &str, password: &str) {
        let out = Self::script(&["scram-user", name, password]);
        assert!(out.status.success(), "scram-user {name} failed");
    }

    /// A file of the test PKI.
    pub fn file(&self, name: &str) -> String {
        self.pki.join(name).display().to_string()
    }

    /// `HL7GW_` variables for SASL_SSL as user `hl7gw` (the password file given).
    pub fn sasl_env(&self, password_file: &str) -> Vec<(&'static str, String)> {
        vec![
            ("HL7GW_KAFKA__BROKERS", self.sasl_ssl.clone()),
            ("HL7GW_KAFKA__SECURITY__PROTOCOL", "SASL_SSL".into()),
            ("HL7GW_KAFKA__SECURITY__CA_FILE", self.file("ca.crt")),
            (
                "HL7GW_KAFKA__SECURITY__SASL_MECHANISM",
                "SCRAM-SHA-512".into(),
            ),
            ("HL7GW_KAFKA__SECURITY__USERNAME", "hl7gw".into()),
            ("HL7GW_KAFKA__SECURITY__PASSWORD_FILE", password_file.into()),
        ]
    }

    /// `HL7GW_` variables for the mTLS listener with the client certificate `client` (`client` or
    /// `other-client`, signed by a CA the broker does not know) and the CA file `ca`.
    pub fn mtls_env(&self, client: &str, ca: &str) -> Vec<(&'static str, String)> {
        vec![
            ("HL7GW_KAFKA__BROKERS", self.mtls.clone()),
            ("HL7GW_KAFKA__SECURITY__PROTOCOL", "SSL".into()),
            ("HL7GW_KAFKA__SECURITY__CA_FILE", self.file(ca)),
            (
                "HL7GW_KAFKA__SECURITY__CERT_FILE",
                self.file(&format!("{client}.crt")),
            ),
            (
                "HL7GW_KAFKA__SECURITY__KEY_FILE",
                self.file(&format!("{client}.key")),
            ),
        ]
    }
}
