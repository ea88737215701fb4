//! The services' gRPC listener, built one way for all three: TLS or mutual TLS (PEM files), TCP_NODELAY, a
//! connection limit, connection lifetimes (first-stream timeout, HTTP/2 keepalive, idle timeout, maximum
//! age), gzip/zstd, health; and who may call which method. Admin methods are refused to anyone not
//! allow-listed (deny by default); every call to them is audited (who, method, what, result; never content).

use crate::admin::Health;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::Status;

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
    /// `Senders`): a list of `token:<name>`, `cert:<CN>`, `authenticated` (any caller with a valid token or
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

/// Why the gRPC settings are refused.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("grpc.{0}")]
    Rule(String),
    #[error("grpc.tls: {0}")]
    Tls(#[from] hl7gw_tls::TlsError),
    #[error("grpc.tokens_file {path}: {reason}")]
    Tokens { path: String, reason: String },
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

    fn acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, GrpcError> {
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

/// Who made a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Anonymous,
    /// A static token's name.
    Token(String),
    /// A client certificate's CN.
    Cert(String),
    /// A Kubernetes user (a ServiceAccount: `system:serviceaccount:<ns>:<name>`), authorised by RBAC.
    Kubernetes(String),
}

/// The `hl7gw.io` resource and verb a SubjectAccessReview asks about for each method.
pub fn kubernetes_resource(method: &str) -> Option<(&'static str, &'static str)> {
    Some(match method {
        "Status" => ("destinations", "get"),
        "ListDeadLetters" => ("deadletters", "list"),
        "Replay" => ("replays", "create"),
        "Transform" => ("dryruns", "create"),
        "Ingest" => ("messages", "create"),
        "Senders" => ("senders", "get"),
        "Trace" => ("traces", "get"),
        _ => return None,
    })
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Anonymous => f.write_str("anonymous"),
            Self::Token(n) => write!(f, "token:{n}"),
            Self::Cert(n) => write!(f, "cert:{n}"),
            Self::Kubernetes(u) => write!(f, "k8s:{u}"),
        }
    }
}

/// The file's modification time and size when last read, and its (name, token) pairs.
type TokensState = (Option<(std::time::SystemTime, u64)>, Vec<(String, String)>);

/// The static tokens, re-read when the file's modification time or size changes.
struct Tokens {
    path: PathBuf,
    state: std::sync::Mutex<TokensState>,
}

impl Tokens {
    fn read(path: &std::path::Path) -> Result<Vec<(String, String)>, GrpcError> {
        let err = |reason: String| GrpcError::Tokens {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(char::is_whitespace) {
                Some((name, token)) if token.trim().len() >= 16 => {
                    out.push((name.to_owned(), token.trim().to_owned()))
                }
                // The line itself may hold a token: never in the error.
                _ => {
                    return Err(err(format!(
                        "line {}: expected `<name> <token>` with a token of at least 16 characters",
                        i + 1
                    )));
                }
            }
        }
        Ok(out)
    }

    /// The name of `token`, reloading the file first when it changed. A file that is missing or does not
    /// parse accepts no token (logged).
    fn name_of(&self, token: &str) -> Option<String> {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.modified().unwrap_or(std::time::UNIX_EPOCH), m.len()));
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if stamp != state.0 || stamp.is_none() {
            // Fails closed: a file that is gone or no longer parses revokes every token (a revocation that
            // left a typo must not keep the revoked token alive).
            let tokens = match stamp.map(|_| Self::read(&self.path)) {
                Some(Ok(tokens)) => {
                    tracing::info!(path = %self.path.display(), tokens = tokens.len(), "gRPC tokens loaded");
                    tokens
                }
                Some(Err(e)) => {
                    tracing::error!(error = %e, "gRPC tokens file refused: no token is accepted until it is fixed");
                    Vec::new()
                }
                None => {
                    if state.0.is_some() || !state.1.is_empty() {
                        tracing::error!(path = %self.path.display(), "gRPC tokens file missing: no token is accepted");
                    }
                    Vec::new()
                }
            };
            *state = (stamp, tokens);
        }
        state
            .1
            .iter()
            .find(|(_, t)| constant_time_eq(t.as_bytes(), token.as_bytes()))
            .map(|(n, _)| n.clone())
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The authorisation of one service's gRPC methods.
pub struct Auth {
    tokens: Option<Tokens>,
    allow: BTreeMap<String, Vec<String>>,
    kubernetes: Option<KubeAuth>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("allow", &self.allow)
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// `defaults`: who may call each method when `grpc.allow` does not say (methods absent: nobody).
    pub fn new(settings: &GrpcSettings, defaults: &[(&str, &[&str])]) -> Self {
        let mut allow: BTreeMap<String, Vec<String>> = defaults
            .iter()
            .map(|(m, who)| {
                (
                    (*m).to_owned(),
                    who.iter().map(|w| (*w).to_owned()).collect(),
                )
            })
            .collect();
        allow.extend(settings.allow.clone());
        Self {
            tokens: settings.tokens_file.as_ref().map(|p| Tokens {
                path: p.clone(),
                state: std::sync::Mutex::new((None, Vec::new())),
            }),
            allow,
            kubernetes: settings.kubernetes_auth.then(KubeAuth::default),
        }
    }

    /// The bearer token of a call, if it sent one.
    fn bearer<T>(req: &tonic::Request<T>) -> Result<Option<&str>, Status> {
        let Some(v) = req.metadata().get("authorization") else {
            return Ok(None);
        };
        v.to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(|t| Some(t.trim()))
            .ok_or_else(|| Status::unauthenticated("authorization must be `Bearer <token>`"))
    }

    /// Who is calling, without Kubernetes: a static bearer token (which must be known), else the client
    /// certificate, else anonymous.
    pub fn authenticate<T>(&self, req: &tonic::Request<T>) -> Result<Caller, Status> {
        if let Some(token) = Self::bearer(req)? {
            return self
                .tokens
                .as_ref()
                .and_then(|t| t.name_of(token))
                .map(Caller::Token)
                .ok_or_else(|| Status::unauthenticated("unknown token"));
        }
        if let Some(cn) = req
            .extensions()
            .get::<ConnInfo>()
            .and_then(|c| c.client_cn.clone())
        {
            return Ok(Caller::Cert(cn));
        }
        Ok(Caller::Anonymous)
    }

    /// Authenticates the caller and checks `method`'s allow list (or, for a Kubernetes token, RBAC):
    /// UNAUTHENTICATED for an anonymous caller where one is needed or an unknown token, PERMISSION_DENIED for
    /// a known caller not allowed.
    pub async fn authorize<T>(
        &self,
        req: &tonic::Request<T>,
        method: &str,
    ) -> Result<Caller, Status> {
        if let (Some(kube), Some(token)) = (&self.kubernetes, Self::bearer(req)?) {
            let is_static = self
                .tokens
                .as_ref()
                .is_some_and(|t| t.name_of(token).is_some());
            if !is_static {
                let peer = peer(req).map(|p| p.ip());
                return kube.authorize(token, method, peer).await;
            }
        }
        let caller = self.authenticate(req)?;
        let allowed = self
            .allow
            .get(method)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let ok = allowed.iter().any(|a| match a.as_str() {
            "anonymous" => true,
            "authenticated" => caller != Caller::Anonymous,
            who => who == caller.to_string(),
        });
        match (ok, &caller) {
            (true, _) => Ok(caller),
            (false, Caller::Anonymous) => Err(Status::unauthenticated(format!(
                "{method} needs a token or a client certificate"
            ))),
            (false, c) => Err(Status::permission_denied(format!(
                "{c} may not call {method}"
            ))),
        }
    }

    /// [`Auth::authorize`] for an admin method, with the audit line of a refusal.
    pub async fn admin<T>(
        &self,
        req: &tonic::Request<T>,
        method: &str,
        what: &str,
    ) -> Result<Caller, Status> {
        self.authorize(req, method).await.inspect_err(|s| {
            audit(
                "refused caller",
                peer(req),
                method,
                what,
                &format!("refused: {:?}: {}", s.code(), s.message()),
            );
        })
    }
}

/// How long a decision about a token the API server authenticated (allowed, or denied by RBAC) is reused.
const KUBE_CACHE_TTL: Duration = Duration::from_secs(10);

/// How long "unknown token" is remembered: briefly (a token just issued is known a moment later), but a
/// caller repeating a made-up token costs no review meanwhile.
const KUBE_NEGATIVE_TTL: Duration = Duration::from_secs(5);

/// Decisions kept at most in each of the two caches; the least recently used goes first. Unknown tokens
/// have their own cache, so a flood of made-up tokens cannot push out the decisions of real callers.
const KUBE_CACHE_MAX: usize = 4096;

/// TokenReviews/SubjectAccessReviews in flight at most per service.
const KUBE_REVIEWS_IN_FLIGHT: usize = 16;

/// Reviews in flight at most for one peer (IP address): one client sending made-up tokens cannot take the
/// reviews every other caller needs.
const KUBE_REVIEWS_PER_PEER: usize = 2;

/// How long a review (TokenReview, then SubjectAccessReview) may take before the call gets UNAVAILABLE.
const KUBE_REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

type KubeDecision = Result<Caller, (tonic::Code, String)>;

/// A map that keeps at most `cap` entries, each for `ttl`, forgetting the least recently used first.
#[derive(Debug)]
struct Lru<K, V> {
    cap: usize,
    ttl: Duration,
    tick: u64,
    /// key → (when stored, last use, value)
    map: std::collections::HashMap<K, (Instant, u64, V)>,
    /// last use → key, oldest first
    order: BTreeMap<u64, K>,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Lru<K, V> {
    fn new(cap: usize, ttl: Duration) -> Self {
        Self {
            cap: cap.max(1),
            ttl,
            tick: 0,
            map: std::collections::HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// The value of `key` if stored less than `ttl` ago (it becomes the most recently used).
    fn get(&mut self, key: &K) -> Option<V> {
        let (at, used, v) = self.map.get_mut(key)?;
        if at.elapsed() >= self.ttl {
            let used = *used;
            self.map.remove(key);
            self.order.remove(&used);
            return None;
        }
        self.tick += 1;
        self.order.remove(&*used);
        *used = self.tick;
        let v = v.clone();
        self.order.insert(self.tick, key.clone());
        Some(v)
    }

    /// Stores `value` under `key`, forgetting the least recently used entry when full.
    fn insert(&mut self, key: K, value: V) {
        self.tick += 1;
        if let Some((_, used, _)) = self.map.get(&key) {
            let used = *used;
            self.order.remove(&used);
        } else if self.map.len() >= self.cap
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.map.remove(&oldest);
        }
        self.map
            .insert(key.clone(), (Instant::now(), self.tick, value));
        self.order.insert(self.tick, key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// What the reviews decided lately: the decisions about tokens the API server knows, per (SHA-256 of the
/// token, method), and the tokens it did not know, per SHA-256, each bounded on its own.
#[derive(Debug)]
struct KubeCache {
    known: Lru<([u8; 32], String), KubeDecision>,
    unknown: Lru<[u8; 32], (tonic::Code, String)>,
}

impl Default for KubeCache {
    fn default() -> Self {
        Self {
            known: Lru::new(KUBE_CACHE_MAX, KUBE_CACHE_TTL),
            unknown: Lru::new(KUBE_CACHE_MAX, KUBE_NEGATIVE_TTL),
        }
    }
}

impl KubeCache {
    fn get(&mut self, digest: [u8; 32], method: &str) -> Option<KubeDecision> {
        if let Some(refusal) = self.unknown.get(&digest) {
            return Some(Err(refusal));
        }
        self.known.get(&(digest, method.to_owned()))
    }

    fn insert(&mut self, digest: [u8; 32], method: &str, decision: KubeDecision) {
        match decision {
            Err((code @ tonic::Code::Unauthenticated, m)) => self.unknown.insert(digest, (code, m)),
            d => self.known.insert((digest, method.to_owned()), d),
        }
    }
}

/// Reviews in flight per peer address, at most `max` each.
#[derive(Debug)]
struct PeerReviews {
    max: usize,
    in_flight: std::sync::Mutex<std::collections::HashMap<Option<std::net::IpAddr>, usize>>,
}

impl PeerReviews {
    fn new(max: usize) -> Self {
        Self {
            max,
            in_flight: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// A place for one review of `peer`'s, or `None` when it has `max` in flight.
    fn try_start(&self, peer: Option<std::net::IpAddr>) -> Option<PeerReview<'_>> {
        let mut m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(peer).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerReview { of: self, peer })
    }
}

/// One review in flight for a peer, until dropped.
struct PeerReview<'a> {
    of: &'a PeerReviews,
    peer: Option<std::net::IpAddr>,
}

impl Drop for PeerReview<'_> {
    fn drop(&mut self) {
        let mut m = self.of.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.peer);
            }
        }
    }
}

/// Kubernetes authentication (TokenReview) and authorisation (SubjectAccessReview), with a short cache.
struct KubeAuth {
    client: tokio::sync::OnceCell<(kube::Client, String)>,
    cache: std::sync::Mutex<KubeCache>,
    /// Reviews in flight at most: unknown tokens cannot flood the API server.
    reviews: tokio::sync::Semaphore,
    /// Reviews in flight per peer.
    per_peer: PeerReviews,
}

impl Default for KubeAuth {
    fn default() -> Self {
        Self {
            client: tokio::sync::OnceCell::new(),
            cache: std::sync::Mutex::new(KubeCache::default()),
            reviews: tokio::sync::Semaphore::new(KUBE_REVIEWS_IN_FLIGHT),
            per_peer: PeerReviews::new(KUBE_REVIEWS_PER_PEER),
        }
    }
}

/// The audience a Kubernetes token must be issued for (`kubectl create token <sa> --audience hl7gw`): a token
/// for the API server itself is refused, so a caller never hands the gateway a credential for the cluster.
pub const KUBERNETES_AUDIENCE: &str = "hl7gw";

impl std::fmt::Debug for KubeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAuth").finish_non_exhaustive()
    }
}

impl KubeAuth {
    async fn client(&self) -> Result<&(kube::Client, String), Status> {
        self.client
            .get_or_try_init(|| async {
                let client = kube::Client::try_default().await.map_err(|e| {
                    tracing::error!(error = %e, "no Kubernetes client for grpc.kubernetes_auth");
                    Status::unavailable("Kubernetes authentication is unavailable")
                })?;
                let ns = std::env::var("POD_NAMESPACE")
                    .unwrap_or_else(|_| client.default_namespace().to_owned());
                Ok((client, ns))
            })
            .await
    }

    async fn authorize(
        &self,
        token: &str,
        method: &str,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Caller, Status> {
        // A ServiceAccount token is a JWT: three dot-separated parts. Anything else is not worth a review.
        if token.split('.').count() != 3 {
            return Err(Status::unauthenticated("unknown token"));
        }
        let digest: [u8; 32] = {
            use sha2::Digest;
            sha2::Sha256::digest(token.as_bytes()).into()
        };
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest, method);
        if let Some(d) = cached {
            return d.map_err(|(c, m)| Status::new(c, m));
        }
        let Some(_peer) = self.per_peer.try_start(peer) else {
            return Err(Status::unavailable(
                "too many authentication reviews in flight from this address; retry",
            ));
        };
        let Ok(_permit) = self.reviews.try_acquire() else {
            return Err(Status::unavailable(
                "too many authentication reviews in flight; retry",
            ));
        };
        let decision = tokio::time::timeout(KUBE_REVIEW_TIMEOUT, self.review(token, method))
            .await
            .map_err(|_| {
                tracing::warn!("Kubernetes review timed out");
                Status::unavailable("Kubernetes authentication timed out; retry")
            })??;
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
            digest,
            method,
            decision.clone(),
        );
        decision.map_err(|(c, m)| Status::new(c, m))
    }

    /// The decision, or UNAVAILABLE (not cached) when the API server could not be asked.
    async fn review(&self, token: &str, method: &str) -> Result<KubeDecision, Status> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let (client, ns) = self.client().await?;
        let unavailable = |e: kube::Error| {
            tracing::warn!(error = %e, "Kubernetes review failed");
            Status::unavailable("Kubernetes authentication is unavailable; retry")
        };
        let tr = kube::Api::<TokenReview>::all(client.clone())
            .create(
                &kube::api::PostParams::default(),
                &TokenReview {
                    spec: TokenReviewSpec {
                        token: token.to_owned(),
                        audiences: Some(vec![KUBERNETES_AUDIENCE.to_owned()]),
                    },
                    ..TokenReview::default()
                },
            )
            .await
            .map_err(unavailable)?;
        let status = tr.status.unwrap_or_default();
        let audience_ok = status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|x| x == KUBERNETES_AUDIENCE));
        let Some(user) = status
            .user
            .filter(|_| status.authenticated == Some(true) && audience_ok)
        else {
            return Ok(Err((tonic::Code::Unauthenticated, "unknown token".into())));
        };
        let name = user.username.clone().unwrap_or_default();
        let Some((resource, verb)) = kubernetes_resource(method) else {
            return Ok(Err((
                tonic::Code::PermissionDenied,
                format!("no RBAC resource for {method}"),
            )));
        };
        let sar = kube::Api::<SubjectAccessReview>::all(client.clone())
            .create(
                &kube::api::PostParams::default(),
                &SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: user.username,
                        groups: user.groups,
                        uid: user.uid,
                        extra: user.extra,
                        resource_attributes: Some(ResourceAttributes {
                            group: Some("hl7gw.io".into()),
                            resource: Some(resource.into()),
                            verb: Some(verb.into()),
                            namespace: Some(ns.clone()),
                            ..ResourceAttributes::default()
                        }),
                        ..SubjectAccessReviewSpec::default()
                    },
                    ..SubjectAccessReview::default()
                },
            )
            .await
            .map_err(unavailable)?;
        if sar.status.is_some_and(|s| s.allowed) {
            Ok(Ok(Caller::Kubernetes(name)))
        } else {
            Ok(Err((
                tonic::Code::PermissionDenied,
                format!("k8s:{name} may not {verb} {resource}.hl7gw.io in namespace {ns}"),
            )))
        }
    }
}

/// Longest caller-supplied value (a destination, a stage, an id, a route name) kept in an audit or error line,
/// in bytes: these are logged before the caller is authorised, so a line must not grow with them.
pub const MAX_LOGGED_VALUE: usize = 128;

/// Longest `what` (the request's description) and `result` of one audit line, in bytes. A replay's result
/// lists the ids it made (ours, at most a page of them), so `result` gets more room.
const MAX_AUDIT_WHAT: usize = 2048;
const MAX_AUDIT_RESULT: usize = 64 * 1024;

/// `value` cut to [`MAX_LOGGED_VALUE`] bytes at a character boundary, with its full length, for a log line or
/// an error message that names a caller-supplied value.
pub fn clip(value: &str) -> std::borrow::Cow<'_, str> {
    clip_to(value, MAX_LOGGED_VALUE)
}

/// `value` cut to `max` bytes at a character boundary, followed by `…[<n> bytes]` when it was longer.
pub fn clip_to(value: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if value.len() <= max {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…[{} bytes]", &value[..end], value.len()))
}

/// The audit line of an admin call: who, from where, which method, on what (ids, destinations, a time range;
/// never message content), and the result. Target `hl7gw::audit`, so it can be routed apart. Every field is
/// bounded ([`clip_to`]), whatever the caller sent.
pub fn audit(who: &str, peer: Option<SocketAddr>, method: &str, what: &str, result: &str) {
    tracing::info!(
        target: "hl7gw::audit",
        caller = &*clip(who),
        peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
        method = &*clip(method),
        what = &*clip_to(what, MAX_AUDIT_WHAT),
        result = &*clip_to(result, MAX_AUDIT_RESULT),
        "admin call"
    );
}

/// [`audit`] once an admin call finished: `ok` says what an answer held (counts, ids), an error its code.
pub fn audit_result<T>(
    caller: &Caller,
    peer: Option<SocketAddr>,
    method: &str,
    what: &str,
    result: &Result<tonic::Response<T>, Status>,
    ok: impl FnOnce(&T) -> String,
) {
    let outcome = match result {
        Ok(r) => format!("ok: {}", ok(r.get_ref())),
        Err(s) => format!("error: {:?}", s.code()),
    };
    audit(&caller.to_string(), peer, method, what, &outcome);
}

/// The peer address of a call on a listener built here.
pub fn peer<T>(req: &tonic::Request<T>) -> Option<SocketAddr> {
    req.extensions().get::<ConnInfo>().and_then(|c| c.remote)
}

/// The client certificate subject of a call made over mutual TLS.
pub fn client_subject<T>(req: &tonic::Request<T>) -> Option<String> {
    req.extensions()
        .get::<ConnInfo>()
        .and_then(|c| c.client_subject.clone())
}

/// Serves `routes` (plus reflection) on `listener` with the listener's TLS until `stop`: at most
/// `limits.max_connections` connections at once, each closed when it opens no call in time, stops answering
/// PINGs, grows old or stays idle (the `grpc:` settings), each close counted in `metrics`. On `stop` every
/// connection gets a GOAWAY; calls in progress have `max_connection_age_grace` to finish.
pub async fn serve(
    routes: tonic::service::Routes,
    listener: TcpListener,
    settings: &GrpcSettings,
    limits: Limits,
    metrics: GrpcMetrics,
    stop: CancellationToken,
) -> Result<(), GrpcServeError> {
    let acceptor = settings.acceptor()?;
    // Reflection (the public schema of proto/, nothing else) for grpcurl and other generic clients.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| GrpcError::Rule(format!("reflection: {e}")))?;
    let routes = routes.add_service(reflection).prepare();
    let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
    let mut http2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    http2
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(nonzero(settings.keepalive_interval))
        .keep_alive_timeout(settings.keepalive_timeout);
    let lifetimes = Lifetimes {
        first_stream: settings.first_stream_timeout,
        max_age: nonzero(settings.max_connection_age),
        grace: settings.max_connection_age_grace,
        idle: nonzero(settings.idle_timeout),
    };
    let tasks = tokio_util::task::TaskTracker::new();
    accept_loop(
        listener,
        limits.max_connections,
        stop.clone(),
        |stream, remote, accepted, permit| {
            let (routes, http2, acceptor, metrics, stop) = (
                routes.clone(),
                http2.clone(),
                acceptor.clone(),
                metrics.clone(),
                stop.clone(),
            );
            tasks.spawn(async move {
                let Some(conn) =
                    handshake(stream, remote, acceptor, accepted, lifetimes, &metrics).await
                else {
                    return;
                };
                metrics.connections.inc();
                serve_connection(conn, routes, http2, lifetimes, &metrics, stop).await;
                metrics.connections.dec();
                drop(permit);
            });
        },
    )
    .await;
    tasks.close();
    tasks.wait().await;
    Ok(())
}

crate::label_sets! {
    /// `reason`: why the server closed a gRPC connection.
    pub struct CloseLabels { pub reason: &'static str }
}

crate::metric_set! {
    /// The gRPC listener's connections (every service has one).
    pub struct GrpcMetrics under "grpc" {
        /// Open gRPC connections, each holding a slot of the connection limit.
        pub connections: prometheus_client::metrics::gauge::Gauge =
            "gRPC connections open (each holds a slot of the listener's connection limit)";
        /// Connections the server closed or sent away, by reason.
        pub connections_closed: prometheus_client::metrics::family::Family<
            CloseLabels,
            prometheus_client::metrics::counter::Counter,
        > = "gRPC connections the server closed or sent a GOAWAY, by reason: handshake_failed, \
             first_stream_timeout (no TLS handshake or first call in time), keepalive_timeout (no PING \
             answer), idle_timeout, max_age, grace_expired (calls still running after a GOAWAY's grace)";
    }
}

impl GrpcMetrics {
    fn closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&CloseLabels { reason })
            .inc();
    }
}

/// How long a connection may live, resolved from [`GrpcSettings`] (`None`: no limit).
#[derive(Debug, Clone, Copy)]
struct Lifetimes {
    first_stream: Duration,
    max_age: Option<Duration>,
    grace: Duration,
    idle: Option<Duration>,
}

/// Accepts connections while fewer than `max` are held, handing each (with its slot) to `serve`, until
/// `stop`. Nagle is turned off (tonic leaves it on for incoming streams, and a unary call then waits ~40 ms
/// for the delayed ACK).
async fn accept_loop(
    listener: TcpListener,
    max: usize,
    stop: CancellationToken,
    mut serve: impl FnMut(TcpStream, SocketAddr, Instant, tokio::sync::OwnedSemaphorePermit),
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(max.max(1)));
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.cancelled() => return,
        };
        let (stream, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
        let _ = stream.set_nodelay(true);
        serve(stream, remote, Instant::now(), permit);
    }
}

/// The TLS handshake when the listener has TLS, finished within the first-stream timeout.
async fn handshake(
    stream: TcpStream,
    remote: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    accepted: Instant,
    lifetimes: Lifetimes,
    metrics: &GrpcMetrics,
) -> Option<Conn> {
    let Some(acceptor) = tls else {
        return Some(Conn {
            io: Io::Plain(stream),
            info: ConnInfo {
                remote: Some(remote),
                client_cn: None,
                client_subject: None,
            },
            accepted,
        });
    };
    let deadline = tokio::time::Instant::from_std(accepted + lifetimes.first_stream);
    match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Ok(Ok(s)) => {
            let cert = s.get_ref().1.peer_certificates().and_then(|c| c.first());
            let info = ConnInfo {
                remote: Some(remote),
                client_cn: cert.and_then(hl7gw_tls::common_name),
                client_subject: cert.map(hl7gw_tls::subject),
            };
            Some(Conn {
                io: Io::Tls(Box::new(s)),
                info,
                accepted,
            })
        }
        Ok(Err(e)) => {
            tracing::debug!(%remote, error = %e, "gRPC TLS handshake failed");
            metrics.closed("handshake_failed");
            None
        }
        Err(_) => {
            tracing::debug!(%remote, "gRPC TLS handshake timed out");
            metrics.closed("first_stream_timeout");
            None
        }
    }
}

/// Calls in progress on one connection, and since when it has had none.
#[derive(Debug)]
struct Activity {
    state: std::sync::Mutex<(usize, Option<Instant>)>,
    changed: tokio::sync::Notify,
}

impl Activity {
    fn new(since: Instant) -> Self {
        Self {
            state: std::sync::Mutex::new((0, Some(since))),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn started(self: &Arc<Self>) -> CallGuard {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 += 1;
        s.1 = None;
        CallGuard(self.clone())
    }

    /// Since when no call has been in progress (`None`: one is).
    fn idle_since(&self) -> Option<Instant> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

/// One call in progress, until its response has been sent (or the call was reset).
struct CallGuard(Arc<Activity>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = s.0.saturating_sub(1);
        if s.0 == 0 {
            s.1 = Some(Instant::now());
            drop(s);
            self.0.changed.notify_one();
        }
    }
}

/// A response body that holds its call's [`CallGuard`] until hyper has sent it or dropped it.
struct TrackedBody {
    inner: tonic::body::Body,
    _call: CallGuard,
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves one connection until it ends, enforcing its [`Lifetimes`]: no call within `first_stream` of the
/// accept closes it; `idle` without a call or `max_age` sends a GOAWAY, and calls still running `grace`
/// later are cut; so does `stop`.
async fn serve_connection(
    conn: Conn,
    routes: tonic::service::Routes,
    http2: hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
    lifetimes: Lifetimes,
    metrics: &GrpcMetrics,
    stop: CancellationToken,
) {
    let accepted = conn.accepted;
    let info = conn.info.clone();
    let activity = Arc::new(Activity::new(Instant::now()));
    let opened = Arc::new(AtomicBool::new(false));
    let svc = {
        let (activity, opened) = (activity.clone(), opened.clone());
        hyper::service::service_fn(move |req: axum::http::Request<hyper::body::Incoming>| {
            use tonic::codegen::Service;
            let call = activity.started();
            opened.store(true, Ordering::Relaxed);
            let mut req = req.map(tonic::body::Body::new);
            // What handlers learn about the connection (`peer`, `client_subject`, the caller's certificate).
            req.extensions_mut().insert(info.clone());
            let mut routes = routes.clone();
            async move {
                std::future::poll_fn(|cx| {
                    Service::<axum::http::Request<tonic::body::Body>>::poll_ready(&mut routes, cx)
                })
                .await?;
                let resp = routes.call(req).await?;
                Ok::<_, std::convert::Infallible>(
                    resp.map(|inner| tonic::body::Body::new(TrackedBody { inner, _call: call })),
                )
            }
        })
    };
    let remote = conn.info.remote;
    let c = http2.serve_connection(hyper_util::rt::TokioIo::new(conn), svc);
    tokio::pin!(c);
    let first_stream_at = accepted + lifetimes.first_stream;
    let max_age_at = lifetimes.max_age.map(|a| accepted + a);
    // Once a GOAWAY went out: when the calls still running are cut.
    let mut cut_at: Option<Instant> = None;
    let far = || Instant::now() + Duration::from_secs(24 * 3600);
    loop {
        let deadline = match cut_at {
            Some(at) => at,
            None => {
                let mut d = max_age_at.unwrap_or_else(far);
                if !opened.load(Ordering::Relaxed) {
                    d = d.min(first_stream_at);
                }
                if let (Some(idle), Some(since)) = (lifetimes.idle, activity.idle_since()) {
                    d = d.min(since + idle);
                }
                d
            }
        };
        tokio::select! {
            r = c.as_mut() => {
                if let Err(e) = r {
                    if keepalive_timed_out(&e) {
                        metrics.closed("keepalive_timeout");
                    }
                    tracing::debug!(peer = ?remote, error = %e, "gRPC connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                let now = Instant::now();
                if cut_at.is_some() {
                    metrics.closed("grace_expired");
                    tracing::debug!(peer = ?remote, "gRPC connection closed: calls still running after the grace period");
                    return;
                }
                let idle = lifetimes.idle.zip(activity.idle_since());
                let (reason, grace) = if !opened.load(Ordering::Relaxed) && now >= first_stream_at {
                    // No call was ever opened: before the HTTP/2 preface this closes the connection at
                    // once, after it a GOAWAY goes out; either way there is nothing to wait for.
                    ("first_stream_timeout", lifetimes.grace.min(lifetimes.first_stream))
                } else if max_age_at.is_some_and(|at| now >= at) {
                    ("max_age", lifetimes.grace)
                } else if idle.is_some_and(|(i, since)| now >= since + i) {
                    ("idle_timeout", lifetimes.grace)
                } else {
                    continue;
                };
                metrics.closed(reason);
                tracing::debug!(peer = ?remote, reason, "gRPC connection sent away (GOAWAY)");
                c.as_mut().graceful_shutdown();
                cut_at = Some(now + grace);
            }
            _ = activity.changed.notified() => {}
            _ = stop.cancelled(), if cut_at.is_none() => {
                c.as_mut().graceful_shutdown();
                cut_at = Some(Instant::now() + lifetimes.grace);
            }
        }
    }
}

/// Whether hyper ended a connection because a keepalive PING went unanswered.
fn keepalive_timed_out(e: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.to_string().contains("keep-alive timed out") {
            return true;
        }
        source = s.source();
    }
    false
}

/// How much one gRPC listener serves at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Streams per connection (none: tonic's default).
    pub max_concurrent_streams: Option<u32>,
    /// Connections served at once; more wait in the backlog.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: None,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// A generated tonic server accepting and sending gzip and zstd (every hl7gw service does).
#[macro_export]
macro_rules! compressed {
    ($server:expr) => {{
        use tonic::codec::CompressionEncoding::{Gzip, Zstd};
        $server
            .accept_compressed(Gzip)
            .accept_compressed(Zstd)
            .send_compressed(Gzip)
            .send_compressed(Zstd)
    }};
}

/// Why a gRPC listener stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum GrpcServeError {
    #[error(transparent)]
    Settings(#[from] GrpcError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// `grpc.health.v1.Health` for a service: SERVING (for `service_name` and for "") while `health` is ready,
/// NOT_SERVING otherwise and once `stop` fires. Polls readiness every 500 ms.
pub fn health(
    health: Arc<Health>,
    service_name: &'static str,
    stop: CancellationToken,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    use tonic_health::ServingStatus;
    let (reporter, service) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let ready = health.is_ready();
            if last != Some(ready) {
                let status = if ready {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                reporter.set_service_status(service_name, status).await;
                reporter.set_service_status("", status).await;
                last = Some(ready);
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
                _ = stop.cancelled() => {
                    reporter.set_service_status(service_name, ServingStatus::NotServing).await;
                    reporter.set_service_status("", ServingStatus::NotServing).await;
                    break;
                }
            }
        }
    });
    service
}

/// Most connections one gRPC listener serves at once by default; more wait in the accept backlog (hyper
/// itself sets no limit, so a flood of idle connections could take a pod's memory and file descriptors).
pub const MAX_CONNECTIONS: usize = 1024;

/// What a handler learns about the connection of a call (request extensions).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// The client certificate's CN (mutual TLS).
    pub client_cn: Option<String>,
    /// The client certificate's subject (mutual TLS).
    pub client_subject: Option<String>,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// One accepted gRPC connection (its slot in the connection limit is held by its task).
pub struct Conn {
    io: Io,
    info: ConnInfo,
    /// When the TCP connection was accepted (the first-stream timeout counts from here).
    accepted: Instant,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match &mut $self.io {
            Io::Plain($s) => {
                let $s = std::pin::Pin::new($s);
                $e
            }
            Io::Tls($s) => {
                let $s = std::pin::Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(auth: Option<&str>, cn: Option<&str>) -> tonic::Request<()> {
        let mut r = tonic::Request::new(());
        if let Some(a) = auth {
            r.metadata_mut()
                .insert("authorization", a.parse().expect("ascii"));
        }
        r.extensions_mut().insert(ConnInfo {
            remote: None,
            client_cn: cn.map(str::to_owned),
            client_subject: None,
        });
        r
    }

    #[tokio::test]
    async fn admin_methods_are_denied_by_default_and_allow_lists_decide() {
        let tokens = "# ops\nops 0123456789abcdef0123\nviewer fedcba9876543210fedc\n";
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tokens");
        std::fs::write(&file, tokens).expect("write");
        let settings = GrpcSettings {
            tokens_file: Some(file.clone()),
            allow: [(
                "Replay".to_owned(),
                vec!["token:ops".to_owned(), "cert:ops-cli".to_owned()],
            )]
            .into(),
            ..GrpcSettings::default()
        };
        settings
            .validate(&["Replay", "Status", "Ingest"])
            .expect("valid");
        let auth = Auth::new(
            &settings,
            &[("Ingest", &["anonymous"]), ("Status", &["authenticated"])],
        );
        let code = |r: Result<Caller, Status>| r.map_err(|s| s.code());
        use tonic::Code::{PermissionDenied, Unauthenticated};
        let (ops, viewer) = (
            Some("Bearer 0123456789abcdef0123"),
            Some("Bearer fedcba9876543210fedc"),
        );
        let cases = [
            (None, None, "Replay", Err(Unauthenticated)),
            (ops, None, "Replay", Ok(Caller::Token("ops".into()))),
            (viewer, None, "Replay", Err(PermissionDenied)),
            (Some("Bearer nope"), None, "Status", Err(Unauthenticated)),
            (
                None,
                Some("ops-cli"),
                "Replay",
                Ok(Caller::Cert("ops-cli".into())),
            ),
            (None, Some("other"), "Replay", Err(PermissionDenied)),
            (
                None,
                Some("other"),
                "Status",
                Ok(Caller::Cert("other".into())),
            ),
            (None, None, "Ingest", Ok(Caller::Anonymous)),
            (None, None, "ListDeadLetters", Err(Unauthenticated)),
        ];
        for (bearer, cert, method, want) in cases {
            let got = code(auth.authorize(&req(bearer, cert), method).await);
            assert_eq!(got, want, "{bearer:?} {cert:?} {method}");
        }
        // Rotated: the old token stops working, the new one works.
        let rotated = Some("Bearer 11112222333344445555");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, "ops 11112222333344445555\n").expect("write");
        assert_eq!(
            code(auth.authorize(&req(ops, None), "Replay").await),
            Err(Unauthenticated)
        );
        assert!(code(auth.authorize(&req(rotated, None), "Replay").await).is_ok());
        // Debug output never holds a token.
        let debug = format!("{auth:?}");
        assert!(!debug.contains("11112222333344445555"), "{debug}");
        // A revocation that leaves a bad line fails closed: no token works until the file is fixed.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, "ops 11112222333344445555\nbroken-line\n").expect("write");
        assert_eq!(
            code(auth.authorize(&req(rotated, None), "Replay").await),
            Err(Unauthenticated)
        );
        // So does a file that is gone.
        std::fs::write(&file, "ops 11112222333344445555\n").expect("write");
        assert!(code(auth.authorize(&req(rotated, None), "Replay").await).is_ok());
        std::fs::remove_file(&file).expect("remove");
        assert_eq!(
            code(auth.authorize(&req(rotated, None), "Replay").await),
            Err(Unauthenticated)
        );
    }

    #[test]
    fn the_review_cache_forgets_the_least_recently_used_and_keeps_unknown_tokens_apart() {
        let mut lru = Lru::new(3, Duration::from_secs(60));
        for k in 0..3 {
            lru.insert(k, k * 10);
        }
        assert_eq!(lru.get(&0), Some(0), "0 is now the most recently used");
        lru.insert(3, 30);
        assert_eq!(lru.get(&1), None, "1 was the least recently used");
        assert_eq!(
            (lru.get(&0), lru.get(&2), lru.get(&3)),
            (Some(0), Some(20), Some(30))
        );
        assert_eq!(lru.len(), 3);
        let mut short = Lru::new(3, Duration::from_millis(20));
        short.insert("k", 1);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(short.get(&"k"), None, "expired");
        assert_eq!(short.len(), 0);

        // A flood of made-up tokens (refused as unknown) never pushes out a real caller's decision.
        let mut cache = KubeCache::default();
        let good = [7u8; 32];
        let caller = Caller::Kubernetes("system:serviceaccount:ns:sa".into());
        cache.insert(good, "Status", Ok(caller.clone()));
        for i in 0..(3 * KUBE_CACHE_MAX as u32) {
            let mut junk = [0u8; 32];
            junk[..4].copy_from_slice(&i.to_be_bytes());
            cache.insert(
                junk,
                "Status",
                Err((tonic::Code::Unauthenticated, "unknown token".into())),
            );
        }
        assert_eq!(cache.get(good, "Status"), Some(Ok(caller)));
        assert!(cache.unknown.len() <= KUBE_CACHE_MAX);
        // The last junk token is remembered as unknown, for any method: no second review.
        let mut last = [0u8; 32];
        last[..4].copy_from_slice(&(3 * KUBE_CACHE_MAX as u32 - 1).to_be_bytes());
        assert!(matches!(
            cache.get(last, "Replay"),
            Some(Err((tonic::Code::Unauthenticated, _)))
        ));
        // An RBAC refusal of a known token is a decision about a real caller: kept with them.
        cache.insert(
            [8u8; 32],
            "Replay",
            Err((tonic::Code::PermissionDenied, "no".into())),
        );
        assert_eq!(cache.known.len(), 2);
    }

    #[test]
    fn one_peer_cannot_take_every_review() {
        let reviews = PeerReviews::new(2);
        let a = Some(std::net::IpAddr::from([10, 0, 0, 1]));
        let b = Some(std::net::IpAddr::from([10, 0, 0, 2]));
        let first = reviews.try_start(a).expect("a: 1");
        let _second = reviews.try_start(a).expect("a: 2");
        assert!(reviews.try_start(a).is_none(), "a third review for a");
        assert!(reviews.try_start(b).is_some(), "b is not held up by a");
        drop(first);
        assert!(reviews.try_start(a).is_some(), "a again once one finished");
        assert_eq!(
            reviews.in_flight.lock().expect("map").len(),
            1,
            "peers without reviews are forgotten"
        );
    }

    /// A log sink for a test subscriber.
    #[derive(Clone, Default)]
    struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn audit_lines_are_bounded_whatever_the_caller_sends() {
        let sink = Sink::default();
        let w = sink.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .finish();
        let big = "d".repeat(4 << 20);
        tracing::subscriber::with_default(sub, || {
            audit(
                "anonymous",
                None,
                "Status",
                &format!("destination={big:?}"),
                "refused: Unauthenticated",
            );
            audit(&big, None, &big, &big, &big);
        });
        let text = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{}", clip_to(&text, 1000));
        for line in lines {
            assert!(
                line.len() < 80 * 1024,
                "an audit line of {} bytes: {}",
                line.len(),
                clip_to(line, 300)
            );
            assert!(line.contains(" bytes]"), "{}", clip_to(line, 300));
        }
        // Cut at a character boundary, with the full length.
        assert_eq!(clip_to("ééé", 3), "é…[6 bytes]");
        assert_eq!(clip("short"), "short");
    }

    #[test]
    fn bad_settings_are_refused_without_showing_tokens() {
        let s = GrpcSettings {
            allow: [("Replay".to_owned(), vec!["ops".to_owned()])].into(),
            ..GrpcSettings::default()
        };
        assert!(s.validate(&["Replay"]).is_err());
        assert!(s.validate(&["Status"]).is_err(), "unknown method");
        let lifetimes = |first: u64, ka: u64, kat: u64| GrpcSettings {
            first_stream_timeout: Duration::from_secs(first),
            keepalive_interval: Duration::from_secs(ka),
            keepalive_timeout: Duration::from_secs(kat),
            ..GrpcSettings::default()
        };
        assert!(GrpcSettings::default().validate(&[]).is_ok());
        assert!(
            lifetimes(0, 60, 20).validate(&[]).is_err(),
            "no first-stream timeout"
        );
        assert!(
            lifetimes(10, 60, 0).validate(&[]).is_err(),
            "keepalive without timeout"
        );
        assert!(lifetimes(10, 0, 0).validate(&[]).is_ok(), "keepalive off");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tokens");
        std::fs::write(&file, "short-secret-token\n").expect("write");
        let e = Tokens::read(&file).expect_err("no name").to_string();
        assert!(!e.contains("short-secret-token"), "{e}");
    }
}
