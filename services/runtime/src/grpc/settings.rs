//! The `grpc:` section every service has: TLS, tokens, Kubernetes auth, the allow lists, connection lifetimes.

use super::error::GrpcError;
use super::tokens::Tokens;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// TLS for a gRPC listener (PEM files, as for the MLLP listener).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// Server certificate chain.
    pub cert: PathBuf,
    /// Server private key.
    pub key: PathBuf,
    /// When set, a caller may present a certificate signed by one of these CAs (mutual TLS; one from another CA
    /// is refused at the handshake); its common name (CN) is the caller's identity, `cert:<CN>` in `allow`.
    /// Callers without one authenticate with a token, or stay anonymous.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// `grpc:` — the gRPC listener's TLS, authorisation and connection lifetimes, the same keys in every service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcSettings {
    /// TLS (absent: plaintext, for a listener reached only inside the pod network; tokens then cross it in
    /// clear, which `--check-config` warns about).
    pub tls: Option<ServerTls>,
    /// Static bearer tokens (a mounted Secret): one `<name> <token>` per line, `#` comments. Re-read when the
    /// file changes. A caller sending `authorization: Bearer <token>` is `token:<name>` in `allow`.
    pub tokens_file: Option<PathBuf>,
    /// Bearer tokens that are not static tokens are Kubernetes ServiceAccount tokens issued for the audience
    /// `hl7gw` (`kubectl create token <sa> --audience hl7gw`): checked with a TokenReview, and each call authorised with a SubjectAccessReview on API group `hl7gw.io` in the pod's
    /// namespace (see [`kubernetes_resource`]), so RBAC Roles decide. Decisions are cached for 10 s. The
    /// service's own ServiceAccount needs `system:auth-delegator`.
    pub kubernetes_auth: bool,
    /// Who may call each method (`Status`, `ListDeadLetters`, `Replay`, `Trace`, `Transform`, `Ingest`,
    /// `Senders`) and who may read message bodies (`ReadMessages`: `ListDeadLetters` with its messages): a list of `token:<name>`, `cert:<CN>`, `authenticated` (any caller with a valid token or
    /// client certificate) or `anonymous` (anyone). A method not listed keeps its default: admin methods nobody, `Ingest` anyone,
    /// or only authenticated callers when the MLLP listener requires client certificates.
    pub allow: BTreeMap<String, Vec<String>>,
    /// A connection that has not finished its TLS handshake and opened its first call (stream) this long
    /// after it was accepted is closed, freeing its slot in the connection limit (a port scanner or a
    /// half-open tunnel cannot hold one).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub first_stream_timeout: Duration,
    /// An HTTP/2 PING is sent after this long without a frame from the client (0s: never); a client that
    /// does not answer within `keepalive_timeout` is disconnected (a dead peer frees its slot).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub keepalive_interval: Duration,
    /// How long a PING may wait for its answer.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub keepalive_timeout: Duration,
    /// A connection this old is asked to go away (HTTP/2 GOAWAY: calls in progress finish, the client
    /// reconnects, possibly to another pod; 0s: never), and closed `max_connection_age_grace` later.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub max_connection_age: Duration,
    /// How long calls in progress may go on after a GOAWAY (age, idle, shutdown) before the connection is
    /// closed under them.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub max_connection_age_grace: Duration,
    /// A connection with no call in progress for this long is asked to go away (0s: never).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub idle_timeout: Duration,
}

impl Default for GrpcSettings {
    fn default() -> Self {
        Self {
            tls: None,
            tokens_file: None,
            kubernetes_auth: false,
            allow: BTreeMap::new(),
            first_stream_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            max_connection_age: Duration::from_secs(30 * 60),
            max_connection_age_grace: Duration::from_secs(5 * 60),
            idle_timeout: Duration::from_secs(5 * 60),
        }
    }
}

impl GrpcSettings {
    /// The rules serde cannot check, given the methods this service has.
    pub fn validate(&self, methods: &[&str]) -> Result<(), GrpcError> {
        if self.first_stream_timeout.is_zero() {
            return Err(GrpcError::Rule(
                "first_stream_timeout must be more than 0s".into(),
            ));
        }
        if !self.keepalive_interval.is_zero() && self.keepalive_timeout.is_zero() {
            return Err(GrpcError::Rule(
                "keepalive_timeout must be more than 0s when keepalive_interval is set".into(),
            ));
        }
        for (method, who) in &self.allow {
            if !methods.contains(&method.as_str()) {
                return Err(GrpcError::Rule(format!(
                    "allow.{method}: no such method here (this service has {})",
                    methods.join(", ")
                )));
            }
            for w in who {
                let ok = matches!(w.as_str(), "anonymous" | "authenticated")
                    || w.strip_prefix("token:").is_some_and(|n| !n.is_empty())
                    || w.strip_prefix("cert:").is_some_and(|n| !n.is_empty());
                if !ok {
                    return Err(GrpcError::Rule(format!(
                        "allow.{method}: {w:?} is not token:<name>, cert:<CN>, authenticated or anonymous"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Reads the TLS files and the tokens once (`--check-config`): a missing Secret mount fails before a pod
    /// starts. The certificates are parsed when the listener is built (at start).
    pub fn check_files(&self) -> Result<(), GrpcError> {
        if let Some(t) = &self.tls {
            for f in [Some(&t.cert), Some(&t.key), t.client_ca.as_ref()]
                .into_iter()
                .flatten()
            {
                std::fs::read(f)
                    .map_err(|e| GrpcError::Rule(format!("tls: {}: {e}", f.display())))?;
            }
        }
        if let Some(path) = &self.tokens_file {
            Tokens::read(path)?;
        }
        Ok(())
    }

    /// [`GrpcSettings::check_files`] and the TLS certificates parsed: what a service checks at start.
    pub fn check_start(&self) -> Result<(), GrpcError> {
        self.check_files()?;
        self.acceptor().map(|_| ())
    }

    /// Warnings for `--check-config`.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.tls.is_none() {
            w.push("grpc.tls is not set: the gRPC listener is plaintext (patient data and tokens in clear)".into());
        }
        for (method, who) in &self.allow {
            if who.iter().any(|x| x == "anonymous") && method != "Ingest" {
                w.push(format!("grpc.allow.{method} lets anonymous callers in"));
            }
        }
        w
    }

    pub(super) fn acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, GrpcError> {
        let Some(t) = &self.tls else { return Ok(None) };
        // Client certificates are optional here: a caller may authenticate with a token instead, and each
        // method's allow list decides (Ingest's default asks for one when the MLLP listener does).
        let config = hl7gw_tls::server_config_with(&t.cert, &t.key, t.client_ca.as_deref(), false)?;
        crate::certs::record("grpc-server", None, &t.cert);
        let mut config = Arc::unwrap_or_clone(config);
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
    }
}
